"""Where threads run: the calling thread kept on its CPU, pool threads kept off it.

Linux only (``os.sched_getaffinity``); elsewhere :func:`spread` yields None and
:func:`apart` just calls its function. Where the caller cannot be pinned (a mask of one
CPU, or refused), pool threads still keep to the caller's mask. Independent of
the pool (:mod:`onnx_recurrent.threads`), which uses it when asked to.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TypeVar

T = TypeVar("T")

Placement = tuple[set[int], set[int]] | None  # (CPUs for pool threads, the caller's mask)


@cache
def _sched_getcpu():
    """libc's ``sched_getcpu``, or None where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


def cpu() -> int:
    """The CPU this thread runs on (-1: unknown)."""
    get = _sched_getcpu()
    return get() if get is not None else -1


@contextmanager
def spread() -> Iterator[Placement]:
    """Keep the calling thread on its CPU for the block; pool threads (:func:`apart`)
    keep off it. Yields their CPUs and the caller's mask (theirs too after the call),
    or None (no affinity here). With a mask of one CPU the caller is left as it is and
    the pool threads share that CPU: they never run outside the caller's mask.

    After a pause (tens of ms), Linux in a VM wakes threads that hand the GIL to each
    other on one CPU and leaves them there for milliseconds: threads that wait for each
    other at every step then run one after the other (measured: up to 2x slower).

    A mask changed from outside during the block (``taskset -a -p``) is kept: a mask
    is put back only where it is still the one set here."""
    here = cpu()
    try:
        mask = os.sched_getaffinity(0)
    except TimeoutError:  # a timer's handler raised here, not the call: the caller's
        raise
    except (OSError, AttributeError):  # no affinity on this platform
        yield None
        return
    if here not in mask or len(mask) < 2:
        yield mask, mask
        return
    try:
        os.sched_setaffinity(0, {here})
    except TimeoutError:
        raise
    except OSError:  # not allowed
        yield mask, mask
        return
    try:
        yield mask - {here}, mask
    finally:
        back(0, {here}, mask)


def within(mask: set[int]) -> Placement:
    """The placement of pool threads that only keep to the caller's ``mask``."""
    return mask, mask


def caller_mask() -> set[int] | None:
    """The calling thread's mask, or None (no affinity here)."""
    try:
        return os.sched_getaffinity(0)
    except TimeoutError:  # a timer's handler raised here, not the call: the caller's
        raise
    except (OSError, AttributeError):
        return None


def apart(placement: Placement, fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` on a pool thread, on the CPUs of ``placement`` (:func:`spread`),
    then on the caller's mask."""
    if placement is None:
        return fn(*args)
    cpus, mask = placement
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:  # refused (a CPU gone from the cpuset): run where it is
        return fn(*args)
    try:
        return fn(*args)
    finally:
        back(0, cpus, mask)


def place(thread_id: int | None, cpus: set[int]) -> None:
    """Keep the thread ``thread_id`` (a native id) on ``cpus`` from now, whether it
    runs or waits (a pool thread placed before it wakes, :func:`spread`'s CPUs)."""
    if thread_id is None:
        return
    try:
        os.sched_setaffinity(thread_id, cpus)
    except OSError:  # the thread has ended, or the mask is refused: apart() tries again
        pass


def back(thread_id: int | None, ours: set[int], mask: set[int]) -> None:
    """Put the thread ``thread_id`` (0: this one) back on ``mask`` where its mask is
    still ``ours``: one changed meanwhile from outside is left as it is."""
    if thread_id is None:
        return
    try:
        if os.sched_getaffinity(thread_id) == ours:
            os.sched_setaffinity(thread_id, mask)
    except TimeoutError:  # a timer's handler raised here, not the call: the caller's
        raise
    except OSError:  # the thread has ended, or the mask is refused
        pass
