"""The pool (threads.py): parties, cancellation, errors, Ctrl-C, fork, no leak, no spin.

Anything that could hang runs in a daemon thread joined with a timeout (:func:`_within`)
or in a subprocess with a timeout (:func:`_python`), so a regression fails, not hangs.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import onnx_recurrent
from onnx_recurrent import scan, threads
from onnx_recurrent.errors import RecurrentError

TIMEOUT = 60  # seconds: only a hang gets near it


def _within(seconds: float, fn, *args):
    """``fn(*args)`` on a daemon thread (also: the pool used from a thread that is not
    the main one); fails if it has not returned after ``seconds``."""
    result: list = []

    def target():
        try:
            result.append(("ok", fn(*args)))
        except BaseException as e:
            result.append(("error", e))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} still running after {seconds} s: a hang"
    kind, value = result[0]
    if kind == "error":
        raise value
    return value


def _sigint_default() -> None:
    """In a child before it starts: SIGINT to its default (a shell's background job
    inherits it ignored, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _python(*code: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT) -> str:
    """Run the pieces of ``code`` (each dedented) in a fresh interpreter; its stdout.
    Fails on an error or a timeout."""
    environment = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            [sys.executable, "-c", "".join(textwrap.dedent(piece) for piece in code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
            preexec_fn=_sigint_default if os.name == "posix" else None,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"subprocess still running after {timeout} s (a hang):\n{e.stderr}")
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("onnx-recurrent")]


# --- num_threads ---------------------------------------------------------------------


def test_num_threads_default_is_the_cpus_this_process_may_use(monkeypatch):
    """Without a CPU quota (tests/test_cpu_quota.py has those): the affinity."""
    from onnx_recurrent import quota

    monkeypatch.setattr(quota, "cpus", lambda root="/": None)
    monkeypatch.delenv(threads.ENV, raising=False)
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    assert threads.num_threads() == (expected or os.cpu_count())
    monkeypatch.setenv(threads.ENV, "")  # set but empty: as unset
    assert threads.num_threads() == (expected or os.cpu_count())


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3), (" 12 ", 12)])
def test_num_threads_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(threads.ENV, value)
    assert threads.num_threads() == expected


@pytest.mark.parametrize(
    "value", ["abc", "0", "-1", "1.5", "2x", "+3", "٣", "0x4", "4097", "99999999999999999999"]
)
def test_num_threads_rejects_anything_but_a_positive_integer(monkeypatch, value):
    monkeypatch.setenv(threads.ENV, value)
    with pytest.raises(RecurrentError) as info:
        threads.num_threads()
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert threads.ENV in message and repr(value.strip()) in message
    assert "positive integer" in message


# --- run: parties, errors, cancellation ----------------------------------------------


def _record(parties: int, **kwargs) -> tuple[list, list]:
    seen = [None] * parties
    aborts = []
    meet = threading.Barrier(parties, timeout=TIMEOUT)  # work(0) waits for every helper

    def work(i):
        seen[i] = threading.get_ident()
        meet.wait()

    _within(TIMEOUT, threads.run, parties, work, lambda: aborts.append(1), **kwargs)
    return seen, aborts


@pytest.mark.parametrize("parties", [1, 2, 3, 8])
def test_every_party_runs_once_and_its_result_is_visible(parties):
    seen, aborts = _record(parties)
    assert all(ident is not None for ident in seen)
    assert len(set(seen)) == parties  # each on its own thread
    assert not aborts


def test_parties_below_one_are_rejected():
    with pytest.raises(ValueError, match="parties"):
        threads.run(0, lambda i: None, lambda: None)


def test_a_helpers_exception_propagates_unchanged_after_abort():
    error = ZeroDivisionError("helper 2 failed")
    stop = threading.Event()
    aborts = []
    ended = []

    def work(i):
        try:
            if i == 2:
                raise error
            assert stop.wait(TIMEOUT), "abort() was never called"  # runs until aborted
        finally:
            ended.append(i)

    def abort():
        aborts.append(1)
        stop.set()

    with pytest.raises(ZeroDivisionError) as info:
        _within(TIMEOUT, threads.run, 3, work, abort)
    assert info.value is error
    assert aborts == [1]
    assert sorted(ended) == [0, 1, 2]  # the started helpers were waited for
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "work" in frames  # the helper's own traceback is kept


