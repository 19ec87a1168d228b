"""Signals held off a stretch that must not stop half-way (a module's import, numba
compiling with its lock held, onnxruntime calling Python back), delivered right after.

Below :mod:`.errors` and :mod:`.threads` (both use it): it imports nothing of the
package.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold off every signal that has a Python handler (Ctrl-C's, a timeout's
    ``SIGALRM``, a ``SIGTERM`` handler that exits...) inside the context, and deliver
    each that came right after, to the handler there before (called: the signal's
    byte went to the wake-up fd when it came), in the order they came.

    Inside, Python runs as C code's callbacks (onnxruntime's custom-op API while it
    makes a session) or must make something whole: a handler's exception raised there
    escaped a callback, which then gave onnxruntime garbage (a crash), or was taken
    for onnxruntime refusing the model. Plain onnxruntime calls no Python there: the
    handlers run once its call returns, as here.

    Only the main thread runs Python's handlers: elsewhere, and for a handler not set
    from Python (it cannot be restored), this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    try:
        for signum in _HANDLED:
            previous = _getsignal(signum)
            if callable(previous):
                in_c = _c_action(signum)
                held[signum] = previous
                signal.signal(signum, hold)
                if in_c is not None and _address(in_c) != c_handler(signum):
                    # a handler set in C over Python's (faulthandler.register's) runs,
                    # not Python's: left alone (it was replaced by Python's after)
                    del held[signum]
                    signal.signal(signum, previous)
                    _set_c_action(signum, in_c)
    except (ValueError, OSError):  # not the main interpreter: nothing held
        _restore(held)
        held.clear()
    except BaseException:  # a handler's exception before all were held
        _restore(held)
        raise
    try:
        yield
    finally:
        _restore(held)
        if pending:
            import inspect

            # the handler called, not the signal raised again: Python's C handler
            # wrote the signal's byte to the wake-up fd when it came (an event loop's
            # callback ran twice for one signal)
            frame = inspect.currentframe()
            for signum in dict.fromkeys(pending):
                held[signum](signum, frame)


def import_whole(module: str, package: str | None = None) -> Any:
    """``importlib.import_module(module, package)`` with the signals held off until it
    ends (:func:`interrupts_held`): a Ctrl-C half-way through a package's import left
    its submodules imported around a parent that failed, and every later import of it
    in the process failed ("partially initialized module 'onnx'": no session could be
    made again)."""
    with interrupts_held():
        return importlib.import_module(module, package)


def _c_action(signum: int) -> Any:
    """``signum``'s ``struct sigaction`` as C has it (Linux; else None)."""
    sigaction = _sigaction()
    if sigaction is None:
        return None
    import ctypes

    action = ctypes.create_string_buffer(256)  # larger than any struct sigaction
    return action if sigaction(signum, None, action) == 0 else None


def c_handler(signum: int) -> int | None:
    """The address of ``signum``'s handler in C (0: the default, 1: ignored), which
    may differ from Python's record (``signal.getsignal``: a handler set in C over it,
    ``faulthandler.register``'s); None where it cannot be read (not Linux)."""
    action = _c_action(signum)
    return None if action is None else _address(action)


def _address(action: Any) -> int:
    import ctypes

    return ctypes.c_void_p.from_buffer(action).value or 0  # the handler: its first field


def _set_c_action(signum: int, action: Any) -> None:
    sigaction = _sigaction()
    if sigaction is not None:
        sigaction(signum, action, None)


def linux_libc(name: str, argtypes: tuple, restype: Any) -> Any:
    """The C library's function ``name`` (ctypes, ``errno`` kept) on Linux, whose
    structs these callers lay out (``sigaction``'s handler first, ``stack_t``); None
    elsewhere or where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        call = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = argtypes, restype
    return call


@functools.cache
def _sigaction() -> Any:
    import ctypes

    return linux_libc("sigaction", (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p), ctypes.c_int)


def _restore(held: dict[int, Any]) -> None:
    for signum, handler in held.items():
        signal.signal(signum, handler)


#: ``signal.getsignal`` without its enum wrapping (0.3 µs a signal: 20 µs for all)
_getsignal = getattr(getattr(signal, "_signal", signal), "getsignal", signal.getsignal)
#: the signals a Python handler can be set for
_HANDLED = tuple(
    s
    for s in (signal.valid_signals() if hasattr(signal, "valid_signals") else (signal.SIGINT,))
    if s not in {getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)}
)
