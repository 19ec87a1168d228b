"""Public real models bundled under ``tests/data/models`` against onnxruntime.

The models (``tests/data/models/README.md``: sources, licences, checksums, inputs and
outputs): Silero VAD v6.0 as faster-whisper ships it (a top-level LSTM), DTLN's stage 1
(two stacked LSTMs) and streaming GTCRN (14 GRU nodes, bidirectional ones among them).
Each runs :data:`CALLS` consecutive calls on seeded voice-like audio, one chunk or frame
per call as its streaming loop makes them (the bench's feed functions), carrying its
states from one call to the next, through plain ``onnxruntime.InferenceSession`` and
through ``onnx_recurrent.InferenceSession`` under the default host and under
``host="reference"``; every output of every call must match onnxruntime's. onnx 1.23's
onnx.reference gets two of GTCRN's other operators wrong (ConvTranspose with group > 1
fails; BatchNormalization-9 with ``momentum`` uses the batch's statistics): for GTCRN
under the reference host the test corrects them where probes find them wrong, so that
it checks our GRU nodes.

Tolerance: float32 throughout, ``rtol`` 1e-4 and ``atol`` 1e-5. The runtimes sum the
same products in different orders (onnxruntime's MLAS GEMMs against NumPy's BLAS and
our kernels), a few float32 ulps per operation, and the carried states add each call's
rounding to the next. Measured: at most 1.2e-5 absolute (GTCRN, outputs up to 42),
4.6e-6 (Silero, states up to 10) and 1.9e-6 (DTLN), each at most a quarter of the bound
``atol + rtol * |onnxruntime's|``. One recurrent node changed (GTCRN: one GRU with
linear_before_reset=0; Silero, DTLN: one LSTM without its bias) moves the outputs by
0.6 to 6.7.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import onnx_recurrent as orc
from onnx_recurrent.tools import bench

DATA = Path(__file__).parent / "data" / "models"
RTOL, ATOL = 1e-4, 1e-5
#: consecutive calls per model, the states carried from one to the next
CALLS = 4
#: chunks per call of faster-whisper's Silero export here (its LSTM's time steps)
WHISPER_CHUNKS = 3

HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None
needs_ort = pytest.mark.skipif(not HAVE_ORT, reason="needs onnxruntime")


@dataclass(frozen=True)
class Public:
    """A bundled model: its file and checksum, one call's feeds from ``samples`` samples
    of audio (``hop`` further on at the next call), the state inputs with the outputs
    that carry them to the next call, its recurrent nodes and its bench cases."""

    file: str
    sha256: str
    feeds: Callable[[np.ndarray], dict[str, np.ndarray]]
    samples: int
    hop: int
    states: dict[str, str]
    recurrent: dict[str, int]
    cases: tuple[str, ...]


MODELS = {
    "fw-silero": Public(
        "faster_whisper_silero_vad_v6.onnx",
        "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
        bench.whisper_silero_feeds,
        samples=bench.models.SILERO_CONTEXT + WHISPER_CHUNKS * bench.models.SILERO_CHUNK,
        hop=WHISPER_CHUNKS * bench.models.SILERO_CHUNK,
        states={"h": "hn", "c": "cn"},
        recurrent={"LSTM": 1},
        cases=("fw-silero-1", "fw-silero-312"),
    ),
    "dtln": Public(
        "dtln_model_1.onnx",
        "22b91cae3855e5a0620e66a917ca6c82c58db0e842c770f58d86751c5e8d4ae3",
        bench.dtln_feeds,
        samples=bench.models.DTLN_BLOCK,
        hop=bench.models.DTLN_HOP,
        states={"input_3": "tf_op_layer_stack_2"},
        recurrent={"LSTM": 2},
        cases=("dtln",),
    ),
    "gtcrn": Public(
        "gtcrn_simple.onnx",
        "b4718df6228e7bdf1a8a435cf98f838636eb2fd331acabf86ba87c5192ebcb87",
        bench.gtcrn_feeds,
        samples=bench.models.GTCRN_FRAME,
        hop=bench.models.GTCRN_HOP,
        states={
            "conv_cache": "conv_cache_out",
            "tra_cache": "tra_cache_out",
            "inter_cache": "inter_cache_out",
        },
        recurrent={"GRU": 14},
        cases=("gtcrn",),
    ),
}


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (not initializers)."""
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _calls(session, public: Public, outputs: list[str], seed: int = 0) -> list[dict]:
    """:data:`CALLS` consecutive calls on one stream of audio, the states carried."""
    audio = bench.voice(public.samples + (CALLS - 1) * public.hop, seed=seed)[0]
    results, carried = [], {}
    for call in range(CALLS):
        feeds = public.feeds(audio[call * public.hop : call * public.hop + public.samples])
        feeds.update(carried)
        result = dict(zip(outputs, session.run(None, feeds), strict=True))
        carried = {state: result[output] for state, output in public.states.items()}
        results.append(result)
    return results