def test_the_first_exception_wins_and_abort_is_called_once():
    first = KeyError("first")
    aborted = threading.Event()
    aborts = []

    def work(i):
        if i == 1:
            raise first
        assert aborted.wait(TIMEOUT)
        raise RuntimeError(f"party {i} saw the abort")  # later: not the one raised

    def abort():
        aborts.append(1)
        aborted.set()

    with pytest.raises(KeyError) as info:
        _within(TIMEOUT, threads.run, 4, work, abort)
    assert info.value is first
    assert aborts == [1]


def test_the_callers_exception_propagates_after_helpers_end():
    error = ValueError("caller failed")
    stop = threading.Event()
    ended = []

    started = threading.Event()

    def work(i):
        if i == 0:
            assert started.wait(TIMEOUT)  # the helper has taken its work
            raise error
        started.set()
        assert stop.wait(TIMEOUT)
        ended.append(i)

    with pytest.raises(ValueError) as info:
        _within(TIMEOUT, threads.run, 2, work, stop.set)
    assert info.value is error
    assert ended == [1]


def test_late_helpers_are_cancelled_not_waited_for():
    """A call whose helpers find every pool thread busy returns when work(0) does."""
    helpers = max(2, len(threads._pool.threads))  # the pool will have exactly this many
    busy = threading.Event()
    release = threading.Event()
    started = []

    def occupy(i):
        started.append(i)
        if len(started) == helpers + 1:
            busy.set()
        assert release.wait(TIMEOUT)

    other = threading.Thread(target=threads.run, args=(helpers + 1, occupy, release.set))
    other.start()
    try:
        assert busy.wait(TIMEOUT), "the pool never ran the first call's helpers"
        ran = []
        t0 = time.perf_counter()
        _within(TIMEOUT, threads.run, 3, ran.append, lambda: None)
        assert time.perf_counter() - t0 < 1.0
        assert ran == [0]
    finally:
        release.set()
        other.join(TIMEOUT)
    assert not other.is_alive()
    time.sleep(0.1)
    assert ran == [0]  # cancelled helpers never run, even once threads are free


