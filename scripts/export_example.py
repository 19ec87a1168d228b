"""Regenerate the bundled example model in ``src/onnx_recurrent/data/``.

The example is a small PyTorch model -- a 2-layer, bidirectional, batch-first
``torch.nn.GRU`` (16 -> 32) followed by a per-time-step ``nn.Linear`` head
(64 -> 4) -- exported to ONNX with PyTorch's default (``torch.export``-based)
exporter.  The script writes three files:

* ``example_gru.onnx``      the model; input ``x`` [batch, seq, 16] (float32),
                            outputs ``logits`` [batch, seq, 4] and
                            ``h_n`` [4, batch, 32] (final hidden state of
                            layer 0 fwd/bwd, then layer 1 fwd/bwd);
* ``example_input.npy``     a seeded sample input, shape [2, 20, 16];
* ``example_expected.npz``  PyTorch's own outputs for that input, one array per
                            ONNX output name.

The exported graph contains two ONNX ``GRU`` nodes (``layout=0``,
``direction="bidirectional"``, ``linear_before_reset=1`` -- PyTorch's GRU
variant) with ``Transpose``/``Reshape`` nodes around them for the batch-first
layout.  The script checks the model against PyTorch with onnxruntime
(max abs diff < 1e-5) on the sample input and on other batch/sequence sizes.

Rerun (from the repository root)::

    # the pinned CPU build: never a bare ``pip install torch`` (it pulls GBs of CUDA)
    pip install "torch==2.13.0"
    pip install "onnxscript==0.7.2" onnx onnxruntime numpy
    python scripts/export_example.py

Only this script needs torch and onnxscript; the package and its tests do not.
The script is deterministic and idempotent: with the versions above, a rerun
rewrites the three files byte for byte (the exporter's per-node debug metadata,
which holds stack traces and local paths, is stripped, and the ``.npz`` archive
is written with fixed timestamps).
"""

from __future__ import annotations

import hashlib
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
INPUT_SIZE = 16
HIDDEN_SIZE = 32
NUM_LAYERS = 2
NUM_OUTPUTS = 4
SAMPLE_SHAPE = (2, 20, INPUT_SIZE)  # batch, seq, features
TOLERANCE = 1e-5

TORCH_VERSION = "2.13.0"
ONNXSCRIPT_VERSION = "0.7.2"

INPUT_NAME = "x"
OUTPUT_NAMES = ("logits", "h_n")

DATA_DIR = Path(__file__).resolve().parents[1] / "src" / "onnx_recurrent" / "data"
MODEL_PATH = DATA_DIR / "example_gru.onnx"
INPUT_PATH = DATA_DIR / "example_input.npy"
EXPECTED_PATH = DATA_DIR / "example_expected.npz"


class ExampleGRU(nn.Module):
    """2-layer bidirectional batch-first GRU with a per-time-step linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(
            INPUT_SIZE,
            HIDDEN_SIZE,
            num_layers=NUM_LAYERS,
            bidirectional=True,
            batch_first=True,
        )
        self.head = nn.Linear(2 * HIDDEN_SIZE, NUM_OUTPUTS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h_n = self.gru(x)  # y: [batch, seq, 2*hidden]; h_n: [layers*2, batch, hidden]
        return self.head(y), h_n


def check_versions() -> None:
    try:
        import onnxscript
    except ImportError as exc:  # pragma: no cover - environment problem
        raise SystemExit(
            "torch.onnx.export (the default, torch.export-based exporter) needs onnxscript: "
            f'pip install "onnxscript=={ONNXSCRIPT_VERSION}"'
        ) from exc
    found = {"torch": torch.__version__, "onnxscript": onnxscript.__version__}
    pinned = {"torch": TORCH_VERSION, "onnxscript": ONNXSCRIPT_VERSION}
    for name, version in found.items():
        if version.split("+")[0] != pinned[name]:
            print(
                f"WARNING: {name} {version} is not the pinned {pinned[name]}; "
                "the regenerated files may differ from the committed ones"
            )


def make_sample_input() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    return rng.standard_normal(SAMPLE_SHAPE, dtype=np.float32)


def export(model: nn.Module, x: np.ndarray) -> onnx.ModelProto:
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # torch.export's noise about GRU's _flat_weights and _check_is_size is harmless here.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            model,
            (torch.from_numpy(x),),
            str(path),
            input_names=[INPUT_NAME],
            output_names=list(OUTPUT_NAMES),
            dynamic_shapes=({0: batch, 1: seq},),
            external_data=False,
            verbose=False,
        )
        return onnx.load(str(path))


def _set_shape(value: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    """Declare ``dims`` (ints fixed, strings named) as the shape of ``value``."""
    elem = value.type.tensor_type.elem_type
    value.type.CopyFrom(onnx.helper.make_tensor_type_proto(elem, dims))


def clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Strip exporter debug metadata and fix the declared graph shapes.

    The exporter attaches stack traces (with local file paths) to every node and
    value, which would make the file depend on where the script ran.  It also
    declares ``logits`` as [batch, 20, 4] although the graph handles any sequence
    length, and leaves some intermediate ``value_info`` entries with bogus 0
    dims; those are dropped (nothing needs them) and the outputs are declared
    with their true symbolic shapes.
    """
    graph = model.graph
    for node in graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        del value.metadata_props[:]
        value.doc_string = ""
    del graph.value_info[:]
    del model.metadata_props[:]
    graph.name = "example_gru"

    assert [i.name for i in graph.input] == [INPUT_NAME]
    assert tuple(o.name for o in graph.output) == OUTPUT_NAMES
    _set_shape(graph.input[0], ["batch", "seq", INPUT_SIZE])
    _set_shape(graph.output[0], ["batch", "seq", NUM_OUTPUTS])
    _set_shape(graph.output[1], [2 * NUM_LAYERS, "batch", HIDDEN_SIZE])
    return model


