"""A whole node call in one compiled function, for one thread: the native nodes' entry.

:func:`run_node` does what :func:`onnx_recurrent.scan.scan` does for one thread, in
compiled code: each direction's rows sorted by length (longest first, so the rows
still running at step ``k`` are a prefix), a reverse direction reading each sequence
from its own last valid step, either layout, the inputs of a block of steps gathered
into the compute buffer, each step's states written straight into ``Y``; each block is
:func:`.numba_backend._block` on the direction's plan (:class:`.plans.Plan`).
Between blocks it reads ``abort[0]`` and stops when it is set (a Ctrl-C). It never
raises and takes its memory from ``malloc`` (:mod:`.views`): the native nodes' code
runs without numba's runtime (:mod:`.native_code`).

The arrays are the caller's: the onnxruntime host passes onnxruntime's own buffers
(:mod:`onnx_recurrent.runtime.hosts.native`), already checked there.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types

from ..scan import BLOCK_BYTES, BLOCK_MACS, MIN_BLOCK  # the skeleton's block, in compiled code
from .jit_cache import jit, prepare
from .numba_backend import PROJECT_BELOW, _block, block_scratch, load_plan
from .plans import SHARE_ALIGN
from .sync import ABORTED as ABORTED_AT
from .sync import atomic_load, claim, cycles, finish, wait
from .views import INTS, allocate, copy, part, release, unowned, view, zero

_jit = jit(fastmath={"contract", "nsz"}, nogil=True, error_model="numpy")
_inline = jit(fastmath={"contract", "nsz"}, nogil=True, error_model="numpy", inline="always")


@_jit
def block_steps(gates, N, I, H, itemsize):
    """Steps of one block (:func:`onnx_recurrent.scan.block_steps`, same figures)."""
    G = max(gates * H * N, 1)
    block = max(MIN_BLOCK, BLOCK_BYTES // (G * itemsize))
    return max(min(block, BLOCK_MACS // (G * (H + I))), 1)


@_jit
def longest_first(L, T, first_of, count):
    """``first_of[i]``: the index of the ``i``-th longest of the lengths ``L`` (each in
    ``[0, T]``), in index order where they tie (a counting sort; ``count``: ``T + 1``
    scratch words)."""
    count[:] = 0
    for j in range(L.shape[0]):
        count[L[j]] += 1
    first = 0
    for t in range(T, -1, -1):
        n = count[t]
        count[t] = first
        first += n
    for j in range(L.shape[0]):
        first_of[count[L[j]]] = j
        count[L[j]] += 1


#: what :func:`run_node` returns
DONE, ABORTED, FAILED = 0, 1, 2
#: a call's flags (:func:`run_node`, :func:`run_layer`): two directions, the one
#: direction reverse, batch-first layout, Y written, initial states given, LSTM (run_layer
#: only: run_node reads the plan's kind), sequence_lens given
TWO_DIRECTIONS, REVERSE, LAYOUT, WRITE_Y, HAS_H0, HAS_C0, LSTM, HAS_LENS = (
    1 << i for i in range(8)
)


@_jit
def shared_sizes(N, I, H, shares, lstm, split, steps):
    """Elements of each of the buffers that the ``shares`` parties of a unit of ``N``
    rows share (:func:`run_unit`): ``h``, its spare, ``c``, ``gz``, ``rh`` and the
    ``steps`` of a block's gathered inputs. Plain integer arithmetic: the skeleton
    sizes the buffer with the same function (its ``py_func``)."""
    most = (H + shares - 1) // shares + SHARE_ALIGN  # the widest (plans.share_bounds)
    nc, ns = N if lstm else 0, N if split else 0
    return (N * H, N * H, nc * H, shares * ns * 3 * most, ns * H, steps * N * I)


@_inline
def _next(sync, calls, phase, shares, first, done):
    """In a phase of ``shares`` shares: mark share ``done`` done (unless -1), then the
    next one this party claims (:func:`.sync.claim`), -1 when none is left; one
    share: share 0, then -1."""
    if shares == 1:
        return 0 if done < 0 else -1
    if done >= 0:
        finish(sync, phase, shares, calls, cycles())
    return claim(sync, phase, shares, first)


@_inline
def _met(sync, calls, phase, shares):
    """Wait until every share of ``phase`` is done; False if the meeting was aborted."""
    return shares == 1 or wait(sync, phase, shares, calls)


@_inline
def _start(i0, i1, d, order, L, h, c, h0, c0, Y, flags, lstm):
    """Rows ``i0 .. i1`` (longest first) of direction ``d``: their initial states
    into ``h`` and ``c``, and zeros into ``Y`` past their lengths (:func:`_run`)."""
    layout = (flags & LAYOUT) != 0
    T = Y.shape[1] if layout else Y.shape[0]
    for i in range(i0, i1):
        b = order[i]
        zero(h[i])
        if lstm:
            zero(c[i])
        if flags & HAS_H0:
            copy(h0[b, d] if layout else h0[d, b], h[i])
        if lstm and flags & HAS_C0:
            copy(c0[b, d] if layout else c0[d, b], c[i])
        if flags & WRITE_Y:
            for t in range(L[i], T):
                zero(Y[b, t, d] if layout else Y[t, d, b])


@_inline
def _gather(s, S, k0, k1, back, order, L, active, X, xb, layout):
    """Share ``s`` of ``S`` of the running rows of steps ``k0 .. k1``: their inputs
    into ``xb`` (:func:`_run`)."""
    for k in range(k0, k1):
        for i in range(s * active[k] // S, (s + 1) * active[k] // S):
            b = order[i]
            t = L[i] - 1 - k if back else k
            copy(X[b, t] if layout else X[t, b], xb[k - k0, i])


@_inline
def _finish(i0, i1, d, order, L, steps, block, h, spare, c, Yh, Yc, layout, lstm):
    """Rows ``i0 .. i1``' final states into ``Yh`` and ``Yc`` (zeros for a length of
    0, not the initial state). ``h`` and ``spare`` alternate with several shares: a
    row's state stays in the one its block ended in (rows that end are copied along
    to their block's end, then left alone)."""
    for i in range(i0, i1):
        b = order[i]
        hd = Yh[b, d] if layout else Yh[d, b]
        cd = Yc[b, d] if layout else Yc[d, b]
        if L[i] > 0:
            end = min(steps, ((L[i] - 1) // block + 1) * block)
            copy(spare[i] if end % 2 == 1 else h[i], hd)
            if lstm:
                copy(c[i], cd)
        else:
            zero(hd)
            if lstm:
                zero(cd)


@_inline
def _run(address0, address1, flags, X, lens, h0, c0, Y, Yh, Yc, rows, sync, calls, abort,
         first, common):  # fmt: skip
    """:func:`run_node`, also as one of the parties that share a direction's hidden
    units (the plan's shares, more than one): ``first``, the share it claims first;
    ``common``, the buffers the parties share (:func:`shared_sizes`). The parties
    also share out, by rows, the initial states, the zeros past each row's length,
    each block's inputs (gathered once, into ``common``) and the final states (each
    step's shares write their parts of the states straight into ``Y``): every piece
    is claimed by whoever comes first, so the caller alone can finish (:mod:`.sync`)."""
    D = 2 if flags & TWO_DIRECTIONS else 1
    reverse, layout = (flags & REVERSE) != 0, (flags & LAYOUT) != 0
    write_Y, has_lens = (flags & WRITE_Y) != 0, (flags & HAS_LENS) != 0
    # the arrays as views without a reference count (:mod:`.views`)
    X, lens, h0, c0, Y = unowned(X), unowned(lens), unowned(h0), unowned(c0), unowned(Y)
    Yh, Yc, rows, sync, calls, abort = (
        unowned(Yh),
        unowned(Yc),
        unowned(rows),
        unowned(sync),
        unowned(calls),
        unowned(abort),
    )
    if layout:
        N, T, I = X.shape
    else:
        T, N, I = X.shape
    subset = rows.shape[0] > 0
    if subset:
        N = rows.shape[0]  # the rows of this call
    H = Yh.shape[2]
    plan0, plan1 = load_plan(address0, Yh), load_plan(address1, Yh)
    lstm = plan0.kind == 2
    gates = 1 if plan0.kind == 0 else 3 if plan0.kind == 1 else 4
    split = plan0.split  # GRU's reset gate before the product: both directions alike
    S = plan0.bounds.shape[0] - 1  # parties sharing the hidden units (one direction)
    phases = 2 if split else 1
    block = block_steps(gates, N, I, H, Yh.itemsize)
    project = N < PROJECT_BELOW and S == 1
    # one allocation each for the integers and the floats of the call (views below)
    ints = allocate(3 * N + max(T, 1) + T + 1, INTS)
    if ints.shape[0] == 0:
        return FAILED
    L, order, first_of = ints[:N], ints[N : 2 * N], ints[2 * N : 3 * N]
    active, count = ints[3 * N : 3 * N + max(T, 1)], ints[3 * N + max(T, 1) :]
    for j in range(N):
        b = rows[j] if subset else j
        L[j] = lens[b] if has_lens else T
    # the rows longest first; then order[i] is the i-th row's place in the batch and
    # L[i] its length
    longest_first(L, T, first_of, count)
    for i in range(N):
        j = first_of[i]
        order[i] = rows[j] if subset else j
        first_of[i] = L[j]
    for i in range(N):
        L[i] = first_of[i]
    steps = L[0] if N > 0 else 0
    active[:] = 0
    for i in range(N):
        for k in range(L[i]):
            active[k] += 1
    span = min(block, max(steps, 1))  # steps of the longest block
    work = max(block_scratch(plan0, span, N, project), block_scratch(plan1, span, N, project))
    sizes = shared_sizes(N, I, H, S, lstm, split, span)
    needed = sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4] + sizes[5]
    own = needed - sizes[1] if S == 1 else 0
    floats = allocate(own + work, Yh)
    if floats.shape[0] == 0 or (S > 1 and (D > 1 or common.shape[0] < needed)):
        release(ints)
        release(floats)
        return FAILED
    pool = floats if S == 1 else common
    o = 0
    h = part(pool, o, (N, H))
    o += sizes[0]
    spare = h
    if S > 1:
        spare = part(pool, o, (N, H))
        o += sizes[1]
    c = part(pool, o, (N if lstm else 0, H))
    o += sizes[2]
    gz = part(pool, o, (S, N if split else 0, 3 * ((H + S - 1) // S)))
    o += sizes[3]
    rh = part(pool, o, (N if split else 0, H))
    o += sizes[4]
    xb_at = o
    scratch = part(floats, own, (work,))  # this thread's own
    result = DONE
    phase = 0
    for d in range(D):
        plan = plan0 if d == 0 else plan1
        back = reverse or d == 1
        # rows' initial states, and the zeros past each row's length
        s = _next(sync, calls, phase, S, first, -1)
        while s >= 0:
            _start(s * N // S, (s + 1) * N // S, d, order, L, h, c, h0, c0, Y, flags, lstm)
            s = _next(sync, calls, phase, S, first, s)
        if not _met(sync, calls, phase, S):
            result = ABORTED
            break
        phase += 1
        for k0 in range(0, steps, block):
            if abort[0] != 0 or (S > 1 and atomic_load(sync, ABORTED_AT) != 0):
                result = ABORTED
                break
            k1 = min(steps, k0 + block)
            n0 = active[k0]
            xb = part(pool, xb_at, (k1 - k0, n0, I))
            s = _next(sync, calls, phase, S, first, -1)  # the block's inputs, by rows
            while s >= 0:
                _gather(s, S, k0, k1, back, order, L, active, X, xb, layout)
                s = _next(sync, calls, phase, S, first, s)
            if not _met(sync, calls, phase, S):
                result = ABORTED
                break
            phase += 1
            to = (order, L, d, back, layout, 0)  # each step's states straight into Y
            if not _block(plan, sync, calls, first, phase, xb, h, spare, c if lstm else h, gz,
                          rh, active[k0:k1], Y, write_Y, k0, project, scratch, to):  # fmt: skip
                result = FAILED
                break
            phase += (k1 - k0) * phases
        if result != DONE:
            break
        s = _next(sync, calls, phase, S, first, -1)
        while s >= 0:
            i0, i1 = s * N // S, (s + 1) * N // S
            _finish(i0, i1, d, order, L, steps, block, h, spare, c, Yh, Yc, layout, lstm)
            s = _next(sync, calls, phase, S, first, s)
        phase += 1
    release(ints)
    release(floats)
    return result


@_jit
def run_node(address0, address1, flags, X, lens, h0, c0, Y, Yh, Yc, rows, sync, calls, abort):
    """One call of a recurrent node on checked arrays: :data:`DONE`, :data:`ABORTED`
    (``abort[0]`` was set) or :data:`FAILED` (no memory, or arrays that disagree with
    the plans; nothing meaningful written). Never raises; its memory from ``malloc``.

    The kernel's whole contract:

    - ``address0``, ``address1``: the directions' prepared records (:class:`.plans.Plan`:
      packed weights, activations, tiles) of one share, kept alive by the caller; one
      direction: the same address twice;
    - ``flags``: the bits above;
    - ``X``: ``[T, N, I]`` (``[N, T, I]`` with ``LAYOUT``); ``lens``: ``[N]`` int32,
      read with ``HAS_LENS``; ``h0``, ``c0``: the initial states, read with
      ``HAS_H0`` / ``HAS_C0``;
    - ``Y``: ``[T, D, N, H]`` (``[N, T, D, H]``), written with ``WRITE_Y``; ``Yh``,
      ``Yc``: ``[D, N, H]`` (``[N, D, H]``), the final states (``Yc``: LSTM only, else
      any array);
    - ``rows``: the batch rows to run (int64; the others are neither read nor
      written), or none (size 0): every row;
    - ``sync``, ``calls``: a one-share meeting (:data:`.numba_backend._ALONE`);
      ``abort``: one word, read between blocks.
    """
    return _run(address0, address1, flags, X, lens, h0, c0, Y, Yh, Yc, rows, sync, calls,
                abort, 0, view(0, (0,), Yh))  # fmt: skip


@_jit
def run_layer(address0, address1, X, lens, h0, c0, flags):
    """One small call of a layer on this thread, its outputs made here: ``(Y, Y_h,
    Y_c)`` (``Y`` of size 0 unless ``WRITE_Y``; ``Y_c`` of size 0 unless ``LSTM``).
    ``address0``, ``address1``: the directions' plans (:class:`.plans.Plan`, kept by
    the caller); ``flags``: the bits above; ``X``, ``lens`` (int64, checked: read with
    ``HAS_LENS``), ``h0``, ``c0`` as :func:`run_node` takes them, in the layer's dtype.

    Raises
    ------
    MemoryError
        No memory for the call's scratch.
    """
    D = 2 if flags & TWO_DIRECTIONS else 1
    layout = (flags & LAYOUT) != 0
    lstm = (flags & LSTM) != 0
    write_Y = (flags & WRITE_Y) != 0
    if layout:
        N, T = X.shape[0], X.shape[1]
    else:
        T, N = X.shape[0], X.shape[1]
    plan0 = load_plan(address0, X)
    H = plan0.bounds[plan0.bounds.shape[0] - 1]
    dt = X.dtype
    Y = np.empty((N, T, D, H) if layout else (T, D, N, H), dt)
    if not write_Y:
        Y = np.empty((0, 0, 0, 0), dt)
    state = (N, D, H) if layout else (D, N, H)
    Yh = np.empty(state, dt)
    Yc = np.empty(state if lstm else (0, 0, 0), dt)
    sync, calls, abort = np.zeros(8, np.int64), np.zeros(4, np.int64), np.zeros(1, np.int64)
    rows = np.zeros(0, np.int64)
    result = run_node(address0, address1, flags, X, lens, h0, c0, Y, Yh, Yc if lstm else Yh,
                      rows, sync, calls, abort)  # fmt: skip
    if result != DONE:
        raise MemoryError("onnx-recurrent: no memory for a layer call's scratch")
    return Y, Yh, Yc


_prepared_layers: set[np.dtype] = set()


def prepare_layer(dt: np.dtype) -> None:
    """Compile (or load) :func:`run_layer` for ``dt``: X and the states C-ordered (a
    signature the dispatcher matches without Python) and read-only ``'A'`` (any array
    converts to it); the lengths int64, C-ordered."""
    if dt in _prepared_layers:
        return
    e = numba.from_dtype(np.dtype(dt))
    given = types.Array(e, 3, "A", readonly=True)
    usual = types.Array(e, 3, "C")  # matched without Python; anything else converts
    lens = types.Array(types.int64, 1, "C")
    for array in (usual, given):
        prepare(run_layer, (types.int64, types.int64, array, lens, array, array, types.int64))
    _prepared_layers.add(dt)


@_jit
def run_unit(address, flags, X, lens, rows, h0, c0, Y, Yh, Yc, sync, calls, abort, first,
             common):  # fmt: skip
    """:func:`run_node` on one direction (the plan at ``address``) of the batch
    ``rows``, as a layer's call runs its units from Python
    (:meth:`.numba_backend.NumbaBackend.run_unit`); with a plan of several shares,
    as party ``first`` of the threads that share its hidden units, ``sync`` their
    meeting and ``common`` their buffers (:func:`shared_sizes` elements)."""
    return _run(address, address, flags, X, lens, h0, c0, Y, Yh, Yc, rows, sync, calls, abort,
                first, common)  # fmt: skip


def prepare_unit(dt: np.dtype) -> None:
    """Compile (or load) :func:`run_unit` for ``dt``: X and the initial states
    read-only ``'A'``, the outputs ``'A'`` (views of one direction), the lengths,
    rows and words int64 (once per dtype: :meth:`.numba_backend.NumbaBackend.prepare`)."""
    e = numba.from_dtype(np.dtype(dt))
    given, out = types.Array(e, 3, "A", readonly=True), types.Array(e, 3, "A")
    ints = types.Array(types.int64, 1, "C")
    Y = types.Array(e, 4, "A")
    prepare(run_unit, (types.int64, types.int64, given, ints, ints, given, given, Y, out, out,
                       ints, ints, ints, types.int64, types.Array(e, 1, "C")))  # fmt: skip