def test_concurrent_callers_share_the_pool_without_deadlock():
    """Several threads call run() at once; work claimed from a shared counter."""
    results = {}

    def call(key: int, parties: int):
        pieces = list(range(200))
        lock = threading.Lock()
        done = []

        def work(i):
            while True:
                with lock:
                    if not pieces:
                        return
                    piece = pieces.pop()
                done.append(piece)
                time.sleep(0.0005)

        threads.run(parties, work, lambda: None)
        results[key] = sorted(done)

    callers = [threading.Thread(target=call, args=(k, 2 + k % 7)) for k in range(12)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(TIMEOUT)
    assert not any(caller.is_alive() for caller in callers), "deadlock"
    assert all(results[k] == list(range(200)) for k in range(12))


def test_nested_run_from_a_helper_completes():
    seen = []

    def inner(i):
        seen.append(("inner", i))

    meet = threading.Barrier(4, timeout=TIMEOUT)

    def outer(i):
        meet.wait()  # every outer party runs: the pool is busy with them
        threads.run(3, inner, lambda: None)  # so inner helpers may have to wait

    _within(TIMEOUT, threads.run, 4, outer, lambda: None)
    assert sum(1 for kind, i in seen if i == 0) == 4  # each outer party ran its inner work(0)


def test_placement_pins_for_the_call_and_restores_every_mask():
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no affinity, or one CPU")
    before = os.sched_getaffinity(0)
    masks = {}
    meet = threading.Barrier(3, timeout=TIMEOUT)

    def work(i):
        masks[i] = (threading.get_native_id(), os.sched_getaffinity(0))
        meet.wait()  # the masks are seen while every party runs

    def body(fail: bool):
        def maybe_failing(i):
            work(i)
            if fail and i == 1:
                raise OSError("helper failed")

        threads.run(3, maybe_failing, lambda: None, placement=True)
        return os.sched_getaffinity(0)

    for fail in (False, True):
        masks.clear()
        meet.reset()
        try:
            after = _within(TIMEOUT, body, fail)
        except OSError:
            assert fail
        else:
            assert not fail and after == before
        caller = masks[0][1]
        assert len(caller) == 1  # the caller on its CPU...
        for i in (1, 2):
            tid, mask = masks[i]
            assert not mask & caller  # ...the helpers off it...
            assert os.sched_getaffinity(tid) == before  # ...and back afterwards
    assert os.sched_getaffinity(0) == before


def test_placement_puts_the_helpers_off_the_callers_cpu_before_they_wake(monkeypatch):
    """A helper is moved off the caller's CPU before it is woken, not by itself once
    running: woken on the caller's CPU (Linux does that after a pause), it would first
    wait there behind the caller's work (measured: 1.4-2.2 ms after a 20-100 ms pause)."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no affinity, or one CPU")
    from onnx_recurrent import affinity

    monkeypatch.setattr(affinity, "apart", lambda placement, fn, *args: fn(*args))
    monkeypatch.setattr(threads, "_pool", threads._Pool())  # one helper: the one woken
    before = os.sched_getaffinity(0)
    masks = {}
    meet = threading.Barrier(2, timeout=TIMEOUT)

    def work(i):
        masks[i] = os.sched_getaffinity(0)
        meet.wait()

    _within(TIMEOUT, lambda: threads.run(2, work, lambda: None, placement=True))
    assert len(masks[0]) == 1 and not masks[1] & masks[0], masks
    assert os.sched_getaffinity(0) == before


def _two_cpus() -> set[int]:
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no affinity, or one CPU")
    return os.sched_getaffinity(0)


def _every_thread_on(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # ended meanwhile
            pass


@pytest.mark.parametrize("placement", [True, False])
def test_a_mask_set_from_outside_during_a_call_is_kept(placement):
    # `taskset -a -p -c N PID` during a call: the caller's and the helpers' masks were
    # put back afterwards, and the threads ran outside the new mask
    from onnx_recurrent import affinity

    before = _two_cpus()
    meet = threading.Barrier(2, timeout=TIMEOUT)
    target: set[int] = set()
    caller = []

    def work(i):
        if i == 0:  # a CPU other than the caller's, whose pin would otherwise match it
            target.add(min(before - {affinity.cpu()}))
            caller.append(threading.get_native_id())
        meet.wait()
        if i == 0:
            _every_thread_on(target)
        meet.wait()

    def body():
        threads.run(2, work, lambda: None, placement=placement)
        return os.sched_getaffinity(0)

    try:
        after = _within(TIMEOUT, body)
        time.sleep(0.05)
        masks = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
        masks[caller[0]] = after  # the caller's thread has ended
        if placement and len(before) == 2:
            # the helpers were placed on the one other CPU, the very mask set from
            # outside: a change that cannot be told from none
            masks = {caller[0]: after}
        assert all(m == target for m in masks.values()), (target, masks)
    finally:
        _every_thread_on(before)


@pytest.mark.parametrize("placement", [True, False])
def test_helpers_keep_to_a_callers_mask_narrowed_after_the_pool_started(placement, monkeypatch):
    # the pool's threads kept the mask they started with: narrowed to one CPU, the
    # caller's helpers still ran on the others
    before = _two_cpus()
    monkeypatch.setattr(threads, "_pool", threads._Pool())
    _within(TIMEOUT, threads.run, 2, lambda i: None, lambda: None)  # the pool started
    one = {min(before)}
    masks = {}

    def body():
        os.sched_setaffinity(0, one)
        meet = threading.Barrier(2, timeout=TIMEOUT)

        def work(i):
            masks[i] = os.sched_getaffinity(0)
            meet.wait()

        threads.run(2, work, lambda: None, placement=placement)

    _within(TIMEOUT, body)
    assert masks[0] == one and masks[1] <= one, masks


def test_a_helper_cancelled_before_it_ran_gets_its_mask_back(monkeypatch):
    # helpers are placed before they are woken; one whose work the caller had already
    # finished never ran, and kept the CPUs it was placed on (about 40% of such calls)
    before = _two_cpus()
    monkeypatch.setattr(threads, "_pool", threads._Pool())  # one helper: placed each time
    stale = 0
    for _ in range(200):
        _within(TIMEOUT, lambda: threads.run(2, lambda i: None, lambda: None, placement=True))
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if all(os.sched_getaffinity(t.native_id) == before for t in threads._pool.threads):
                break
            time.sleep(0.002)
        else:
            stale += 1
    assert stale == 0


# --- the pool: bounded, idle, interrupt, fork (fresh interpreters) --------------------


def test_the_pool_grows_to_the_largest_ask_and_idles_without_cpu():
    out = _python(
        """
        import threading, time
        from onnx_recurrent import threads
        def count():
            return sum(t.name.startswith("onnx-recurrent") for t in threading.enumerate())
        counts = []
        for parties in (3, 5, 3, 2, 5):  # 2, 4, 2, 1, 4 helpers
            threads.run(parties, lambda i: None, lambda: None)
            counts.append(count())
        names = sorted(t.name for t in threading.enumerate() if t.name.startswith("onnx"))
        time.sleep(0.1)
        t0 = time.process_time()
        time.sleep(0.5)
        print((counts, names, time.process_time() - t0))
        """
    )
    counts, names, cpu = ast.literal_eval(out)
    assert counts == [2, 4, 4, 4, 4]
    assert names == [f"onnx-recurrent-{k}" for k in (1, 2, 3, 4)]
    assert cpu < 0.05, f"idle threads used {cpu:.3f} s of CPU in 0.5 s: spinning"


_INTERRUPT = """
    import _thread, threading, time
    from onnx_recurrent import threads
    started, stop = threading.Event(), threading.Event()
    aborts, ended = [], []
    def work(i):
        if i == 0:
            assert started.wait(10)  # the helper has taken its work
            {work0}
        else:
            started.set()
            while not stop.is_set():  # a helper that runs until aborted
                time.sleep(0.001)
            ended.append(i)
    def abort():
        aborts.append(time.perf_counter())
        stop.set()
    interrupted = []
    def interrupt():
        interrupted.append(time.perf_counter())
        _thread.interrupt_main()
    threading.Timer(0.2, interrupt).start()
    try:
        threads.run(2, work, abort)
    except KeyboardInterrupt:
        caught = time.perf_counter()
    else:
        raise SystemExit("no KeyboardInterrupt")
    assert ended == [1], ended
    assert len(aborts) == 1, aborts
    latency = caught - interrupted[0]
    # the library is usable afterwards, and nothing spins
    seen = []
    for parties in (2, 3):
        meet = threading.Barrier(parties, timeout=10)  # work(0) waits for the helpers
        threads.run(parties, lambda i: (seen.append(i), meet.wait()), lambda: None)
    assert sorted(seen) == [0, 0, 1, 1, 2], seen
    time.sleep(0.1)
    t0 = time.process_time()
    time.sleep(0.3)
    print(latency, time.process_time() - t0)
"""


@pytest.mark.parametrize(
    "work0",
    [
        "return  # the caller waits on the helper",
        "while True: time.sleep(0.01)  # the caller is in its own work",
    ],
    ids=["while-waiting", "in-work0"],
)
def test_ctrl_c_interrupts_promptly_and_leaves_the_pool_usable(work0):
    out = _python(_INTERRUPT.replace("{work0}", work0), timeout=30)
    latency, cpu = map(float, out.split())
    assert latency < 0.5, f"KeyboardInterrupt {latency:.3f} s after the interrupt"
    assert cpu < 0.05, f"{cpu:.3f} s of CPU in 0.3 s after the interrupt: a helper spins"


def test_a_forked_child_gets_a_fresh_pool():
    out = _python(
        """
        import multiprocessing, threading
        from onnx_recurrent import threads
        def use(parties):
            seen = [None] * parties
            meet = threading.Barrier(parties, timeout=10)
            def work(i):
                seen[i] = threading.current_thread().name
                meet.wait()
            threads.run(parties, work, lambda: None)
            return seen
        def child(conn):
            conn.send((use(3), use(4)))
        parent = use(3)  # the parent's pool exists and is idle
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=child, args=(send,))
        process.start()
        ok = receive.poll(20)
        process.join(5)
        if process.is_alive():
            process.kill()
        if not ok:
            raise SystemExit("the forked child hung in run()")
        print(parent, *receive.recv(), process.exitcode, sep="\\n")
        """
    )
    _, first, second, exitcode = out.splitlines()
    assert exitcode == "0"
    assert "None" not in first + second  # every party ran in the child
    assert sorted(ast.literal_eval(first)[1:]) == ["onnx-recurrent-1", "onnx-recurrent-2"]


def test_a_child_forked_during_a_call_in_another_thread_works():
    """The fork happens while a pool thread is busy (and may hold the pool's lock)."""
    out = _python(
        """
        import os, threading, time
        from onnx_recurrent import threads
        release = threading.Event()
        busy = threading.Thread(
            target=threads.run, args=(3, lambda i: release.wait(10), release.set)
        )
        busy.start()
        time.sleep(0.1)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            seen = []
            meet = threading.Barrier(4, timeout=10)
            threads.run(4, lambda i: (seen.append(i), meet.wait()), lambda: None)
            os.write(write, repr(sorted(seen)).encode())
            os._exit(0)
        os.close(write)
        import select
        ready, _, _ = select.select([read], [], [], 20)
        if not ready:
            os.kill(pid, 9)
            raise SystemExit("the forked child hung in run()")
        print(os.read(read, 100).decode())
        os.waitpid(pid, 0)
        release.set()
        busy.join(10)
        """
    )
    assert out.strip() == "[0, 1, 2, 3]"


FORK_WHILE_COMPILING = """
import os, signal, threading, time
from onnx_recurrent import threads

held = threading.Event()

def compile_for_a_second():  # another thread's compile, holding COMPILING
    with threads.COMPILING:
        held.set()
        time.sleep(1.0)

threading.Thread(target=compile_for_a_second).start()
held.wait()
main = threading.main_thread().ident
threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT)).start()  # Ctrl-C
started = time.monotonic()
try:
    pid = os.fork()
except KeyboardInterrupt:
    raise SystemExit("os.fork raised KeyboardInterrupt")
if pid == 0:
    with threads.COMPILING:  # the child has the lock to itself
        os._exit(7)
waited = time.monotonic() - started
try:
    time.sleep(5)
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic() - started - waited:.2f} s after the fork", flush=True)
_, status = os.waitpid(pid, 0)
print(f"waited {waited:.1f} child {os.waitstatus_to_exitcode(status)}", flush=True)
"""


def test_ctrl_c_while_a_fork_waits_for_a_compile_comes_after_the_fork():
    """os.fork drops an exception of its hooks: a Ctrl-C while its hook waited for
    another thread's compile was printed ("Exception ignored"), lost, and the fork went
    on without the lock (the child could hang on the compiling thread's locks; the hooks
    after it failed, releasing what they had not taken). Now the fork waits for the
    compile, and the Ctrl-C is raised in the parent once the fork is done."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_COMPILING],
        capture_output=True, text=True, timeout=60,
        preexec_fn=_sigint_default if os.name == "posix" else None,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    interrupted, waited = done.stdout.splitlines()
    assert interrupted.startswith("interrupted") and float(interrupted.split()[1]) < 1.0
    seconds, child = float(waited.split()[1]), waited.split()[3]
    assert seconds >= 0.6 and child == "7", done.stdout


def test_a_child_forked_while_a_layer_prepares_calls_that_layer():
    """A fork while another thread made a ``Layer(prepare=False)``'s first call: the
    child inherited the layer's lock held by a thread it does not have, and hung on its
    own call of that layer (8 children in 12)."""
    out = _python(
        """
        import os, signal, threading, time
        import numpy as np
        import onnx_recurrent as orc
        rng = np.random.default_rng(0)
        W = rng.standard_normal((1, 12, 3), dtype=np.float32)
        R = rng.standard_normal((1, 12, 4), dtype=np.float32)
        X = rng.standard_normal((2, 1, 3), dtype=np.float32)
        want = orc.Layer("GRU", W, R)(X)[1]
        layer = orc.Layer("GRU", W, R, prepare=False)
        preparing, done = threading.Event(), threading.Event()

        def first_call():  # the prepare in progress as the fork comes
            with layer._preparing:
                preparing.set()
                done.wait(10)
            layer(X)

        threading.Thread(target=first_call).start()
        preparing.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a hang: killed
            os._exit(0 if np.array_equal(layer(X)[1], want) else 1)
        done.set()
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert out.strip() == "0", out


def test_a_child_forked_while_another_thread_holds_our_locks_goes_on():
    """A fork while another thread was inside the functions' kept layers, a stream's
    step or the native nodes' registration: the child inherited those locks held by a
    thread it does not have and hung on its first call (10 children in 10 with the
    functions on changing weights); a stream refused every step ("another thread's
    step runs"). Each such lock is a :class:`threads.ForkLock`, made anew in a child."""
    pytest.importorskip("onnxruntime_extensions")
    out = _python(
        """
        import os, signal, threading, warnings
        from importlib import resources
        import numpy as np
        import onnx_recurrent as orc
        from onnx_recurrent import prepared
        from onnx_recurrent.runtime.hosts import native
        warnings.simplefilter("ignore")
        rng = np.random.default_rng(0)
        W = rng.standard_normal((1, 12, 3), dtype=np.float32)
        R = rng.standard_normal((1, 12, 4), dtype=np.float32)
        X = rng.standard_normal((2, 1, 3), dtype=np.float32)
        want = orc.Layer("GRU", W + 1, R)(X)[1]
        example = str(resources.files("onnx_recurrent") / "data" / "example_gru.onnx")
        x = rng.standard_normal((1, 3, 16), dtype=np.float32)
        stream = orc.StreamingSession(example, host="reference")
        first = orc.StreamingSession(example, host="reference").step({"x": x})
        orc.InferenceSession(example, host="onnxruntime")  # registered
        locks = [prepared._lock, stream._stepping, native._setup_lock]
        holding, done = threading.Event(), threading.Event()

        def hold():
            for lock in locks:
                lock.acquire()
            holding.set()
            done.wait(30)
            for lock in locks:
                lock.release()

        threading.Thread(target=hold).start()
        holding.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hang: killed
            ok = np.array_equal(orc.gru(X, W + 1, R)[1], want)  # weights not kept
            ok = ok and all(map(np.array_equal, stream.step({"x": x}), first))
            session = orc.InferenceSession(example, host="onnxruntime")
            ok = ok and np.array_equal(session.run(None, {"x": x})[0], first[0])
            os._exit(0 if ok else 1)
        done.set()
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert out.strip() == "0", out


def test_a_fork_lock_acquires_and_releases_as_the_lock_it_holds():
    for reentrant in (False, True):
        lock = threads.ForkLock(reentrant=reentrant)
        with lock:
            assert not lock.acquire(blocking=False) or reentrant
            if reentrant:
                lock.release()
        assert lock.acquire(timeout=1)
        lock.release()


# --- end to end, through the public functions -------------------------------------

_LSTM = """
    import numpy as np
    import onnx_recurrent
    def lstm_inputs(T, N, I, H, D=1, seed=0):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((T, N, I), dtype=np.float32)
        W = rng.standard_normal((D, 4 * H, I), dtype=np.float32) * 0.05
        R = rng.standard_normal((D, 4 * H, H), dtype=np.float32) * 0.05
        B = rng.standard_normal((D, 8 * H), dtype=np.float32) * 0.05
        return X, W, R, B
"""


def test_end_to_end_a_child_forked_after_a_threaded_call_computes_the_same():
    out = _python(
        _LSTM,
        """
        import multiprocessing
        inputs = lstm_inputs(100, 32, 256, 256)
        expected = onnx_recurrent.lstm(*inputs)  # threads (T=100, N=32, I=H=256)
        def child(conn):
            got = onnx_recurrent.lstm(*inputs)
            conn.send(all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True)))
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=child, args=(send,))
        process.start()
        if not receive.poll(30):
            process.kill()
            raise SystemExit("the forked child hung in lstm()")
        same = receive.recv()
        process.join(10)
        print(same, process.exitcode)
        """,
        env={threads.ENV: "4"},
        timeout=120,
    )
    assert out.split() == ["True", "0"]


@pytest.mark.parametrize(
    ("count", "direction"), [("2", "forward"), ("2", "bidirectional"), ("4", "forward")]
)
def test_end_to_end_ctrl_c_interrupts_a_long_threaded_call_promptly(count, direction):
    out = _python(
        _LSTM,
        f"""
        direction, D = {direction!r}, {2 if direction == "bidirectional" else 1}
        """,
        """
        import _thread, threading, time
        small = lstm_inputs(100, 32, 64, 256, D)
        expected = onnx_recurrent.lstm(*small, direction=direction)
        # compiled before the interrupt, which must not land in numba's compiler
        onnx_recurrent.lstm(*small, direction=direction, output_sequence=False)
        # 4x the steps of T=3000, N=32, H=256: a call that cannot be interrupted
        # ends well after 0.5 s
        X, W, R, B = lstm_inputs(12000, 32, 64, 256, D)
        interrupted = []
        def interrupt():
            interrupted.append(time.perf_counter())
            _thread.interrupt_main()
        threading.Timer(0.3, interrupt).start()
        t0 = time.perf_counter()
        try:
            onnx_recurrent.lstm(X, W, R, B, direction=direction, output_sequence=False)
        except KeyboardInterrupt:
            caught = time.perf_counter()
        else:
            raise SystemExit(f"the call ended ({time.perf_counter() - t0:.2f} s) first")
        again = onnx_recurrent.lstm(*small, direction=direction)
        same = all(np.array_equal(a, b) for a, b in zip(expected, again, strict=True))
        print(caught - interrupted[0], same)
        """,
        env={threads.ENV: count},
        timeout=120,
    )
    latency, same = out.split()
    assert float(latency) < 0.5, f"KeyboardInterrupt {float(latency):.3f} s after the interrupt"
    assert same == "True"


def _case(op: str, direction: str, seed: int = 0) -> dict:
    """Inputs of M's order: 2**26 to 2**28 multiply-adds, on threads from 2**23 (the
    tests set scan.PARALLEL_MACS so, whatever this CPU's plan says)."""
    T, N, I, H = 100, 24, 128, 128
    D = 2 if direction == "bidirectional" else 1
    G = {"gru": 3, "lstm": 4, "rnn": 1}[op]
    rng = np.random.default_rng(seed)
    return dict(
        X=rng.standard_normal((T, N, I), dtype=np.float32),
        W=rng.standard_normal((D, G * H, I), dtype=np.float32) * 0.1,
        R=rng.standard_normal((D, G * H, H), dtype=np.float32) * 0.1,
        B=rng.standard_normal((D, 2 * G * H), dtype=np.float32) * 0.1,
        direction=direction,
    )


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize(
    ("op", "attributes"),
    [
        ("gru", {"linear_before_reset": 0}),
        ("gru", {"linear_before_reset": 1}),
        ("lstm", {}),
        ("rnn", {}),
    ],
    ids=["gru-lbr0", "gru-lbr1", "lstm", "rnn"],
)
def test_end_to_end_every_thread_count_gives_the_same_bits(monkeypatch, op, attributes, direction):
    fn = getattr(onnx_recurrent, op)
    inputs = _case(op, direction)
    monkeypatch.setattr(scan, "PARALLEL_MACS", 1 << 23)
    results = {}
    for count in range(1, 9):
        monkeypatch.setenv(threads.ENV, str(count))
        results[count] = _within(TIMEOUT, lambda: fn(**inputs, **attributes))
    for count in range(2, 9):
        for a, b in zip(results[1], results[count], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{count} threads")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "99999999999999999999"])
def test_end_to_end_a_bad_thread_count_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(threads.ENV, value)
    with pytest.raises(ValueError, match=threads.ENV):
        onnx_recurrent.lstm(**_case("lstm", "forward"))


@pytest.mark.parametrize("value", ["abc", "0", "5000"])
def test_a_bad_thread_count_stops_a_small_call_too(monkeypatch, value):
    """A call too small for threads does not read the variable; the layer it makes
    does (a bad value went unnoticed until the first large call)."""
    feeds = {"X": np.ones((2, 1, 3), np.float32), "W": np.ones((1, 12, 3), np.float32)}
    feeds["R"] = np.ones((1, 12, 3), np.float32)
    monkeypatch.setenv(threads.ENV, value)
    with pytest.raises(ValueError, match=threads.ENV):
        onnx_recurrent.lstm(**feeds)
    with pytest.raises(ValueError, match=threads.ENV):
        onnx_recurrent.Layer("LSTM", feeds["W"], feeds["R"])


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (threads.ENV, "abc"),
        (threads.ENV, "99999999999999999999"),
        ("ONNX_RECURRENT_BACKEND", "bogus"),
    ],
)
def test_a_bad_variable_stops_a_session_under_either_host(monkeypatch, variable, value):
    # under the onnxruntime host it failed inside onnxruntime: "auto" fell back to the
    # reference host with a warning, or (a huge count) "Python int too large to convert
    # to C long"; the onnxruntime host never read ONNX_RECURRENT_BACKEND
    pytest.importorskip("onnxruntime_extensions")
    from models import node_model, random_inputs

    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    model = node_model("GRU", feeds, {"hidden_size": 5})
    monkeypatch.setenv(variable, value)
    for host in ("auto", "onnxruntime", "reference"):
        with pytest.raises(ValueError, match=variable):
            onnx_recurrent.InferenceSession(model, host=host).run(None, feeds)
    monkeypatch.setenv("ONNX_RECURRENT_BACKEND", "")  # empty: unset, as the others
    monkeypatch.delenv(threads.ENV, raising=False)
    assert onnx_recurrent.InferenceSession(model, host="reference").run(None, feeds)


