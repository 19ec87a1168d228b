"""The packed panels' layout, made with NumPy: what :mod:`.packed`'s products read.

``B`` (``W^T`` or ``R^T``) becomes column panels ``[panels, K, L]``: ``L`` columns,
two SIMD vectors of the host CPU, contiguous for each ``k``, zero-padded, cache-line
aligned. No numba here: a session's weights are packed without loading the compiler.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np

_features = llvm.get_host_cpu_features()
#: bytes of one SIMD register (AVX-512: 64; AVX: 32; else 16)
VECTOR_BYTES = 64 if _features.get("avx512f") else 32 if _features.get("avx") else 16
#: alignment of packed panels (a cache line)
ALIGN = 64
#: elements of ``B`` packed at a time (a piece's temporary copy)
CONVERT_ELEMENTS = 1 << 18


def panel_width(dtype: np.dtype) -> int:
    """``L``: columns of one panel, two SIMD vectors of ``dtype``."""
    return 2 * VECTOR_BYTES // np.dtype(dtype).itemsize


def panels(B: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``B`` ``[K, N]`` (any strides, any float dtype) packed for :func:`.packed.mm`:
    ``[ceil(N / L), K, L]`` in ``dtype``, columns past ``N`` zero, cache-line aligned."""
    dtype = np.dtype(dtype)
    K, N = B.shape
    out = empty_panels(-(-N // panel_width(dtype)), K, dtype)
    pack(B, np.arange(N), out)
    return out


def empty_panels(count: int, K: int, dtype: np.dtype) -> np.ndarray:
    """``count`` panels of ``K`` rows, ``[count, K, L]`` in ``dtype``, cache-line
    aligned, not initialised (:func:`pack` fills them)."""
    dtype = np.dtype(dtype)
    L = panel_width(dtype)
    raw = np.empty(count * K * L + ALIGN // dtype.itemsize, dtype)
    start = (-raw.ctypes.data % ALIGN) // dtype.itemsize
    # raw[start:] first: an empty slice raw[a:a] points at raw's start, not at a
    return raw[start:][: count * K * L].reshape(count, K, L)


def pack(B: np.ndarray, columns: np.ndarray, out: np.ndarray, k0: int = 0) -> None:
    """Rows ``k0 .. k0 + K - 1`` of the panels ``out`` ``[P, depth, L]`` from ``B``
    ``[K, *]`` (any strides, any float dtype, converted): panel column ``j = p L + i``
    is ``B[:, columns[j]]``, zero past ``len(columns)``. ``[W^T; R^T]`` is ``W^T`` at
    ``k0 = 0``, then ``R^T`` at ``k0 = input_size``; a piece of panels at a time.

    Raises
    ------
    ValueError
        ``out`` not C-ordered or too small, a column outside ``B``.
    """
    K = B.shape[0]
    P, depth, L = out.shape
    columns = np.ascontiguousarray(columns, np.int64)
    n = len(columns)
    if not out.flags.c_contiguous or n > P * L or not 0 <= k0 <= depth - K:
        raise ValueError("pack: panels too small or not contiguous")
    if n and not (0 <= columns.min() and columns.max() < B.shape[1]):
        raise ValueError("pack: a column outside B")
    step = max(1, CONVERT_ELEMENTS // max(1, K * L))  # panels per piece
    rows = max(1, CONVERT_ELEMENTS // (step * L))  # and rows (K large: not a whole panel)
    for p0 in range(0, P, step):
        p1 = min(P, p0 + step)
        chosen = columns[p0 * L : p1 * L]
        for r0 in range(0, K, rows):
            r1 = min(K, r0 + rows)
            piece = np.zeros((r1 - r0, (p1 - p0) * L), out.dtype)
            piece[:, : len(chosen)] = B[r0:r1, chosen]
            out[p0:p1, k0 + r0 : k0 + r1] = piece.reshape(r1 - r0, p1 - p0, L).transpose(1, 0, 2)


def packed_bytes(n_gates: int, hidden_size: int, input_size: int, dtype: np.dtype) -> int:
    """About the bytes of one direction's panels of ``[W^T; R^T]``: each gate group's
    columns (GRU: ``z r`` and ``h``) padded to whole panels, which a small
    ``n_gates * hidden_size`` makes many times the weights (RNN, ``hidden_size`` 1:
    ``L`` times)."""
    L = panel_width(dtype)
    groups = (2, 1) if n_gates == 3 else (n_gates,)
    width = sum(-(-g * hidden_size // L) * L for g in groups)
    return width * (input_size + hidden_size) * np.dtype(dtype).itemsize


def columns(n: int, dtype: np.dtype) -> int:
    """Row length for a matrix that a product writes ``n`` columns of: whole panels,
    plus one cache line so that the row stride is not a multiple of 1-4 KiB."""
    L = panel_width(dtype)
    return -(-n // L) * L + ALIGN // np.dtype(dtype).itemsize
