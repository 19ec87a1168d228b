"""A whole node call in one compiled function, for one thread: the native nodes' entry.

:func:`run_node` does what :func:`onnx_recurrent.scan.scan` does for one thread, in
compiled code: each direction's rows sorted by length (longest first, so the rows
still running at step ``k`` are a prefix), a reverse direction reading each sequence
from its own last valid step, either layout, blocks of steps gathered into the
compute buffer and scattered back into ``Y``; each block is
:func:`.numba_backend._part_block` on the direction's :class:`.numba_backend.Plan`.
Between blocks it reads ``abort[0]`` and returns 1 when it is set (a Ctrl-C).

The arrays are the caller's: the onnxruntime host passes onnxruntime's own buffers
(:mod:`onnx_recurrent.runtime.hosts.native`), already checked there.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic

from ..scan import BLOCK_BYTES, BLOCK_MACS, MIN_BLOCK  # the skeleton's block, in compiled code
from .jit_cache import jit, prepare
from .numba_backend import PROJECT_BELOW, _part_block, plan_type
from .views import keep, part, unowned

_jit = jit(fastmath={"contract", "nsz"}, nogil=True, error_model="numpy")


@intrinsic
def plan_at(typingctx, address, like):
    """The :class:`.numba_backend.Plan` whose meminfo is at ``address`` (a new
    reference; its owner keeps the record alive), of the dtype of the array ``like``."""
    ty = plan_type(np.dtype(str(like.dtype)))

    def codegen(context, builder, signature, args):
        plan = cgutils.create_struct_proxy(ty)(context, builder)
        plan.meminfo = builder.inttoptr(args[0], plan.meminfo.type)
        context.nrt.incref(builder, ty, plan._getvalue())
        return plan._getvalue()

    return ty(types.int64, like), codegen


@intrinsic
def _meminfo(typingctx, plan):
    def codegen(context, builder, signature, args):
        proxy = cgutils.create_struct_proxy(signature.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(proxy.meminfo, ir.IntType(64))

    return types.int64(plan), codegen


@_jit
def address_of(plan):
    """The address :func:`plan_at` takes for ``plan``."""
    return _meminfo(plan)


@_jit
def block_steps(gates, N, I, H, itemsize):
    """Steps of one block (:func:`onnx_recurrent.scan.block_steps`, same figures)."""
    G = max(gates * H * N, 1)
    block = max(MIN_BLOCK, BLOCK_BYTES // (G * itemsize))
    return max(min(block, BLOCK_MACS // (G * (H + I))), 1)


@_jit
def run_node(plan0, plan1, D, reverse, layout, X, lens, has_lens, h0, has_h0, c0, has_c0, Y,
             write_Y, Yh, Yc, sync, calls, abort):  # fmt: skip
    """One call of a recurrent node on checked arrays; returns 0, or 1 if aborted.

    ``X``: ``[T, N, I]`` (``[N, T, I]`` if ``layout``); ``lens`` ``[N]`` int32 (read
    if ``has_lens``); ``h0``, ``c0``: the initial states (read if ``has_*``);
    ``Y`` ``[T, D, N, H]`` (``[N, T, D, H]``), written if ``write_Y``; ``Yh``, ``Yc``
    ``[D, N, H]`` (``[N, D, H]``): the final states (``Yc``: LSTM only, else any
    array); direction 0 runs ``plan0``, direction 1 ``plan1``; ``reverse``: the one
    direction runs backwards. ``sync``, ``calls``: a one-share meeting
    (:data:`.numba_backend._ALONE`).
    """
    # the arrays as views without a reference count (:mod:`.views`)
    X, lens, h0, c0, Y = unowned(X), unowned(lens), unowned(h0), unowned(c0), unowned(Y)
    Yh, Yc, sync, calls, abort = (
        unowned(Yh),
        unowned(Yc),
        unowned(sync),
        unowned(calls),
        unowned(abort),
    )
    if layout:
        N, T, I = X.shape
        H = Yh.shape[2]
    else:
        T, N, I = X.shape
        H = Yh.shape[2]
    dt = Yh.dtype
    lstm = plan0.kind == 2
    gates = 1 if plan0.kind == 0 else 3 if plan0.kind == 1 else 4
    split = plan0.split  # GRU's reset gate before the product: both directions alike
    block = block_steps(gates, N, I, H, Yh.itemsize)
    # one allocation each for the integers and the floats of the call (views below)
    own_ints = np.empty(2 * N + max(T, 1), np.int64)
    ints = unowned(own_ints)
    L, order, active = ints[:N], ints[N : 2 * N], ints[2 * N :]
    ragged = False
    for b in range(N):
        L[b] = lens[b] if has_lens else T
        order[b] = b
        ragged = ragged or L[b] < T
    if ragged:
        order[:] = np.argsort(-L, kind="mergesort")
    steps = L[order[0]] if N > 0 else 0
    active[:] = 0
    for i in range(N):
        for k in range(L[order[i]]):
            active[k] += 1
    if write_Y and ragged:
        Y[...] = 0
    nc = N if lstm else 0
    ns = N if split else 0
    ny = N if write_Y else 0
    sizes = (N * H, nc * H, ns * 3 * H, ns * H, block * N * I, block * ny * H)
    own_floats = np.empty(sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4] + sizes[5], dt)
    floats = unowned(own_floats)
    o = 0
    h = part(floats, o, (N, H))
    o += sizes[0]
    c = part(floats, o, (nc, H))
    o += sizes[1]
    gz = part(floats, o, (1, ns, 3 * H))
    o += sizes[2]
    rh = part(floats, o, (ns, H))
    o += sizes[3]
    xs = o
    o += sizes[4]
    ys = o
    project = N < PROJECT_BELOW
    for d in range(D):
        plan = plan0 if d == 0 else plan1
        back = reverse or d == 1
        h[...] = 0
        c[...] = 0
        for i in range(N):
            b = order[i]
            if has_h0:
                src = h0[b, d] if layout else h0[d, b]
                for j in range(H):
                    h[i, j] = src[j]
            if lstm and has_c0:
                src = c0[b, d] if layout else c0[d, b]
                for j in range(H):
                    c[i, j] = src[j]
        for k0 in range(0, steps, block):
            if abort[0] != 0:
                return 1
            k1 = min(steps, k0 + block)
            n0 = active[k0]
            xb = part(floats, xs, (k1 - k0, n0, I))
            for k in range(k0, k1):
                for i in range(active[k]):
                    b = order[i]
                    t = L[b] - 1 - k if back else k
                    src = X[b, t] if layout else X[t, b]
                    dst = xb[k - k0, i]
                    for j in range(I):
                        dst[j] = src[j]
            Yb = part(floats, ys, (k1 - k0, n0 if write_Y else 0, H))
            _part_block(plan, sync, calls, xb, h, h, c if lstm else h, gz, rh, active[k0:k1], Yb,
                        write_Y, k0, project)  # fmt: skip
            if write_Y:
                for k in range(k0, k1):
                    for i in range(active[k]):
                        b = order[i]
                        t = L[b] - 1 - k if back else k
                        dst = Y[b, t, d] if layout else Y[t, d, b]
                        src = Yb[k - k0, i]
                        for j in range(H):
                            dst[j] = src[j]
        for i in range(N):
            b = order[i]
            hd = Yh[b, d] if layout else Yh[d, b]
            ran = L[b] > 0
            for j in range(H):
                hd[j] = h[i, j] if ran else 0
            if lstm:
                cd = Yc[b, d] if layout else Yc[d, b]
                for j in range(H):
                    cd[j] = c[i, j] if ran else 0
    keep(own_ints)
    keep(own_floats)
    return 0


def prepare_node(dt: np.dtype) -> None:
    """Compile (or load) :func:`.numba_backend._part_block` for the buffers
    :func:`run_node` passes it, in ``dt``, before code calling :func:`run_node` is
    compiled (the entry compiles nothing at call time, :func:`.jit_cache.prepare`)."""
    e = numba.from_dtype(np.dtype(dt))
    ints, flag = types.Array(types.int64, 1, "C"), types.boolean

    def array(ndim: int) -> types.Array:
        return types.Array(e, ndim, "C")

    states = (array(2), array(2), array(2))  # h, spare, c
    prepare(_part_block, (plan_type(dt), ints, ints, array(3), *states, array(3), array(2), ints,
                          array(3), flag, types.int64, flag))  # fmt: skip


#: run_layer's flags
TWO_DIRECTIONS, REVERSE, LAYOUT, WRITE_Y, HAS_H0, HAS_C0, LSTM = (1 << i for i in range(7))


@_jit
def run_layer(address0, address1, X, h0, c0, flags):
    """One small call of a layer on this thread, its outputs made here: ``(Y, Y_h,
    Y_c)`` (``Y`` of size 0 unless ``WRITE_Y``; ``Y_c`` of size 0 unless ``LSTM``).
    ``address0``, ``address1``: the directions' plans (:func:`address_of`; a record
    passed by address: a record argument costs µs to type per call); ``flags``: the
    bits above; ``X``, ``h0``, ``c0`` as :func:`run_node` takes them, in the layer's
    dtype."""
    plan0 = plan_at(address0, X)
    plan1 = plan_at(address1, X)
    D = 2 if flags & TWO_DIRECTIONS else 1
    layout = (flags & LAYOUT) != 0
    lstm = (flags & LSTM) != 0
    write_Y = (flags & WRITE_Y) != 0
    if layout:
        N, T = X.shape[0], X.shape[1]
    else:
        T, N = X.shape[0], X.shape[1]
    H = plan0.bounds[plan0.bounds.shape[0] - 1]
    dt = X.dtype
    Y = np.empty((N, T, D, H) if layout else (T, D, N, H), dt)
    if not write_Y:
        Y = np.empty((0, 0, 0, 0), dt)
    state = (N, D, H) if layout else (D, N, H)
    Yh = np.empty(state, dt)
    Yc = np.empty(state if lstm else (0, 0, 0), dt)
    sync, calls, abort = np.zeros(8, np.int64), np.zeros(4, np.int64), np.zeros(1, np.int64)
    run_node(plan0, plan1, D, (flags & REVERSE) != 0, layout, X, np.zeros(0, np.int32), False,
             h0, (flags & HAS_H0) != 0, c0, (flags & HAS_C0) != 0, Y, write_Y, Yh,
             Yc if lstm else Yh, sync, calls, abort)  # fmt: skip
    return Y, Yh, Yc


_prepared_layers: set[np.dtype] = set()


def prepare_layer(dt: np.dtype) -> None:
    """Compile (or load) :func:`run_layer` for ``dt``: X and the states C-ordered (a
    signature the dispatcher matches without Python) and read-only ``'A'`` (any array
    converts to it); and what it calls (:func:`prepare_node`)."""
    if dt in _prepared_layers:
        return
    prepare_node(dt)
    e = numba.from_dtype(np.dtype(dt))
    given = types.Array(e, 3, "A", readonly=True)
    usual = types.Array(e, 3, "C")  # matched without Python; anything else converts
    for array in (usual, given):
        prepare(run_layer, (types.int64, types.int64, array, array, array, types.int64))
    _prepared_layers.add(dt)
