"""The one recurrence skeleton: directions, per-sequence reverse, lengths, layout, dtype.

The work of a call is split into units, one per direction and slice of the batch
(rows are independent in every recurrence), which run on threads when there is
enough of it; two threads on one direction instead share its hidden units (each
computes its half of every gate, for every row, and they meet after each step).
In a unit the rows are sorted by length, longest first, so the rows
still running at step ``k`` are a prefix ``[:active[k]]`` and finished sequences
cost nothing. A reverse direction reads each sequence from its own last valid step
back to 0 (not ``np.flip``, which is right only for full-length sequences). The
inputs go to the backend a block of time steps at a time (the NumPy backend projects
them, ``X W^T + b``, at once), so working memory grows with the block, not with
``seq_length``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache

import numpy as np

from . import backends, prepared
from .spec import Inputs, RecSpec

#: bytes of input projection computed at once (at least MIN_BLOCK steps)
BLOCK_BYTES = 8 << 20
MIN_BLOCK = 16
#: multiply-adds of a call above which its units run on threads
PARALLEL_MACS = 1 << 23
#: hidden size from which two threads may share a direction's hidden units (>= 2)
MIN_SHARE = 16


def num_threads() -> int:
    """Threads for one call: ``ONNX_RECURRENT_NUM_THREADS``, else the CPU count."""
    value = os.environ.get("ONNX_RECURRENT_NUM_THREADS")
    return max(1, int(value)) if value else _cpu_count()


@cache
def _cpu_count() -> int:
    return max(1, os.cpu_count() or 1)


@cache
def _executor(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="onnx-recurrent")


@cache
def _sched_getcpu():
    """libc's ``sched_getcpu``, or None where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


def _cpu() -> int:
    """The CPU this thread runs on (-1: unknown)."""
    get = _sched_getcpu()
    return get() if get is not None else -1


Placement = tuple[set[int], set[int]] | None  # (CPUs for pool threads, the caller's mask)


@contextmanager
def _spread() -> Iterator[Placement]:
    """Keep the calling thread on its CPU for the block; pool threads (:func:`_apart`)
    keep off it. Yields their CPUs and the mask to restore, or None (cannot pin).

    After a pause (tens of ms), Linux in a VM wakes threads that hand the GIL to each
    other on one CPU and leaves them there for milliseconds: threads that wait for each
    other at every step then run one after the other (measured: up to 2x slower)."""
    cpu = _cpu()
    try:
        mask = os.sched_getaffinity(0)
        if cpu not in mask or len(mask) < 2:
            raise OSError
        os.sched_setaffinity(0, {cpu})
    except (OSError, AttributeError):  # no affinity on this platform, or not allowed
        yield None
        return
    try:
        yield mask - {cpu}, mask
    finally:
        os.sched_setaffinity(0, mask)


def _apart(placement: Placement, fn, *args):
    """``fn(*args)`` on a pool thread, on the CPUs of ``placement`` (:func:`_spread`)."""
    if placement is None:
        return fn(*args)
    cpus, mask = placement
    os.sched_setaffinity(0, cpus)
    try:
        return fn(*args)
    finally:
        os.sched_setaffinity(0, mask)


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
            active = np.empty(seq_length, np.int64)
            active.fill(N)
            return cls(rows, sequence_lens, active, seq_length if N else 0, True)
        order = rows[np.argsort(-sequence_lens[rows], kind="stable")]
        lens = sequence_lens[order]
        active = (lens[None, :] > np.arange(seq_length)[:, None]).sum(axis=1)
        return cls(order, lens, active, int(lens[0]) if len(lens) else 0, False)

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
        Y_tm[t[valid], d, rows[valid]] = Yb[valid]


