"""NumPy's own BLAS ``gemm``, found for compiled code to call.

The numba kernels call it once per time step, so that a whole block of steps runs in
one compiled call that holds no GIL (with Python between the steps, the threads of a
call queue for the GIL at every step). The library is the one NumPy loaded, found
through threadpoolctl; only ILP64 OpenBLAS symbols (``*gemm64_``, as in NumPy's
wheels) are used, whose integer type is unambiguous. Anything else: :func:`address`
returns None and the kernels fall back to one NumPy product per step.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_SYMBOLS = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_")
_C_TYPE = {
    np.dtype(np.float32): ("s", ctypes.c_float),
    np.dtype(np.float64): ("d", ctypes.c_double),
}


def _prototype(scalar):
    i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    # cblas_?gemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
    return ctypes.CFUNCTYPE(None, i, i, i, i64, i64, i64, scalar, p, i64, p, i64, scalar, p, i64)


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ...]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ()
    found = []
    for info in threadpool_info():
        if info.get("internal_api") == "openblas":
            try:
                found.append(ctypes.CDLL(info["filepath"]))
            except OSError:
                continue
    return tuple(found)


@functools.cache
def function(dtype: np.dtype):
    """``cblas_?gemm`` (ILP64) for float32 or float64 as a ctypes function, checked on a
    small product; or None."""
    if dtype not in _C_TYPE:
        return None
    letter, scalar = _C_TYPE[dtype]
    for lib in _libraries():
        for template in _SYMBOLS:
            address = getattr(lib, template.format(letter), None)
            if address is None:
                continue
            fn = _prototype(scalar)(ctypes.cast(address, ctypes.c_void_p).value)
            if _works(fn, dtype):
                return fn
    return None


@functools.cache
def address(dtype: np.dtype) -> tuple[int, int] | None:
    """``(gemm, threads)``: the address of :func:`function`, and of the same library's
    ``int openblas_set_num_threads_local(int)`` (0 if it has none), which the kernels use
    to keep their own products on their own thread (plain integers are the cheapest
    arguments to pass to compiled code); or None."""
    fn = function(dtype)
    if fn is None:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value, _threads_local()


@functools.cache
def _threads_local() -> int:
    for lib in _libraries():
        fn = getattr(lib, "openblas_set_num_threads_local", None)
        if fn is not None:
            return ctypes.cast(fn, ctypes.c_void_p).value or 0
    return 0


def _works(fn, dtype: np.dtype) -> bool:
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 5)).astype(dtype), rng.random((5, 4)).astype(dtype)
    c = np.zeros((3, 4), dtype)
    args = (3, 4, 5, 1.0, a.ctypes.data, 5, b.ctypes.data, 4, 0.0, c.ctypes.data, 4)
    fn(ROW_MAJOR, NO_TRANS, NO_TRANS, *args)
    return bool(np.allclose(c, a @ b, rtol=1e-5))
