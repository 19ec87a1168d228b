"""The functions' layers, kept across calls while the weights passed stay the same.

:func:`~onnx_recurrent.gru` and the other functions take their weights at every call;
preparing them (copies, the cell's arrangement, a backend's packed panels) costs as
much as a short call. Most callers pass the same weights every time, so the
:class:`~onnx_recurrent.Layer` made for a call is kept, and used again while the weights
passed are equal to its copies bit for bit: an array changed in place makes a new
layer. Comparing reads the weights once (``memcmp`` for C-ordered arrays: 5 µs for
LSTM's at hidden size 128). To run the same weights many times without comparing,
make a :class:`~onnx_recurrent.Layer` yourself.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from .cells import Cell
from .layers import Layer
from .spec import (
    RecSpec,
    as_array,
    check_weights,
    check_X,
    compute_dtype,
    list_in_dtype,
    make_spec,
)
from .threads import ForkLock

#: layers kept, at most (least recently used dropped first): a stack of more distinct
#: layers, called in turn, would prepare each one again at every call
MAX_ENTRIES = 64
#: bytes kept, at most: the weight copies and what is prepared from them
#: (:meth:`~onnx_recurrent.Layer.memory`; a new layer counted at what it will hold),
#: except that the layer made last is kept whatever its size (a larger one is kept
#: alone, until another is made: calls of its weights do not prepare it again)
MAX_BYTES = 64 << 20

_lock = ForkLock()
_entries: list[tuple[tuple, Layer]] = []  # least recently used first


@functools.cache
def _memcmp():
    """libc's ``memcmp``, or None where there is none."""
    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


def _same_bits(a: np.ndarray | None, kept: np.ndarray | None, address: int) -> bool:
    """``a`` equal to the layer's C-ordered copy ``kept`` (at ``address``), bit for
    bit (NaNs and signed zeros included)."""
    if a is None or kept is None:
        return a is kept
    memcmp = _memcmp()
    if memcmp is not None and a.flags.c_contiguous:
        return memcmp(a.__array_interface__["data"][0], address, kept.nbytes) == 0
    bits = f"u{a.itemsize}"
    return bool(np.array_equal(np.ascontiguousarray(a).view(bits), kept.view(bits)))


def layer(
    spec: RecSpec,
    attributes: dict,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None,
    P: np.ndarray | None,
) -> Layer:
    """The layer of these weights and attributes (checked by the caller against X):
    a kept one whose weights equal them bit for bit, else a new one, kept."""
    key = (W.dtype, W.shape, B is None, P is None)
    for entry in reversed(_entries[:]):  # a copy: other threads may change the list
        kept = entry[1]
        if entry[0] != key or (kept.spec is not spec and kept.spec != spec):
            continue
        arrays = (kept.W, kept.R, kept.B, kept.P)
        if all(map(_same_bits, (W, R, B, P), arrays, kept.addresses)):
            if _entries and _entries[-1] is not entry:
                with _lock:
                    if entry in _entries:
                        _entries.remove(entry)
                        _entries.append(entry)
            return kept
    made = Layer.from_spec(spec, attributes, W, R, B, P)
    with _lock:
        _entries.append((key, made))
        _evict()
    return made


def _evict() -> None:
    """Under ``_lock``: the least recently used layers dropped until the kept ones fit
    :data:`MAX_ENTRIES` and :data:`MAX_BYTES`, the last one kept whatever its size."""
    while len(_entries) > 1 and (len(_entries) > MAX_ENTRIES or _kept_bytes() > MAX_BYTES):
        del _entries[0]


def for_call(
    cell: Cell,
    attributes: dict,
    X: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None,
    P: np.ndarray | None,
) -> tuple[np.ndarray, Layer]:
    """What a function's call runs on: ``attributes`` parsed, ``X`` and the weights
    checked against them and each other, and the kept layer of these weights
    (:func:`layer`): ``(X, layer)``. Shapes and dtypes as :func:`onnx_recurrent.gru`,
    :func:`~onnx_recurrent.lstm` and :func:`~onnx_recurrent.rnn` take them (``X``
    ``[seq_length, batch_size, input_size]``, or batch first with ``layout=1``; ``W``
    ``[num_directions, gates*hidden_size, input_size]``, ``R`` ``[..., hidden_size]``,
    ``B`` ``[num_directions, 2*gates*hidden_size]``, ``P`` ``[num_directions,
    3*hidden_size]``; one float dtype); ONNX GRU/LSTM/RNN's inputs and attributes.

    Raises
    ------
    ValueError
        (``onnx_recurrent.RecurrentError``) a bad attribute value, or a shape that
        disagrees with the attributes or the other inputs (expected and actual given).
    TypeError
        (``onnx_recurrent.RecurrentTypeError``) a non-float ``X``, or weights of
        another dtype than ``X``'s (``X`` given as a list or tuple of numbers takes
        ``W``'s; of anything else, strings, None, complex or bools, is refused).
    """
    spec = make_spec(cell, as_array("R", R), **attributes)
    X = list_in_dtype("X", X, W)  # a list has no dtype of its own: W's
    X = check_X(spec, X)
    W, R, B, P = check_weights(spec, W, R, B, P, dtype=X.dtype, input_size=X.shape[2])
    return X, layer(spec, attributes, W, R, B, P)


def evict_to_fit(layer: Layer) -> None:
    """After a call of ``layer``: if it was kept new, count what its call prepared
    (its estimate may be short: packed panels are padded) and drop the least recently
    used layers until the kept ones fit :data:`MAX_BYTES` (``layer`` stays)."""
    if not _entries or _entries[-1][1] is not layer or layer._counted:
        return
    with _lock:
        layer._counted = True
        _evict()


def clear() -> None:
    """Forget every kept layer (their memory is freed once no call uses them)."""
    with _lock:
        _entries.clear()


def _cost(layer: Layer) -> int:
    """What ``layer`` holds, or will once prepared: its copies and a backend's
    arrangement of them in the compute type (packed panels, or NumPy's ``W^T`` and
    ``R^T``: about as large again)."""
    compute = layer.nbytes * compute_dtype(layer.dtype).itemsize // layer.dtype.itemsize
    return max(layer.memory(), layer.nbytes + compute)


def _kept_bytes() -> int:
    return sum(_cost(kept) for _, kept in _entries)
