"""16-bit floats widened and rounded by their bits (backends/halves.py), against
NumPy's float16 and ml_dtypes' bfloat16 casts: every 16-bit value widened; rounded
from float32, every exponent with the mantissas around each rounding boundary (ties,
one ulp either side), the special values, and a seeded sample of all the others.
(Every one of the 2**32 float32 values was checked once, 2026-12-07: the same bits.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

halves = pytest.importorskip("onnx_recurrent.backends.halves")
ml_dtypes = pytest.importorskip("ml_dtypes")

KINDS = [(halves.FLOAT16, np.dtype(np.float16)), (halves.BFLOAT16, np.dtype(ml_dtypes.bfloat16))]


def _float32_bits() -> np.ndarray:
    """Float32 bit patterns: each sign and exponent with mantissas at and beside the
    rounding boundaries of both 16-bit types, and a seeded sample of the rest."""
    exponents = np.arange(256, dtype=np.uint32) << 23
    near = []
    for shift in (13, 16):  # the bits float16 and bfloat16 drop
        half = 1 << (shift - 1)
        for kept in (0, 1, 2, 0x3FF, (1 << (23 - shift)) - 1):
            base = kept << shift
            for offset in (-1, 0, 1):
                near += [base + half + offset, base + offset, base + (1 << shift) - 1]
    mantissas = np.unique(np.array(near, np.int64) & 0x7FFFFF).astype(np.uint32)
    grid = (exponents[:, None] | mantissas[None, :]).ravel()
    sample = np.random.default_rng(0).integers(0, 1 << 32, 1 << 22, dtype=np.uint64)
    bits = np.concatenate([grid, sample.astype(np.uint32)])
    return np.concatenate([bits, bits | np.uint32(0x80000000)])


@pytest.mark.parametrize(("kind", "dtype"), KINDS)
def test_every_16_bit_value_widens_exactly(kind, dtype):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.empty(bits.size, np.float32)
    halves.widen(bits, got, kind)
    want = bits.view(dtype).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(("kind", "dtype"), KINDS)
def test_float32_rounds_as_numpy_and_ml_dtypes_do(kind, dtype):
    values = _float32_bits().view(np.float32)
    got = np.empty(values.size, np.uint16)
    halves.narrow(values, got, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow to inf, NaN casts
        want = values.astype(dtype).view(np.uint16)
    np.testing.assert_array_equal(got, want)
