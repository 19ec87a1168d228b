"""The one recurrence skeleton: directions, per-sequence reverse, lengths, layout, dtype.

The work of a call is split into units, one per direction and slice of the batch
(rows are independent in every recurrence), which threads take from a queue when
there is enough of it; on one direction, threads instead share its hidden units
(each takes shares of every step's gates, for every row, :mod:`.backends.sync`).
In a unit the rows are sorted by length, longest first, so the rows
still running at step ``k`` are a prefix ``[:active[k]]`` and finished sequences
cost nothing. A reverse direction reads each sequence from its own last valid step
back to 0 (not ``np.flip``, which is right only for full-length sequences). The
inputs go to the backend a block of time steps at a time, so working memory grows
with the block, not with ``seq_length``, and a Ctrl-C is seen between blocks.
"""

from __future__ import annotations

import functools
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from . import backends, interrupts, threads
from .backends import tuning
from .cells import Weights
from .spec import Inputs, RecSpec, allocate

#: bytes of gate inputs of one block (at least MIN_BLOCK steps)
BLOCK_BYTES = 8 << 20
MIN_BLOCK = 16
#: multiply-adds of one block at most: a block is one compiled call, and Python
#: (Ctrl-C) runs between blocks (about 20 ms at 28 GMAC/s)
BLOCK_MACS = 1 << 29
#: multiply-adds of a call below which it runs on the calling thread, whatever the plan
#: (the least of :func:`parallel_macs`'s candidates)
SERIAL_MACS = 1 << 22
#: multiply-adds of a call from which it runs on the pool's threads: None, as planned on
#: this CPU (:func:`parallel_macs`); a number, that one (tests)
PARALLEL_MACS: int | None = None
#: pauses before each timed call of :func:`measure_parallel` (seconds): the helpers idle,
#: as between a stream's calls, where waking them costs most (AMD EPYC, LSTM N=16
#: I=H=64: two threads over one 1.6x at 2**23 multiply-adds after 2 ms, 1.2x back to
#: back; even at 2**25, 0.96-1.05x after 2-50 ms)
PAUSE = 0.005
#: multiply-adds of a call from which its compiled units are watched for Ctrl-C
#: (:mod:`.interrupts`): a shorter one returns to Python first (about 20 ms at 100
#: GMAC/s, 0.2 s at 10), and a window's round trip with the watcher thread costs
#: 50-100 µs (AMD EPYC, M ragged: 2% of the call)
WATCH_MACS = 1 << 31
#: hidden units of one thread's share of a direction, at least
MIN_SHARE = 16
#: rows of one thread's slice of a direction at least (fewer: the threads share its
#: hidden units, whatever was planned)
MIN_ROWS = 8
#: rows of a ragged direction's units when threads split it: rows of like lengths, so a
#: unit's products shrink little before it ends, taken from a queue. Against two slices
#: of 16 rows at M ragged: Intel Xeon (tiles of 12 rows, so a slice took a 4-row tile
#: every step) LSTM 11.5 -> 7.7 ms; AMD EPYC (tiles of 8) beside a busy process 0.71-0.85
#: of the time, quiet 0.95-1.09 (bidirectional, each thread a direction: 1.03-1.05, so
#: left as it was). The shorter half of the rows goes in buckets of half as many
#: (:func:`bucket_bounds`)
BUCKET_ROWS = 8
#: threads kept apart during a call (:mod:`.affinity`), by the way they split it:
#: after a pause Linux may wake the helper on the caller's CPU and leave it there.
#: Units (rows, directions) pinned: measured at M ragged, 20-30% faster, 0-15% slower
#: beside a busy process. Shares too, since the helpers are placed before they wake
#: (AMD EPYC, M forward, alternating: RNN 4.6 vs 7.7 ms after 20 ms pauses, GRU 15.1
#: vs 20.8 after 50 ms; equal after 10 ms)
PIN_UNITS = True
PIN_SHARES = True