def _units(
    spec: RecSpec, x: Inputs, workers: int, can_share: bool = True
) -> tuple[list[tuple[int, np.ndarray]], bool, int]:
    """(direction, batch rows) pairs, whether the call is large enough for threads, and
    how many threads share each unit's hidden units.

    Two threads on one direction of full-length sequences share its hidden units (both
    products per step keep every row, which BLAS runs faster than half the rows; with
    ragged lengths the rows' products shrink and the per-step barrier no longer pays,
    measured); otherwise the rows of a
    direction are dealt round-robin by length, so every slice gets a fair share of long
    and short sequences.
    """
    T, N, I = x.X.shape
    D, H, G = spec.num_directions, spec.hidden_size, spec.cell.n_gates
    large = T * N * D * G * H * (H + I) >= PARALLEL_MACS
    ragged = x.ragged
    if can_share and large and workers == 2 and D == 1 and H >= max(2, MIN_SHARE) and not ragged:
        return [(0, np.arange(N))], large, 2
    slices = 1
    if workers > 1 and large:
        slices = min(N, -(-workers // D))
    if slices == 1:
        return [(d, np.arange(N)) for d in range(D)], large, 1
    by_length = np.argsort(-x.sequence_lens, kind="stable")
    units = [(d, np.sort(by_length[i::slices])) for d in range(D) for i in range(slices)]
    return units, large, 1


def scan(
    spec: RecSpec, x: Inputs, *, output_sequence: bool = True
) -> tuple[np.ndarray | None, ...]:
    """Run every direction over the whole sequence.

    Returns ``(Y, *final_states)`` in the caller's layout and X's dtype; ``Y`` is None
    when ``output_sequence`` is false (and is then never materialised).
    """
    cell = spec.cell
    T, N, _ = x.X.shape
    D, H = spec.num_directions, spec.hidden_size
    ct = x.compute_dtype
    ragged = x.ragged

    # Outputs in the caller's layout, written through time-major views.
    Y = Y_tm = None
    if output_sequence:
        shape = (N, T, D, H) if spec.layout else (T, D, N, H)
        Y = (np.zeros if ragged else np.empty)(shape, x.dtype)
        Y_tm = Y.transpose(1, 2, 0, 3) if spec.layout else Y
    finals = [np.empty((N, D, H) if spec.layout else (D, N, H), x.dtype) for _ in cell.state_names]
    finals_tm = [f.transpose(1, 0, 2) if spec.layout else f for f in finals]
    backend = backends.select(spec, ct)
    per_step = N * cell.n_gates * H * ct.itemsize
    block = max(MIN_BLOCK, BLOCK_BYTES // max(per_step, 1))

    def initial(d: int, s: Schedule) -> tuple[np.ndarray, ...]:
        rows = slice(None) if s.whole else s.order
        return tuple(np.array(init[d][rows], dtype=ct, order="C") for init in x.initial_states)

    directions = prepared.weights(spec, x.W, x.R, x.B, x.P)

    def run(unit: tuple[int, np.ndarray], states=None, share=None) -> tuple[np.ndarray, ...]:
        """One unit (``share``: hidden units ``j0..j1-1`` of it, with other threads)."""
        d, rows = unit
        s = Schedule.of(rows, x.sequence_lens, T, ragged)
        reverse = spec.direction == "reverse" or d == 1
        w = directions[d]
        states = initial(d, s) if states is None else states
        cols = slice(None)
        if share is not None:
            cols = slice(share[1], share[2])
            w = w.hidden_units(share[1], share[2], cell.n_gates)
        width = len(range(H)[cols])
        direct = s.whole and ct == x.dtype  # Y written in place
        for k0 in range(0, s.steps, block):
            k1 = min(s.steps, k0 + block)
            n0 = int(s.active[k0])
            xb = s.inputs(x.X, k0, k1, n0, reverse)
            Yb = None
            if Y_tm is not None:
                Yb = (
                    s.outputs(Y_tm, d, k0, k1, reverse)[..., cols]
                    if direct
                    else np.empty((k1 - k0, n0, width), ct)
                )
            extra = () if share is None else (share,)
            backend.run_block(
                spec, w, spec.activations[d], xb, states, s.active[k0:k1], Yb, *extra
            )
            if Yb is not None and not direct:
                if s.whole:
                    s.outputs(Y_tm[..., cols], d, k0, k1, reverse)[...] = Yb
                else:
                    s.store(Y_tm[..., cols], d, Yb, k0, k1, reverse)
        if share is None:
            for final, state in zip(finals_tm, states, strict=True):
                final[d, slice(None) if s.whole else s.order] = state
        return states

    def run_shared(unit: tuple[int, np.ndarray], shares) -> None:
        """Threads (this one and pool threads) share the unit's hidden units."""
        d, rows = unit
        s = Schedule.of(rows, x.sequence_lens, T, ragged)
        states = initial(d, s)
        parties = shares.parties
        bounds = [i * H // parties for i in range(parties + 1)]

        def part(i: int) -> None:
            try:
                run(unit, states, (shares, bounds[i], bounds[i + 1]))
            except BaseException:
                shares.abort()
                raise

        pool = _executor(parties - 1)
        with _spread() as placement:
            pending = [pool.submit(_apart, placement, part, i) for i in range(1, parties)]
            try:
                part(0)
            finally:
                futures.wait(pending)
        for done in pending:
            done.result()
        for final, state in zip(finals_tm, states, strict=True):
            final[d, slice(None) if s.whole else s.order] = state

    workers = num_threads()
    units, large, parties = _units(spec, x, workers)
    shares = None
    if parties > 1:
        make = getattr(backend, "shares", None)
        shares = None if make is None else make(spec, N, ct, parties)
        if shares is None:
            units, large, parties = _units(spec, x, workers, can_share=False)
    # Per-step products are too small for BLAS's own threads to pay (measured: slower
    # than one thread); our units use the cores instead.
    if not large:
        for unit in units:
            run(unit)
    else:
        with backends.single_threaded_blas() if backend.calls_blas else nullcontext():
            if shares is not None:
                run_shared(units[0], shares)
            elif workers > 1 and len(units) > 1:
                # the caller's thread takes the first unit: one thread fewer to wake
                pool = _executor(workers - 1)
                with _spread() as placement:
                    pending = [pool.submit(_apart, placement, run, unit) for unit in units[1:]]
                    try:
                        run(units[0])
                    finally:
                        futures.wait(pending)
                for done in pending:
                    done.result()
            else:
                for unit in units:
                    run(unit)
    if ragged or T == 0:  # no step ran: zeros, not initial_h (SEMANTICS.md, "Sequences")
        empty = x.sequence_lens == 0
        for final in finals_tm:
            final[:, empty] = 0
    return (Y, *finals)
