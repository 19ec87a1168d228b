"""Ctrl-C during compiled loops: a word they read between blocks, set on SIGINT.

Compiled code runs without the GIL and never sees Python's SIGINT handler, which runs
only once the main thread is back in Python. While a call is watched
(:func:`watch_start` to :func:`watch_end`, or :func:`watching`), Python's C-level
handler writes the signal's number to a pipe (``signal.set_wakeup_fd``); a daemon
thread waiting on it sets the watched words, so the loops stop within a block and the
call returns to Python, where the handler raises KeyboardInterrupt. Bytes leave the
pipe only under a lock, and a window's end takes what is left itself
(:func:`watch_end`), so a SIGINT read late under load never stops the next call, and
the end never waits for the watcher (which needs the GIL); bytes of other signals go on
to the wake-up fd that was there before (an event loop's).

The native nodes (:mod:`.runtime.hosts.native`) and a layer's compiled units
(:mod:`.scan`) are watched this way.
"""

from __future__ import annotations

import ctypes
import functools
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

_lock = threading.Lock()
_pipe: tuple[int, int, int] | None = None  # (pid, the pipe's write end, its read end)
#: the words a SIGINT now sets, and the wake-up fd each window replaced (under _lock)
_windows: list[tuple[np.ndarray, int]] = []
#: the wake-up fd the last outermost window replaced: put back where a window torn
#: open by an exception left the pipe's (:func:`watch_start`)
_outer = -1


class Unavailable(RuntimeError):
    """No watcher can be had: no file descriptor for its pipe, or no thread."""


def _libc_read() -> Callable[[int, Any, int], int] | None:
    """libc's ``read`` called with the GIL held (``ctypes.PyDLL``): taking a window's
    bytes then costs no GIL handoff, which busy Python threads make milliseconds long."""
    try:
        read = ctypes.PyDLL(None).read
    except (OSError, AttributeError):  # no C library to call: os.read
        return None
    read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    read.restype = ctypes.c_ssize_t
    return read


_read = _libc_read()


def _take(fd: int, hold_gil: bool = False) -> bytes | None:
    """Under ``_lock``: the bytes waiting in the pipe (the read end does not block),
    None once its write end is closed; ``hold_gil``: read without releasing the GIL."""
    data = b""
    buffer = ctypes.create_string_buffer(256) if hold_gil and _read is not None else None
    while True:
        if buffer is not None:
            n = _read(fd, buffer, 256)
            if n < 0:  # EAGAIN (empty) or an error: nothing more to take
                return data
            chunk = buffer.raw[:n]
        else:
            try:
                chunk = os.read(fd, 256)
            except (BlockingIOError, InterruptedError):
                return data
        if not chunk:
            return data or None
        data += chunk


def _note(data: bytes) -> int:
    """Under ``_lock``: a SIGINT in ``data`` sets every watched word. Returns the fd
    that other signals' bytes go on to (-1: none)."""
    if int(signal.SIGINT) in data:
        for word, _ in _windows:
            word[0] = 1
    fd = _windows[0][1] if _windows else -1
    return -1 if _pipe is not None and fd == _pipe[1] else fd


def _forward(fd: int, data: bytes) -> None:
    others = bytes(b for b in data if b != int(signal.SIGINT))
    if others and fd >= 0:
        try:
            os.write(fd, others)
        except OSError:  # closed or full: as Python's handler does, drop it
            pass


def _watcher(fd: int) -> None:
    """Sets the watched words for each SIGINT Python's C handler writes to the pipe
    while a window is open (waiting without the GIL; reading under ``_lock``)."""
    while True:
        try:
            select.select([fd], [], [])
        except InterruptedError:
            continue
        except (OSError, ValueError):
            return
        with _lock:
            try:
                data = _take(fd)
            except OSError:
                return
            if data is None:
                return
            forward = _note(data)
        _forward(forward, data)


def _pipe_ends() -> tuple[int, int]:
    """The watcher's pipe (write end, read end), made once per process (a forked
    child makes its own: the thread does not survive a fork).

    Raises
    ------
    Unavailable
        No file descriptor for the pipe, or no thread for the watcher.
    """
    global _pipe, _lock
    pid = os.getpid()
    if _pipe is not None and _pipe[0] != pid:  # a forked child: its parent's lock may
        _lock = threading.Lock()  # be held by a thread it lacks
    with _lock:
        if _pipe is None or _pipe[0] != pid:
            _windows.clear()  # a forked child's copy of its parent's windows
            try:
                r, w = os.pipe()
            except OSError as e:  # EMFILE: no descriptor left
                raise Unavailable(f"no pipe for the SIGINT watcher: {e}") from e
            try:
                os.set_blocking(w, False)
                os.set_blocking(r, False)
                threading.Thread(
                    target=_watcher, args=(r,), name="onnx-recurrent-sigint", daemon=True
                ).start()
            except BaseException as e:  # no thread: the pipe is not kept
                os.close(r)
                os.close(w)
                if isinstance(e, RuntimeError) and not isinstance(e, Unavailable):
                    raise Unavailable(f"no thread for the SIGINT watcher: {e}") from e
                raise
            _pipe = (pid, w, r)
        return _pipe[1], _pipe[2]


