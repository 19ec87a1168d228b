"""Our per-user cache directories (numba's kernels, the native nodes' machine code).

A cache holds code that is loaded and run: it must be the user's alone. The first
choice is the platform's user cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``
on Linux), then a directory of the user's in the temporary directory, used only if
no one else can write it.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from ..held import c_handler


class CompileCacheWarning(RuntimeWarning):
    """A compilation cache cannot be written: each process compiles the kernels again."""


#: the topics :func:`warn_once` has warned of in this process
WARNED: set[str] = set()


def warn_once(topic: str, message: str, stacklevel: int) -> None:
    """``message`` as a :class:`CompileCacheWarning`, once a process per ``topic``
    (``stacklevel`` counted from the caller, as ``warnings.warn``'s)."""
    if topic not in WARNED:
        WARNED.add(topic)
        warnings.warn(message, CompileCacheWarning, stacklevel=stacklevel + 1)


def _temporary_directory() -> str | None:
    """The temporary directory (None: none can be written, a full disk)."""
    try:
        return tempfile.gettempdir()
    except OSError:  # FileNotFoundError: "No usable temporary directory found"
        return None


# the temporary directory found now, on import: the first gettempdir() takes a lock of
# tempfile's, and a fork while another thread holds it (planning, say) hung the child
_temporary_directory()


def our_roots(kind: str = "numba") -> list[tuple[str, bool]]:
    """Our per-user cache roots, in order of preference, each with whether it lies in
    a directory shared between users (the temporary one)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser(r"~\AppData\Local")
    elif sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # the XDG rule: a relative path is ignored
            base = os.path.expanduser("~/.cache")
    roots = [(os.path.join(base, "onnx-recurrent", kind), False)]
    temporary = _temporary_directory()
    if hasattr(os, "getuid") and temporary is not None:
        user = os.path.join(temporary, f"onnx-recurrent-{os.getuid()}")
        roots.append((os.path.join(user, kind), True))
    return roots


def private(directory: str) -> bool:
    """Whether ``directory`` (made if missing) is the user's alone: in a shared
    directory, another user could have made it, to have their code loaded as ours."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    st = os.lstat(directory)
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def writable(path: str) -> bool:
    """numba's own test of a cache directory: create it, write a file in it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def first_usable(kind: str) -> tuple[str | None, list[str]]:
    """The first of :func:`our_roots` for ``kind`` that is private and writable
    (None if none is), and the directories tried."""
    tried = []
    for root, shared in our_roots(kind):
        tried.append(root)
        if (not shared or private(os.path.dirname(root))) and writable(root):
            return root, tried
    return None, tried


def readable_roots(kind: str) -> list[str]:
    """Where a cache of ``kind`` is read: :func:`first_usable`'s directory, after those
    of :func:`our_roots` preferred to it that are there but cannot be written (a warm
    cache shipped read-only: a container image's, a read-only mount); one in a shared
    directory only where it is the user's alone (what it holds is loaded as code)."""
    found = []
    for root, shared in our_roots(kind):
        if shared and not private(os.path.dirname(root)):
            continue
        if writable(root):
            return [*found, root]
        if os.path.isdir(root):
            found.append(root)
    return found


#: the signals whose default action ends the process (``kill``, ``timeout``, a closed
#: terminal): while one of them is left at that action, :func:`replacing` removes its
#: temporary file before the process ends
ENDING_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGHUP")
    if hasattr(signal, name) and hasattr(signal, "pthread_sigmask")  # not on Windows
)


@contextmanager
def replacing(path: str | os.PathLike, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file whose content replaces ``path``'s when the block ends: a temporary
    file beside it, renamed over it (a reader sees the old file or the new one, never
    half of one). On any exception, Ctrl-C's included, the temporary file is removed,
    ``path`` is left as it was and the exception propagates. Where the system has
    unnamed files (Linux's ``O_TMPFILE``), the temporary file has no name while it is
    written: a process killed then (SIGKILL, SIGQUIT...) leaves nothing; it is named
    beside ``path`` only for the rename. On the main thread, a SIGTERM or SIGHUP left to
    end the process while the temporary file has a name removes it first, then ends the
    process as before (the same signal, the same status). ``mode``: the new file's
    permission bits (None: the temporary file's, the user's alone).

    Raises
    ------
    OSError
        The temporary file cannot be made or written, or the rename fails.
    """
    directory = os.path.dirname(os.fspath(path)) or "."
    made: list[str] = []
    with _removed_when_ended(made) as ending:
        fd = _unnamed(directory)
        if fd is None:
            fd = _named(path, directory, made, ending)
        try:
            try:
                # the caller's file object on a copy of the descriptor: closing it (a
                # text wrapper closes what it wraps) leaves ours, which names the file
                with os.fdopen(os.dup(fd), "wb") as f:
                    yield f
                if mode is not None:
                    os.fchmod(fd, mode)
                if not made:  # named now, for the rename
                    _link(fd, path, directory, made, ending)
            finally:
                os.close(fd)
            try:
                os.replace(made[0], path)
            except OSError as e:  # named by the file meant (a directory there, say)
                raise type(e)(e.errno, e.strerror, os.fspath(path)) from None
            made.clear()
        except BaseException:
            for name in made:
                with suppress(OSError):
                    os.unlink(name)
            raise


def _unnamed(directory: str) -> int | None:
    """A file of the user's alone in ``directory`` with no name (``O_TMPFILE``), open for
    writing; None where the system or its file system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):  # named through /proc at the end
        return None
    try:
        return os.open(directory, flag | os.O_WRONLY, 0o600)
    except OSError:  # no O_TMPFILE there (EOPNOTSUPP, EISDIR), or not writable: said next
        return None


def _named(path: str | os.PathLike, directory: str, made: list[str], ending: list[int]) -> int:
    """A temporary file beside ``path`` (its name put in ``made``), open for writing."""
    # the ending signals held while it is made and listed: one handled between would
    # leave it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ending) if ending else None
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        made.append(temporary)
        return fd
    except OSError as e:  # named by the file meant, not the temporary one
        raise type(e)(e.errno, e.strerror, os.fspath(path)) from None
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _link(fd: int, path: str | os.PathLike, directory: str, made: list[str], ending: list[int]):
    """Name the unnamed file ``fd`` beside ``path`` (the name put in ``made``)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ending) if ending else None
    try:
        # linkat(AT_SYMLINK_FOLLOW) on /proc's link to the file (os.link calls plain
        # link(), which links the /proc entry itself, EXDEV, unless given a dir_fd)
        where = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for _ in range(100):
                name = f".tmp-{os.urandom(6).hex()}"
                try:
                    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=where, follow_symlinks=True)
                except FileExistsError:
                    continue
                made.append(os.path.join(directory, name))
                return
        finally:
            os.close(where)
        raise FileExistsError(errno.EEXIST, "no free temporary name", os.fspath(path))
    except OSError as e:
        raise type(e)(e.errno, e.strerror, os.fspath(path)) from None
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextmanager
def _removed_when_ended(made: list[str]) -> Iterator[list[int]]:
    """On the main thread, each of :data:`ENDING_SIGNALS` at its default action gets,
    inside the block, a handler that removes the files in ``made`` and ends the
    process by the same signal; yields those signals. The default is back after it."""
    ours: list[int] = []
    if threading.current_thread() is threading.main_thread():

        def ended(signum: int, frame: object) -> None:
            for name in made:
                with suppress(OSError):
                    os.unlink(name)
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            os.kill(os.getpid(), signum)

        for signum in ENDING_SIGNALS:
            try:
                if signal.getsignal(signum) is signal.SIG_DFL and c_handler(signum) in (None, 0):
                    signal.signal(signum, ended)
                    ours.append(signum)
            except (ValueError, OSError):  # not the main interpreter
                break
    try:
        yield ours
    finally:
        for signum in ours:
            signal.signal(signum, signal.SIG_DFL)


def write_atomic(path: str | os.PathLike, data: bytes) -> bool:
    """Keep ``data`` at ``path`` (:func:`replacing`); whether it was kept (a failure
    keeps nothing and raises nothing)."""
    try:
        with replacing(path) as f:
            f.write(data)
    except OSError:
        return False
    return True


def read_regular(path: str | os.PathLike, limit: int) -> bytes | None:
    """The bytes of the cache file ``path``; None where it is not a regular file (a
    named pipe would block, a device never end) or holds more than ``limit`` bytes.

    Raises
    ------
    OSError
        It cannot be opened or read (missing, say).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
            return None
        return f.read(limit + 1)