def test_end_to_end_thread_counts_leave_a_bounded_pool():
    out = _python(
        _LSTM,
        """
        import os, threading
        inputs = lstm_inputs(100, 32, 256, 256)
        counts = []
        for count in (2, 4, 8, 2):
            os.environ["ONNX_RECURRENT_NUM_THREADS"] = str(count)
            onnx_recurrent.lstm(*inputs)
            counts.append(  # the pool's threads (the SIGINT watcher is one more)
                sum(t.name[len("onnx-recurrent-"):].isdigit() for t in threading.enumerate())
            )
        print(*counts)
        """,
        timeout=120,
    )
    counts = [int(c) for c in out.split()]
    assert max(counts) <= 7, f"live pool threads after 2, 4, 8, 2 threads: {counts}"
    assert counts[-1] == counts[-2], "a later, smaller count started more threads"


FORK_DURING_FIRST_USE = """
import faulthandler, os, sys, threading, time
import numpy as np
import onnx_recurrent as orc
I, H = 16, 32
rng = np.random.default_rng(0)
W, R = rng.standard_normal((1, 3 * H, I)), rng.standard_normal((1, 3 * H, H))
X = rng.standard_normal((5, 3, I))
orc.Layer("GRU", W.astype(np.float32), R.astype(np.float32))(X.astype(np.float32))
first = threading.Thread(target=lambda: orc.Layer("GRU", W, R)(X))  # float64: first use
first.start()
time.sleep(float(sys.argv[1]))
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang: status 1
    orc.Layer("GRU", W, R)(X)
    os._exit(0)
first.join()
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1])
def test_a_fork_during_another_threads_first_use_leaves_a_working_child(delay):
    """A fork while another thread compiled or loaded a layer's kernels: the child
    waited forever for the lock that thread held (ours, then numba's, then an import's).
    A fork now waits for that work to end."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_DURING_FIRST_USE, str(delay)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_first_call_from_several_threads_at_once_gives_every_thread_the_same_bits(
    monkeypatch,
):
    """A layer made with ``prepare=False`` prepares on its first call: several threads
    making it together once each arranged the weights, the last arrangement replaced
    the others and freed the plans a kept small call pointed at (silent wrong answers,
    up to 1.4 off). Each thread's arrangement is slowed here so that they overlap."""
    import gc

    from onnx_recurrent import cells

    rng = np.random.default_rng(0)
    H, I, n = 64, 32, 4
    W = rng.standard_normal((1, 4 * H, I)).astype(np.float32) * 0.3
    R = rng.standard_normal((1, 4 * H, H)).astype(np.float32) * 0.3
    X = rng.standard_normal((20, 4, I)).astype(np.float32)
    expected = onnx_recurrent.Layer("LSTM", W, R)(X)
    arrange = type(cells.LSTM).prepare

    def slow(self, *args):
        time.sleep(0.05)
        return arrange(self, *args)

    monkeypatch.setattr(type(cells.LSTM), "prepare", slow)
    for _ in range(8):
        layer = onnx_recurrent.Layer("LSTM", W, R, prepare=False)
        results = [None] * n
        start = threading.Barrier(n)

        def first_call(t, layer=layer, results=results, start=start):
            start.wait()
            results[t] = layer(X)

        workers = [threading.Thread(target=first_call, args=(t,)) for t in range(n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        gc.collect()
        junk = [np.full(20000, 7.0, np.float32) for _ in range(50)]  # reuses freed memory
        for got in [*results, layer(X)]:
            np.testing.assert_array_equal(got[0], expected[0])
            np.testing.assert_array_equal(got[1], expected[1])
        del junk


def test_a_timers_exception_at_an_affinity_call_is_not_taken_for_no_affinity(monkeypatch):
    # a timer's handler raising TimeoutError (an OSError) as sched_getaffinity returned
    # was taken for "no affinity on this platform": the call went on, the timeout lost
    # (probe S: every seed, once in 20-150 timed calls)
    from onnx_recurrent import affinity

    def timer(pid, *mask):
        raise TimeoutError("timer")

    monkeypatch.setattr(os, "sched_getaffinity", timer)
    monkeypatch.setattr(os, "sched_setaffinity", timer)
    with pytest.raises(TimeoutError, match=r"^timer$"):
        threads._usable_cpus()
    with pytest.raises(TimeoutError, match=r"^timer$"):
        affinity.caller_mask()
    with pytest.raises(TimeoutError, match=r"^timer$"):
        with affinity.spread():
            pass
    with pytest.raises(TimeoutError, match=r"^timer$"):
        affinity.back(0, {0}, {0, 1})