@dataclass(frozen=True)
class Schedule:
    """Which rows of a unit run at which step."""

    order: np.ndarray  # the unit's batch rows, sorted by length (longest first)
    lens: np.ndarray  # their lengths
    active: np.ndarray  # active[k]: rows with length > k
    steps: int  # the longest length
    whole: bool  # every row, in batch order, all of full length: views, not gathers

    @classmethod
    def of(
        cls, rows: np.ndarray, sequence_lens: np.ndarray, seq_length: int, ragged: bool
    ) -> Schedule:
        N = len(sequence_lens)
        if len(rows) == N and not ragged:
            steps = seq_length if N else 0
            active = np.empty(steps, np.int64)  # none for no rows (a long T of nothing)
            active.fill(N)
            return cls(rows, sequence_lens, active, steps, True)
        order = rows[np.argsort(-sequence_lens[rows], kind="stable")]
        lens = sequence_lens[order]
        steps = int(lens[0]) if len(lens) else 0
        # rows longer than k: lens is descending, so -lens ascending (no [T, N] compare)
        active = np.searchsorted(-lens, -np.arange(steps), side="left").astype(np.int64)
        return cls(order, lens, active, steps, False)

    def time_index(self, k0: int, k1: int, n: int, reverse: bool) -> np.ndarray:
        """``[k1-k0, n]``: the time step each of the first ``n`` rows reads at steps k0..k1-1."""
        k = np.arange(k0, k1)[:, None]
        if not reverse:
            return np.broadcast_to(k, (k1 - k0, n))
        return np.maximum(self.lens[None, :n] - 1 - k, 0)

    def outputs(self, Y_tm: np.ndarray, d: int, k0: int, k1: int, reverse: bool) -> np.ndarray:
        """Where steps k0..k1-1 of a whole schedule write ``Y``: a view of it."""
        T = Y_tm.shape[0]
        return Y_tm[T - k1 : T - k0, d][::-1] if reverse else Y_tm[k0:k1, d]

    def inputs(self, X: np.ndarray, k0: int, k1: int, n: int, reverse: bool) -> np.ndarray:
        """X rows that steps k0..k1-1 read, ``[k1-k0, n, input_size]``, in schedule order."""
        T = X.shape[0]
        if self.whole:
            return X[T - k1 : T - k0][::-1] if reverse else X[k0:k1]
        return X[self.time_index(k0, k1, n, reverse), self.order[None, :n]]

    def store(self, Y_tm: np.ndarray, d: int, Yb: np.ndarray, k0: int, k1: int, reverse: bool):
        """Scatter a block's hidden states into ``Y[t, d, b]`` (valid steps only; a whole
        schedule writes into :meth:`outputs` instead)."""
        n0 = Yb.shape[1]
        valid = np.arange(k0, k1)[:, None] < self.lens[None, :n0]
        t = self.time_index(k0, k1, n0, reverse)
        rows = np.broadcast_to(self.order[None, :n0], t.shape)
        with np.errstate(over="ignore"):  # float16's overflow is its inf (no warning)
            Y_tm[t[valid], d, rows[valid]] = Yb[valid]


