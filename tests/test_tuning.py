"""The plan measured on this CPU (:mod:`onnx_recurrent.backends.tuning`): kept once, read
by later processes, redone on request, never a failure; results the same whatever it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import onnx_recurrent as orc
from onnx_recurrent import RecurrentError, scan
from onnx_recurrent.backends import tuning
from onnx_recurrent.backends.cache_dirs import CompileCacheWarning

pytest.importorskip("onnx_recurrent.backends.numba_backend")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache (XDG_CACHE_HOME) and nothing read yet; restored after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.forget()
    yield tmp_path
    tuning.forget()


def _counting(values):
    calls = []

    def measure():
        calls.append(1)
        return dict(values)

    return measure, calls


def test_measured_once_then_kept(fresh):
    """The first use measures and keeps the choice in one file named by the CPU; the
    next use (and a new process's, reading the file) measures nothing."""
    measure, calls = _counting({"rows": 6, "span": 2})
    assert tuning.planned(("rows", "span"), measure) == {"rows": 6, "span": 2}
    assert tuning.planned(("rows", "span"), measure) == {"rows": 6, "span": 2}
    assert len(calls) == 1
    files = list((fresh / "onnx-recurrent" / "tuning").glob("plan-*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["rows"] == 6
    tuning.forget()  # as a new process: read from the file
    assert tuning.planned(("rows", "span"), measure) == {"rows": 6, "span": 2}
    assert len(calls) == 1
    assert tuning.state() == (True, str(files[0]))


def test_a_later_process_reads_the_plan(fresh):
    """A child process with the kept plan (values no measurement here would give)
    uses it: its tiles are the file's."""
    measure, _ = _counting({"rows": 12, "span": 1, "depth": 128})
    tuning.planned(("rows", "span", "depth"), measure)
    code = "from onnx_recurrent.backends import tuning; print(tuning.tiles())"
    env = os.environ | {"XDG_CACHE_HOME": str(fresh)}
    env.pop(tuning.ENV, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(12, 1, 128)"


@pytest.mark.parametrize(
    "damage", [b"", b"{not json", b'{"key": "another CPU", "rows": 4}', b'{"rows": 5}', b"[1]"]
)
def test_a_damaged_or_foreign_file_is_planned_again(fresh, damage):
    measure, calls = _counting({"rows": 4, "span": 4})
    tuning.planned(("rows", "span"), measure)
    (path,) = (fresh / "onnx-recurrent" / "tuning").glob("plan-*.json")
    path.write_bytes(damage)
    tuning.forget()
    assert tuning.planned(("rows", "span"), measure) == {"rows": 4, "span": 4}
    assert len(calls) == 2
    assert json.loads(path.read_text())["span"] == 4  # replaced by a good one


@pytest.mark.parametrize("damage", ["nested", "fifo"])
def test_a_plan_file_nested_too_deep_or_a_pipe_is_planned_again(fresh, damage):
    """JSON nested past Python's stack (a RecursionError, caught by nothing) failed
    every compiled call of every process; a named pipe blocked the first, Ctrl-C
    included."""
    measure, calls = _counting({"rows": 4, "span": 4})
    tuning.planned(("rows", "span"), measure)
    (path,) = (fresh / "onnx-recurrent" / "tuning").glob("plan-*.json")
    if damage == "nested":
        path.write_text("[" * 200_000)
    else:
        path.unlink()
        os.mkfifo(path)
    tuning.forget()
    assert tuning.planned(("rows", "span"), measure) == {"rows": 4, "span": 4}
    assert len(calls) == 2
    assert json.loads(path.read_text())["span"] == 4  # replaced by a good one


@pytest.mark.parametrize("value", [27.0, True, "27"])
def test_a_value_of_another_type_is_planned_again(fresh, value):
    """``27.0`` and ``true`` compare equal to kept values: read as they were, a float
    ``parallel`` broke every large call in every process (a shift by a float)."""
    measure, calls = _counting({"parallel": 25})
    tuning.planned(("parallel",), measure)
    (path,) = (fresh / "onnx-recurrent" / "tuning").glob("plan-*.json")
    data = json.loads(path.read_text())
    data["parallel"] = value if value is not True else True
    path.write_text(json.dumps(data))
    tuning.forget()
    assert tuning.planned(("parallel",), measure) == {"parallel": 25}
    assert type(tuning.planned(("parallel",), measure)["parallel"]) is int
    assert len(calls) == 2


def test_unwritable_cache_plans_for_the_process(fresh, monkeypatch):
    """No writable cache directory: the plan is measured and used, kept in memory."""
    monkeypatch.setattr(tuning, "first_usable", lambda kind: (None, ["/nowhere"]))
    measure, calls = _counting({"share": 0})
    assert tuning.planned(("share",), measure) == {"share": 0}
    assert tuning.planned(("share",), measure) == {"share": 0}
    assert len(calls) == 1
    assert tuning.state() == (True, None)


def test_a_plan_shipped_read_only_is_read(fresh, monkeypatch):
    # a warm cache that cannot be written (a container image's, a read-only mount) was
    # passed over for the first writable directory, and the plan measured again
    from onnx_recurrent.backends import cache_dirs

    measure, calls = _counting({"rows": 12, "span": 1})
    tuning.planned(("rows", "span"), measure)
    shipped = str(fresh / "onnx-recurrent" / "tuning")
    writable = cache_dirs.writable
    monkeypatch.setattr(cache_dirs, "writable", lambda path: path != shipped and writable(path))
    elsewhere = fresh / "elsewhere"
    monkeypatch.setattr(
        cache_dirs, "our_roots", lambda kind: [(shipped, False), (str(elsewhere), False)]
    )
    tuning.forget()  # as a new process
    assert tuning.planned(("rows", "span"), measure) == {"rows": 12, "span": 1}
    assert len(calls) == 1


def test_a_plan_that_cannot_be_written_is_said_once(fresh, monkeypatch):
    # a directory where the plan file goes: each process measured again, unsaid
    measure, calls = _counting({"rows": 4, "span": 4})
    tuning.planned(("rows", "span"), measure)
    (path,) = (fresh / "onnx-recurrent" / "tuning").glob("plan-*.json")
    path.unlink()
    path.mkdir()
    monkeypatch.setattr(tuning, "_unkept_said", False)
    said = []
    for _ in range(2):  # measured again each time, said once
        tuning.forget()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert tuning.planned(("rows", "span"), measure) == {"rows": 4, "span": 4}
        said += [str(w.message) for w in caught if w.category is CompileCacheWarning]
    assert len(calls) == 3
    assert len(said) == 1 and "could not keep its plan for this CPU at" in said[0], said


def test_measure_again_on_request(fresh, monkeypatch):
    """ONNX_RECURRENT_PLAN=measure: measured again once in the process, and kept."""
    measure, calls = _counting({"share": 1})
    tuning.planned(("share",), measure)
    monkeypatch.setenv(tuning.ENV, "measure")
    tuning.forget()
    again, calls2 = _counting({"share": 0})
    assert tuning.planned(("share",), again) == {"share": 0}
    assert tuning.planned(("share",), again) == {"share": 0}
    assert (len(calls), len(calls2)) == (1, 1)
    monkeypatch.delenv(tuning.ENV)
    tuning.forget()
    assert tuning.planned(("share",), measure) == {"share": 0}


def test_values_given_are_used_and_not_kept(fresh, monkeypatch):
    monkeypatch.setenv(tuning.ENV, "rows=4, span=2, depth=0")
    measure, calls = _counting({"rows": 8, "span": 1})
    assert tuning.tiles() == (4, 2, 0)
    assert tuning.planned(("rows", "span"), measure) == {"rows": 4, "span": 2}
    assert not calls
    assert not (fresh / "onnx-recurrent" / "tuning").exists() or not list(
        (fresh / "onnx-recurrent" / "tuning").glob("plan-*.json")
    )


@pytest.mark.parametrize(
    "value",
    ["rows=5", "rows", "colour=1", "rows=8;span=1", "again", "rows=²", "rows=٨", "depth=¹²⁸"],
)
def test_a_malformed_variable_is_a_clear_error(fresh, monkeypatch, value):
    monkeypatch.setenv(tuning.ENV, value)
    expected = rf"ONNX_RECURRENT_PLAN={value!r}: expected 'measure'"
    with pytest.raises(RecurrentError, match=expected):
        tuning.planned(("rows",), lambda: {"rows": 8})


def test_a_name_given_twice_is_a_clear_error(fresh, monkeypatch):
    # was: the last one won, silently
    monkeypatch.setenv(tuning.ENV, "rows=8,rows=4")
    with pytest.raises(RecurrentError, match=r"'rows' given twice"):
        tuning.planned(("rows",), lambda: {"rows": 8})


def test_measured_tiles_are_candidates(fresh):
    """The real measurement returns one of the candidates for each name; a ragged
    bucket's step is among the shapes timed."""
    from onnx_recurrent.backends import packed

    assert tuning.BUCKET_STEP[0] == scan.BUCKET_ROWS

    chosen = tuning.measure_tiles()
    assert chosen["rows"] in packed.ROWS and chosen["span"] in packed.SPANS
    assert chosen["depth"] in packed.DEPTHS


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_results_do_not_depend_on_the_plan(fresh, monkeypatch, op):
    """Every tile and split gives the same bits (each element: the same sum in the same
    order): a batch of 1, 3 and 32 rows, one and two threads."""
    rng = np.random.default_rng(1)
    G, H, I = {"GRU": 3, "LSTM": 4, "RNN": 1}[op], 48, 20
    W = rng.standard_normal((1, G * H, I)).astype(np.float32) * 0.3
    R = rng.standard_normal((1, G * H, H)).astype(np.float32) * 0.3
    Xs = [rng.standard_normal((7, N, I)).astype(np.float32) for N in (1, 3, 32)]
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 8)
    monkeypatch.setattr(scan, "MIN_ROWS", 1)
    expected = None
    plans = ("rows=4,span=1,depth=0,share=1", "rows=12,span=4,depth=128,share=0")
    for plan in (*plans, "rows=6,span=2,depth=256,share=1"):
        for threads in ("1", "2"):
            monkeypatch.setenv(tuning.ENV, plan)
            monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", threads)
            layer = orc.Layer(op, W, R)  # a plan's tiles are read when it is made
            got = [b"".join(a.tobytes() for a in layer(X)) for X in Xs]
            expected = expected or got
            assert got == expected, (plan, threads)


def test_the_split_is_planned_per_size_class(fresh, monkeypatch):
    """The threads' split of a direction is measured once per size class of its weights
    of a step (what pays depends on the caches they fit: a lent Xeon planned slices at M
    float32, and its float64 at M then ran 2.2-4.0x its float32, L at 73-75% of the
    sgemm peak; sharing: 1.6-2.2x, 87-95%), each kept under its own name, and a call
    takes its class's: float32 and float64 of one layer differ by a class."""
    names = []
    monkeypatch.setattr(
        scan, "measure_share", lambda name: names.append(name) or {name: int(name > "share20")}
    )
    assert scan.share_class(3 * 256 * 384 * 4) == "share20"  # M GRU float32, 1.1 MiB
    assert scan.share_class(3 * 256 * 384 * 8) == "share21"  # float64
    assert scan.share_class(4 * 512 * 1024 * 4) == "share23"  # L LSTM float32
    assert (scan.share_class(1), scan.share_class(1 << 40)) == ("share16", "share26")
    for _ in range(2):
        assert not scan.planned_share(3 * 256 * 384 * 4)
        assert scan.planned_share(3 * 256 * 384 * 8)
    assert names == ["share20", "share21"]
    assert "share20=0 share21=1" in tuning.describe()
    # a call's split: float32 in slices of rows, float64 sharing the hidden units
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    rng = np.random.default_rng(0)
    from onnx_recurrent import cells
    from onnx_recurrent.spec import check_call, check_X, make_spec

    for dt, shares in ((np.float32, 1), (np.float64, 2)):
        R = rng.standard_normal((1, 3 * 256, 256)).astype(dt)
        spec = make_spec(cells.GRU, R, hidden_size=None)
        X = rng.standard_normal((2, 32, 128)).astype(dt)
        x = check_call(spec, check_X(spec, X), None, [("initial_h", None)])
        units, _, got = scan._units(spec, x, 2)
        assert (len(units), got) == ((2, 1) if shares == 1 else (1, 2)), dt
    # given: share for every class, or one class's
    monkeypatch.setenv(tuning.ENV, "share=1")
    assert scan.planned_share(3 * 256 * 384 * 4) and "share20" not in tuning.describe()
    monkeypatch.setenv(tuning.ENV, "share21=0")
    assert not scan.planned_share(3 * 256 * 384 * 8)
    assert names == ["share20", "share21"]


def test_the_split_of_ragged_rows_is_planned_per_class_and_phases(fresh, monkeypatch):
    """Ragged rows' split (sharing the hidden units, or buckets of rows) is measured
    once per size class and kind of step (one phase; two: GRU with the reset gate
    before the product, whose second meeting a step tipped it the other way on a lent
    Xeon), apart from full-length rows' (``share<k>``), and a ragged call takes it."""
    names = []
    monkeypatch.setattr(
        scan, "measure_ragged", lambda name: names.append(name) or {name: int("split" in name)}
    )
    monkeypatch.setattr(scan, "measure_share", lambda name: {name: 1})
    for _ in range(2):
        assert not scan.planned_ragged(4 * 256 * 384 * 4, split=False)  # M LSTM, 1.5 MiB
        assert scan.planned_ragged(3 * 256 * 384 * 4, split=True)  # M GRU, 1.1 MiB
    assert names == ["ragged21", "raggedsplit20"]
    assert "ragged21=0" in tuning.describe() and "raggedsplit20=1" in tuning.describe()
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    rng = np.random.default_rng(0)
    from onnx_recurrent import cells
    from onnx_recurrent.spec import check_call, check_X, make_spec

    for cell, lbr, shares in ((cells.LSTM, 0, 1), (cells.GRU, 0, 2), (cells.GRU, 1, 1)):
        G = cell.n_gates
        R = rng.standard_normal((1, G * 256, 256)).astype(np.float32)
        attributes = {"linear_before_reset": lbr} if cell is cells.GRU else {}
        spec = make_spec(cell, R, hidden_size=None, **attributes)
        X = rng.standard_normal((4, 32, 128)).astype(np.float32)
        states = [(k, None) for k in cell.state_names]
        lens = np.arange(32) % 4 + 1
        ragged = check_call(spec, check_X(spec, X), lens, states)
        full = check_call(spec, check_X(spec, X), None, states)
        assert scan._units(spec, ragged, 2)[2] == shares, (cell.name, lbr)
        assert scan._units(spec, full, 2)[2] == 2  # share<k> planned 1
    assert names == ["ragged21", "raggedsplit20", "ragged20"]  # GRU lbr=1: one phase
    monkeypatch.setenv(tuning.ENV, "ragged=1")
    assert scan.planned_ragged(4 * 256 * 384 * 4, split=False)
    assert "ragged21" not in tuning.describe()


@pytest.mark.parametrize("name", ["ragged16", "raggedsplit21"])
def test_measured_ragged_split_names_its_class(fresh, name):
    """The real measurement of ragged rows' split: a candidate, under its class's name."""
    assert scan.measure_ragged(name).keys() == {name}


@pytest.mark.parametrize("name", ["share16", "share21"])
def test_measured_split_names_its_class(fresh, name):
    """The real measurement of the split at a size class: one of the candidates, under
    the class's name."""
    assert scan.measure_share(name).keys() == {name}
    assert tuning.planned((name,), lambda: scan.measure_share(name))[name] in (0, 1)


def test_threads_from_the_planned_size(fresh, monkeypatch):
    """Whether a call runs on the pool's threads is planned on this CPU (waking a helper
    after a pause cost more than it saved below 2**26 multiply-adds on an AMD EPYC):
    measured once, only for a call that could use them (2**22 multiply-adds and more,
    more than one thread); a layer's call below the plan runs its small path, above it
    goes to the threads; ``parallel=k`` given fixes it."""
    measured = []
    monkeypatch.setattr(scan, "measure_parallel", lambda: measured.append(1) or {"parallel": 24})
    monkeypatch.setattr(scan.threads, "_cpus", lambda: 2)  # whatever this machine has
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    assert not scan.threaded((1 << 22) - 1) and not scan.threaded(1 << 30, workers=1)
    assert not measured  # nothing that could run on threads asked
    assert not scan.threaded((1 << 24) - 1) and scan.threaded(1 << 24)
    assert scan.parallel_macs() == 1 << 24 and measured == [1]
    assert "parallel=24" in tuning.describe()
    rng = np.random.default_rng(0)
    H, N = 64, 16  # 2**19 multiply-adds a step
    W = rng.standard_normal((1, 4 * H, H)).astype(np.float32) * 0.1
    R = rng.standard_normal((1, 4 * H, H)).astype(np.float32) * 0.1
    layer = orc.Layer("LSTM", W, R)
    pooled = []
    run = scan.threads.run
    monkeypatch.setattr(scan.threads, "run", lambda *a, **k: pooled.append(a[0]) or run(*a, **k))
    for plan, T in (("", 16), ("", 32), ("parallel=25", 32), ("parallel=25", 64)):
        monkeypatch.setenv(tuning.ENV, plan)
        pooled.clear()
        layer(rng.standard_normal((T, N, H)).astype(np.float32))
        assert bool(pooled) == ((T == 32 and not plan) or T == 64), (plan, T)
    assert measured == [1]


def test_more_threads_than_cpus_measure_and_keep_nothing(fresh, monkeypatch):
    """ONNX_RECURRENT_NUM_THREADS above the process's CPUs: threads from 2**27, not
    measured (threads that share CPUs lose at every size a measurement would time) and
    nothing kept for the later processes that run with their own CPUs."""
    measured = []
    monkeypatch.setattr(scan, "measure_parallel", lambda: measured.append(1) or {"parallel": 23})
    monkeypatch.setattr(scan.threads, "_cpus", lambda: 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "4")
    assert not scan.threaded((1 << 27) - 1) and scan.threaded(1 << 27)
    assert scan.parallel_macs() == 1 << 27 and not measured
    assert "parallel" not in tuning.describe()
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    assert scan.parallel_macs() == 1 << 23 and measured == [1]


def test_measured_threads_size_is_a_candidate(fresh, monkeypatch):
    """The real measurement returns one of the candidates."""
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    monkeypatch.setattr(scan, "PAUSE", 0.0)
    assert scan.measure_parallel()["parallel"] in tuning.FIELDS["parallel"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_measures_plans(fresh):
    """A process forked while one of its threads measures a plan (which holds the
    plan's lock for up to seconds: planning happens inside a call, on whichever thread
    makes it) has no such thread: the child plans for itself instead of waiting
    forever for a lock nobody will release."""
    code = """
import os, signal, threading, time
from onnx_recurrent.backends import tuning
started = threading.Event()
def slow():
    started.set()
    time.sleep(1.0)
    return {"rows": 8}
thread = threading.Thread(target=tuning.planned, args=(("rows",), slow))
thread.start()
started.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(10)  # the default action ends a child that hangs
    got = tuning.planned(("span",), lambda: {"span": 2})
    os._exit(0 if got == {"span": 2} else 3)
_, status = os.waitpid(pid, 0)
thread.join()
print(os.waitstatus_to_exitcode(status), tuning.planned(("rows",), slow))
"""
    env = os.environ | {"XDG_CACHE_HOME": str(fresh)}
    env.pop(tuning.ENV, None)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 1) == ["0", "{'rows': 8}\n"], out.stdout


FULL_DISK = """
import errno, warnings
from numba.core import caching

def full(self, *args, **kwargs):  # every cache write finds the disk full
    raise OSError(errno.ENOSPC, "No space left on device")

caching.IndexDataCacheFile._save_data = full
caching.IndexDataCacheFile._save_index = full
warnings.simplefilter("ignore")
from onnx_recurrent.backends import packed, tuning
tiles = tuning.measure_tiles()
print(tiles["rows"] in packed.ROWS)
"""


def test_a_full_cache_disk_does_not_fail_the_planner(tmp_path):
    # the timing kernel was compiled by its first call, outside the cache's fall back:
    # numba's OSError (ENOSPC) failed a first use, in every process while the disk was full
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr[-2000:]
