"""The pool: the threads that share a call's work, fork-safe and interruptible.

One process-wide set of daemon threads (``onnx-recurrent-1``, ``-2``, ...), started on
first use and grown to the largest number of helpers ever asked for at once; idle
threads block on a condition (no CPU used). :func:`run` is the one way in:

- **Cancellation.** The work of a call is claimed dynamically by whoever calls
  ``work(i)``, so a helper is an offer, not a promise: once ``work(0)`` has returned on
  the calling thread, helpers that have not started are cancelled (never run) and only
  the started ones are waited for. Several calls (from several threads) share the pool
  without deadlock: a call never waits for a helper that has not started.
- **Interrupts.** A failure or an interrupt (Ctrl-C) on either side calls ``abort()``
  once, which makes running ``work(i)`` return soon; the caller waits for the started
  helpers and re-raises. It waits in short timed waits, so the main thread handles a
  signal within :data:`POLL` seconds. A second interrupt while it waits for aborted
  helpers stops the wait (they end on their own; the pool stays consistent, as each
  helper does its own bookkeeping).
- **Held interrupts.** :func:`~.held.interrupts_held` keeps signals with Python handlers (Ctrl-C,
  a timeout's SIGALRM) off a stretch that must not
  stop half-way (numba compiling with its lock held, a module being imported) and
  delivers it right after.
- **Fork.** A child made with ``os.fork`` has none of the parent's threads; an at-fork
  hook gives the child a fresh, empty pool (new locks, queue and threads).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging  # noqa: F401 (before COMPILING's fork hook: see there)
import os
import re
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any, TypeVar

from . import affinity, quota
from .errors import RecurrentError
from .held import interrupts_held

T = TypeVar("T")

#: the environment variable that sets the threads of one call
ENV = "ONNX_RECURRENT_NUM_THREADS"
#: seconds between two looks for a pending signal while the caller waits for helpers
POLL = 0.05
_POSITIVE = re.compile(r"[0-9]+")
#: the most threads one call may be given (a call splits into fewer units anyway)
MAX_THREADS = 4096


def num_threads() -> int:
    """Threads for one call.

    ``ONNX_RECURRENT_NUM_THREADS`` if set (a positive integer, spaces around it
    ignored; set but empty or blank counts as unset), else the CPUs this process may
    run on (its affinity), or its cgroup's CPU quota rounded up where that is smaller
    (a container's ``--cpus``: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, read once per process; :mod:`onnx_recurrent.quota`).

    Returns
    -------
    int
        At least 1.

    Raises
    ------
    ValueError
        (``onnx_recurrent.RecurrentError``) the variable is set to anything but a
        positive integer up to :data:`MAX_THREADS`; the message names the variable,
        the value and what it accepts.
    """
    value = os.environ.get(ENV, "").strip()
    limit = getattr(_limits, "most", 0)
    if not value:
        return _cpus() if limit < 1 else min(limit, _cpus())
    if _POSITIVE.fullmatch(value) and 0 < int(value) <= MAX_THREADS:
        return int(value) if limit < 1 else min(limit, int(value))
    raise RecurrentError(
        f"{ENV}={value!r}: expected a positive integer up to {MAX_THREADS} (the threads "
        f"of one call, e.g. 4), or the variable unset for the CPUs this process may use "
        f"({_cpus()})"
    )


#: per thread: ``most``, the threads a call on it may take at most (0: no limit)
_limits = threading.local()


@contextlib.contextmanager
def at_most(count: int) -> Iterator[None]:
    """:func:`num_threads` at most ``count`` on this thread inside the context (0: no
    limit): an onnxruntime session's ``intra_op_num_threads`` for the calls of its
    nodes that run on onnx-recurrent's own pool."""
    before = getattr(_limits, "most", 0)
    _limits.most = count if before < 1 else min(before, count) if count > 0 else before
    try:
        yield
    finally:
        _limits.most = before


def confined_pool_size() -> int:
    """Threads to give a thread pool that sizes itself from the whole machine, so that
    it keeps to the CPUs this process may use (onnxruntime's intra-op pool).

    onnxruntime's default pool has one thread per physical core of the machine and
    pins each to its own core, outside a narrower affinity mask (``taskset``; measured
    with onnxruntime 1.32: under a mask of 2 of 16 CPUs its threads ran on all 16), and
    it ignores a cgroup's CPU quota.

    Returns
    -------
    int
        The default threads of one call (:func:`_cpus`: the affinity mask, fewer under
        a CPU quota) where those are fewer than the machine's CPUs; else 0 (the pool's
        own default).
    """
    cpus = _cpus()
    return cpus if cpus < max(os.cpu_count() or 1, _usable_cpus()) else 0


def _cpus() -> int:
    """The default threads of one call: the CPUs this process may run on
    (:func:`_usable_cpus`), fewer where its cgroup's CPU quota allows less time
    (:func:`onnx_recurrent.quota.cpus`: ``cpu.max``, ``cpu.cfs_quota_us``, rounded up).

    Returns
    -------
    int
        The smaller of the two, at least 1.
    """
    usable = _usable_cpus()
    limit = quota.cpus()
    return usable if limit is None else max(1, min(usable, limit))


def _usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``os.sched_getaffinity``),
    else ``os.cpu_count()`` where there is no affinity; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except TimeoutError:  # a timer's handler raised here, not the call: the caller's
        raise
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class _Pool:
    """The threads and the queue of helpers not yet started: ``(call, i)`` pairs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)  # a helper was queued
        self.queue: deque[tuple[_Call, int]] = deque()
        self.threads: list[threading.Thread] = []

    def grow(self, helpers: int) -> None:
        """At least ``helpers`` threads (fewer if the system refuses more: a helper
        that never starts is cancelled, so the call still completes)."""
        if len(self.threads) >= helpers:
            return
        with self.lock:
            while len(self.threads) < helpers:
                thread = threading.Thread(
                    target=_serve,
                    args=(self,),
                    name=f"onnx-recurrent-{len(self.threads) + 1}",
                    daemon=True,
                )
                try:
                    thread.start()
                except RuntimeError:  # can't start new thread
                    return
                self.threads.append(thread)


class _Call:
    """One :func:`run`: its work, its helpers' bookkeeping (under the pool's lock)."""

    __slots__ = (
        "abort", "aborted", "closed", "done", "error", "placement", "running", "seen", "work",
    )  # fmt: skip

    def __init__(self, pool: _Pool, work, abort, placement: affinity.Placement) -> None:
        self.work = work
        self.abort = abort
        self.placement = placement
        self.done = threading.Condition(pool.lock)  # a started helper ended
        self.running = 0  # helpers started and not ended
        self.closed = False  # helpers not started are cancelled
        self.aborted = False
        self.error: BaseException | None = None  # the first exception, any party
        self.seen: set[int | None] = set()  # native ids of the threads that took a helper

    def fail(self, pool: _Pool, error: BaseException) -> None:
        """Record ``error`` (if first), cancel the helpers not started, abort once."""
        with pool.lock:
            if self.error is None:
                self.error = error
            self.closed = True
            first, self.aborted = not self.aborted, True
        if first:
            try:
                self.abort()
            except BaseException as e:  # kept only if nothing came before it
                with pool.lock:
                    if self.error is None:
                        self.error = e

    def close(self, pool: _Pool) -> None:
        """Cancel the helpers not started (idempotent)."""
        with pool.lock:
            self.closed = True
            if any(call is self for call, _ in pool.queue):
                pool.queue = deque(item for item in pool.queue if item[0] is not self)

    def wait(self, pool: _Pool) -> None:
        """Until the started helpers have ended; timed waits, so signals get through."""
        with pool.lock:
            while self.running:
                self.done.wait(POLL)


def _serve(pool: _Pool) -> None:
    """A pool thread: run queued helpers, skipping cancelled ones; block when idle."""
    while True:
        with pool.lock:
            while not pool.queue:
                pool.ready.wait()
            call, i = pool.queue.popleft()
            call.seen.add(threading.get_native_id())
            if call.closed:  # cancelled: its work(0) has returned
                placement, call = call.placement, None
                if placement is not None:  # placed before waking: its mask back
                    affinity.back(0, placement[0], placement[1])
                continue
            call.running += 1
        try:
            affinity.apart(call.placement, call.work, i)
        except BaseException as e:
            call.fail(pool, e)
        finally:
            with pool.lock:
                call.running -= 1
                if not call.running:
                    call.done.notify_all()
        call = None  # idle threads keep no call's arrays alive


_pool = _Pool()


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: a fresh pool, started on first use;
    each :class:`ForkLock` made anew at its first use."""
    global _pool, _forks, _remaking
    _pool = _Pool()
    _forks += 1
    _remaking = threading.Lock()


