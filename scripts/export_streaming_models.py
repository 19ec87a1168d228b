"""Regenerate the streaming test models in ``tests/data/``.

Two small PyTorch models whose recurrent state stays inside the graph (they take no
``h0``): the exporter builds the initial state as zeros with ``Expand``, which is what
:func:`onnx_recurrent.runtime.streaming.expose_states` must replace by graph inputs.

* ``streaming_gru.onnx``: a 2-layer batch-first ``nn.GRU`` (4 -> 8) and a per-step
  ``nn.Linear`` head (8 -> 3); input ``x`` [batch, seq, 4], outputs ``y``
  [batch, seq, 3] and ``h_n`` [2, batch, 8].
* ``streaming_lstm.onnx``: a 2-layer time-major ``nn.LSTM`` (4 -> 8); input ``x``
  [seq, batch, 4], outputs ``y`` [seq, batch, 8], ``h_n`` and ``c_n`` [2, batch, 8].
* ``streaming_expected.npz``: for each model, a seeded 50-step input (batch 2) and
  PyTorch's own outputs for it (``gru.x``, ``gru.y``, ``gru.h_n``, ``lstm.x``, ...).

The GRU is exported with the default (``torch.export``-based) exporter, which builds
the zero state with ``Expand``; the LSTM with the TorchScript one (``dynamo=False``),
which builds it with ``ConstantOfShape``. Batch and sequence axes are dynamic; both are
checked against PyTorch with onnxruntime (max abs
difference < 1e-5) for several sizes, a 1-step sequence included.

Rerun (from the repository root)::

    pip install "torch==2.13.0" "onnxscript==0.7.2" onnx onnxruntime numpy
    python scripts/export_streaming_models.py

Only this script needs torch; the tests read the files it writes.
"""

from __future__ import annotations

import io
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

SEED = 0
INPUT_SIZE = 4
HIDDEN_SIZE = 8
NUM_LAYERS = 2
HEAD_SIZE = 3
SAMPLE_BATCH, SAMPLE_STEPS = 2, 50
TOLERANCE = 1e-5

DATA_DIR = Path(__file__).resolve().parents[1] / "tests" / "data"


class StreamingGRU(nn.Module):
    """2-layer batch-first GRU with a per-step linear head; no h0 input."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(INPUT_SIZE, HIDDEN_SIZE, num_layers=NUM_LAYERS, batch_first=True)
        self.head = nn.Linear(HIDDEN_SIZE, HEAD_SIZE)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h_n = self.gru(x)
        return self.head(y), h_n


class StreamingLSTM(nn.Module):
    """2-layer time-major LSTM; no (h0, c0) input."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(INPUT_SIZE, HIDDEN_SIZE, num_layers=NUM_LAYERS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, (h_n, c_n) = self.lstm(x)
        return y, h_n, c_n


#: name -> (module class, output names, batch axis of x, exported with dynamo)
MODELS = {
    "gru": (StreamingGRU, ("y", "h_n"), 0, True),
    "lstm": (StreamingLSTM, ("y", "h_n", "c_n"), 1, False),
}


def export(
    module: nn.Module, x: np.ndarray, outputs: tuple[str, ...], batch_axis: int, dynamo: bool
) -> onnx.ModelProto:
    """Export with the torch.export-based exporter, or the TorchScript one.

    The TorchScript exporter is used for the time-major LSTM: the dynamo exporter
    bakes the sample's sequence length into a Reshape after a time-major LSTM.
    """
    time_axis = 1 - batch_axis
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's
        path = Path(tmp) / "model.onnx"
        if dynamo:
            dims = {batch_axis: torch.export.Dim("batch"), time_axis: torch.export.Dim("seq")}
            kwargs = {"dynamic_shapes": (dims,), "external_data": False}
        else:
            kwargs = {"dynamic_axes": {"x": {batch_axis: "batch", time_axis: "seq"}}}
        torch.onnx.export(
            module,
            (torch.from_numpy(x),),
            str(path),
            input_names=["x"],
            output_names=list(outputs),
            dynamo=dynamo,
            verbose=False,
            **kwargs,
        )
        return onnx.load(str(path))


def _set_shape(value: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    """Declare ``dims`` (ints fixed, strings named) as the shape of ``value``."""
    elem = value.type.tensor_type.elem_type
    value.type.CopyFrom(onnx.helper.make_tensor_type_proto(elem, dims))


def clean(model: onnx.ModelProto, name: str, batch_axis: int) -> onnx.ModelProto:
    """Strip the exporter's debug metadata (local paths) and declare symbolic shapes."""
    graph = model.graph
    for node in graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        del value.metadata_props[:]
        value.doc_string = ""
    del graph.value_info[:]
    del model.metadata_props[:]
    graph.name = f"streaming_{name}"
    seq_dims = ["batch", "seq"] if batch_axis == 0 else ["seq", "batch"]
    _set_shape(graph.input[0], [*seq_dims, INPUT_SIZE])
    width = HEAD_SIZE if name == "gru" else HIDDEN_SIZE
    _set_shape(graph.output[0], [*seq_dims, width])
    for out in graph.output[1:]:
        _set_shape(out, [NUM_LAYERS, "batch", HIDDEN_SIZE])
    return model


def torch_outputs(module: nn.Module, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.detach().numpy().astype(np.float32) for t in module(torch.from_numpy(x))]


def check(model: onnx.ModelProto, module: nn.Module, batch_axis: int) -> None:
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node if n.op_type in ("GRU", "LSTM")]
    assert len(ops) == NUM_LAYERS, ops
    assert [i.name for i in model.graph.input] == ["x"], "the model must not take h0"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(SEED + 1)
    for batch, steps in [(1, 1), (2, 7), (3, 33)]:
        shape = [0, 0, INPUT_SIZE]
        shape[batch_axis], shape[1 - batch_axis] = batch, steps
        x = rng.standard_normal(shape, dtype=np.float32)
        got = sess.run(None, {"x": x})
        want = torch_outputs(module, x)
        diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
        print(f"  onnxruntime vs torch, x {list(x.shape)}: max abs diff {diff:.3g}")
        assert diff < TOLERANCE, diff


def save_npz_deterministic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` with fixed zip timestamps, so reruns give identical bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def main() -> None:
    expected = {}
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for index, (name, (cls, outputs, batch_axis, dynamo)) in enumerate(MODELS.items()):
        torch.manual_seed(SEED + index)
        module = cls().eval()
        shape = [0, 0, INPUT_SIZE]
        shape[batch_axis], shape[1 - batch_axis] = SAMPLE_BATCH, SAMPLE_STEPS
        x = np.random.default_rng(SEED + index).standard_normal(shape, dtype=np.float32)
        model = clean(export(module, x, outputs, batch_axis, dynamo), name, batch_axis)
        print(f"{name}: producer {model.producer_name} {model.producer_version}")
        check(model, module, batch_axis)
        path = DATA_DIR / f"streaming_{name}.onnx"
        path.write_bytes(model.SerializeToString())
        print(f"  wrote {path.relative_to(DATA_DIR.parents[1])}: {path.stat().st_size} bytes")
        expected[f"{name}.x"] = x
        for out, value in zip(outputs, torch_outputs(module, x), strict=True):
            expected[f"{name}.{out}"] = value
    save_npz_deterministic(DATA_DIR / "streaming_expected.npz", expected)
    print("  wrote tests/data/streaming_expected.npz")


if __name__ == "__main__":
    main()
