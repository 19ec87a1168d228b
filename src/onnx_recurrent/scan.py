"""The one recurrence skeleton: directions, per-sequence reverse, lengths, layout, dtype.

For each direction the batch is kept sorted by length (longest first), so the rows
still running at step ``k`` are a prefix ``[:active[k]]`` and finished sequences cost
nothing. A reverse direction reads each sequence from its own last valid step back to
0 (not ``np.flip``, which is right only for full-length sequences). The input
projection ``X W^T + b`` is one matrix product per block of time steps, so working
memory grows with the block, not with ``seq_length``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import backends
from .spec import Inputs, RecSpec

#: bytes of input projection computed at once (at least MIN_BLOCK steps)
BLOCK_BYTES = 8 << 20
MIN_BLOCK = 16


@dataclass(frozen=True)
class Schedule:
    """Which rows run at which step, shared by both directions of a call."""

    order: np.ndarray | None  # batch rows sorted by length (None: all full length)
    lens: np.ndarray  # lengths in that order
    active: np.ndarray  # active[k]: rows with length > k
    steps: int  # the longest length

    @classmethod
    def of(cls, sequence_lens: np.ndarray, seq_length: int) -> Schedule:
        if (sequence_lens == seq_length).all():
            n = len(sequence_lens)
            return cls(None, sequence_lens, np.full(seq_length, n), seq_length if n else 0)
        order = np.argsort(-sequence_lens, kind="stable")
        lens = sequence_lens[order]
        active = (lens[None, :] > np.arange(seq_length)[:, None]).sum(axis=1)
        return cls(order, lens, active, int(lens[0]) if len(lens) else 0)

    def time_index(self, k0: int, k1: int, n: int, reverse: bool, T: int) -> np.ndarray:
        """``[k1-k0, n]``: the time step each of the first ``n`` rows reads at steps k0..k1-1."""
        k = np.arange(k0, k1)[:, None]
        if not reverse:
            return np.broadcast_to(k, (k1 - k0, n))
        return np.maximum(self.lens[None, :n] - 1 - k, 0)


def _block_inputs(
    X: np.ndarray, s: Schedule, k0: int, k1: int, n: int, reverse: bool
) -> np.ndarray:
    """X rows that steps k0..k1-1 read, ``[k1-k0, n, input_size]``, in schedule order."""
    T = X.shape[0]
    if s.order is None:
        return X[T - k1 : T - k0][::-1] if reverse else X[k0:k1]
    return X[s.time_index(k0, k1, n, reverse, T), s.order[None, :n]]


def _store(
    Y_tm: np.ndarray, d: int, Yb: np.ndarray, s: Schedule, k0: int, k1: int, reverse: bool
) -> None:
    """Scatter a block's hidden states (schedule order) into ``Y[t, d, b]``."""
    T = Y_tm.shape[0]
    if s.order is None:
        if reverse:
            Y_tm[T - k1 : T - k0, d] = Yb[::-1]
        else:
            Y_tm[k0:k1, d] = Yb
        return
    n0 = Yb.shape[1]
    valid = np.arange(k0, k1)[:, None] < s.lens[None, :n0]
    t = s.time_index(k0, k1, n0, reverse, T)
    rows = np.broadcast_to(s.order[None, :n0], t.shape)
    Y_tm[t[valid], d, rows[valid]] = Yb[valid]


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
    s = Schedule.of(x.sequence_lens, T)
    ragged = s.order is not None

    # Outputs in the caller's layout, written through time-major views.
    Y = Y_tm = None
    if output_sequence:
        shape = (N, T, D, H) if spec.layout else (T, D, N, H)
        Y = (np.zeros if ragged else np.empty)(shape, x.dtype)
        Y_tm = Y.transpose(1, 2, 0, 3) if spec.layout else Y
    finals = [np.empty((N, D, H) if spec.layout else (D, N, H), x.dtype) for _ in cell.state_names]
    finals_tm = [f.transpose(1, 0, 2) if spec.layout else f for f in finals]

    per_step = N * cell.n_gates * H * ct.itemsize
    block = max(MIN_BLOCK, BLOCK_BYTES // max(per_step, 1))
    backend = backends.select(spec, ct)
    for d in range(D):
        reverse = spec.direction == "reverse" or d == 1
        P = x.P[d] if x.P is not None else None
        w = cell.prepare(spec, x.W[d], x.R[d], x.B[d], P)
        rows = slice(None) if s.order is None else s.order
        states = tuple(np.array(init[d][rows], dtype=ct) for init in x.initial_states)
        WT = w.W.T
        for k0 in range(0, s.steps, block):
            k1 = min(s.steps, k0 + block)
            n0 = int(s.active[k0])
            xb = _block_inputs(x.X, s, k0, k1, n0, reverse)
            xw = np.matmul(xb.reshape(-1, xb.shape[-1]).astype(ct, copy=False), WT)
            xw += w.bias
            xw = xw.reshape(k1 - k0, n0, -1)
            Yb = None if Y_tm is None else np.empty((k1 - k0, n0, H), ct)
            backend.run_block(spec, w, spec.activations[d], xw, states, s.active[k0:k1], Yb)
            if Yb is not None:
                _store(Y_tm, d, Yb, s, k0, k1, reverse)
        for final, state in zip(finals_tm, states, strict=True):
            final[d, rows] = state
    empty = x.sequence_lens == 0
    if empty.any():  # no step ran: zeros, not initial_h (SEMANTICS.md, "Sequences")
        for final in finals_tm:
            final[:, empty] = 0
    return (Y, *finals)