#: forks this process descends from (counted by a fork hook, not a weak set of locks:
#: a weak set's callbacks run Python code as each goes, where a Ctrl-C is dropped)
_forks = 0
_remaking = threading.Lock()


class ForkLock:
    """A ``threading.Lock`` (an ``RLock`` where ``reentrant``) that a forked child makes
    anew at its first use there: the parent's may be held by a thread the child does
    not have (a thread of the parent inside it as another forked: the child's first
    use waited for good). Used as the lock: ``with``, :meth:`acquire`, :meth:`release`.
    """

    __slots__ = ("_factory", "_forks", "_lock")

    def __init__(self, reentrant: bool = False) -> None:
        self._factory = threading.RLock if reentrant else threading.Lock
        self._lock = self._factory()
        self._forks = _forks

    def _current(self) -> Any:
        if self._forks != _forks:
            with _remaking:
                if self._forks != _forks:
                    self._lock = self._factory()
                    self._forks = _forks
        return self._lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._current().acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._current().acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


class _HeldLock:
    """A reentrant lock that tells whether this thread holds it (:meth:`held`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = threading.local()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth.count = getattr(self._depth, "count", 0) + 1
        return got

    def release(self) -> None:
        self._depth.count -= 1
        self._lock.release()

    def held(self) -> bool:
        return getattr(self._depth, "count", 0) > 0

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


#: held while the kernels compile or a backend is imported (:func:`compiling`,
#: :mod:`.runtime.hosts`): a fork waits for it, as the child would wait forever for
#: the locks that thread held (numba's compiler lock, a module's import lock). Its
#: hook is registered after logging's, so that it runs before it: the compiling
#: thread may need logging's lock, which logging's own hook takes
COMPILING = _HeldLock()


def _exit_past_a_compile() -> None:
    """At exit, where another thread still compiles (one that Ctrl-C left running on its
    daemon thread, :func:`compiling`), have C's exit end with ``_exit`` before its
    handlers: they destroy LLVM's global context under that compile, which then dies
    (SIGABRT, SIGSEGV). Python's own finalization (its buffers flushed) is done by
    then; glibc's ``on_exit`` hands ``_exit`` the status. Elsewhere nothing is done."""
    if COMPILING.acquire(blocking=False):  # no other thread compiles
        COMPILING.release()
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        on_exit, _exit = libc.on_exit, libc._exit
    except (OSError, AttributeError):  # not glibc
        return
    on_exit.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    on_exit(ctypes.cast(_exit, ctypes.c_void_p), None)  # the last added runs first


