"""The benchmark tool, on the hidden ``tiny`` shape: it runs, its table has the expected
rows and columns, and competitors that are missing or cannot run a case are skipped with
a reason. Nothing here times anything or asserts anything about speed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import ClassVar

import numpy as np
import pytest

from onnx_recurrent.tools import bench

HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None
HAVE_OV = importlib.util.find_spec("openvino") is not None


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def _key(case: bench.Case) -> str:
    return f"{case.shape.name} {case.label}"


class FakeClock:
    """A clock that only moves when a fake call says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Missing(bench.Runtime):
    name, title, short = "missing", "missing ms", "Δ missing"
    module, install = "onnx_recurrent_no_such_module", "no-such-package"


class Broken(bench.Runtime):
    name, title, short = "broken", "broken ms", "Δ broken"

    def prepare(self, case, model, feeds):
        raise RuntimeError("cannot load this model\nsecond line")


class Wrong(bench.Runtime):
    """Fast and wrong: returns zeros of the right shapes."""

    name, title, short = "wrong", "wrong ms", "Δ wrong"

    def prepare(self, case, model, feeds):
        zeros = [np.zeros(s, np.float32) for s in bench.output_shapes(case)]
        return lambda: zeros


# ------------------------------------------------------------------ cases and targets


def test_cases_are_those_of_the_issue():
    cases = bench.make_cases(bench.OPS, ("S", "M", "L"))
    keys = [_key(c) for c in cases]
    assert len(keys) == len(set(keys))
    by_shape = {s: [c for c in cases if c.shape.name == s] for s in ("S", "M", "L")}
    # GRU lbr 0 and 1, LSTM, RNN; forward and bidirectional
    assert len(by_shape["S"]) == len(by_shape["L"]) == 8
    m = by_shape["M"]
    assert len(m) == 8 + 8 + 4 + 4  # plain, ragged (both directions), layout=1, float64
    assert sum(c.ragged for c in m) == 8
    assert sum(c.layout == 1 for c in m) == sum(c.dtype == "float64" for c in m) == 4
    assert not any(c.ragged or c.layout or c.dtype != "float32" for c in by_shape["S"])
    assert {(c.op, c.linear_before_reset) for c in m} == {
        ("GRU", 0),
        ("GRU", 1),
        ("LSTM", 0),
        ("RNN", 0),
    }
    assert "M GRU lbr=1 bidi ragged" in keys
    assert "M LSTM fwd layout=1" in keys
    assert "M RNN fwd float64" in keys
    assert bench.SHAPES["M"] == bench.Shape("M", 100, 32, 128, 256)


def test_ops_select_operators():
    cases = bench.make_cases(["lstm"], ["S"])
    assert [c.label for c in cases] == ["LSTM fwd", "LSTM bidi"]
    with pytest.raises(ValueError, match="unknown op"):
        bench.make_cases(["gruu"], ["S"])


def test_targets():
    def targets(label, shape="M"):
        case = next(c for c in bench.make_cases(bench.OPS, [shape]) if c.label == label)
        return {(t.runtime, t.kind, t.bound, t.ours) for t in case.targets}

    # issue 21's targets
    assert targets("LSTM fwd", "step") == {
        ("fastest", "ratio", 0.8, "layer"),
        ("fastest", "ratio", 2.0, "ours"),
    }
    assert targets("GRU lbr=0 fwd", "S") == {("fastest", "ratio", 0.9, "layer")}
    assert targets("LSTM bidi", "S") == {("fastest", "ratio", 0.9, "layer")}
    reference = ("reference", "speedup", 10.0, "ours")
    assert targets("LSTM bidi") == {("fastest", "ratio", 0.8, "ours"), reference}
    assert targets("LSTM bidi", "L") == {("fastest", "ratio", 0.9, "ours"), reference}
    # M forward: also at most 2.5x its own quiet time beside one busy process
    assert targets("GRU lbr=1 fwd") == {
        ("fastest", "ratio", 0.9, "ours"),
        reference,
        ("quiet", "contended", 2.5, "ours"),
    }
    assert targets("RNN fwd", "L") == targets("LSTM bidi", "L")
    assert targets("RNN fwd ragged") == {("fastest", "ratio", 0.5, "ours")}
    assert targets("RNN bidi ragged") == {("fastest", "ratio", 0.5, "ours")}
    assert targets("GRU lbr=1 fwd layout=1") == {("openvino", "ratio", 1.0, "ours"), reference}
    # float64: no peer computes real double, so no peer target (OpenVINO's ratio is shown,
    # not judged); the yardstick is our own float32 (format_double)
    assert targets("GRU lbr=0 fwd float64") == {reference}
    assert targets("LSTM fwd float64", "tiny") == {reference}


def test_verdicts_from_medians():
    case = next(c for c in bench.make_cases(["gru"], ["M"]) if c.label == "GRU lbr=0 fwd")
    result = bench.CaseResult(
        case, samples={"ours": [1.0, 3.0, 2.0], "onnxruntime": [4.0], "reference": [5.0]}
    )
    assert result.median("ours") == 2.0
    (ort, r_ort, ok_ort), (ref, r_ref, ok_ref), (loaded, r_loaded, ok_loaded) = result.verdicts()
    assert (ort.runtime, r_ort, ok_ort) == ("fastest", 0.5, True)
    assert result.fastest() == "onnxruntime"
    assert (ref.runtime, r_ref, ok_ref) == ("reference", 0.4, False)  # 2.5x, not 10x
    assert (loaded.kind, r_loaded, ok_loaded) == ("contended", None, None)  # no load: n/a

    row = bench.format_table([result], bench.make_runtimes(runtimes=("onnxruntime", "reference")))
    assert "ort 0.50" in row and "≤ 0.9 PASS" in row
    assert "2.5x [2x-3.3x]" in row and "≥ 10x MISS" in row  # ref / our quartiles
    notes = bench.format_notes(
        [result], bench.make_runtimes(runtimes=("onnxruntime", "reference"))
    )
    assert "Targets: 1 PASS, 1 MISS." in notes
    # no baseline time: the target is not judged
    alone = bench.CaseResult(case, samples={"ours": [1.0]})
    assert [met for _, _, met in alone.verdicts()] == [None, None, None]


