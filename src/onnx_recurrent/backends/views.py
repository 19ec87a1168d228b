"""Arrays without a reference count, for the compiled step loop.

numba counts references of every array it passes, slices or reads from a record:
an atomic add and subtract on the array's owner, 30-40 % of a small call (one RNN
step at H=4: 0.65 µs of its 0.8). A view made by :func:`unowned` has no owner, so
those counts cost a branch. Its memory must outlive it: the caller's arguments
during the call, a scratch array that stays alive (:func:`keep`), or a plan's
arrays, which the plan's Python object keeps (:func:`.numba_backend._make_plan`).
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic, overload


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
