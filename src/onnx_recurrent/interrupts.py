"""Ctrl-C during compiled loops: a word they read between blocks, set on SIGINT.

Compiled code runs without the GIL and never sees Python's SIGINT handler, which runs
only once the main thread is back in Python. While a call is watched
(:func:`watch_start` to :func:`watch_end`, or :func:`watching`), Python's C-level
handler writes the signal's number to a pipe (``signal.set_wakeup_fd``); a daemon
thread reading it sets the watched words, so the loops stop within a block and the
call returns to Python, where the handler raises KeyboardInterrupt. A window ends only
once the watcher has read every byte written while it was open (a marker byte behind
them, :func:`watch_end`), so a SIGINT read late under load never stops the next call,
watched or not; bytes of other signals go on to the wake-up fd that was there before
(an event loop's).

The native nodes (:mod:`.runtime.hosts.native`) and a layer's compiled units
(:mod:`.scan`) are watched this way.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None  # (pid, the pipe's write end)
#: the words a SIGINT now sets, and the wake-up fd each window replaced (under _lock)
_windows: list[tuple[np.ndarray, int]] = []
#: the byte :func:`watch_end` writes behind a window's (no signal's number), and the
#: markers the watcher has read (under _lock; ``_read`` notified)
MARKER = 0
_markers = 0
_read = threading.Condition(_lock)
#: seconds a window's end waits for the watcher at most (it runs within microseconds
#: unless the machine is starved)
FLUSH_SECONDS = 1.0


def _watcher(fd: int) -> None:
    """Sets the watched words for each SIGINT Python's C handler writes to the pipe,
    and counts :func:`watch_end`'s markers."""
    global _markers
    sigint = int(signal.SIGINT)
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        with _lock:  # a window's bytes are all read before it ends
            forward = _windows[0][1] if _windows else -1
            if sigint in data:
                for word, _ in _windows:
                    word[0] = 1
            if MARKER in data:
                _markers += data.count(MARKER)
                _read.notify_all()
        others = bytes(b for b in data if b not in (sigint, MARKER))
        if others and forward >= 0:
            try:
                os.write(forward, others)
            except OSError:  # closed or full: as Python's handler does, drop it
                pass


def _write_end() -> int:
    """The write end of the watcher's pipe, made once per process (a forked child
    makes its own: the thread does not survive a fork)."""
    global _pipe, _markers, _lock, _read
    pid = os.getpid()
    if _pipe is not None and _pipe[0] != pid:  # a forked child: its parent's lock and
        _lock = threading.Lock()  # condition may be held by a thread it lacks
        _read = threading.Condition(_lock)
    with _lock:
        if _pipe is None or _pipe[0] != pid:
            _windows.clear()  # a forked child's copy of its parent's windows
            _markers = 0
            r, w = os.pipe()
            try:
                os.set_blocking(w, False)
                threading.Thread(
                    target=_watcher, args=(r,), name="onnx-recurrent-sigint", daemon=True
                ).start()
            except BaseException:  # no thread: the pipe is not kept
                os.close(r)
                os.close(w)
                raise
            _pipe = (pid, w)
        return _pipe[1]


def watch_start(word: np.ndarray) -> int:
    """On the main thread: from now, a SIGINT sets ``word[0]`` (an int64 array, cleared
    here) as well as calling Python's handler later. Returns the wake-up fd it
    replaced, for :func:`watch_end`.

    Raises
    ------
    ValueError
        Not on the main thread (``signal.set_wakeup_fd``'s own error).
    OSError, RuntimeError
        No file descriptor for the watcher's pipe, or no thread for it (nothing is
        changed then).
    """
    fd = _write_end()
    previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    with _lock:
        word[0] = 0
        _windows.append((word, previous if previous != fd else -1))
    return previous


def watch_end(word: np.ndarray, previous: int) -> bool:
    """The window of :func:`watch_start` closed: the wake-up fd ``previous`` back, then
    a marker written behind the bytes of its SIGINTs and waited for (at most
    :data:`FLUSH_SECONDS`), so that none is read after the window, when it would stop
    the next one. Returns whether a SIGINT set ``word`` in it; ``word`` is clear after
    it."""
    signal.set_wakeup_fd(previous)
    fd = _write_end()
    try:
        with _lock:
            target = _markers + 1
        os.write(fd, bytes([MARKER]))
        with _lock:
            _read.wait_for(lambda: _markers >= target, FLUSH_SECONDS)
    except OSError:  # the pipe full: the watcher is far behind; end without waiting
        pass
    finally:  # also on an interrupt while waiting
        with _lock:
            _windows[:] = [w for w in _windows if w[0] is not word]
            aborted = bool(word[0])
            word[0] = 0
    return aborted


def watchable() -> bool:
    """Whether a SIGINT now is this thread's to watch for: the main thread, with
    Python's own handler (one that raises KeyboardInterrupt) installed."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


@contextmanager
def watching(word: np.ndarray) -> Iterator[bool]:
    """:func:`watch_start` to :func:`watch_end` around the block where
    :func:`watchable` (and a watcher can be had: a file descriptor, a thread), else
    nothing; yields whether it watches. ``word`` keeps what a SIGINT set after the
    block (the caller reads it)."""
    previous = None
    if watchable():
        try:
            previous = watch_start(word)
        except (OSError, RuntimeError):  # unwatched: a Ctrl-C waits for the block's end
            pass
    if previous is None:
        yield False
        return
    try:
        yield True
    finally:
        if watch_end(word, previous):
            word[0] = 1