def _reference_model(node: onnx.NodeProto, x: np.ndarray, *weights: np.ndarray) -> np.ndarray:
    """onnx.reference's output of one opset-11 ``node`` on ``x`` with constant ``weights``."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, n) for w, n in zip(weights, node.input[1:], strict=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    return ReferenceEvaluator(model).run(None, {node.input[0]: x})[0]


def _grouped_conv_transpose_fails() -> bool:
    """onnx.reference's ConvTranspose with group > 1 and several output channels per
    group raises "could not broadcast" (onnx 1.23; onnx pull request 8446)."""
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2)
    x, w = np.ones((1, 2, 3), np.float32), np.ones((2, 2, 1), np.float32)
    try:
        _reference_model(node, x, w)
    except ValueError:
        return True
    return False


def _batch_norm_9_uses_batch_statistics() -> bool:
    """onnx.reference's BatchNormalization of opsets 9-13 with ``momentum`` set (as
    PyTorch exports it) mixes the batch's statistics into Y where a one-output node
    must use the running ones (onnx 1.23; onnx pull request 8442)."""
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], momentum=0.9)
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    one, zero = np.ones(2, np.float32), np.zeros(2, np.float32)
    return not np.allclose(_reference_model(node, x, one, zero, zero, one), x, atol=1e-4)


def _correct_onnx_reference(monkeypatch) -> list[str]:
    """Correct, for one test, the operators of onnx.reference that GTCRN meets and that
    the probes find wrong; returns what was corrected. Our recurrent nodes under the
    reference host can then be checked on GTCRN."""
    from onnx.reference.ops import op_batch_normalization, op_conv_transpose

    corrected = []
    if _grouped_conv_transpose_fails():
        ungrouped = op_conv_transpose.ConvTranspose._run

        def grouped(self, X, W, B=None, group=1, **attributes):
            if group == 1:
                return ungrouped(self, X, W, B=B, group=1, **attributes)
            ins, outs = X.shape[1] // group, W.shape[1]
            parts = [
                ungrouped(
                    self,
                    X[:, g * ins : (g + 1) * ins],
                    W[g * ins : (g + 1) * ins],
                    B=None if B is None else B[g * outs : (g + 1) * outs],
                    group=1,
                    **attributes,
                )[0]
                for g in range(group)
            ]
            return (np.concatenate(parts, axis=1).astype(X.dtype),)

        monkeypatch.setattr(op_conv_transpose.ConvTranspose, "_run", grouped)
        corrected.append("ConvTranspose with group > 1")
    if _batch_norm_9_uses_batch_statistics():

        def running(self, x, scale, bias, mean, var, epsilon=1e-5, momentum=None):
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
            return ((y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype),)

        monkeypatch.setattr(op_batch_normalization.BatchNormalization_9, "_run", running)
        corrected.append("BatchNormalization-9 with momentum")
    return corrected


def test_bundled_files_are_the_published_ones():
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for public in MODELS.values():
        path = DATA / public.file
        assert hashlib.sha256(path.read_bytes()).hexdigest() == public.sha256, public.file
        assert public.file in readme and public.sha256 in readme
        assert path.stat().st_size < 2_000_000
    for licence in ("silero-vad", "faster-whisper", "DTLN", "GTCRN"):
        text = (DATA / "LICENSES" / f"{licence}.txt").read_text(encoding="utf-8")
        assert text.startswith("MIT License") and f"LICENSES/{licence}.txt" in readme


@pytest.mark.parametrize("name", MODELS)
def test_recurrent_nodes_are_top_level(name):
    public = MODELS[name]
    model = onnx.load(DATA / public.file)
    ops = [n.op_type for n in model.graph.node if n.op_type in ("GRU", "LSTM", "RNN")]
    assert {op: ops.count(op) for op in set(ops)} == public.recurrent
    assert [i.name for i in _inputs(model)][1:] == list(public.states)


@needs_ort
@pytest.mark.parametrize("host", ["default", "reference"])
@pytest.mark.parametrize("name", MODELS)
def test_consecutive_calls_match_onnxruntime(name, host, monkeypatch):
    import onnxruntime as ort

    public = MODELS[name]
    path = DATA / public.file
    outputs = [o.name for o in onnx.load(path).graph.output]
    onnxruntime = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = _calls(onnxruntime, public, outputs)
    if host == "reference" and name == "gtcrn":
        # onnx 1.23's onnx.reference gets two of GTCRN's other operators wrong (it fails
        # on the first, alone as under our reference host): corrected here, so that
        # what is checked is our 14 GRU nodes in the reference host's graph
        _correct_onnx_reference(monkeypatch)
    ours_session = (
        orc.InferenceSession(path) if host == "default" else orc.InferenceSession(path, host=host)
    )
    ours = _calls(ours_session, public, outputs)
    for call, (got, want) in enumerate(zip(ours, theirs, strict=True)):
        for output in outputs:
            assert got[output].shape == want[output].shape, (call, output)
            assert got[output].dtype == want[output].dtype, (call, output)
            np.testing.assert_allclose(
                got[output], want[output], rtol=RTOL, atol=ATOL, err_msg=f"call {call} {output}"
            )
    # the states moved: the calls after the first are not the first again
    assert not np.array_equal(theirs[-1][outputs[-1]], theirs[0][outputs[-1]])


@pytest.mark.parametrize("case_name", [c for p in MODELS.values() for c in p.cases])
def test_bench_cases_build_the_model_inputs(case_name, monkeypatch):
    monkeypatch.setenv(bench.MODELS_DIR_VARIABLE, str(DATA))
    (case,) = bench.make_model_cases(case_name)
    assert case.file is not None and case.missing() is None
    assert case.file.find() == DATA / case.file.name
    model, feeds = case.build(0)
    inputs = _inputs(model)
    assert list(feeds) == [i.name for i in inputs]
    for value in inputs:
        tensor = value.type.tensor_type
        feed = feeds[value.name]
        assert feed.dtype == helper.tensor_dtype_to_np_dtype(tensor.elem_type), value.name
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        assert feed.ndim == len(dims), value.name
        assert all(d is None or d == n for d, n in zip(dims, feed.shape, strict=True)), value.name
    assert all(np.isfinite(f).all() for f in feeds.values())
    if case.chunks:
        assert feeds["input"].shape == (case.chunks, 64 + 512)
        # each chunk carries the previous one's last 64 samples in front
        assert np.array_equal(feeds["input"][1:, :64], feeds["input"][:-1, -64:])


def test_a_case_whose_file_is_nowhere_is_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv(bench.MODELS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    file = bench.ModelFile(
        "absent.onnx", "no_such_package_of_onnx_recurrent", "asset/absent.onnx", "pip install x"
    )

    def build(seed):
        raise AssertionError("a case without its file is not built")

    case = bench.ModelCase("absent", "a model that is nowhere", build, file=file)
    reason = case.missing()
    assert reason is not None and reason.startswith("absent.onnx not found in tests/data/models")
    assert reason.endswith("no_such_package_of_onnx_recurrent/asset/absent.onnx (pip install x)")
    runtimes = bench.make_runtimes(models=True, runtimes=["ours-reference"])
    result = bench.run_case(case, runtimes)
    assert result.missing == reason and not result.samples
    assert f"not run: {reason}" in bench.format_table([result], runtimes)
    with pytest.raises(FileNotFoundError, match=r"absent\.onnx not found"):
        file.path()


def test_a_file_is_read_from_the_package_that_ships_it(monkeypatch, tmp_path):
    (tmp_path / "empty").mkdir()  # named, it must be there (else an error)
    monkeypatch.setenv(bench.MODELS_DIR_VARIABLE, str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    shipped = tmp_path / "site" / "shipping_package_of_onnx_recurrent" / "asset" / "m.onnx"
    shipped.parent.mkdir(parents=True)
    (shipped.parents[1] / "__init__.py").write_text("raise ImportError('never imported')\n")
    shipped.write_bytes(b"model")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    file = bench.ModelFile("m.onnx", "shipping_package_of_onnx_recurrent", "asset/m.onnx", "")
    assert file.find() == shipped
    bundled = tmp_path / "empty" / "m.onnx"
    bundled.write_bytes(b"model")
    assert file.find() == bundled  # the bundled file first


def test_the_silero_cases_ask_for_silero_vad_6():
    silero = [c for c in bench.MODEL_CASES if c.requires == "silero_vad"]
    assert [c.name for c in silero] == ["silero-1", "silero-128"]
    assert all(c.min_version == "6.0" and "Silero VAD v6" in c.description for c in silero)
    if importlib.util.find_spec("silero_vad") is None:
        pytest.skip("needs silero-vad")
    too_new = bench.ModelCase("s", "", silero[0].build, requires="silero_vad", min_version="99")
    reason = too_new.missing()
    assert reason is not None and reason.startswith("silero_vad ")
    assert "installed, the case needs 99 or later" in reason