def watch_start(word: np.ndarray) -> int:
    """On the main thread: from now, a SIGINT sets ``word[0]`` (an int64 array, cleared
    here) as well as calling Python's handler later. Returns the wake-up fd it
    replaced, for :func:`watch_end`.

    A handler's exception while the window opens (a timer's ``TimeoutError``) closes
    it again: the wake-up fd back, the window forgotten. A window left open all the
    same (a handler raising just as this returned) is mended by the next
    outermost window: its wake-up fd put back (:data:`_outer`).

    Raises
    ------
    ValueError
        Not on the main thread (``signal.set_wakeup_fd``'s own error).
    Unavailable
        No file descriptor for the watcher's pipe, or no thread for it (nothing is
        changed then).
    """
    global _outer
    fd, _ = _pipe_ends()
    # the fd replaced is put in ``box`` by C code (list.extend over map): a handler
    # raising as the call returns (at the bytecode after it) cannot lose it
    box: list[int] = []
    try:
        box.extend(map(functools.partial(signal.set_wakeup_fd, warn_on_full_buffer=False), (fd,)))
        previous = box[0]
        with _lock:
            if previous == fd and not _windows:  # the pipe's, left by a torn window
                previous = _outer
            if not _windows:
                _outer = previous
            word[0] = 0
            _windows.append((word, previous))
    except BaseException:
        if box:  # the fd was replaced: the window's (corrected) record, else box's
            recorded = any(w is word for w, _ in _windows)
            lost = box[0] == fd and not _windows  # the pipe's, left by a torn window
            watch_abandon(word, None if recorded else _outer if lost else box[0])
        raise
    return previous


def watch_abandon(word: np.ndarray, previous: int | None = None) -> None:
    """A window of :func:`watch_start` that an exception tore (it may or may not have
    opened) closed again: forgotten, and the wake-up fd it replaced back (``previous``
    where known; else the window's, or where no window is open and the pipe's is set,
    the one the outermost window replaced)."""
    with _lock:
        mine = [fd for w, fd in _windows if w is word]
        _windows[:] = [w for w in _windows if w[0] is not word]
        word[0] = 0
        others = bool(_windows)
    if previous is None and mine:
        previous = mine[0]
    if previous is None:
        if others or _pipe is None:
            return
        current = signal.set_wakeup_fd(-1)
        previous = _outer if current == _pipe[1] else current
    signal.set_wakeup_fd(previous)


def watch_end(word: np.ndarray, previous: int) -> bool:
    """The window of :func:`watch_start` closed: the wake-up fd ``previous`` back, then
    the bytes its signals left in the pipe taken here (not waiting for the watcher), so
    that none is read after the window, when it would stop the next one. Returns
    whether a SIGINT set ``word`` in it; ``word`` is clear after it."""
    data, forward = b"", -1
    try:
        signal.set_wakeup_fd(previous)
    finally:  # also on an interrupt there
        with _lock:
            try:
                data = (_take(_pipe[2], hold_gil=True) or b"") if _pipe is not None else b""
            except OSError:
                data = b""
            forward = _note(data)
            _windows[:] = [w for w in _windows if w[0] is not word]
            aborted = bool(word[0])
            word[0] = 0
    _forward(forward, data)
    return aborted


def watchable() -> bool:
    """Whether a SIGINT now is this thread's to watch for: the main thread, with
    Python's own handler (one that raises KeyboardInterrupt) installed. A handler of
    ours left in its place (an exception tore a window as it opened) is replaced by
    Python's here: every later Ctrl-C was dropped."""
    if threading.current_thread() is not threading.main_thread():
        return False
    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "onnx_recurrent_window", False):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return True
    return handler is signal.default_int_handler


class _Deferring:
    """SIGINT's handler while a window opens: notes the signal (raised once open)."""

    onnx_recurrent_window = True  # one of ours: watchable() puts Python's back

    def __init__(self, deferred: list[int]) -> None:
        self.deferred = deferred

    def __call__(self, signum: int, frame: Any) -> None:
        self.deferred.append(signum)


class watching:  # lower case: used as contextlib's managers are
    """:func:`watch_start` to :func:`watch_end` around a ``with`` block where
    :func:`watchable` (and a watcher can be had: a file descriptor, a thread), else
    nothing; ``as`` gives whether it watches. ``word`` keeps what a SIGINT set after the
    block (the caller reads it).

    A SIGINT while the window opens waits (a handler that notes it) until the window
    can be closed by ``__exit__``: a KeyboardInterrupt raised there, before the block,
    would leave the wake-up fd on the watcher's pipe and the window open for good.
    """

    def __init__(self, word: np.ndarray) -> None:
        self.word = word
        self.previous: int | None = None

    def __enter__(self) -> bool:
        if not watchable():
            return False
        deferred: list[int] = []
        try:
            signal.signal(signal.SIGINT, _Deferring(deferred))
            try:
                self.previous = watch_start(self.word)
            except Unavailable:  # unwatched: a Ctrl-C waits for the block's end
                pass
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if deferred:
                raise KeyboardInterrupt
        except BaseException:  # that, or another handler's (a timer's TimeoutError)
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            finally:
                if self.previous is None:  # opened, maybe, but not known here
                    watch_abandon(self.word)
                self._end()
            raise
        return self.previous is not None

    def __exit__(self, *exc_info: object) -> None:
        self._end()

    def _end(self) -> None:
        previous, self.previous = self.previous, None
        if previous is not None and watch_end(self.word, previous):
            self.word[0] = 1