def test_ratios_to_the_fastest_peer_with_their_spread():
    case = next(c for c in bench.make_cases(["gru"], ["step"]) if c.label == "GRU lbr=0 fwd")
    samples = {
        "ours": [4.0, 5.0, 6.0, 7.0, 8.0],
        "layer": [1.0, 2.0, 3.0],
        "onnxruntime": [3.0],
        "openvino": [2.0],
    }
    result = bench.CaseResult(case, samples=samples)
    assert result.fastest() == "openvino"
    (layer, r_layer, ok_layer), (functions, r_fun, ok_fun) = result.verdicts()
    assert (layer.ours, r_layer, ok_layer) == ("layer", 1.0, False)  # target 0.8
    assert (functions.ours, r_fun, ok_fun) == ("ours", 3.0, False)  # target 2.0
    assert (layer.bound, functions.bound) == (0.8, 2.0)
    assert result.quartiles("ours") == (5.0, 7.0)
    assert result.spread("fastest") == (2.5, 3.5)
    table = bench.format_table([result], bench.make_runtimes())
    assert "6000 (5000-7000)" in table  # median (quartiles), ms
    assert "Layer/ov 1.00 [0.75-1.25]" in table and "ov 3.00 [2.50-3.50]" in table
    assert "Layer ≤ 0.8 MISS; ≤ 2.0 MISS" in table
    notes = bench.format_notes([result], bench.make_runtimes())
    assert "Targets: 0 PASS, 2 MISS." in notes
    assert "MISS step GRU lbr=0 fwd Layer vs OpenVINO 1.00 (target Layer ≤ 0.8)" in notes
    assert "MISS step GRU lbr=0 fwd vs OpenVINO 3.00 (target ≤ 2.0)" in notes


def test_float64_is_not_judged_against_openvino():
    # issue 21: OpenVINO rounds double to float32, so its ratio is information only
    case = next(c for c in bench.make_cases(["lstm"], ["M"]) if c.dtype == "float64")
    assert case.baseline == "openvino"
    assert all(t.runtime != "openvino" for t in case.targets)
    samples = {"ours": [3.0, 3.0, 3.0], "openvino": [2.0], "reference": [60.0]}
    result = bench.CaseResult(case, samples=samples)
    assert [(t.runtime, met) for t, _, met in result.verdicts()] == [("reference", True)]
    runtimes = bench.make_runtimes(runtimes=("openvino", "reference"))
    row = bench.format_table([result], runtimes).splitlines()[2]
    assert "| ov 1.50 [1.50-1.50] " in row  # shown
    assert "none (f32 ≤ 2.1 below)" in row and "MISS" not in row  # not judged
    notes = bench.format_notes([result], runtimes)
    assert "Targets: 1 PASS, 0 MISS." in notes and "OpenVINO" not in notes


def _at_share(label, share, peak=100.0, shape="L"):
    """A CaseResult whose functions run at ``share`` of a ``peak`` GMAC/s."""
    case = next(c for c in bench.make_cases(bench.OPS, [shape]) if c.label == label)
    seconds = case.macs / (share * peak * 1e9)
    samples = {"ours": [seconds] * 3, "layer": [seconds / 2] * 3, "onnxruntime": [seconds]}
    return bench.CaseResult(case, samples=samples)


def test_share_of_the_sgemm_peak_is_judged_at_l_forward():
    # issue 21: at L forward, at least 90% of NumPy's sgemm peak on the same machine
    assert bench.report.PEAK_SHARE == 0.9
    info = {**_info(), "sgemm_peak_gmacs": {"all": 100.0, "1": 60.0}}
    below, above = _at_share("GRU lbr=0 fwd", 0.8), _at_share("LSTM fwd", 0.95)
    bidi = _at_share("RNN bidi", 0.5)  # L bidirectional: the ratio only
    m_fwd = _at_share("RNN fwd", 0.5, shape="M")  # M: shown, not judged
    results = [below, above, bidi, m_fwd]
    judged = bench.report.peak_verdicts(results, info)
    verdicts = [(r.case.label, round(share, 2), met) for r, share, met in judged]
    assert verdicts == [("GRU lbr=0 fwd", 0.8, False), ("LSTM fwd", 0.95, True)]
    runtimes = bench.make_runtimes(runtimes=["layer", "onnxruntime"])
    notes = bench.format_notes(results, runtimes, info=info)
    # the ratio targets: 1.0 > 0.9, three at L and one at M; the peak: one of two met
    assert "Targets: 1 PASS, 5 MISS." in notes
    assert "- MISS L GRU lbr=0 fwd share of the sgemm peak 80% (target ≥ 90%)" in notes
    assert "LSTM fwd share" not in notes
    peak = bench.report.format_peak(results, info)
    assert "L GRU lbr=0 fwd 80 [80-80] (80% [80%-80%]) MISS" in peak
    assert "L LSTM fwd 95 [95-95] (95% [95%-95%]) PASS" in peak
    assert "L GRU lbr=0 fwd (Layer) 160 [160-160] (160% [160%-160%]);" in peak  # no word
    assert "L RNN bidi 50 [50-50] (50% [50%-50%]);" in peak
    assert "M RNN fwd 50 [50-50] (50% [50%-50%])" in peak and "(50% [50%-50%]) MISS" not in peak
    assert "target at L forward, through the functions: ≥ 90%" in peak
    report = bench.format_report(results, runtimes, info, ["L", "M"])
    assert "Targets: 1 PASS, 5 MISS." in report
    # without a peak (no M or L in the run): not judged
    assert "Targets: 0 PASS, 4 MISS." in bench.format_notes(results, runtimes)


def test_the_share_of_the_peak_is_judged_round_by_round_beside_the_product():
    # the machine's speed halves half-way through the case (a VM's neighbours): ours and
    # the sgemm product timed beside them slow alike, so each round's share stays 95%,
    # where the peak measured once (at the fast start) would make it 71%
    info = {**_info(), "sgemm_peak_gmacs": {"all": 100.0, "1": 60.0}}
    result = _at_share("LSTM fwd", 0.95)
    fast, slow = result.samples["ours"][0], 2 * result.samples["ours"][0]
    result.samples["ours"] = [fast, fast, slow, slow, slow]
    product = bench.machine.SGEMM_SIZE**3 / 100e9  # 100 GMAC/s, then 50
    result.peak = [product, product, 2 * product, 2 * product, 2 * product]
    shares = bench.report.peak_shares(result)
    assert np.allclose(shares, 0.95)
    [(_, share, met)] = bench.report.peak_verdicts([result], info)
    assert round(share, 3) == 0.95 and met
    text = bench.report.format_peak([result], info)
    assert "L LSTM fwd 48 [48-95] (95% [95%-95%] of the product beside it) PASS" in text
    assert "beside each L forward case's calls: 50 [50-100] GMAC/s" in text
    assert text.endswith("L LSTM fwd (Layer) 190 [190-190] (190% [190%-190%])")  # the run's
    # without the product beside it: the peak measured once in the run
    result.peak = []
    [(_, share, met)] = bench.report.peak_verdicts([result], info)
    assert round(share, 3) == 0.475 and not met


