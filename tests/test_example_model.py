"""The bundled example model: a PyTorch 2-layer bidirectional GRU + linear head.

``src/onnx_recurrent/data/`` holds ``example_gru.onnx``, a sample input and
PyTorch's own outputs for it (written by ``scripts/export_example.py``).  These
tests run the model through ``onnx_recurrent.InferenceSession`` and compare with
the stored PyTorch outputs, and cross-check with onnxruntime.  No torch needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx_recurrent

TOLERANCE = 1e-5
INPUT_NAME = "x"
OUTPUT_NAMES = ["logits", "h_n"]


def _data_file(name: str, stack: ExitStack) -> Path:
    ref = resources.files("onnx_recurrent") / "data" / name
    return stack.enter_context(resources.as_file(ref))


@pytest.fixture(scope="module")
def files() -> Iterator[dict[str, Path]]:
    with ExitStack() as stack:
        yield {
            "model": _data_file("example_gru.onnx", stack),
            "input": _data_file("example_input.npy", stack),
            "expected": _data_file("example_expected.npz", stack),
        }


@pytest.fixture(scope="module")
def model_path(files: dict[str, Path]) -> str:
    return str(files["model"])


@pytest.fixture(scope="module")
def x(files: dict[str, Path]) -> np.ndarray:
    return np.load(files["input"], allow_pickle=False)


@pytest.fixture(scope="module")
def expected(files: dict[str, Path]) -> dict[str, np.ndarray]:
    with np.load(files["expected"], allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.fixture(scope="module")
def session(model_path: str) -> onnx_recurrent.InferenceSession:
    return onnx_recurrent.InferenceSession(model_path)


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _assert_close(got: list[np.ndarray], want: dict[str, np.ndarray], names: list[str]) -> None:
    assert len(got) == len(names)
    for name, g in zip(names, got, strict=True):
        w = want[name]
        assert isinstance(g, np.ndarray), name
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert g.dtype == np.float32, (name, g.dtype)
        assert np.all(np.isfinite(g)), name
        diff = _max_abs_diff(g, w)
        assert diff < TOLERANCE, f"{name}: max abs diff {diff:.3g}"


def test_bundled_data_is_consistent(model_path, x, expected):
    model = onnx.load(model_path)
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == [INPUT_NAME]
    assert [o.name for o in model.graph.output] == OUTPUT_NAMES
    assert sorted(expected) == sorted(OUTPUT_NAMES)
    assert x.dtype == np.float32
    assert x.shape == (2, 20, 16)
    assert expected["logits"].shape == (2, 20, 4)
    assert expected["h_n"].shape == (4, 2, 32)
    assert all(v.dtype == np.float32 for v in expected.values())


def test_graph_uses_pytorch_gru_variant(model_path):
    model = onnx.load(model_path)
    grus = [n for n in model.graph.node if n.op_type == "GRU"]
    assert len(grus) == 2  # one per layer
    for node in grus:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["linear_before_reset"] == 1
        assert attrs["direction"] == b"bidirectional"
        assert attrs["hidden_size"] == 32


def test_onnx_recurrent_matches_pytorch(session, x, expected):
    got = session.run(None, {INPUT_NAME: x})
    _assert_close(got, expected, OUTPUT_NAMES)


def test_onnx_recurrent_selected_outputs(session, x, expected):
    _assert_close(session.run(["h_n"], {INPUT_NAME: x}), expected, ["h_n"])
    _assert_close(session.run(["h_n", "logits"], {INPUT_NAME: x}), expected, ["h_n", "logits"])


def test_session_metadata(session, model_path):
    # Same shape/type conventions as onnxruntime: symbolic dims as their names.
    inputs = session.get_inputs()
    outputs = session.get_outputs()
    assert [(i.name, list(i.shape), i.type) for i in inputs] == [
        (INPUT_NAME, ["batch", "seq", 16], "tensor(float)")
    ]
    assert [(o.name, list(o.shape), o.type) for o in outputs] == [
        ("logits", ["batch", "seq", 4], "tensor(float)"),
        ("h_n", [4, "batch", 32], "tensor(float)"),
    ]
    # as onnxruntime's: new objects at each call, hashable (a caller filling in the
    # symbolic dims of a shape changed what the session reported from then on)
    with pytest.warns(UserWarning, match="run backwards in time"):
        stream = onnx_recurrent.StreamingSession(model_path, host="reference")
    for made in (session, stream):
        for arg in (*made.get_inputs(), *made.get_outputs()):
            arg.shape[:] = [1] * len(arg.shape)
        assert made.get_inputs()[0].shape == ["batch", "seq", 16]
        assert made.get_outputs()[1].shape == [4, "batch", 32]
        assert len({*made.get_inputs(), *made.get_inputs()}) == 1
    assert hash(session.get_modelmeta()) == hash(session.get_modelmeta())


def test_onnxruntime_matches_pytorch(model_path, x, expected):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    _assert_close(sess.run(None, {INPUT_NAME: x}), expected, OUTPUT_NAMES)


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (1, 7), (3, 33)])
def test_dynamic_batch_and_seq_vs_onnxruntime(session, model_path, batch, seq):
    """Our outputs have the shapes the dims give, and onnxruntime's values."""
    ort = pytest.importorskip("onnxruntime")
    xi = np.random.default_rng(batch * 100 + seq).standard_normal((batch, seq, 16), np.float32)
    got = session.run(None, {INPUT_NAME: xi})
    assert [g.shape for g in got] == [(batch, seq, 4), (4, batch, 32)]
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    want = dict(zip(OUTPUT_NAMES, sess.run(None, {INPUT_NAME: xi}), strict=True))
    _assert_close(got, want, OUTPUT_NAMES)
