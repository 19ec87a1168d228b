"""Prepared weights, kept across calls while the weights passed stay the same.

Preparing a call's weights (the cell's ``prepare``, the backend's packed panels,
the threads' shares of hidden units) costs as much as a short call: on this project's
machine 50-450 µs, mostly page faults in fresh buffers. Most callers pass the same
weights at every call (a model's initializers), so prepared weights are kept, each
with its own copy of the weights it was made from, and reused only while the weights
passed are equal to that copy, bit for bit: an array changed in place is prepared
again. Comparing costs a read of the weights (3 µs at hidden size 64, 0.1 ms at 256).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .cells import Weights
from .spec import RecSpec

#: prepared weights kept, at most (least recently used dropped first)
MAX_ENTRIES = 16
#: bytes of weight copies kept, at most
MAX_BYTES = 64 << 20
#: arrays up to this size are compared as ``bytes`` (fewest calls; no NumPy temporaries)
SMALL = 1 << 18


@dataclass(eq=False)
class _Entry:
    key: tuple
    copies: tuple[np.ndarray | None, ...]  # W, R, B, P as prepared (C order, our own)
    snapshots: tuple[bytes | None, ...]  # the small copies' bytes
    prepared: tuple[Weights, ...]  # one per direction

    def matches(self, arrays: tuple[np.ndarray | None, ...]) -> bool:
        """Bit for bit (NaNs and signed zeros included)."""
        for a, copy, snapshot in zip(arrays, self.copies, self.snapshots, strict=True):
            if a is None or copy is None:
                if a is not copy:
                    return False
            elif a.shape != copy.shape or a.dtype != copy.dtype:
                return False
            elif snapshot is not None:
                if a.tobytes() != snapshot:
                    return False
            else:
                bits = f"u{a.itemsize}"
                if not np.array_equal(np.ascontiguousarray(a).view(bits), copy.view(bits)):
                    return False
        return True

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.copies if c is not None)


_lock = threading.Lock()
_entries: list[_Entry] = []  # least recently used first


def weights(
    spec: RecSpec, W: np.ndarray, R: np.ndarray, B: np.ndarray, P: np.ndarray | None
) -> tuple[Weights, ...]:
    """``spec.cell.prepare`` for each direction of ``W, R, B, P`` (``[num_directions,
    ...]``), or the same weights prepared by an earlier call (see the module's
    docstring). Nothing returned aliases the arrays passed."""
    cell = spec.cell
    key = (cell.name, spec.hidden_size, spec.linear_before_reset, W.dtype, W.shape)
    arrays = (W, R, B, P)
    with _lock:
        candidates = [e for e in reversed(_entries) if e.key == key]
    for entry in candidates:
        if entry.matches(arrays):
            with _lock:
                if _entries and _entries[-1] is not entry and entry in _entries:
                    _entries.remove(entry)
                    _entries.append(entry)
            return entry.prepared
    copies = tuple(None if a is None else np.array(a, order="C") for a in arrays)
    snapshots = tuple(None if c is None or c.nbytes > SMALL else c.tobytes() for c in copies)
    Wc, Rc, Bc, Pc = copies
    prepared = tuple(
        cell.prepare(spec, Wc[d], Rc[d], Bc[d], None if Pc is None else Pc[d])
        for d in range(W.shape[0])
    )
    entry = _Entry(key, copies, snapshots, prepared)
    if entry.nbytes <= MAX_BYTES:
        with _lock:
            _entries.append(entry)
            while len(_entries) > MAX_ENTRIES or _kept_bytes() > MAX_BYTES:
                del _entries[0]
    return entry.prepared


def clear() -> None:
    """Forget every prepared weight (their memory is freed once no call uses them)."""
    with _lock:
        _entries.clear()


def _kept_bytes() -> int:
    return sum(e.nbytes for e in _entries)