def test_an_l_forward_case_times_the_sgemm_product_in_its_rounds():
    # a case held to the share of the peak (L forward, float32, full length) gets one
    # sgemm product a round, kept apart from the runtimes' times; others get none
    tiny_l = bench.Shape("L", 3, 2, 3, 4)
    case = bench.Case("RNN", tiny_l)
    assert case.peak_judged
    assert not bench.Case("RNN", tiny_l, direction="bidirectional").peak_judged
    assert not bench.Case("RNN", tiny_l, dtype="float64").peak_judged
    result = bench.run_case(case, [bench.Ours()], repeat=4)
    assert result.error is None, result.error
    assert set(result.samples) == {"ours"} and len(result.peak) == 4
    assert all(t > 0 for t in result.peak)
    assert result.to_json()["sgemm_beside_s"] == result.peak
    m = next(c for c in bench.make_cases(["rnn"], ["tiny"]) if c.label == "RNN fwd")
    assert bench.run_case(m, [bench.Ours()], repeat=2).peak == []
    # a float64 case: our float32 twin timed in its rounds, kept apart too
    double = bench.run_case(replace(m, dtype="float64"), [bench.Ours()], repeat=3)
    assert double.error is None and set(double.samples) == {"ours"}
    assert len(double.twins["ours"]) == 3 and all(t > 0 for t in double.twins["ours"])
    assert double.to_json()["float32_twin_samples_s"] == double.twins


def test_the_help_states_the_targets_with_their_values():
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    bench.add_parser(subparsers)
    text = " ".join(subparsers.choices["bench"].description.split())
    assert "{" not in text and "}" not in text  # no unformatted field
    assert "at least 90% of it round by round" in text and "(at most 2.1;" in text


