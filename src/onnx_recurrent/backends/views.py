"""Arrays without a reference count, and memory without numba's runtime, for the
compiled step loop.

numba counts references of every array it passes, slices or reads from a record:
an atomic add and subtract on the array's owner, 30-40 % of a small call (one RNN
step at H=4: 0.65 µs of its 0.8). A view made by :func:`unowned` has no owner, so
those counts cost a branch. Its memory must outlive it: the caller's arguments
during the call, a scratch array that stays alive (:func:`keep`), or a plan's
arrays, which the plan's Python object keeps (:class:`.plans.Plan`).

The native nodes' code allocates with the C library's ``malloc`` (:func:`allocate`),
not NumPy's ``np.empty``: it is loaded without numba (:mod:`.native_code`), whose
allocator lives in numba's runtime.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic, overload

#: an empty int64 array: the ``like`` of views and allocations of int64 words
INTS = np.zeros(0, np.int64)


@intrinsic
def pointer(typingctx, address):
    """An int64 address as a ``void*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@intrinsic
def address(typingctx, ptr):
    """A ``void*`` as an int64."""

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], ir.IntType(64))

    return types.int64(types.voidptr), codegen


def unowned(a):
    """``a`` as a view without an owner where it is C-ordered (else ``a`` itself)."""
    raise NotImplementedError("compiled code only")


@overload(unowned, inline="always")
def _unowned(a):
    if isinstance(a, types.Array) and a.layout == "C":
        dt = a.dtype

        def view(a):
            return numba.carray(pointer(a.ctypes.data), a.shape, dt)

        return view
    return lambda a: a


@intrinsic
def keep(typingctx, a):
    """A use of ``a`` that the compiler keeps: its owner lives until this point."""

    def codegen(context, builder, signature, args):
        return context.get_dummy_value()

    return types.void(a), codegen


def part(a, offset, shape):
    """Elements ``offset ..`` of the 1-d array ``a`` as an unowned C array of
    ``shape`` (a reshape that calls no helper); the caller keeps ``a`` big enough."""
    raise NotImplementedError("compiled code only")


@overload(part, inline="always")
def _part(a, offset, shape):
    dt = a.dtype

    def view(a, offset, shape):
        return numba.carray(pointer(a.ctypes.data + offset * a.itemsize), shape, dt)

    return view


def view(address, shape, like):
    """The C array of ``shape`` (a tuple) at ``address`` (an int64), of ``like``'s
    dtype (``like``: an array), without an owner."""
    raise NotImplementedError("compiled code only")


@overload(view, inline="always")
def _view(address, shape, like):
    dt = like.dtype

    def make(address, shape, like):
        return numba.carray(pointer(address), shape, dt)

    return make


_malloc = types.ExternalFunction("malloc", types.voidptr(types.uintp))
_free = types.ExternalFunction("free", types.void(types.voidptr))


@numba.njit(inline="always")
def allocate(count, like):
    """``count`` elements of ``like``'s dtype from ``malloc``, as an unowned 1-d
    array (0 elements if the allocation failed: the caller checks the size);
    :func:`release` frees it."""
    if count <= 0:
        return view(0, (0,), like)
    p = address(_malloc(count * like.itemsize))
    return view(p, (count if p != 0 else 0,), like)


@numba.njit(inline="always")
def release(a):
    """Free an array made by :func:`allocate`."""
    if a.size > 0:
        _free(pointer(a.ctypes.data))


@numba.njit(inline="always")
def copy(src, dst):
    """``dst[:] = src`` for two 1-d arrays of one length (a loop, raising nothing); as
    C arrays where both are contiguous, so that it is vectorized (views of any
    layout, typed ``'A'``, otherwise copy an element at a time)."""
    n = dst.shape[0]
    if src.strides[0] == src.itemsize and dst.strides[0] == dst.itemsize:
        s, d = view(src.ctypes.data, (n,), src), view(dst.ctypes.data, (n,), dst)
        for j in range(n):
            d[j] = s[j]
    else:
        for j in range(n):
            dst[j] = src[j]


@numba.njit(inline="always")
def zero(dst):
    """``dst[:] = 0`` for a 1-d array (as :func:`copy`, vectorized where contiguous)."""
    n = dst.shape[0]
    if dst.strides[0] == dst.itemsize:
        d = view(dst.ctypes.data, (n,), dst)
        for j in range(n):
            d[j] = 0
    else:
        for j in range(n):
            dst[j] = 0