def _units(
    spec: RecSpec,
    x: Inputs,
    workers: int,
    can_share: bool = True,
    share: bool | None = None,
    parallel: bool | None = None,
) -> tuple[list[tuple[int, np.ndarray]], bool, int]:
    """(direction, batch rows) pairs, whether the call is large enough for threads
    (:func:`threaded`; ``parallel``: that given), and how many shares of hidden units
    each unit's steps are cut into.

    On one direction, threads share its hidden units (every thread's product keeps
    every running row; the weights are split between the threads' caches, each
    thread's share staying in its own, a meeting per step; ragged rows in compiled
    units, :meth:`Scan._shared`) or take slices of its rows, whichever was measured
    faster on this CPU (:func:`planned_share`; ragged rows: :func:`planned_ragged`;
    ``share``: that choice given). Taking
    slices with ragged lengths, where threads outnumber directions, the rows go by
    length into buckets (:func:`bucket_bounds`), the longest first, which the threads
    take from a queue; with too few rows for that, and with full lengths, the rows of a
    direction are dealt by length, there and back, so every slice gets a fair share of
    long and short ones. (AMD EPYC Zen 5, M ragged forward, shares against buckets,
    alternating: LSTM 0.92-0.94 of the time, GRU 0.93-0.99.)
    """
    T, N, I = x.X.shape
    D, H, G = spec.num_directions, spec.hidden_size, spec.cell.n_gates
    large = threaded(T * N * D * G * H * (H + I), workers) if parallel is None else parallel
    if workers > 1 and large and can_share and D == 1:
        if x.dtype == x.compute_dtype and H >= 2 * max(1, MIN_SHARE):
            nbytes = G * H * (I + H) * x.compute_dtype.itemsize
            if share is None and N >= 2 * MIN_ROWS:  # (fewer rows: shared, unmeasured)
                share = planned_ragged(nbytes, spec.split) if x.ragged else planned_share(nbytes)
            if N < 2 * MIN_ROWS or share:
                return [(0, np.arange(N))], large, min(workers, H // max(1, MIN_SHARE))
    slices = min(N, -(-workers // D)) if workers > 1 and large else 1
    if slices <= 1:
        return [(d, np.arange(N)) for d in range(D)], large, 1
    by_length = np.argsort(-x.sequence_lens, kind="stable")
    if x.ragged and bucketed(N, D, workers):
        # Buckets of rows of like lengths, the longest first, taken from the queue by
        # whichever thread is free (at least two a thread, so the ends even out).
        cuts = [bucket_bounds(i, N) for i in range(buckets(N))]
        units = [(d, by_length[a:b]) for a, b in cuts for d in range(D)]
        return units, large, 1
    # Dealt by length there and back (1 2 2 1 1 2 ...): the slices' total lengths
    # differ by less than one row's (round-robin gave the first slice the longer row
    # of every pair: 11% more work at M ragged, measured).
    turn = np.arange(N) % (2 * slices)
    slice_of = np.minimum(turn, 2 * slices - 1 - turn)
    units = [(d, by_length[slice_of == i]) for d in range(D) for i in range(slices)]
    return units, large, 1


def bucketed(N: int, D: int, workers: int) -> bool:
    """Whether the ``N`` ragged rows of ``D`` directions go into buckets on ``workers``
    threads: more threads than directions, and at least two buckets of
    :data:`BUCKET_ROWS` a thread. Plain integer arithmetic: the native nodes compile
    this same function (:mod:`.runtime.hosts.native_compute`)."""
    return D < workers and D * ((N + BUCKET_ROWS - 1) // BUCKET_ROWS) >= 2 * workers


def buckets(N: int) -> int:
    """How many buckets the ``N`` rows of a ragged direction go into (:func:`bucket_bounds`)."""
    B = BUCKET_ROWS
    small = max(1, B // 2)
    long = B * (N // (2 * B))
    return long // B + -(-(N - long) // small)


def bucket_bounds(i: int, N: int) -> tuple[int, int]:
    """Rows ``start, stop`` (of the ``N`` sorted longest first) of bucket ``i``: the
    longer half in buckets of :data:`BUCKET_ROWS`, the rest in buckets of half as many,
    so that the queue ends in small units and the threads finish nearly together
    (AMD EPYC, M ragged forward, alternating with buckets of 8 throughout: LSTM
    0.946-0.995, GRU 0.977-0.98, RNN 1.005 of the time). Plain integer arithmetic: the native nodes
    compile this same function (:mod:`.runtime.hosts.native_compute`)."""
    B = BUCKET_ROWS
    small = max(1, B // 2)
    long = B * (N // (2 * B))
    whole = long // B
    if i < whole:
        return i * B, (i + 1) * B
    start = long + (i - whole) * small
    return start, min(N, start + small)


def threaded(macs: int, workers: int | None = None) -> bool:
    """Whether a call of ``macs`` multiply-adds runs on ``workers`` threads (None:
    :func:`.threads.num_threads`): more than one, and at least :func:`parallel_macs`
    (planned only for calls of :data:`SERIAL_MACS` and more, on more than one thread)."""
    if macs < (SERIAL_MACS if PARALLEL_MACS is None else PARALLEL_MACS):
        return False
    workers = threads.num_threads() if workers is None else workers
    return workers > 1 and macs >= parallel_macs(workers)


def parallel_macs(workers: int | None = None) -> int:
    """Multiply-adds of a call on ``workers`` threads (None: :func:`.threads.num_threads`)
    from which they pay on this CPU: waking a helper costs more than it saves in a short
    call, how much depends on the CPU and its idle states; measured once
    (:func:`measure_parallel`, :mod:`.backends.tuning`), or :data:`PARALLEL_MACS` where
    set. With more threads than the process has CPUs, ``2**27``, neither measured nor
    kept (a measurement would speak for that setting only, and be kept for all)."""
    if PARALLEL_MACS is not None:
        return PARALLEL_MACS
    if (threads.num_threads() if workers is None else workers) > threads._cpus():
        return 1 << max(tuning.FIELDS["parallel"])
    return 1 << tuning.planned(("parallel",), measure_parallel)["parallel"]


def measure_parallel() -> dict[str, int]:
    """Time a float32 LSTM direction of 16 rows, I = H = 64 (``2**19`` multiply-adds a
    step) over ``2**k`` multiply-adds for each candidate ``k`` (22 to 26,
    :data:`.backends.tuning.FIELDS`), each call after a pause of :data:`PAUSE`, on the
    calling thread as a small call runs (the backend's one compiled call) and on the
    call's threads (:func:`.threads.num_threads`), interleaved: ``{"parallel": k}``, the
    least ``k`` from which the threads were faster (by median) at every larger
    candidate; 27 if they were not at 26."""
    from .cells import LSTM
    from .spec import check_call

    rng = np.random.default_rng(0)
    ct = np.dtype(np.float32)
    N, H = 16, 64
    spec, weights = _probe(LSTM, H, H, rng)
    backend = backends.select(spec, ct)
    prepare, small = getattr(backend, "prepare", None), getattr(backend, "small_call", None)
    if prepare is not None:
        prepare(spec, weights[0], spec.activations[0], ct, 1)
    one = None if small is None else small(spec, weights, ct)
    states = [("initial_h", None), ("initial_c", None)]
    candidates = [k for k in tuning.FIELDS["parallel"] if k < max(tuning.FIELDS["parallel"])]

    def call(X: np.ndarray, threads: bool) -> float:
        time.sleep(PAUSE)
        started = time.perf_counter()
        if threads or one is None:
            x = check_call(spec, X, None, states, dtype=ct, input_size=H)
            scan(spec, weights, x, parallel=threads)
        else:
            one(X, None, None, True)
        return time.perf_counter() - started

    inputs = {k: rng.standard_normal((2 ** (k - 19), N, H)).astype(ct) for k in candidates}
    ways = {(k, w): functools.partial(call, X, w) for k, X in inputs.items() for w in (1, 0)}
    median = _medians(ways, 5)
    chosen = max(tuning.FIELDS["parallel"])
    for k in reversed(candidates):
        if median[k, 1] >= median[k, 0]:
            break
        chosen = k
    return {"parallel": chosen}


def planned_share(nbytes: int) -> bool:
    """Whether threads split one direction whose weights of a step (``[W; R]``) take
    ``nbytes`` by sharing its hidden units (each thread then reads half of them every
    step) or by slices of its rows (each reads all), as measured on this CPU once per
    size class (:func:`share_class`, :mod:`.backends.tuning`): what pays depends on
    which caches the weights fit (a lent Intel Xeon, slices planned at M float32: float64
    at M 2.2-4.0x our float32 and L at 73-75% of the sgemm peak, against 1.6-2.2x and
    87-95% sharing, on another day)."""
    name = share_class(nbytes)
    return bool(tuning.planned((name,), lambda: measure_share(name))[name])


def planned_ragged(nbytes: int, split: bool) -> bool:
    """:func:`planned_share` for one direction of ragged rows (buckets of rows, or one
    unit whose hidden units the threads share), per size class and the phases of a
    step (``split``: two, GRU with ``linear_before_reset = 0``): ``ragged<k>`` or
    ``raggedsplit<k>`` (:data:`.backends.tuning.RAGGED_KINDS`; AMD EPYC Zen 5, M ragged
    forward, sharing over buckets: LSTM 0.92-0.94 of the time, GRU 0.93-0.99; a lent
    Intel Xeon: LSTM 0.94-0.99, GRU 1.06)."""
    kind = tuning.RAGGED_KINDS[1 if split else 0]
    name = share_class(nbytes).replace("share", kind)
    return bool(tuning.planned((name,), lambda: measure_ragged(name))[name])


def share_class(nbytes: int) -> str:
    """The plan's name for the split at ``nbytes`` of weights a step: ``share<k>``, ``2**k``
    bytes the nearest power of two (:data:`.backends.tuning.SHARE_CLASSES`)."""
    low, high = tuning.SHARE_CLASSES[0], tuning.SHARE_CLASSES[-1]
    return f"share{min(max(round(math.log2(max(nbytes, 1))), low), high)}"


def measure_share(name: str = "share20") -> dict[str, int]:
    """Time a float32 GRU direction whose weights of a step take the ``2**k`` bytes of
    the size class ``name`` (``share<k>``; I = H/2; N = 32 up to 2 MiB, 64 above, as the
    bench's M and L; T = 20, fewer for the larger) on the call's threads
    (:func:`.threads.num_threads`) both ways, interleaved: ``{name: 1}`` if sharing the
    hidden units was faster (by median), else ``{name: 0}``."""
    from .cells import GRU

    k = int(name.removeprefix("share"))
    return {name: _sharing_pays(GRU, k, max(4, 20 >> max(0, k - 20)), ragged=False)}


def measure_ragged(name: str = "ragged20") -> dict[str, int]:
    """Time a float32 direction of ragged rows (lengths 1 to T, as the bench's) whose
    weights of a step take the ``2**k`` bytes of ``name`` (``ragged<k>``: an LSTM, one
    phase a step; ``raggedsplit<k>``: a GRU with ``linear_before_reset = 0``, two;
    sizes as :func:`measure_share`'s, T = 100, fewer for the larger) on the call's
    threads both ways, interleaved, after :data:`PAUSE` each: ``{name: 1}`` if sharing
    the hidden units was faster (by median), else ``{name: 0}``."""
    from .cells import GRU, LSTM

    kind = name.rstrip("0123456789")
    k = int(name.removeprefix(kind))
    cell = GRU if kind == tuning.RAGGED_KINDS[1] else LSTM
    return {name: _sharing_pays(cell, k, max(8, 100 >> max(0, k - 20)), ragged=True)}


def _sharing_pays(cell, k: int, T: int, ragged: bool) -> int:
    """1 if a float32 direction of ``cell`` whose weights of a step take ``2**k`` bytes
    (I = H/2; N = 32 up to 2 MiB, 64 above) over ``T`` steps ran faster (median of 7
    interleaved rounds) with its threads sharing the hidden units than splitting its
    rows, else 0; ``ragged``: lengths 1 to T, each call after :data:`PAUSE`."""
    H = max(32, 16 * round(math.sqrt(2**k / (6 * cell.n_gates)) / 16))  # G H (H + H/2)
    N, I = 32 if k <= 21 else 64, H // 2
    rng = np.random.default_rng(0)
    ct = np.dtype(np.float32)
    spec, weights = _probe(cell, H, I, rng)
    X = rng.standard_normal((T, N, I)).astype(ct)
    lens = np.full(N, T, np.int64)
    if ragged:
        lens = rng.integers(1, T + 1, N).astype(np.int64)
        lens[0] = T
    x = Inputs(X, lens, (None,) * len(cell.state_names), ct, ct, ragged=ragged)

    def call(share: bool) -> float:
        if ragged:
            time.sleep(PAUSE)
        started = time.perf_counter()
        scan(spec, weights, x, share=share, parallel=True)
        return time.perf_counter() - started

    median = _medians({share: functools.partial(call, share) for share in (True, False)}, 7)
    return int(median[True] <= median[False])


def _probe(cell, H: int, I: int, rng: np.random.Generator) -> tuple[RecSpec, tuple[Weights]]:
    """One float32 direction of ``cell`` (``hidden_size`` H, ``input_size`` I) with
    random weights and zero biases, prepared: what the plan's measurements run."""
    from .spec import make_spec

    ct, G = np.dtype(np.float32), cell.n_gates
    W = (rng.standard_normal((G * H, I)) * 0.1).astype(ct)
    R = (rng.standard_normal((G * H, H)) * 0.1).astype(ct)
    spec = make_spec(cell, R[None], hidden_size=H)
    return spec, (cell.prepare(spec, W, R, np.zeros(2 * G * H, ct), None),)


def _medians(timed: dict, rounds: int) -> dict:
    """The median seconds of each of ``timed``'s calls (each returns its own time):
    one untimed round first (compiled and prepared), then ``rounds`` interleaved."""
    for call in timed.values():
        call()
    times: dict = {key: [] for key in timed}
    for _ in range(rounds):
        for key, call in timed.items():
            times[key].append(call())
    return {key: sorted(v)[len(v) // 2] for key, v in times.items()}


def block_steps(spec: RecSpec, N: int, I: int, ct: np.dtype) -> int:
    """Steps of one block (:data:`BLOCK_BYTES`, :data:`BLOCK_MACS`)."""
    G = spec.cell.n_gates * spec.hidden_size * N or 1
    block = max(MIN_BLOCK, BLOCK_BYTES // (G * ct.itemsize))
    return min(block, BLOCK_MACS // (G * (spec.hidden_size + I))) or 1


def scan(
    spec: RecSpec,
    directions: tuple[Weights, ...],
    x: Inputs,
    *,
    output_sequence: bool = True,
    share: bool | None = None,
    parallel: bool | None = None,
) -> tuple[np.ndarray | None, ...]:
    """Run every direction over the whole sequence (``directions``: each one's prepared
    weights, :meth:`onnx_recurrent.Layer.directions`); ``share``: how threads split
    one direction, ``parallel``: whether the call runs on threads (:func:`_units`),
    None for the planned way.

    Returns ``(Y, *final_states)`` in the caller's layout and X's dtype; ``Y`` is None
    when ``output_sequence`` is false (and is then never materialised).
    """
    return Scan(spec, directions, x, output_sequence).run(share, parallel)


class Scan:
    """One call of :func:`scan`: its outputs, made up front, and the ways its units of
    work run (:meth:`run`): one after another on this thread, from a queue on the
    pool's threads, or one unit whose hidden units the threads share."""

    def __init__(
        self, spec: RecSpec, directions: tuple[Weights, ...], x: Inputs, output_sequence: bool
    ) -> None:
        self.spec, self.directions, self.x = spec, directions, x
        T, N, I = x.X.shape
        D, H = spec.num_directions, spec.hidden_size
        self.backend = backend = backends.select(spec, x.compute_dtype)
        # Units of gathered rows (ragged, or a slice of the batch) as one compiled call
        # each, where the backend has one and no cast is needed: no Python, no GIL
        # between their blocks (measured at M ragged: 5-18% faster). A whole direction
        # of full-length rows stays on run_block, which writes Y in place (the compiled
        # unit's copy: 3-9% slower at M bidirectional).
        self.compiled = x.dtype == x.compute_dtype and hasattr(backend, "run_unit")
        # Outputs in the caller's layout, written through time-major views (a compiled
        # unit writes the zeros past each row's length itself).
        self.Y = self.Y_tm = None
        if output_sequence:
            shape = (N, T, D, H) if spec.layout else (T, D, N, H)
            make = np.zeros if x.ragged and not self.compiled else np.empty
            hint = "; output_sequence=False computes no Y"
            self.Y = allocate(f"Y, the {spec.cell.name} output", shape, x.dtype, make, hint)
            self.Y_tm = self.Y.transpose(1, 2, 0, 3) if spec.layout else self.Y
        shape = (N, D, H) if spec.layout else (D, N, H)
        self.finals = [
            allocate(f"{name}, the {spec.cell.name} output", shape, x.dtype)
            for name in ("Y_h", "Y_c")[: len(spec.cell.state_names)]
        ]
        self.finals_tm = [f.transpose(1, 0, 2) if spec.layout else f for f in self.finals]
        self.block = block_steps(spec, N, I, x.compute_dtype)
        self.abort = np.zeros(1, np.int64)  # read by compiled units between blocks

    def run(
        self, share: bool | None = None, parallel: bool | None = None
    ) -> tuple[np.ndarray | None, ...]:
        """Every unit (:func:`_units`), then the states of empty sequences zeroed:
        ``(Y, *final_states)``."""
        spec, x, backend = self.spec, self.x, self.backend
        workers = threads.num_threads()
        units, large, shares = _units(spec, x, workers, share=share, parallel=parallel)
        shared = None
        if shares > 1:
            make = getattr(backend, "shares", None)
            # compiled units where ragged (:meth:`_gathered`): buffers for their blocks
            I = x.X.shape[2] if self._gathered(units[0]) else None
            shared = None if make is None else make(spec, x.X.shape[1], x.compute_dtype, shares, I)
            if shared is None:  # this backend cannot share hidden units
                units, large, shares = _units(spec, x, workers, False, parallel=large)
        prepare = getattr(backend, "prepare", None)  # here, on the calling thread, not in the pool
        for d in sorted({d for d, _ in units}) if prepare is not None else ():
            prepare(spec, self.directions[d], spec.activations[d], x.compute_dtype, shares)
        # compiled units stop within a block on Ctrl-C (:mod:`.interrupts`) in a long call
        gathered = sum(self._gathered(u) for u in units)
        T, N, I = x.X.shape
        macs = T * N * spec.num_directions * spec.cell.n_gates * spec.hidden_size
        watched = gathered > 0 and macs * (spec.hidden_size + I) >= WATCH_MACS
        with interrupts.watching(self.abort) if watched else nullcontext():
            if shared is not None:
                self._shared(units[0], shared)
            elif len(units) == 1 or workers == 1 or not large:
                for unit in units:
                    if not self._one(unit):
                        break
            else:
                self._queued(units, workers)
        if self.abort[0]:  # stopped by a SIGINT whose KeyboardInterrupt has not come
            raise KeyboardInterrupt
        # no step ran: zeros, not initial_h (docs/semantics.md); compiled units wrote them
        if (x.ragged or x.X.shape[0] == 0) and gathered < len(units):
            empty = x.sequence_lens == 0
            for final in self.finals_tm:
                final[:, empty] = 0
        return (self.Y, *self.finals)

    def _initial(self, d: int, s: Schedule) -> tuple[np.ndarray, ...]:
        """Direction ``d``'s initial states for the rows of ``s``, in the compute type."""
        x, rows = self.x, slice(None) if s.whole else s.order
        return tuple(
            np.zeros((len(s.order), self.spec.hidden_size), x.compute_dtype)
            if init is None
            else np.array(init[d][rows], dtype=x.compute_dtype, order="C")
            for init in x.initial_states
        )

    def _unit(self, unit, states=None, shared=None, stopped=lambda: False):
        """One unit's steps, block by block (``shared``: with other threads, see
        :mod:`.backends.sync`); returns its states and schedule."""
        spec, x, Y_tm = self.spec, self.x, self.Y_tm
        d, rows = unit
        T, H, ct = x.X.shape[0], spec.hidden_size, x.compute_dtype
        s = Schedule.of(rows, x.sequence_lens, T, x.ragged)
        reverse = spec.direction == "reverse" or d == 1
        states = self._initial(d, s) if states is None else states
        direct = s.whole and ct == x.dtype  # Y written in place
        for k0 in range(0, s.steps, self.block):
            if stopped():
                break
            k1 = min(s.steps, k0 + self.block)
            n0 = int(s.active[k0])
            xb = s.inputs(x.X, k0, k1, n0, reverse)
            Yb = None
            if Y_tm is not None:
                Yb = (
                    s.outputs(Y_tm, d, k0, k1, reverse)
                    if direct
                    else np.empty((k1 - k0, n0, H), ct)
                )
            self.backend.run_block(
                spec, self.directions[d], spec.activations[d], xb, states, s.active[k0:k1], Yb,
                shared, k0,
            )  # fmt: skip
            if Yb is not None and not direct:
                if s.whole:
                    with np.errstate(over="ignore"):  # float16's overflow: its inf
                        s.outputs(Y_tm, d, k0, k1, reverse)[...] = Yb
                else:
                    s.store(Y_tm, d, Yb, k0, k1, reverse)
        return states, s

    def _finish(self, d: int, states, s: Schedule) -> None:
        """A unit's final states into the outputs."""
        with np.errstate(over="ignore"):  # float16's overflow is its inf (no warning)
            for final, state in zip(self.finals_tm, states, strict=True):
                final[d, slice(None) if s.whole else s.order] = state

    def _shared(self, unit, shared) -> None:
        """One unit, its hidden units shared by ``shared.shares`` threads."""
        if self._gathered(unit):  # a compiled call a thread

            def abort() -> None:
                self.abort[0] = 1
                shared.abort()

            threads.run(
                shared.shares, lambda i: self._one(unit, shared=shared.party(i)), abort,
                placement=PIN_SHARES,
            )  # fmt: skip
            return
        whole = Schedule.of(unit[1], self.x.sequence_lens, self.x.X.shape[0], self.x.ragged)
        states = self._initial(unit[0], whole)

        def party(i: int) -> None:
            self._unit(unit, states, shared.party(i), lambda: shared.aborted)

        threads.run(shared.shares, party, shared.abort, placement=PIN_SHARES)
        shared.final_state_into(states, whole.steps)
        self._finish(unit[0], states, whole)

    def _gathered(self, unit) -> bool:
        """Whether ``unit`` runs as one compiled call (see :meth:`__init__`)."""
        return self.compiled and (self.x.ragged or len(unit[1]) < self.x.X.shape[1])

    def _one(self, unit, stop: list | None = None, shared=None) -> bool:
        """One unit, whichever way it runs (``shared``: a party of a compiled unit
        whose hidden units threads share); False if it was stopped."""
        if self._gathered(unit):
            d, rows = unit
            spec = self.spec
            return self.backend.run_unit(
                spec, self.directions[d], spec.activations[d], d, rows, self.x, self.Y_tm,
                self.finals_tm, self.abort, shared,
            )  # fmt: skip
        states, s = self._unit(unit, stopped=lambda: bool(stop))
        if stop:
            return False
        self._finish(unit[0], states, s)
        return True

    def _queued(self, units, workers: int) -> None:
        """The units taken from a queue by whichever of ``workers`` threads is free."""
        queue = iter(units)  # next() holds the GIL
        stop: list = []

        def worker(i: int) -> None:
            for unit in queue:
                if stop or not self._one(unit, stop):
                    return

        # Per-step products are too small for BLAS's own threads to pay (measured: slower
        # than one thread); our units use the cores instead.
        blas = backends.single_threaded_blas() if self.backend.calls_blas else nullcontext()
        with blas:
            threads.run(min(workers, len(units)), worker, self._stop(stop), placement=PIN_UNITS)

    def _stop(self, stop: list):
        """The queue's abort: no further unit, and compiled ones end at their next block."""

        def abort() -> None:
            stop.append(True)
            self.abort[0] = 1

        return abort
