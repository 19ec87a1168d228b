"""16-bit floats widened to float32 and rounded back by their bits, for compiled code
(numba has no float16 on the CPU): the same bits as NumPy's ``astype(np.float16)`` and
ml_dtypes' ``astype(bfloat16)`` (round to nearest even; inf past the range; a NaN as each
makes it), checked over every float32 by tests/test_halves.py.

``kind`` is :data:`FLOAT16` or :data:`BFLOAT16`; the 16-bit arrays are their bits
(``uint16``); the float32 ones C-contiguous.
"""

from __future__ import annotations

import numba
import numpy as np

from .jit_cache import jit
from .views import pointer

FLOAT16 = 1
BFLOAT16 = 2

_jit = jit(nogil=True, error_model="numpy")


@_jit
def widen(bits, out, kind):
    """``out[i] = float32(bits[i])`` (exact) for 1-D ``bits`` (uint16) and ``out``
    (float32) of one size."""
    wide = numba.carray(pointer(out.ctypes.data), out.size, np.uint32)  # (a view's
    # dtype check raises, which the native nodes' machine code cannot hold)
    if kind == BFLOAT16:
        for i in range(bits.size):
            wide[i] = np.uint32(bits[i]) << np.uint32(16)
        return
    for i in range(bits.size):
        h = np.uint32(bits[i])
        sign = (h & np.uint32(0x8000)) << np.uint32(16)
        exponent = (h >> np.uint32(10)) & np.uint32(0x1F)
        mantissa = h & np.uint32(0x3FF)
        if exponent == 0:  # zero or subnormal: mantissa * 2**-24, exact in float32
            out[i] = np.float32(mantissa) * np.float32(5.9604644775390625e-08)
            wide[i] |= sign
        elif exponent == 31:  # inf or NaN
            wide[i] = sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13))
        else:
            wide[i] = (
                sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (mantissa << np.uint32(13))
            )


@_jit
def narrow(values, out, kind):
    """``out[i]`` = the bits of ``values[i]`` (float32) rounded to ``kind``, for 1-D
    arrays of one size (``out``: uint16)."""
    wide = numba.carray(pointer(values.ctypes.data), values.size, np.uint32)  # as widen
    if kind == BFLOAT16:
        for i in range(values.size):
            f = wide[i]
            if (f & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: ml_dtypes' one
                out[i] = np.uint16(((f >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
            else:
                rounded = f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))
                out[i] = np.uint16(rounded >> np.uint32(16))
        return
    for i in range(values.size):
        out[i] = _half(wide[i])


@_jit
def _half(f):
    """NumPy's float32 bits to float16 bits (``npy_floatbits_to_halfbits``)."""
    sign = np.uint32((f & np.uint32(0x80000000)) >> np.uint32(16))
    exponent = f & np.uint32(0x7F800000)
    if exponent >= np.uint32(0x47800000):  # past the range, inf or NaN
        mantissa = f & np.uint32(0x007FFFFF)
        if exponent == np.uint32(0x7F800000) and mantissa != 0:
            nan = np.uint32(0x7C00) + (mantissa >> np.uint32(13))
            if nan == np.uint32(0x7C00):
                nan += np.uint32(1)
            return np.uint16(sign + nan)
        return np.uint16(sign + np.uint32(0x7C00))
    if exponent <= np.uint32(0x38000000):  # a subnormal half or a signed zero
        if exponent < np.uint32(0x33000000):
            return np.uint16(sign)
        shift = np.uint32(113) - (exponent >> np.uint32(23))
        mantissa = (np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))) >> shift
        if (mantissa & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            mantissa += np.uint32(0x1000)
        return np.uint16(sign + (mantissa >> np.uint32(13)))
    half_exponent = (exponent - np.uint32(0x38000000)) >> np.uint32(13)
    mantissa = f & np.uint32(0x007FFFFF)
    if (mantissa & np.uint32(0x3FFF)) != np.uint32(0x1000):
        mantissa += np.uint32(0x1000)
    return np.uint16(sign + half_exponent + (mantissa >> np.uint32(13)))
