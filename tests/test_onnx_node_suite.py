"""onnx's own node test suite through :mod:`onnx_recurrent.backend`, beside onnxruntime.

Every case of ``onnx.backend.test.case.node.collect_testcases()`` (the generators the
onnx wheel ships: one model and its data sets per case) runs through plain
onnxruntime and through our backend (host ``"auto"``), its outputs compared as onnx's
backend test runner compares them (its tolerances, per case: rtol 1e-3, atol 1e-7 in
onnx 1.23). Asserted: every case onnxruntime passes passes under ours, and every
recurrent case (``test_gru_*``, ``test_lstm_*``, ``test_rnn_*``, ``test_simple_rnn_*``)
passes under ours, under the onnxruntime host where it can run, and under the reference
host, as does every case with a sequence or optional graph input. The counts and the
cases onnxruntime fails are printed in the terminal summary (and by the tests, with
``-s``).

The comparison is the runner's (``Runner.assert_similar_outputs``: lengths, shapes,
element types, strings equal, ``assert_allclose``), written out here because the
runner's recursion fails on a sequence of 0-d arrays (``len()`` of a 0-d array:
``test_loop16_seq_none`` fails under every backend) and it has no case for an empty
optional (None).
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")
import onnxruntime as ort
from onnx.backend.test.case.node import collect_testcases

from onnx_recurrent import backend

RECURRENT = ("test_gru_", "test_lstm_", "test_rnn_", "test_simple_rnn_")
#: the onnxruntime host needs onnxruntime-extensions too; without it ours runs every
#: model on the reference host, which is not held to onnxruntime's results
HAS_EXTENSIONS = importlib.util.find_spec("onnxruntime_extensions") is not None


def _normal(value):
    """A data set's value as a backend returns it: TensorProto -> ndarray, recursively."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def assert_similar(expected, got, rtol: float, atol: float, where: str = "output") -> None:
    """onnx's runner's comparison, for tensors, sequences, optionals and maps."""
    if expected is None:
        assert got is None, f"{where}: expected None (an empty optional), got {type(got)}"
        return
    if isinstance(expected, list | tuple):
        assert isinstance(got, list | tuple), f"{where}: expected a list, got {type(got)}"
        assert len(got) == len(expected), f"{where}: {len(got)} values, expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            assert_similar(e, g, rtol, atol, f"{where}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), f"{where}: keys differ"
        for k in expected:
            assert_similar(
                np.asarray(expected[k]), np.asarray(got[k]), rtol, atol, f"{where}[{k}]"
            )
        return
    assert isinstance(got, np.ndarray), f"{where}: expected an ndarray, got {type(got)}"
    np.testing.assert_array_equal(got.shape, expected.shape, err_msg=f"{where}: shape")
    if expected.dtype == object:  # strings
        np.testing.assert_array_equal(got, expected, err_msg=where)
        return
    assert got.dtype == expected.dtype, f"{where}: element type {got.dtype}, not {expected.dtype}"
    if got.dtype.name == "bfloat16":  # two bfloat16 ulps, as the runner
        rtol = max(rtol, 2**-6)
        got, expected = got.astype(np.float32), expected.astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=where)


def _onnxruntime(case, inputs: list) -> list:
    """Plain onnxruntime, inputs mapped by position as its backend maps them (NumPy
    scalars made arrays, which its ``run`` refuses)."""
    session = ort.InferenceSession(
        case.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    inputs = [np.asarray(v) if isinstance(v, np.generic) else v for v in inputs]
    names = [arg.name for arg in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs, strict=False)))


def _ours(case, inputs: list, host: str = "auto", hosts: dict | None = None) -> list:
    rep = backend.prepare(case.model, host=host)
    if hosts is not None:
        hosts[case.name] = rep.session.host
    return rep.run(inputs)


def _outcome(run, case) -> str | None:
    """None where every data set of ``case`` gives its outputs; else why not."""
    try:
        for inputs, outputs in case.data_sets:
            got = run(case, _normal(list(inputs)))
            assert_similar(_normal(list(outputs)), list(got), case.rtol, case.atol)
    except Exception as e:  # a backend's refusal or a mismatch: the case fails
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"[:200]
    return None