#: while a fork waits for :data:`COMPILING`: the SIGINT handler it replaced, and the
#: interrupts that came meanwhile
_fork_handler: list[Any] = []
_fork_interrupts: list[int] = []


def _before_fork() -> None:
    """Take :data:`COMPILING` for the fork, with Ctrl-C recorded meanwhile, not raised:
    os.fork drops a hook's exception, so an interrupt while it waited here let the fork
    go on without the lock (the child could hang on the locks the compiling thread
    held) and was lost. It is raised in the parent once the fork is done."""
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None and previous != signal.SIG_IGN:
                signal.signal(signal.SIGINT, lambda signum, frame: _fork_interrupts.append(1))
                _fork_handler.append(previous)
        except (ValueError, OSError):  # not the main interpreter
            pass
    COMPILING.acquire()


def _handler_back() -> Any:
    """The SIGINT handler :func:`_before_fork` replaced, back; it, where an interrupt
    came meanwhile (else None)."""
    came = bool(_fork_interrupts)
    _fork_interrupts.clear()
    if not _fork_handler:
        return None
    handler = _fork_handler.pop()
    signal.signal(signal.SIGINT, handler)
    return handler if came else None


def _after_fork_in_parent() -> None:
    COMPILING.release()
    handler = _handler_back()
    if handler is None:
        return
    # raised here (any call checks for it), it would be dropped as the hook's: sent
    # again a moment later, once os.fork has returned (a signal: it ends a sleep)
    again = (threading.main_thread().ident, signal.SIGINT)
    try:
        threading.Timer(POLL, signal.pthread_kill, again).start()
    except RuntimeError:  # no thread to be had: now (dropped, but said)
        signal.pthread_kill(*again)


def _after_fork_in_child_released() -> None:
    _handler_back()
    COMPILING.release()


atexit.register(_exit_past_a_compile)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child_released,
    )


