"""How threads that share one direction's hidden units meet at every step.

The work of a step (a *phase*; GRU with the reset gate before the product has two per
step) is cut into ``S`` shares of hidden units. Any thread may compute any share: it
*claims* one (:func:`claim`: its own first, share ``i`` for party ``i``, so that each
share's weights stay in one core's cache; then any left), computes it, marks it done
(:func:`finish`), and when no share is left waits until all are done (:func:`wait`).
A helper that starts late, or that the OS has descheduled, leaves its shares to the
threads that run: the caller alone can finish a call. A waiting thread spins briefly
(the others are usually microseconds away), then sleeps on a futex (Linux; elsewhere in
short sleeps), so that its CPU goes idle and the scheduler can run a descheduled party
there instead of two threads spinning against a busy neighbour.

``sync``, one int64 array per call: ``[done, aborted, waiters, sequence,
share_cycles, claimed_0 .. claimed_S-1]``. Completions count up over the whole call
(phase ``p`` is over at ``(p+1)*S``); ``claimed_s`` is the phase whose share ``s`` is
next to claim, so a late thread never claims a share of a phase that is over.
Results do not depend on which thread computes a share.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic

from .jit_cache import jit, prepare

DONE, ABORTED, WAITERS, SEQUENCE, SHARE_CYCLES, CLAIMED = range(6)  # CLAIMED + s: share s
#: cycles a waiter spins before it sleeps, at least (about 20-40 µs) ...
SPIN_CYCLES = 60_000
#: ... and at least this many times the last share's cycles: a waiter that slept
#: through a share that runs while it waits would wake too late for the next step
SPIN_SHARES = 3
#: ... and at most (about 1 ms)
SPIN_MOST = 3_000_000
#: longest sleep of a waiter, ns: a safety net, wake-ups are explicit
SLEEP_NS = 2_000_000
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())

_jit = jit(nogil=True)


def _pointer(context, builder, array_type, array, index):
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index])


@intrinsic
def atomic_add(typingctx, array, index, value):
    """``array[index] += value`` atomically (int64 array); returns the old value."""

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return types.int64(array, index, types.int64), codegen


@intrinsic
def atomic_load(typingctx, array, index):
    """``array[index]``, read atomically (int64 array)."""

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "seq_cst", 8)

    return types.int64(array, index), codegen


@intrinsic
def compare_exchange(typingctx, array, index, expected, value):
    """``array[index] = value`` if it holds ``expected`` (atomically); True if so."""

    def codegen(context, builder, signature, args):
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(array, index, types.int64, types.int64), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (``llvm.readcyclecounter``)."""

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter"
        )
        return builder.call(fn, [])

    return types.int64(), codegen


@intrinsic
def c_call(typingctx, addr, a0, a1, a2, a3, a4, a5):
    """``((long (*)(long, ...)) addr)(a0, ..., a5)``: a C function by its address
    (``syscall``; ``usleep`` ignores the extra arguments)."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn_type = ir.FunctionType(i64, [i64], var_arg=True)
        fn = builder.inttoptr(args[0], fn_type.as_pointer())
        return builder.call(fn, list(args[1:]))

    i64 = types.int64
    return i64(i64, i64, i64, i64, i64, i64, i64), codegen


@functools.cache
def _addresses() -> tuple[int, int]:
    """(``syscall`` where futexes work, else 0; ``usleep``, or 0: spin only)."""
    try:
        libc = ctypes.CDLL(None)
        usleep = ctypes.cast(libc.usleep, ctypes.c_void_p).value or 0
        syscall = 0
        if sys.platform.startswith("linux") and _SYS_FUTEX is not None:
            syscall = ctypes.cast(libc.syscall, ctypes.c_void_p).value or 0
    except (OSError, AttributeError, TypeError):
        return 0, 0
    return syscall, usleep


@_jit
def claim(sync, phase, shares, first):
    """An unclaimed share of ``phase``, ``first`` if it is one (a party's own, whose
    weights its core holds), else the next after it; -1 when none is left."""
    for j in range(shares):
        if atomic_load(sync, ABORTED) != 0:
            return -1
        s = (first + j) % shares
        if atomic_load(sync, CLAIMED + s) == phase and compare_exchange(
            sync, CLAIMED + s, phase, phase + 1
        ):
            return s
    return -1


@_jit
def finish(sync, phase, shares, calls, started):
    """Mark one share of ``phase`` done (begun at cycle ``started``); the last one
    wakes the sleepers."""
    sync[SHARE_CYCLES] = cycles() - started
    if atomic_add(sync, DONE, 1) + 1 == (phase + 1) * shares:
        _wake(sync, calls)


@_jit
def _wake(sync, calls):
    atomic_add(sync, SEQUENCE, 1)
    if atomic_load(sync, WAITERS) > 0 and calls[0] != 0:
        futex = sync.ctypes.data + SEQUENCE * 8  # the low half (little-endian)
        c_call(calls[0], calls[2], futex, _FUTEX_WAKE_PRIVATE, 1 << 30, 0, 0)


@_jit
def wait(sync, phase, shares, calls):
    """Until every share of ``phase`` is done: spin, then sleep. False if aborted.

    ``calls``: ``[syscall, usleep, SYS_futex, timespec address]`` (0: not there)."""
    target = (phase + 1) * shares
    start = cycles()
    spin = min(max(SPIN_CYCLES, SPIN_SHARES * sync[SHARE_CYCLES]), SPIN_MOST)
    while atomic_load(sync, DONE) < target:
        if atomic_load(sync, ABORTED) != 0:
            return False
        if cycles() - start < spin:
            continue
        sequence = atomic_load(sync, SEQUENCE)
        atomic_add(sync, WAITERS, 1)
        if atomic_load(sync, DONE) < target and atomic_load(sync, ABORTED) == 0:
            if calls[0] != 0:
                futex = sync.ctypes.data + SEQUENCE * 8
                low = sequence & 0xFFFFFFFF  # the kernel compares 32 bits
                c_call(calls[0], calls[2], futex, _FUTEX_WAIT_PRIVATE, low, calls[3], 0)
            elif calls[1] != 0:
                c_call(calls[1], 50, 0, 0, 0, 0, 0)
        atomic_add(sync, WAITERS, -1)
    return atomic_load(sync, ABORTED) == 0


@dataclass
class Sync:
    """One call's meeting point (see the module's docstring)."""

    shares: int
    sync: np.ndarray  # [done, aborted, waiters, sequence, share_cycles, claimed_s...]
    calls: np.ndarray  # [syscall, usleep, SYS_futex, timespec address]
    timespec: np.ndarray  # [seconds, nanoseconds]: the longest sleep

    @classmethod
    def make(cls, shares: int) -> Sync:
        timespec = np.array([0, SLEEP_NS], np.int64)
        syscall, usleep = _addresses()
        calls = np.array([syscall, usleep, _SYS_FUTEX or 0, timespec.ctypes.data], np.int64)
        if shares > 1:  # abort() may be called on an interrupt: compiled now
            _prepare_abort()
        return cls(shares, np.zeros(CLAIMED + shares, np.int64), calls, timespec)

    def abort(self) -> None:
        """Make every party return at its next claim or wait."""
        _abort(self.sync, self.calls)

    @property
    def aborted(self) -> bool:
        return bool(self.sync[ABORTED])


@functools.cache
def _prepare_abort() -> None:
    """:func:`_abort` compiled, once (a numba type costs tens of µs to make)."""
    prepare(_abort, (types.Array(types.int64, 1, "C"),) * 2)


@_jit
def _abort(sync, calls):
    atomic_add(sync, ABORTED, 1)
    _wake(sync, calls)