@dataclass
class Suite:
    total: int = 0
    onnxruntime: dict[str, str | None] = field(default_factory=dict)
    ours: dict[str, str | None] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    recurrent: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cases: dict = field(default_factory=dict)

    def passed(self, results: dict) -> list[str]:
        return [name for name, why in results.items() if why is None]

    def summary(self) -> list[str]:
        ort_failed = {n: w for n, w in self.onnxruntime.items() if w is not None}
        lines = [
            f"onnx {onnx.__version__} node suite ({self.total} cases, {self.seconds:.0f} s): "
            f"onnx-recurrent passes {len(self.passed(self.ours))}, "
            f"onnxruntime {ort.__version__} {len(self.passed(self.onnxruntime))}",
            "ours by host: "
            + ", ".join(
                f"{h} {sum(v == h for v in self.hosts.values())}"
                for h in sorted(set(self.hosts.values()))
            )
            + f" (of {len(self.hosts)} prepared; 'auto' falls back to the reference host "
            "where onnxruntime refuses a model)",
            "recurrent cases (ours / onnxruntime): "
            + ", ".join(
                f"{n} {'pass' if self.ours[n] is None else 'FAIL'}/"
                f"{'pass' if self.onnxruntime[n] is None else 'fail'}"
                for n in self.recurrent
            ),
            f"cases onnxruntime fails ({len(ort_failed)}), and ours on each:",
        ]
        lines += [
            f"  {n} [ours: {'pass' if self.ours[n] is None else 'fail'}]: {why}"
            for n, why in sorted(ort_failed.items())
        ]
        return lines


class _Summary:
    """A pytest plugin that prints the suite's summary at the end of the session."""

    def __init__(self, suite: Suite) -> None:
        self.suite = suite

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.section("onnx node suite: onnx-recurrent and onnxruntime")
        for line in self.suite.summary():
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def suite(request) -> Suite:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' overflows, host fallbacks
        cases = collect_testcases()
        result = Suite(total=len(cases))
        for case in cases:
            result.cases[case.name] = case
            result.onnxruntime[case.name] = _outcome(_onnxruntime, case)
            result.ours[case.name] = _outcome(lambda c, i: _ours(c, i, hosts=result.hosts), case)
            if case.name.startswith(RECURRENT):
                result.recurrent.append(case.name)
    result.seconds = time.perf_counter() - start
    request.config.pluginmanager.register(_Summary(result), "onnx-node-suite-summary")
    return result


def test_every_recurrent_case_passes_under_ours(suite):
    print("\n".join(suite.summary()))
    assert len(suite.recurrent) >= 18, suite.recurrent
    failed = {n: suite.ours[n] for n in suite.recurrent if suite.ours[n] is not None}
    assert not failed, failed
    if HAS_EXTENSIONS:  # computed by our native nodes inside onnxruntime
        assert {suite.hosts[n] for n in suite.recurrent} == {"onnxruntime"}


@pytest.mark.skipif(not HAS_EXTENSIONS, reason="the onnxruntime host needs onnxruntime-extensions")
def test_every_case_onnxruntime_passes_passes_under_ours(suite):
    failed = {
        n: suite.ours[n] for n in suite.passed(suite.onnxruntime) if suite.ours[n] is not None
    }
    assert not failed, failed
    assert len(suite.passed(suite.onnxruntime)) > suite.total // 2  # the suite did run


def test_recurrent_and_container_cases_under_the_reference_host(suite):
    """The recurrent cases, and the cases with a sequence or optional graph input,
    under the reference host too (onnx.reference runs the graph)."""
    cases = suite.cases
    containers = [
        name
        for name, case in cases.items()
        if any(v.type.WhichOneof("value") != "tensor_type" for v in case.model.graph.input)
    ]
    assert len(containers) >= 18, containers
    failed = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in [*suite.recurrent, *containers]:
            why = _outcome(lambda c, i: _ours(c, i, host="reference"), cases[name])
            if why is not None:
                failed[name] = why
    # the optional cases onnxruntime cannot run (OptionalHasElement/GetElement-28) run
    # under the reference host; none is allowed to fail
    assert not failed, failed