def compiling(work: Callable[[], T]) -> T:
    """``work()`` (a compile, a cache load, an import of the kernels) holding
    :data:`COMPILING`, where Ctrl-C cannot stop it half-way (an interrupt inside
    numba's compiler can leave its lock held, and a pool thread waiting for that lock
    hangs the process).

    On the main thread, where it does not hold :data:`COMPILING` already, ``work``
    runs on a thread of its own (in a copy of this context) that the main thread
    waits for: Ctrl-C raises ``KeyboardInterrupt`` at once (a first compile takes up
    to a minute a kernel; it was held off until then) while ``work`` ends and is kept
    in the background (a daemon thread: an exit does not wait for it). Elsewhere,
    inside such work, or where no thread can be started, on this thread with Ctrl-C
    held off until it ends (:func:`interrupts_held`).
    """
    main = threading.current_thread() is threading.main_thread()
    if main and not COMPILING.held():
        done: list[tuple[bool, Any]] = []
        context = contextvars.copy_context()

        def run() -> None:
            try:
                if hasattr(signal, "pthread_sigmask"):  # Ctrl-C to the main thread
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                with COMPILING:
                    done.append((True, context.run(work)))
            except BaseException as e:  # the caller's
                done.append((False, e))

        thread = threading.Thread(target=run, name="onnx-recurrent-compile", daemon=True)
        try:
            # a handler's exception inside Thread.start left threading's books wrong
            # (KeyError: <Thread(onnx-recurrent-compile...)>, and tracebacks printed)
            with interrupts_held():
                thread.start()
        except RuntimeError:  # no thread to be had (a limit): on this one
            pass
        else:
            while thread.is_alive():  # Ctrl-C: KeyboardInterrupt here; a timeout, so
                thread.join(0.1)  # that it is seen wherever the signal landed
            ok, value = done[0]
            if not ok:
                raise value
            return value
    with COMPILING, interrupts_held():
        return work()


def run(
    parties: int,
    work: Callable[[int], None],
    abort: Callable[[], None],
    *,
    placement: bool = False,
) -> None:
    """Call ``work(0)`` on the calling thread and ``work(1)`` ... ``work(parties-1)`` on
    pool threads, and return when all have returned.

    The work is claimed dynamically by the callers of ``work``, so a helper that starts
    late or never is harmless: once ``work(0)`` has returned, helpers that have not yet
    started are cancelled (never run), and only the started ones are waited for.

    If any ``work(i)`` raises, or the calling thread is interrupted (KeyboardInterrupt,
    any BaseException) while running ``work(0)`` or while waiting, ``abort()`` is called
    once (it must make running ``work(i)`` return soon); the started helpers are waited
    for, then the caller's interrupt is re-raised, else the first exception, unchanged
    (same object, traceback kept). Waiting is done in timed waits of :data:`POLL`
    seconds, so that a signal is handled promptly in the main thread.

    Parameters
    ----------
    parties : int
        Threads for the call, the calling one included (>= 1; 1 runs ``work(0)`` only).
    work : callable
        ``work(i)``, for ``i`` in ``range(parties)``.
    abort : callable
        Makes running ``work(i)`` return soon; called at most once per call.
    placement : bool
        Keep the calling thread on its CPU and the helpers off it for the call
        (:func:`onnx_recurrent.affinity.spread`); the masks are restored afterwards.
    """
    if parties < 1:
        raise ValueError(f"parties must be at least 1, not {parties}")
    pool = _pool
    if parties < 2:
        context: Any = nullcontext()
    else:
        pool.grow(parties - 1)  # before pinning: new threads inherit the caller's mask
        if placement:
            context = affinity.spread()
        else:  # the helpers only kept to the caller's mask, which may have changed
            mask = affinity.caller_mask()
            context = nullcontext(None if mask is None else affinity.within(mask))
    with context as where:
        placed = []
        if where is not None and len(pool.threads) == parties - 1:
            # the helpers (all of them: the ones woken) put on their CPUs before they
            # wake, not by themselves once running, which may first wait for a
            # timeslice on the caller's busy CPU (measured: 1.4-2.2 ms after a pause)
            placed = [thread.native_id for thread in pool.threads]
            for native_id in placed:
                affinity.place(native_id, where[0])
        call = _Call(pool, work, abort, where)
        try:
            _run(pool, call, parties)
        finally:
            for native_id in placed:  # those whose helper was cancelled unseen: back
                if native_id not in call.seen:
                    affinity.back(native_id, where[0], where[1])
            call = None  # no cycle through a raised exception's traceback


def _run(pool: _Pool, call: _Call, parties: int) -> None:
    mine = None  # the calling thread's exception
    try:
        if parties > 1:
            with pool.lock:
                pool.queue.extend((call, i) for i in range(1, parties))
                pool.ready.notify(parties - 1)
        call.work(0)
    except BaseException as e:
        mine = e
        call.fail(pool, e)
    while True:
        try:
            call.close(pool)
            call.wait(pool)
            break
        except BaseException as e:
            if mine is not None and not isinstance(mine, Exception):
                raise  # interrupted again: the aborted helpers end on their own
            mine = e
            call.fail(pool, e)
    error = mine if mine is not None and not isinstance(mine, Exception) else call.error
    if error is not None:
        try:
            raise error
        finally:
            error = mine = None