def check_graph(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    op_types = sorted({n.op_type for n in model.graph.node})
    print(f"opset: {[(o.domain or 'ai.onnx', o.version) for o in model.opset_import]}")
    print(f"graph op types: {op_types}")
    grus = [n for n in model.graph.node if n.op_type == "GRU"]
    assert len(grus) == NUM_LAYERS, f"expected {NUM_LAYERS} GRU nodes, found {len(grus)}"
    for node in grus:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        print(f"  GRU {node.name}: {attrs}")
        assert attrs.get("linear_before_reset") == 1, "PyTorch's GRU needs linear_before_reset=1"
        assert attrs.get("direction") == b"bidirectional"
        assert attrs.get("hidden_size") == HIDDEN_SIZE
        assert attrs.get("layout", 0) == 0
    initializers = list(model.graph.initializer)
    assert all(t.data_type == onnx.TensorProto.FLOAT for t in initializers if len(t.dims) > 1)


def torch_outputs(model: nn.Module, x: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = model(torch.from_numpy(x))
    return {
        name: out.numpy().astype(np.float32) for name, out in zip(OUTPUT_NAMES, outs, strict=True)
    }


def compare(model_bytes: bytes, model: nn.Module, x: np.ndarray) -> float:
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    got = sess.run(None, {INPUT_NAME: x})
    want = torch_outputs(model, x)
    worst = 0.0
    for name, g in zip(OUTPUT_NAMES, got, strict=True):
        assert g.shape == want[name].shape, (name, g.shape, want[name].shape)
        worst = max(worst, float(np.max(np.abs(g - want[name]))))
    return worst


def save_npz_deterministic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez`` but with fixed zip timestamps, so reruns give identical bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def main() -> None:
    check_versions()
    torch.manual_seed(SEED)
    model = ExampleGRU().eval()
    x = make_sample_input()

    onnx_model = clean(export(model, x))
    check_graph(onnx_model)
    model_bytes = onnx_model.SerializeToString()

    diff = compare(model_bytes, model, x)
    print(f"onnxruntime vs torch, sample input {x.shape}: max abs diff {diff:.3g}")
    assert diff < TOLERANCE, diff
    # The batch and sequence axes are dynamic: check other sizes too.
    rng = np.random.default_rng(SEED + 1)
    for batch, seq in [(1, 1), (1, 7), (3, 33), (5, 64)]:
        xi = rng.standard_normal((batch, seq, INPUT_SIZE), dtype=np.float32)
        d = compare(model_bytes, model, xi)
        print(f"onnxruntime vs torch, input {xi.shape}: max abs diff {d:.3g}")
        assert d < TOLERANCE, (batch, seq, d)

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    MODEL_PATH.write_bytes(model_bytes)
    np.save(INPUT_PATH, x, allow_pickle=False)
    save_npz_deterministic(EXPECTED_PATH, torch_outputs(model, x))

    for path in (MODEL_PATH, INPUT_PATH, EXPECTED_PATH):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        print(
            f"wrote {path.relative_to(DATA_DIR.parents[2])}: {path.stat().st_size} bytes, "
            f"sha256 {digest}"
        )


if __name__ == "__main__":
    main()