def test_background_load_processes_come_and_go():
    import os

    from onnx_recurrent.tools.bench.load import BackgroundLoad

    with BackgroundLoad(2) as load:
        pids = [p.pid for p in load.processes]
        assert len(pids) == 2 and all(p.poll() is None for p in load.processes)
    for pid in pids:  # killed and reaped: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError), BackgroundLoad(1) as load:
        pids = [p.pid for p in load.processes]
        raise RuntimeError("a failure during the run")
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    with pytest.raises(ValueError, match="0 or more"):
        BackgroundLoad(-1)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_background_load_ends_when_its_parent_is_killed():
    import subprocess

    script = (
        "import os, sys\n"
        "from onnx_recurrent.tools.bench.load import BackgroundLoad\n"
        "load = BackgroundLoad(1).__enter__()\n"
        "print(load.processes[0].pid, flush=True)\n"
        "os._exit(0)\n"  # as if killed: no __exit__, no atexit
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(done.stdout)
    for _ in range(200):  # it notices within some 20 ms; allow 10 s on a busy machine
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # ended, waiting for its new parent to reap it
        except OSError:
            break  # reaped meanwhile
        __import__("time").sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the busy process outlived its parent")


class Recording(bench.BackgroundLoad):
    """BackgroundLoad that remembers the ids of every busy process it started."""

    pids: ClassVar[list[int]] = []
    live: ClassVar[list[Recording]] = []

    def __enter__(self):
        super().__enter__()
        Recording.pids += [p.pid for p in self.processes]
        Recording.live.append(self)
        return self

    def stop(self):
        super().stop()
        if self in Recording.live:
            Recording.live.remove(self)


def _assert_gone(pids):
    assert pids
    for pid in pids:  # killed and reaped: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class Logged(bench.Runtime):
    """Ours, logging for each call whether busy processes were running; raises
    ``failure`` at call number ``fail_at`` (the warm-up is call 1)."""

    name, title, short = "logged", "logged ms", "Δ logged"

    def __init__(self, fail_at=None, failure=RuntimeError):
        super().__init__()
        self.log, self.fail_at, self.failure = [], fail_at, failure

    def prepare(self, case, model, feeds):
        call = bench.Ours().prepare(case, model, feeds)

        def logged():
            self.log.append("loaded" if Recording.live else "quiet")
            if len(self.log) == self.fail_at:
                raise self.failure("stopped in the middle of the loaded rounds")
            return call()

        return logged


@pytest.fixture
def recording(monkeypatch):
    from onnx_recurrent.tools.bench import timing

    Recording.pids, Recording.live = [], []
    monkeypatch.setattr(timing, "BackgroundLoad", Recording)
    return Recording


def test_background_load_quiet_loaded_quiet_and_gone_after(recording):
    case = next(c for c in bench.make_cases(["rnn"], ["tiny"]) if c.label == "RNN fwd")
    logged = Logged()
    result = bench.run_case(case, [bench.Ours(), logged], repeat=4, background_load=2)
    assert result.error is None and result.load == 2
    # warm-up, 2 quiet rounds, 4 loaded, 2 quiet: both halves of the quiet rounds count
    assert logged.log == ["quiet"] * 3 + ["loaded"] * 4 + ["quiet"] * 2
    assert [len(result.samples[n]) for n in ("ours", "logged")] == [4, 4]
    assert [len(result.contended[n]) for n in ("ours", "logged")] == [4, 4]
    assert result.contention("logged") is not None
    assert len(recording.pids) == 2 and not recording.live
    _assert_gone(recording.pids)
    # with --repeat 1: one quiet round (before the loaded one), one loaded
    one = bench.run_case(case, [bench.Ours()], repeat=1, background_load=1)
    assert (len(one.samples["ours"]), len(one.contended["ours"])) == (1, 1)
    _assert_gone(recording.pids)


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_background_load_is_stopped_on_a_failure_or_ctrl_c(recording, failure):
    case = next(c for c in bench.make_cases(["rnn"], ["tiny"]) if c.label == "RNN fwd")
    logged = Logged(fail_at=1 + 1 + 2, failure=failure)  # the 2nd loaded call
    runtimes = [bench.Ours(), logged]
    if failure is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            bench.run_case(case, runtimes, repeat=2, background_load=1)
    else:
        result = bench.run_case(case, runtimes, repeat=2, background_load=1)
        assert result.error.startswith("failed while timing: RuntimeError")
    assert logged.log[-1] == "loaded" and not recording.live
    _assert_gone(recording.pids)


def _children() -> list[int]:
    """The ids of this process's live children (from /proc)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(entry))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_command_with_background_load_leaves_no_process(capsys):
    before = set(_children())
    args = _parse(
        "--shapes", "tiny", "--ops", "rnn", "-k", "RNN fwd float64", "--repeat", "2",
        "--runtimes", "layer", "--background-load", "1", "-q",
    )  # fmt: skip
    assert args.handler(args) == 0
    assert set(_children()) <= before
    printed = capsys.readouterr().out
    assert "OTHER LOAD WAS PRESENT, 1 busy process(es)" in printed
    assert "Under background load" in printed and "Layer loaded/quiet" in printed


def test_step_cases_run_through_the_functions_and_a_layer():
    cases = [c for c in bench.make_cases() if c.shape.name == "step"]
    assert bench.SHAPES["step"] == bench.Shape("step", 1, 1, 128, 128)
    assert [c.label for c in cases] == ["GRU lbr=0 fwd", "GRU lbr=1 fwd", "LSTM fwd", "RNN fwd"]
    runtimes = bench.make_runtimes(runtimes=["layer"])
    assert [r.name for r in runtimes] == ["ours", "layer"]
    results = [bench.run_case(c, runtimes, repeat=2, budget=0.0) for c in cases]
    for result in results:
        assert result.error is None and not result.skipped
        assert [len(result.samples[n]) for n in ("ours", "layer")] == [2, 2]
        assert result.diffs["layer"] < 1e-6  # the same kernels
    table = bench.format_table(results, runtimes)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[4:6] == ["ours ms", "Layer ms"]
    rows = table.splitlines()[2:]
    assert len(rows) == 4 and all(r.split("|")[6].strip() != "—" for r in rows)
    assert bench.make_cases(["lstm"], ["tiny"])[0].macs == 4 * 3 * 1 * 4 * 5 * (3 + 5)


def test_layer_runtime_skips_cleanly_without_layer(monkeypatch):
    import onnx_recurrent

    monkeypatch.delattr(onnx_recurrent, "Layer", raising=False)
    monkeypatch.delitem(onnx_recurrent._LAZY, "Layer")  # imported on first use (PEP 562)
    case = next(c for c in bench.make_cases(["gru"], ["step"]))
    result = bench.run_case(case, bench.make_runtimes(runtimes=["layer"]), repeat=1)
    assert result.error is None
    assert result.skipped == {"layer": "this onnx-recurrent has no Layer"}


def test_ratio_to_the_fastest_peer_with_onnxruntime_and_openvino():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    case = next(c for c in bench.make_cases(["lstm"], ["tiny"]) if c.label == "LSTM fwd")
    runtimes = bench.make_runtimes(runtimes=["onnxruntime", "openvino"])
    result = bench.run_case(case, runtimes, repeat=3)
    assert set(result.samples) == {"ours", "onnxruntime", "openvino"}
    peer = result.fastest()
    assert peer in ("onnxruntime", "openvino")
    assert result.median(peer) == min(result.median(p) for p in bench.YARDSTICKS)
    assert result.ratio("fastest") == result.median("ours") / result.median(peer)
    cell = bench.format_table([result], runtimes).splitlines()[2]
    short = {"onnxruntime": "ort", "openvino": "ov"}[peer]
    assert f"{short} {bench.report.fmt_ratio(result.ratio('fastest'))} [" in cell


def test_ragged_cases_count_the_multiply_adds_of_their_valid_steps():
    case = next(c for c in bench.make_cases(["gru"], ["tiny"]) if c.ragged)
    lens = bench.make_inputs(case)["sequence_lens"]
    result = bench.run_case(case, [bench.Ours()], repeat=1)
    s = case.shape
    assert result.macs == lens.sum() * case.num_directions * 3 * s.H * (s.I + s.H) < case.macs
    full = bench.run_case(bench.make_cases(["gru"], ["tiny"])[0], [bench.Ours()], repeat=1)
    assert full.macs == full.case.macs


def test_no_rounds_when_neither_a_minimum_nor_a_budget():
    calls = {"ours": lambda: None}
    assert bench.time_alternating(calls, min_repeats=0, budget=0.0) == {"ours": []}
    assert bench.time_alternating(calls, min_repeats=0, max_repeats=0, budget=1.0) == {"ours": []}


def test_sgemm_peak_on_all_threads_and_on_one():
    pytest.importorskip("threadpoolctl")
    peak = bench.sgemm_peak(size=64, calls=1)
    assert set(peak) == {"all", "1"} and all(v > 0 for v in peak.values())


def _info():
    return {
        "cpu": "test CPU",
        "logical_cpus": 2,
        "physical_cores": 2,
        "usable_cpus": 2,
        "python": "3",
        "platform": "test",
        "runtimes": {},
    }


def test_contended_over_quiet_and_the_peak_share_are_reported():
    case = next(c for c in bench.make_cases(["rnn"], ["M"]) if c.label == "RNN fwd")
    result = bench.CaseResult(
        case,
        samples={"ours": [0.010], "onnxruntime": [0.020]},
        contended={"ours": [0.020, 0.030, 0.040], "onnxruntime": [0.030]},
        load=1,
    )
    assert result.contention("ours") == pytest.approx(3.0)
    assert result.contention_spread("ours") == pytest.approx((2.5, 3.5))
    runtimes = bench.make_runtimes(runtimes=["onnxruntime"])
    info = {**_info(), "sgemm_peak_gmacs": {"all": 100.0, "1": 50.0}, "background_load": 1}
    text = bench.format_report([result], runtimes, info, ["M"])
    assert "M RNN fwd: ours 3.00 (≤ 2.5) MISS" in text and "ort loaded/quiet" in text
    assert "3.00 [2.50-3.50]" in text  # the spread of the contended ratio
    assert "OTHER LOAD WAS PRESENT, 1 busy process(es)" in text
    assert "quiet, loaded, quiet" in text
    notes = bench.format_notes([result], runtimes)
    assert "MISS M RNN fwd loaded/quiet 3.00 (target loaded/quiet ≤ 2.5 (1 busy))" in notes
    macs = case.macs / 0.010 / 1e9
    assert f"RNN fwd {macs:.0f} [{macs:.0f}-{macs:.0f}] ({macs / 100:.0%} [" in text
    assert "100 GMAC/s on all threads, 50 on one thread" in text
    # the share is of the better of the two peaks (two threads can lose on a busy machine)
    slower = {**info, "sgemm_peak_gmacs": {"all": 40.0, "1": 50.0}}
    assert f"({macs / 50:.0%} [" in bench.format_report([result], runtimes, slower, ["M"])
    # the bound is stated for one busy process: beside two, shown but not judged
    result.load = 2
    assert [met for t, _, met in result.verdicts() if t.kind == "contended"] == [None]
    text = bench.format_report([result], runtimes, {**info, "background_load": 2}, ["M"])
    assert "ours 3.00 (≤ 2.5) n/a" in text and "not judged" in text


def test_inputs_and_model_agree_with_the_case():
    for case in bench.make_cases(bench.OPS, ["tiny"]):
        feeds = bench.make_inputs(case, seed=1)
        s = case.shape
        assert feeds["X"].shape == ((s.N, s.T, s.I) if case.layout else (s.T, s.N, s.I))
        assert all(a.dtype == case.dtype for n, a in feeds.items() if n != "sequence_lens")
        if case.ragged:
            lens = feeds["sequence_lens"]
            assert lens.dtype == np.int32 and lens.min() >= 1 and lens.max() <= s.T
        model = bench.make_model(case, feeds)
        assert model.ir_version == 8
        assert [i.name for i in model.graph.input] == list(feeds)
        assert model.graph.node[0].op_type == case.op
    again = bench.make_inputs(case, seed=1)
    assert all(np.array_equal(again[n], feeds[n]) for n in feeds)


def test_transposed_model_computes_layout_1():
    onnx_reference = pytest.importorskip("onnx.reference")
    case = next(c for c in bench.make_cases(["lstm"], ["tiny"]) if c.layout == 1)
    feeds = bench.make_inputs(case)
    ours = bench.Ours().prepare(case, None, feeds)()
    model = bench.make_transposed_model(case, feeds)
    theirs = onnx_reference.ReferenceEvaluator(model).run(None, feeds)
    assert [o.shape for o in theirs] == bench.output_shapes(case)
    assert bench.max_abs_diff(ours, theirs) < 1e-5


# ------------------------------------------------------------------ the timing loop


def test_time_alternating_rotates_and_counts_rounds():
    clock = FakeClock()
    order = []

    def call(name, cost):
        def run():
            order.append(name)
            clock.now += cost

        return run

    calls = {"ours": call("ours", 1.0), "a": call("a", 2.0), "b": call("b", 3.0)}
    samples = bench.time_alternating(calls, min_repeats=30, max_repeats=30, clock=clock)
    assert samples == {"ours": [1.0] * 30, "a": [2.0] * 30, "b": [3.0] * 30}
    rounds = [order[i : i + 3] for i in range(0, 90, 3)]
    assert all(sorted(r) == ["a", "b", "ours"] for r in rounds)  # one call each per round
    before_ours = {r[r.index("ours") - 1] for r in rounds if r[0] != "ours"}
    assert before_ours == {"a", "b"}  # not always after the same runtime
    assert len({tuple(r) for r in rounds}) > 2
    order.clear()
    bench.time_alternating(calls, min_repeats=30, max_repeats=30, clock=clock)
    assert [order[i : i + 3] for i in range(0, 90, 3)] == rounds  # seeded

    # adaptive: rounds of 6 s in a 30 s budget -> 5 rounds (the 6th would end at 36 s)
    order.clear()
    samples = bench.time_alternating(calls, budget=30.0, clock=clock)
    assert len(samples["ours"]) == 5
    # the minimum holds even with no budget, the maximum caps a large one
    assert len(bench.time_alternating(calls, budget=0.0, clock=clock)["a"]) == 3
    capped = bench.time_alternating(calls, max_repeats=7, budget=1e9, clock=clock)
    assert len(capped["b"]) == 7
    assert bench.time_alternating({}, clock=clock) == {}

    # blocks: each runtime's calls together, each with an equal share of the budget
    order.clear()
    blocks = bench.time_alternating(
        calls, min_repeats=1, budget=3 * 12.0, clock=clock, order="blocks"
    )
    assert order == ["ours"] * 12 + ["a"] * 6 + ["b"] * 4
    assert [len(blocks[n]) for n in calls] == [12, 6, 4]
    with pytest.raises(ValueError, match="order"):
        bench.time_alternating(calls, clock=clock, order="random")


def test_budgets_split_over_shapes():
    assert bench.budgets(["S", "M"], None) == {"S": 25.0, "M": 150.0}
    split = bench.budgets(["S", "M"], 35.0)
    assert split == pytest.approx({"S": 5.0, "M": 30.0})
    assert bench.budgets(["tiny"], 4.0) == {"tiny": 4.0}


def test_max_abs_diff():
    a = [np.zeros((2, 3)), np.ones(2)]
    assert bench.max_abs_diff(a, [np.zeros((2, 3)), np.ones(2) * 1.5]) == 0.5
    assert bench.max_abs_diff(a, [np.zeros((3, 2)), np.ones(2)]) == float("inf")
    assert bench.max_abs_diff(a, a[:1]) == float("inf")


# ------------------------------------------------------------------ runs on tiny


def test_unavailable_and_failing_competitors_are_skipped_with_a_reason():
    case = bench.make_cases(["rnn"], ["tiny"])[0]
    runtimes = [bench.Ours(), Missing(), Broken(), Wrong()]
    result = bench.run_case(case, runtimes, repeat=1)
    assert result.error is None
    assert "not installed" in result.skipped["missing"]
    assert "pip install no-such-package" in result.skipped["missing"]
    assert result.skipped["broken"] == "failed: RuntimeError: cannot load this model"
    assert set(result.samples) == {"ours", "wrong"}
    assert result.repeats == 1
    assert result.diffs["wrong"] > bench.TOLERANCE  # fast but wrong is visible
    table = bench.format_table([result], runtimes)
    assert " !" in table
    notes = bench.format_notes([result], runtimes)
    assert "Skipped ('—'):" in notes and "- missing: not installed" in notes
    assert "Outputs farther than" in notes


def test_run_bench_on_tiny_has_every_row_and_column():
    done = bench.run_bench(shapes=["tiny"], repeat=1)
    cases = bench.make_cases(bench.OPS, ["tiny"])
    assert [r.case for r in done.results] == cases
    assert all(r.error is None for r in done.results)
    table = bench.format_table(done.results, done.runtimes)
    lines = table.splitlines()
    assert len(lines) == 2 + len(cases)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [
        "shape",
        "case",
        "reps",
        "other CPU",
        "ours ms",
        "Layer ms",
        "session ms",
        "onnxruntime ms",
        "OpenVINO ms",
        "onnx.reference ms",
        "ours/peer [quartiles]",
        "target",
        "ref/ours",
        "target",
        "Δ layer",
        "Δ session",
        "Δ ort",
        "Δ ov",
        "Δ ref",
    ]
    rows = {line.split("|")[2].strip(): line for line in lines[2:]}
    assert set(rows) == {c.label for c in cases}
    assert all(len(line.split("|")) == len(header) + 2 for line in lines)

    by_label = {r.case.label: r for r in done.results}
    for result in done.results:
        case = result.case
        assert result.diffs["session"] == 0.0  # the session runs the same kernels
        # a competitor is skipped exactly where check's lint probes it wrong (OpenVINO's
        # layout=1 is timed on the equivalent model); every one that runs agrees
        known = bench.known_wrong(
            bench.make_model(case, bench.make_inputs(case)), {"openvino": {"layout"}}
        )
        for name, installed in (("onnxruntime", HAVE_ORT), ("openvino", HAVE_OV)):
            if not installed:
                assert "not installed" in result.skipped[name]
                assert name not in known
        for name in ("onnxruntime", "openvino", "reference"):
            if name in known:
                assert result.skipped[name] == known[name], (case.label, name)
            elif name in result.skipped:
                assert "not installed" in result.skipped[name], (case.label, name)
            else:
                assert result.diffs[name] < 1e-5, (case.label, name)
        if "reference" in known:
            assert case.ragged and known["reference"].startswith(
                "known wrong: ignores sequence_lens (runs every sequence to the end) (probed: "
            )
    # the ratio column names the fastest peer that ran (OpenVINO alone where
    # onnxruntime is skipped)
    for label in ("GRU lbr=0 fwd", "GRU lbr=0 fwd float64"):
        result = by_label[label]
        ran = [p for p in bench.YARDSTICKS if p in result.samples]
        if not ran:
            assert result.fastest() is None
            continue
        fastest = min(ran, key=result.median)
        assert result.fastest() == fastest
        short = {"onnxruntime": "ort", "openvino": "ov"}[fastest]
        assert f"| {short} " in rows[label], rows[label]
    assert ("openvino" in by_label["GRU lbr=0 fwd float64"].samples) == HAVE_OV
    assert by_label["LSTM bidi ragged"].repeats == 1

    report = done.report()
    assert "CPU:" in report
    assert "intra_op_num_threads" in report or not HAVE_ORT
    assert "Targets:" in report
    data = json.loads(json.dumps(done.to_json()))
    assert len(data["results"]) == len(cases)
    assert data["options"]["repeat"] == 1


def test_skip_reference_at_a_shape_and_reference_limit():
    case = bench.make_cases(["rnn"], ["tiny"])[0]
    skipped = bench.run_case(
        case, bench.make_runtimes(runtimes=["reference"], skip_reference=["tiny"]), repeat=1
    )
    assert "--skip-reference" in skipped.skipped["reference"]
    slow = bench.run_case(
        case, bench.make_runtimes(runtimes=["reference"]), repeat=1, reference_limit=0.0
    )
    assert "--reference-limit" in slow.skipped["reference"]


# ------------------------------------------------------------------ the command


def test_command_runs_and_saves_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = _parse("--shapes", "tiny", "--ops", "rnn", "--repeat", "1", "-q", "--json", str(out))
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert "| shape | case" in printed
    assert "tiny  | RNN fwd float64" in printed
    data = json.loads(out.read_text())
    assert [r["label"] for r in data["results"]] == [
        c.label for c in bench.make_cases(["rnn"], ["tiny"])
    ]
    first = data["results"][0]
    assert len(first["samples_s"]["ours"]) == 1 and "max_abs_diff" in first
    assert data["machine"]["cpu"]


def test_a_stdout_without_the_reports_signs_prints_them_as_question_marks(tmp_path):
    """A latin-1 (or Windows' cp1252) standard output failed the run after its timing
    on the report's first "Δ" (status 2), and ``--json``, written after the report,
    was lost with it."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONIOENCODING="latin-1")
    done = subprocess.run(
        [sys.executable, "-m", "onnx_recurrent", "bench", "--shapes", "tiny", "--ops", "rnn",
         "--repeat", "1", "--no-settle", "--runtimes", "onnxruntime", "-q", "--json", str(out)],
        capture_output=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"| shape | case" in done.stdout and "Δ".encode() not in done.stdout
    assert json.loads(out.read_text())["results"]


def test_a_peer_that_fails_to_import_is_not_called_not_installed(tmp_path, monkeypatch):
    """A peer installed but failing to import (a missing shared library) was reported
    "not installed", with a pip command that would change nothing."""
    from onnx_recurrent.tools.bench.runtimes import Runtime

    (tmp_path / "broken_peer.py").write_text("raise ImportError('libpeer.so: not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = type("Broken", (Runtime,), {"module": "broken_peer", "install": "peer"})()
    absent = type("Absent", (Runtime,), {"module": "no_such_peer_here", "install": "peer"})()
    assert broken.missing() == "installed, but fails to import (libpeer.so: not found)"
    assert absent.missing().startswith("not installed (No module named 'no_such_peer_here'")


def test_command_list_and_filter(capsys):
    args = _parse("--shapes", "S,M", "--ops", "gru", "--list", "-k", "ragged")
    assert args.handler(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"M GRU lbr={lbr} {d} ragged" for lbr in (0, 1) for d in ("fwd", "bidi")]


def test_command_rejects_unknown_names(capsys):
    args = _parse("--shapes", "XL")
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "unknown shape 'XL'" in err and "tiny" not in err


def test_plot_without_matplotlib_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = _parse("--shapes", "tiny", "--plot", "out.png")
    assert args.handler(args) == 2
    assert "pip install onnx-recurrent[plot]" in capsys.readouterr().err


def test_float64_is_reported_over_our_float32_on_the_same_case():
    # issue 21: no peer computes real double; the yardstick is our own float32
    cases = {c.label: c for c in bench.make_cases(["gru"], ["tiny"])}
    single, double = cases["GRU lbr=0 fwd"], cases["GRU lbr=0 fwd float64"]
    results = [
        bench.CaseResult(single, samples={"ours": [1.0, 1.0, 1.0], "layer": [2.0] * 3}),
        bench.CaseResult(double, samples={"ours": [1.9, 2.0, 2.1], "layer": [4.6] * 3}),
        bench.CaseResult(cases["GRU lbr=1 fwd float64"], samples={"ours": [5.0] * 3}),
    ]
    text = bench.format_double(results)
    assert "tiny GRU lbr=0 fwd float64 2.00 [1.95-2.05] PASS" in text
    assert "tiny GRU lbr=0 fwd float64 (Layer) 2.30 [2.30-2.30] MISS" in text
    assert "lbr=1" not in text  # its float32 twin did not run
    assert bench.format_double(results[1:]) == ""
    # the twin timed in the float64 case's own rounds: the round-by-round ratios judged
    # (the float32 case, a minute earlier, measured the change of load as much: 2.4-3.8
    # against 1.8 when alternated)
    paired = bench.CaseResult(double, samples={"ours": [2.0, 4.0, 3.0]})
    paired.twins = {"ours": [1.0, 2.0, 1.5]}
    assert "tiny GRU lbr=0 fwd float64 2.00 [2.00-2.00] PASS" in bench.format_double([paired])
    # counted in the targets' summary, through the functions (as the sgemm share)
    results[2] = bench.CaseResult(cases["GRU lbr=0 fwd layout=1"], samples={"ours": [1.0]})
    results.append(bench.CaseResult(double, samples={"ours": [2.5] * 3}))
    notes = bench.format_notes(results, bench.make_runtimes(runtimes=["layer"]), info=_info())
    assert "Targets: 1 PASS, 1 MISS." in notes
    assert "- MISS tiny GRU lbr=0 fwd float64 over our float32 2.50 (target ≤ 2.1)" in notes


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    results = []
    for i, case in enumerate(bench.make_cases(["gru"], ["tiny"])):
        samples = {"ours": [1.0 + i], "onnxruntime": [2.0], "openvino": [1.5]}
        if not case.ragged:
            samples["reference"] = [20.0]
        results.append(bench.CaseResult(case, samples=samples))
    path = tmp_path / "ratios.png"
    bench.plot_ratios(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bench.plot_ratios(results, tmp_path / "bare")  # no suffix: .png, as matplotlib's
    bench.plot_ratios(results, tmp_path / "ratios.svg")
    assert (tmp_path / "bare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "ratios.svg").read_bytes()[:1000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.png", "ratios.png", "ratios.svg"]


@pytest.mark.parametrize("before", [None, "2"])
def test_command_threads_and_blocks(capsys, monkeypatch, before):
    """--threads 1 for the run; ONNX_RECURRENT_NUM_THREADS as it was afterwards (set or
    unset)."""
    if before is None:
        monkeypatch.delenv("ONNX_RECURRENT_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", before)
    args = _parse(
        "--shapes", "tiny", "--ops", "gru", "-k", "lbr=1 fwd float64", "--repeat", "2",
        "--threads", "1", "--order", "blocks", "-q",
    )  # fmt: skip
    assert args.handler(args) == 0
    printed = capsys.readouterr().out
    assert "all of one runtime's calls, then the next one's; after each runtime's" in printed
    assert "own threads 1" in printed
    assert os.environ.get("ONNX_RECURRENT_NUM_THREADS") == before  # restored, or absent
    if HAVE_ORT:
        assert "intra_op_num_threads 1" in printed
    if HAVE_OV:
        assert "INFERENCE_NUM_THREADS 1" in printed
        assert "| ov " in printed
    assert printed.count("| tiny ") == 1


def test_settle_waits_while_threads_spin():
    clock, spent = FakeClock(), FakeClock()
    spinning = {"quanta": 3}

    def sleep(seconds):
        clock.now += seconds
        if spinning["quanta"] > 0:  # a thread pool still spinning on one core
            spinning["quanta"] -= 1
            spent.now += seconds

    waited = bench.settle(quantum=0.01, clock=clock, cpu=spent, sleep=sleep)
    assert waited == pytest.approx(0.04)  # 3 busy quanta, then one quiet one
    assert bench.settle(quantum=0.01, clock=clock, cpu=spent, sleep=sleep) == pytest.approx(0.01)
    spinning["quanta"] = 10**6
    assert bench.settle(max_wait=0.1, quantum=0.01, clock=clock, cpu=spent, sleep=sleep) < 0.12


def test_between_runs_after_every_alternating_call():
    clock = FakeClock()
    log = []
    calls = {"ours": lambda: log.append("ours"), "a": lambda: log.append("a")}
    bench.time_alternating(
        calls, min_repeats=2, max_repeats=2, clock=clock, between=lambda: log.append("|")
    )
    assert log[1::2] == ["|"] * 4 and sorted(log[0::2]) == ["a", "a", "ours", "ours"]
    log.clear()  # blocks: a pause between one runtime's calls and the next one's
    bench.time_alternating(
        calls, min_repeats=2, max_repeats=2, order="blocks", between=lambda: log.append("|")
    )
    assert log == ["ours", "ours", "|", "a", "a"]


@pytest.mark.parametrize("value", ["-1", "two"])
def test_background_load_must_be_a_count(value, capsys):
    from onnx_recurrent.tools.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["bench", "--background-load", value, "--list"])
    assert exit.value.code == 2
    assert (
        "--background-load: expected a number of processes, 0 or more" in capsys.readouterr().err
    )


def test_replan_beside_given_plan_values_is_refused(monkeypatch, capsys):
    # --replan set ONNX_RECURRENT_PLAN=measure over the user's rows=8: dropped unsaid
    from onnx_recurrent.backends import tuning
    from onnx_recurrent.tools.cli import main

    monkeypatch.setenv(tuning.ENV, "rows=8")
    assert main(["bench", "--replan", "--list"]) == 2
    assert "--replan measures the plan again, while ONNX_RECURRENT_PLAN='rows=8'" in (
        capsys.readouterr().err
    )
    assert os.environ[tuning.ENV] == "rows=8"


# ------------------------------------------------------------------ whole models (--models)

HAVE_SILERO = importlib.util.find_spec("silero_vad") is not None


def _table_rows(table: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(header)
        rows[cells[0]] = cells
    return header, rows


def test_models_list_and_filter(capsys):
    args = _parse("--models", "--list")
    assert args.handler(args) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == [c.name for c in bench.MODEL_CASES]
    assert {"silero-1", "silero-128", "example", "gru-layout1", "lstm-float64"} <= set(names)
    assert {"rnn-affine", "lstm-input-forget", "dtln", "gtcrn"} <= set(names)
    args = _parse("--models", "--list", "-k", "silero")
    assert args.handler(args) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "silero-1",
        "silero-128",
        "fw-silero-1",
        "fw-silero-312",
    ]


@pytest.mark.parametrize("models", [False, True])
def test_selection_matching_nothing_is_an_error(capsys, models):
    args = _parse(*(["--models"] if models else []), "-k", "silero-1,dtln")
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert "-k 'silero-1,dtln' matches no case" in err
    assert "Traceback" not in err and "TypeError" not in err


def test_models_reject_operator_options_and_no_ours(capsys):
    args = _parse("--models", "--shapes", "M", "--list")
    assert args.handler(args) == 2
    assert "--models does not take --shapes" in capsys.readouterr().err
    args = _parse("--models", "--runtimes", "onnxruntime,reference", "--list")
    assert args.handler(args) == 2
    assert "needs one of ours" in capsys.readouterr().err


def test_models_quick_run_has_rows_columns_and_finite_ratios():
    done = bench.run_bench(models=True, select="example", repeat=2, warmup=1)
    assert [r.case.name for r in done.results] == ["example"]
    result = done.results[0]
    assert result.error is None and result.missing is None
    ours = [n for n in bench.MODEL_OURS if n in result.samples]
    assert ours, result.skipped  # at least one host ran
    assert all(len(result.samples[n]) == 2 for n in ours)
    header, rows = _table_rows(bench.format_table(done.results, done.runtimes))
    assert header == [
        "case",
        "reps",
        "other CPU",
        "ours (ort host) ms",
        "ours (ref host) ms",
        "onnxruntime ms",
        "OpenVINO ms",
        "onnx.reference ms",
        "ours (ort host)/ort [quartiles]",
        "ours (ref host)/ort [quartiles]",
        "ref/ours (ort host / ref host)",
        "Δ ref host",
        "Δ ort",
        "Δ ov",
        "Δ ref",
    ]
    row = dict(zip(header, rows["example"], strict=True))
    assert row["reps"] == "2"
    if HAVE_ORT:
        assert result.diffs["onnxruntime"] < 1e-5
        for name in ours:
            ratio = result.ratio("onnxruntime", name)
            assert ratio is not None and np.isfinite(ratio) and ratio > 0
            title = {"ours-onnxruntime": "ours (ort host)", "ours-reference": "ours (ref host)"}
            cell = row[f"{title[name]}/ort [quartiles]"]
            assert cell.startswith(bench.report.fmt_ratio(ratio) + " [")
    else:
        assert "not installed" in result.skipped["onnxruntime"]
    for name, reason in result.skipped.items():  # a host that did not run says why
        assert reason
        assert row[{r.name: r.title for r in done.runtimes}[name]] == "—"
    report = done.report()
    assert "Cases: example: the bundled example_gru.onnx" in report
    assert "ours/ort: our median over onnxruntime alone's" in report
    assert "Targets:" not in report
    data = json.loads(json.dumps(done.to_json()))
    assert data["results"][0]["case"] == "example"
    assert data["options"]["models"] is True


def test_models_command_skips_what_onnxruntime_alone_gets_wrong(tmp_path, capsys):
    out = tmp_path / "models.json"
    args = _parse(
        "--models", "-k", "gru-layout1", "--repeat", "1", "-q", "--json", str(out),
        "--runtimes", "ours-onnxruntime,ours-reference,onnxruntime",
    )  # fmt: skip
    status = args.handler(args)
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    (result,) = data["results"]
    assert status == (0 if result["error"] is None else 1)
    assert "| gru-layout1 " in printed
    if HAVE_ORT:  # the reason is the lint's, from its probe
        reason = result["skipped"]["onnxruntime"]
        assert reason.startswith("known wrong: does not support layout=1 (refused: ")
        assert f"- onnxruntime: {reason} — all cases" in printed
    assert result["over_onnxruntime"] == {"ours-onnxruntime": None, "ours-reference": None}


class _OldSession:
    """An InferenceSession from before the hosts: no host=, onnx.reference runs it."""

    def __init__(self, model):
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(model)

    def run(self, names, feeds):
        return self.evaluator.run(names, feeds)


def test_models_without_host_the_ort_host_is_unavailable(monkeypatch):
    import onnx_recurrent

    monkeypatch.setattr(onnx_recurrent, "InferenceSession", _OldSession)
    (case,) = bench.make_model_cases("gru-layout1")
    runtimes = bench.make_runtimes(models=True, runtimes=["ours-onnxruntime", "ours-reference"])
    result = bench.run_case(case, runtimes, repeat=1)
    assert result.error is None
    if HAVE_ORT:
        assert result.skipped["ours-onnxruntime"].startswith("unavailable: ")
        assert "takes no host=" in result.skipped["ours-onnxruntime"]
    assert len(result.samples["ours-reference"]) == 1
    assert "without host=" in result.notes["ours-reference"]


def test_models_error_when_none_of_ours_runs(monkeypatch):
    import onnx_recurrent

    class Failing:
        def __init__(self, model, *args, host="auto", **kwargs):
            raise RuntimeError("no session today")

    monkeypatch.setattr(onnx_recurrent, "InferenceSession", Failing)
    (case,) = bench.make_model_cases("rnn-affine")
    result = bench.run_case(case, bench.make_runtimes(models=True), repeat=1)
    assert result.error == "ours-reference: failed: RuntimeError: no session today"
    assert result.skipped["ours-onnxruntime"] == "failed: RuntimeError: no session today"
    assert not result.samples


@pytest.mark.skipif(not HAVE_SILERO, reason="needs silero-vad (pip install --no-deps silero-vad)")
def test_models_silero_feeds_and_time_per_chunk():
    feeds = bench.silero_feeds(128, seed=1)
    assert feeds["input"].shape == (128, 64 + 512) and feeds["input"].dtype == np.float32
    assert feeds["state"].shape == (2, 128, 128) and not feeds["state"].any()
    assert feeds["sr"].shape == () and feeds["sr"].dtype == np.int64 and feeds["sr"] == 16000
    assert 0.05 < float(np.abs(feeds["input"]).max()) < 1.0
    if not HAVE_ORT:
        pytest.skip("needs onnxruntime")
    done = bench.run_bench(
        models=True, select="silero-1", runtimes=["ours-onnxruntime", "onnxruntime"], repeat=1
    )
    (result,) = done.results
    assert result.error is None
    report = done.report()
    assert "Silero VAD, ms per 512-sample chunk" in report
    if "ours-onnxruntime" in result.samples:
        assert result.per_chunk("ours-onnxruntime") == result.median("ours-onnxruntime")
        assert result.diffs["onnxruntime"] < 1e-4


def test_time_alternating_caps_a_slow_runtime():
    clock = FakeClock()

    def call(seconds):
        def run():
            clock.now += seconds

        return run

    calls = {"fast": call(0.01), "slow": call(1.0)}
    samples = bench.time_alternating(
        calls, min_repeats=3, max_repeats=1000, budget=5.0, clock=clock, max_calls={"slow": 2}
    )
    assert len(samples["slow"]) == 2
    # the budget left after the slow calls goes to rounds of the fast one alone
    assert len(samples["fast"]) > 100
    assert clock.now <= 5.0 + 0.01
    blocks = bench.time_alternating(
        calls, min_repeats=3, max_repeats=3, order="blocks", clock=clock, max_calls={"slow": 1}
    )
    assert [len(blocks["fast"]), len(blocks["slow"])] == [3, 1]


def test_openvino_reason_names_what_it_could_not_convert():
    from onnx_recurrent.tools.bench.runtimes import openvino_reason

    error = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:105:\n"
        "Check 'false' failed at src/frontends/x.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\n"
        "Summary:\n-- Conversion is failed for: Conv-16, ReduceMean-16\n"
    )
    assert openvino_reason(error) == "cannot convert the model: Conv-16, ReduceMean-16"
    assert openvino_reason(RuntimeError("Exception from a.cpp:1:\nbad shape")) == "bad shape"


def test_a_models_dir_that_is_not_there_is_an_error(monkeypatch, tmp_path):
    # was ignored: the models were looked for elsewhere, the typo never said
    from onnx_recurrent.tools.bench import models

    monkeypatch.setenv(models.MODELS_DIR_VARIABLE, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"ONNX_RECURRENT_MODELS_DIR=.*nowhere': no such dir"):
        models.model_dirs()
    monkeypatch.setenv(models.MODELS_DIR_VARIABLE, str(tmp_path))
    assert models.model_dirs()[0] == tmp_path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_plot_to_a_device_or_pipe_is_written_as_named(tmp_path):
    """--plot /dev/null wrote a new file /dev/null.png: a device or a pipe (no suffix)
    is written as named, in PNG, as run -o writes one."""
    pytest.importorskip("matplotlib")
    import threading

    from onnx_recurrent.tools.bench.plot import plot_path

    if os.path.exists("/dev/null"):
        assert plot_path("/dev/null") == "/dev/null"
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert plot_path(str(pipe)) == str(pipe)
    case = bench.make_cases(["gru"], ["tiny"])[0]
    results = [bench.CaseResult(case, samples={"ours": [1.0], "onnxruntime": [2.0]})]
    read = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_bytes()), daemon=True)
    reader.start()
    bench.plot_ratios(results, pipe)
    reader.join(60)
    assert read and read[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["pipe"]
