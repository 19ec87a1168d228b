"""Seeded mutants of ONNX models, and what :class:`onnx_recurrent.InferenceSession`
does with each (issue 14).

A mutant is one of the corpus models (the bundled example, the exported streaming
models, Silero VAD where installed, small one-node models) changed by one to three
seeded mutations, either of its bytes (truncated, flipped, spliced, inserted,
deleted) or of its fields (dims, element types, tensor dims and data, attributes of
the recurrent nodes and of others, node inputs and outputs, operator types, opset and
IR versions, graph inputs, outputs and initializers, node order, the bytes of one
node or value info), with feeds that are the corpus model's, or made to fit the
mutant's declared inputs, and sometimes one feed changed too. ``mutant(seed)`` is a
pure function of the seed.

Each mutant runs in a worker process (``python tests/fuzz.py worker HOSTS``), under
each host, so that a crash of the interpreter, or a hang, is seen and reported with
its seed; :func:`fuzz` drives the workers (a dead one is replaced). An outcome is

- ``outputs``: the session ran and gave one array per declared output; a graph
  output computed directly by a top-level recurrent node has the shape the node gives;
- ``error``: a clear error, an instance of :data:`CLEAR_ERRORS` (ValueError and
  TypeError, which onnx-recurrent's errors subclass, RuntimeError, which onnxruntime
  refusing a model becomes, ...) or of :data:`ENGINE_ERRORS` (onnxruntime's own), with
  a message, raised by onnx-recurrent itself or by the engine that runs the graph
  (onnxruntime, onnx.reference), not leaked from a helper library our code called;
- a defect (:data:`DEFECTS`): ``crash`` (the worker died), ``hang`` (no answer within
  the timeout), ``unclear`` (another type, e.g. ``KeyError`` or ``UnicodeDecodeError``,
  or no message), ``leak`` (a ``ValueError``/``TypeError`` raised by numpy or onnx
  called by our code: its message names no input), ``shape`` (a wrong count, not an
  array, or a recurrent node's output of another shape than it gives), ``disagree``
  (the two hosts gave outputs of different shapes, types or values), ``fuzzer`` (this
  module failed to make the mutant).

``scripts/fuzz_models.py`` runs thousands; ``tests/test_fuzz.py`` a few hundred.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT / "src" / "onnx_recurrent" / "data"

#: exception types that are a clear error when they carry a message: the builtin
#: ones our errors subclass, and the engines' own (by module and name)
CLEAR_ERRORS = (ValueError, TypeError, RuntimeError, FileNotFoundError)
#: the engines' exception types (no common base) accepted as clear errors
ENGINE_ERRORS = {
    "onnxruntime.capi.onnxruntime_pybind11_state": {
        "Fail",
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "EngineError",
        "RuntimeException",
        "InvalidProtobuf",
        "ModelLoaded",
        "NotImplemented",
        "InvalidGraph",
        "EPFail",
    },
    "onnx.onnx_cpp2py_export.checker": {"ValidationError"},
    "onnx.onnx_cpp2py_export.shape_inference": {"InferenceError"},
    "onnx.onnx_cpp2py_export.defs": {"SchemaError"},
}
#: our frames that call an engine: what is raised below them is the engine's error
ENGINE_CALLS = {
    ("hosts/reference.py", "__init__"),
    ("hosts/reference.py", "run"),
    ("hosts/onnxruntime.py", "__init__"),
    ("hosts/onnxruntime.py", "run"),
    ("runtime/loop.py", "_run"),
}
DEFECTS = ("crash", "hang", "unclear", "leak", "shape", "disagree", "fuzzer")
RECURRENT = ("GRU", "RNN", "LSTM")
#: a feed made for a mutant's declared inputs holds at most this many elements
MAX_FEED = 1 << 20


# -- the corpus -----------------------------------------------------------------------


@dataclass
class Seed:
    """A corpus model and feeds it runs with."""

    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]


def _node_seed(
    name: str,
    op: str,
    attributes: dict,
    *,
    constant: tuple[str, ...] = (),
    dtype=np.float32,
    layout: int = 0,
    outputs: tuple[str, ...] | None = None,
    opset: int = 22,
    D: int = 1,
    full: bool = True,
) -> Seed:
    from models import node_model, random_inputs

    feeds = random_inputs(op, D=D, dtype=dtype, seed=len(name), full=full)
    if layout:
        for n in ("X", "initial_h", "initial_c"):
            if n in feeds:
                feeds[n] = np.ascontiguousarray(feeds[n].transpose(1, 0, 2))
    if layout:
        attributes = {**attributes, "layout": layout}
    model = node_model(op, feeds, attributes, opset=opset, outputs=outputs)
    graph = model.graph
    kept = [i for i in graph.input if i.name not in constant]
    del graph.input[:]
    graph.input.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(feeds.pop(n), n) for n in constant)
    return Seed(name, model, feeds)


@functools.cache
def corpus() -> tuple[Seed, ...]:
    """The models mutated: files shipped or exported, and one-node models."""
    rng = np.random.default_rng(0)
    seeds = [
        Seed(
            "example",
            onnx.load(DATA / "example_gru.onnx"),
            {"x": np.load(DATA / "example_input.npy")},
        ),
        Seed(
            "streaming_gru",
            onnx.load(HERE / "data" / "streaming_gru.onnx"),
            {"x": rng.standard_normal((2, 5, 4)).astype(np.float32)},
        ),
        Seed(
            "streaming_lstm",
            onnx.load(HERE / "data" / "streaming_lstm.onnx"),
            {"x": rng.standard_normal((5, 2, 4)).astype(np.float32)},
        ),
    ]
    weights = ("W", "R", "B")
    seeds += [
        _node_seed("gru", "GRU", {"hidden_size": 3}),
        _node_seed(
            "gru_bidirectional_const",
            "GRU",
            {"direction": "bidirectional", "linear_before_reset": 1, "clip": 2.5},
            constant=weights,
            D=2,
        ),
        _node_seed("gru_layout1_const", "GRU", {"hidden_size": 3}, constant=weights, layout=1),
        _node_seed("gru_float64", "GRU", {"direction": "reverse"}, dtype=np.float64),
        _node_seed("gru_float16_noY", "GRU", {}, dtype=np.float16, outputs=("", "Y_h")),
        _node_seed(
            "rnn_activations",
            "RNN",
            {
                "direction": "bidirectional",
                "activations": ["LeakyRelu", "Tanh"],
                "activation_alpha": [0.1],
            },
            constant=weights,
            D=2,
        ),
        _node_seed("rnn_opset7", "RNN", {"hidden_size": 3}, opset=7, full=False),
        _node_seed("lstm", "LSTM", {"input_forget": 1}),
        _node_seed(
            "lstm_bidirectional_const",
            "LSTM",
            {"direction": "bidirectional", "clip": 1.0},
            constant=(*weights, "P"),
            D=2,
        ),
        _node_seed("lstm_layout1", "LSTM", {}, layout=1, dtype=np.float64),
    ]
    try:
        from onnx_recurrent.tools import vad

        path = vad.silero_model_path()
    except Exception:  # silero-vad not installed
        path = None
    if path is not None:
        seeds.append(
            Seed(
                "silero",
                onnx.load(os.fspath(path)),
                {
                    "input": (rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
                    "state": np.zeros((2, 1, 128), np.float32),
                    "sr": np.array(16000, np.int64),
                },
            )
        )
    return tuple(seeds)


# -- walking a model ------------------------------------------------------------------


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    out: list[onnx.GraphProto] = []

    def visit(g: onnx.GraphProto) -> None:
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    visit(a.g)
                for sub in a.graphs:
                    visit(sub)

    visit(model.graph)
    return out


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in _graphs(model) for n in g.node]


def _recurrent(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in _nodes(model) if n.op_type in RECURRENT]


def _value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return [
        v
        for g in _graphs(model)
        for v in (*g.input, *g.output, *g.value_info)
        if v.type.HasField("tensor_type")
    ]


def _tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    out = [t for g in _graphs(model) for t in g.initializer]
    for n in _nodes(model):
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR:
                out.append(a.t)
    return out


def _names(model: onnx.ModelProto) -> list[str]:
    names = {t.name for g in _graphs(model) for t in g.initializer}
    names |= {v.name for g in _graphs(model) for v in g.input}
    names |= {o for n in _nodes(model) for o in n.output if o}
    # a name that is not UTF-8 (an earlier mutation) comes back as bytes: apart from str
    return sorted(names, key=lambda name: (isinstance(name, bytes), name))


class _NotApplicable(Exception):
    """The mutation has nothing to work on in this model."""


def _pick(rng: np.random.Generator, items):
    items = list(items)
    if not items:
        raise _NotApplicable
    return items[int(rng.integers(len(items)))]


def _node(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.NodeProto:
    """A node, the recurrent ones far more often than their share."""
    recurrent = _recurrent(model)
    if recurrent and rng.random() < 0.7:
        return _pick(rng, recurrent)
    return _pick(rng, _nodes(model))


# -- field mutations ------------------------------------------------------------------

DIM_VALUES = (0, 1, 2, 3, 5, 7, 16, 128, -1, -7, 2**31 - 1, 2**62)
ELEM_TYPES = (0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 14, 16, 17, 21, 40, 1000)


def mutate_dims(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A declared dim changed, added, removed or made unknown; or the shape dropped."""
    vi = _pick(rng, _value_infos(model))
    t = vi.type.tensor_type
    dims = t.shape.dim
    what = int(rng.integers(6))
    if what == 0 or not dims:
        if what == 0 and t.HasField("shape"):
            t.ClearField("shape")
            return f"dims: {vi.name!r} shape dropped"
        d = t.shape.dim.add()
        d.dim_value = int(_pick(rng, DIM_VALUES))
        return f"dims: {vi.name!r} dim {d.dim_value} added"
    i = int(rng.integers(len(dims)))
    if what == 1:
        del dims[i]
        return f"dims: {vi.name!r} dim {i} removed"
    if what == 2:
        dims[i].dim_param = _pick(rng, ["fuzz", "batch", "seq", ""])
        return f"dims: {vi.name!r} dim {i} -> param {dims[i].dim_param!r}"
    if what == 3:
        dims[i].Clear()
        return f"dims: {vi.name!r} dim {i} cleared"
    dims[i].dim_value = int(_pick(rng, DIM_VALUES))
    return f"dims: {vi.name!r} dim {i} -> {dims[i].dim_value}"


def mutate_elem_type(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A declared element type, or a tensor's data type, changed."""
    elem = int(_pick(rng, ELEM_TYPES))
    if rng.random() < 0.5:
        vi = _pick(rng, _value_infos(model))
        vi.type.tensor_type.elem_type = elem
        return f"elem_type: {vi.name!r} -> {elem}"
    t = _pick(rng, _tensors(model))
    t.data_type = elem
    return f"elem_type: tensor {t.name!r} -> {elem}"


def mutate_tensor_dims(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A tensor's dims changed (its data left as it was)."""
    t = _pick(rng, _tensors(model))
    what = int(rng.integers(4))
    if what == 0 or not t.dims:
        t.dims.append(int(_pick(rng, DIM_VALUES)))
        return f"tensor dims: {t.name!r} dim appended -> {list(t.dims)}"
    i = int(rng.integers(len(t.dims)))
    if what == 1:
        del t.dims[i]
    elif what == 2:
        t.dims[i] = int(_pick(rng, DIM_VALUES))
    else:
        t.dims[i] = t.dims[i] + int(_pick(rng, [-1, 1]))
    return f"tensor dims: {t.name!r} -> {list(t.dims)}"


def mutate_tensor_data(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A tensor's data truncated, extended, moved to the wrong field, made non-finite,
    or made external (a file that does not exist)."""
    t = _pick(rng, _tensors(model))
    what = int(rng.integers(6))
    if what == 0 and t.raw_data:
        cut = int(rng.integers(len(t.raw_data)))
        t.raw_data = t.raw_data[:cut]
        return f"tensor data: {t.name!r} raw_data cut to {cut} bytes"
    if what == 1:
        t.raw_data = t.raw_data + bytes(int(rng.integers(1, 9)))
        return f"tensor data: {t.name!r} raw_data extended to {len(t.raw_data)} bytes"
    if what == 2:
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * int(rng.integers(0, 3)))
        return f"tensor data: {t.name!r} raw_data dropped ({len(t.float_data)} float_data)"
    if what == 3:
        t.int64_data.append(int(rng.integers(-(2**40), 2**40)))
        return f"tensor data: {t.name!r} an int64_data value added"
    if what == 4 and t.raw_data and t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE):
        raw = bytearray(t.raw_data)
        size = 4 if t.data_type == TensorProto.FLOAT else 8
        i = int(rng.integers(len(raw) // size)) * size if len(raw) >= size else 0
        value = _pick(rng, [math.nan, math.inf, -math.inf, 1e38])
        fmt = np.float32 if size == 4 else np.float64
        raw[i : i + size] = np.array(value, fmt).tobytes()[: len(raw) - i]
        t.raw_data = bytes(raw)
        return f"tensor data: {t.name!r} a value -> {value}"
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    entry = t.external_data.add()
    entry.key, entry.value = "location", _pick(rng, ["fuzz_missing.bin", "../x", "/dev/null"])
    return f"tensor data: {t.name!r} external -> {entry.value!r}"


def _strings(values) -> list[bytes]:
    return [v.encode() if isinstance(v, str) else v for v in values]


ACTIVATIONS = (
    "Sigmoid",
    "Tanh",
    "Relu",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
    "sigmoid",
    "Bogus",
    "",
)
FLOATS = (0.0, -1.0, 0.5, 1.0, 3.0, 1e-30, 1e30, math.nan, math.inf, -math.inf)


def _recurrent_value(name: str, rng: np.random.Generator):
    """An odd value, of the attribute's own type, for a recurrent attribute."""
    if name == "hidden_size":
        return int(_pick(rng, (0, -1, 1, 2, 3, 4, 7, 8, 31, 32, 33, 2**31 - 1, 2**40)))
    if name == "direction":
        return _pick(
            rng,
            (b"forward", b"reverse", b"bidirectional", b"foward", b"REVERSE", b"", b"\xff"),
        )
    if name == "activations":
        return _strings(_pick(rng, ACTIVATIONS) for _ in range(int(rng.integers(0, 7))))
    if name in ("activation_alpha", "activation_beta"):
        return [float(_pick(rng, FLOATS)) for _ in range(int(rng.integers(0, 7)))]
    if name == "clip":
        return float(_pick(rng, FLOATS))
    if name == "layout":
        return int(_pick(rng, (0, 1, 2, -1, 2**40)))
    return int(_pick(rng, (0, 1, 2, -1)))  # flags, output_sequence


RECURRENT_ATTRIBUTES = {
    "hidden_size": AttributeProto.INT,
    "direction": AttributeProto.STRING,
    "activations": AttributeProto.STRINGS,
    "activation_alpha": AttributeProto.FLOATS,
    "activation_beta": AttributeProto.FLOATS,
    "clip": AttributeProto.FLOAT,
    "layout": AttributeProto.INT,
    "linear_before_reset": AttributeProto.INT,
    "input_forget": AttributeProto.INT,
    "output_sequence": AttributeProto.INT,
}
#: a value of each attribute type, for attributes given the wrong type
TYPED_VALUES = {
    AttributeProto.FLOAT: 1.5,
    AttributeProto.INT: 3,
    AttributeProto.STRING: b"Tanh",
    AttributeProto.FLOATS: [1.0, 2.0],
    AttributeProto.INTS: [1, 2],
    AttributeProto.STRINGS: [b"Tanh", b"Sigmoid"],
}


def _set_attribute(node: onnx.NodeProto, name: str, value, attr_type) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(helper.make_attribute(name, value, attr_type=attr_type))


def mutate_attribute(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A recurrent node's attribute set to an odd value (of its type, or, rarely,
    another), removed, duplicated or unknown; or another node's attribute changed."""
    node = _node(model, rng)
    label = f"{node.op_type} {node.name!r}"
    if node.op_type in RECURRENT:
        name = _pick(rng, RECURRENT_ATTRIBUTES)
        what = rng.random()
        if what < 0.65:
            value = _recurrent_value(name, rng)
            _set_attribute(node, name, value, RECURRENT_ATTRIBUTES[name])
            return f"attribute: {label} {name}={value!r}"
        if what < 0.75:
            kind = _pick(rng, TYPED_VALUES)
            _set_attribute(node, name, TYPED_VALUES[kind], kind)
            return f"attribute: {label} {name}={TYPED_VALUES[kind]!r} (type {kind})"
        if what < 0.85:
            a = _pick(rng, node.attribute)
            node.attribute.remove(a)
            return f"attribute: {label} {a.name} removed"
        if what < 0.93:
            a = _pick(rng, node.attribute)
            node.attribute.append(copy.deepcopy(a))
            return f"attribute: {label} {a.name} duplicated"
        node.attribute.append(helper.make_attribute("fuzz", 1))
        return f"attribute: {label} unknown attribute 'fuzz'"
    a = _pick(rng, [a for a in node.attribute if a.type != AttributeProto.GRAPH])
    if a.type == AttributeProto.INT:
        a.i = int(_pick(rng, (a.i + 1, a.i - 1, 0, -1, 2**31, -(2**62))))
        return f"attribute: {label} {a.name}={a.i}"
    if a.type == AttributeProto.INTS and a.ints:
        i = int(rng.integers(len(a.ints)))
        if rng.random() < 0.5:
            del a.ints[i]
        else:
            a.ints[i] = int(_pick(rng, (a.ints[i] + 1, -1, 0, 2**31)))
        return f"attribute: {label} {a.name}={list(a.ints)}"
    if a.type == AttributeProto.FLOAT:
        a.f = float(_pick(rng, FLOATS))
        return f"attribute: {label} {a.name}={a.f}"
    if a.type == AttributeProto.STRING:
        a.s = _pick(rng, (b"", b"fuzz", b"\xff"))
        return f"attribute: {label} {a.name}={a.s!r}"
    node.attribute.remove(a)
    return f"attribute: {label} {a.name} removed"


def mutate_node_inputs(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A node's input renamed (to a missing name or another tensor), emptied, removed,
    added, or two swapped."""
    node = _node(model, rng)
    label = f"{node.op_type} {node.name!r}"
    inputs = node.input
    what = int(rng.integers(6))
    if what == 0 or not inputs:
        inputs.append(_pick(rng, [*_names(model), "", "fuzz_missing"]))
        return f"inputs: {label} input {inputs[-1]!r} appended"
    i = int(rng.integers(len(inputs)))
    if what == 1:
        inputs[i] = "fuzz_missing"
    elif what == 2:
        inputs[i] = ""
    elif what == 3:
        del inputs[-1]
        return f"inputs: {label} last input removed"
    elif what == 4:
        inputs[i] = _pick(rng, _names(model))
    else:
        j = int(rng.integers(len(inputs)))
        inputs[i], inputs[j] = inputs[j], inputs[i]
        return f"inputs: {label} inputs {i} and {j} swapped"
    return f"inputs: {label} input {i} -> {inputs[i]!r}"


def mutate_node_outputs(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A node's output emptied, renamed (to another tensor's name), removed or added."""
    node = _node(model, rng)
    label = f"{node.op_type} {node.name!r}"
    outputs = node.output
    what = int(rng.integers(4))
    if what == 0 or not outputs:
        outputs.append(_pick(rng, ["fuzz_extra", ""]))
        return f"outputs: {label} output {outputs[-1]!r} appended"
    i = int(rng.integers(len(outputs)))
    if what == 1:
        outputs[i] = ""
    elif what == 2:
        outputs[i] = _pick(rng, _names(model))
    else:
        del outputs[-1]
        return f"outputs: {label} last output removed"
    return f"outputs: {label} output {i} -> {outputs[i]!r}"


def mutate_op_type(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A recurrent node made another recurrent operator, a misspelt one or of another
    domain; or another node made a recurrent one."""
    node = _node(model, rng)
    before = node.op_type
    if before in RECURRENT and rng.random() < 0.8:
        what = rng.random()
        if what < 0.6:
            node.op_type = _pick(rng, [o for o in RECURRENT if o != before])
        elif what < 0.8:
            node.op_type = before.lower()
        else:
            node.domain = _pick(rng, ["ai.onnx", "com.microsoft", "fuzz"])
            return f"op_type: {before} {node.name!r} domain -> {node.domain!r}"
    else:
        node.op_type = _pick(rng, RECURRENT)
    return f"op_type: {before} {node.name!r} -> {node.op_type}"


def mutate_versions(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """The default domain's opset, or the IR version, changed; or the opset import
    dropped or given twice."""
    what = rng.random()
    if what < 0.25:
        model.ir_version = int(_pick(rng, (0, 1, 3, 4, 7, 8, 9, 10, 11, 12, 13, 100)))
        return f"versions: ir_version -> {model.ir_version}"
    entries = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if what < 0.35 and entries:
        model.opset_import.remove(entries[0])
        return "versions: default opset import removed"
    if what < 0.45:
        model.opset_import.append(helper.make_opsetid("", int(_pick(rng, (7, 14, 22)))))
        return "versions: a second default opset import"
    version = int(_pick(rng, (0, 1, 3, 6, 7, 9, 13, 14, 16, 17, 20, 21, 22, 23, 24, 25, 99)))
    if entries:
        entries[0].version = version
    else:
        model.opset_import.append(helper.make_opsetid("", version))
    return f"versions: opset -> {version}"


def mutate_graph_io(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A graph input or output removed, duplicated or renamed; an initializer also
    declared as an input; or an initializer removed or duplicated."""
    graph = _pick(rng, _graphs(model)) if rng.random() < 0.3 else model.graph
    what = int(rng.integers(7))
    if what == 0:
        v = _pick(rng, graph.input)
        graph.input.remove(v)
        return f"graph io: input {v.name!r} removed"
    if what == 1:
        v = _pick(rng, graph.output)
        graph.output.remove(v)
        return f"graph io: output {v.name!r} removed"
    if what == 2:
        v = _pick(rng, graph.output)
        graph.output.append(copy.deepcopy(v))
        return f"graph io: output {v.name!r} duplicated"
    if what == 3:
        v = _pick(rng, [*graph.output, *graph.input])
        v.name = _pick(rng, ["fuzz_missing", *_names(model)])
        return f"graph io: a graph input or output renamed {v.name!r}"
    if what == 4:
        t = _pick(rng, graph.initializer)
        graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        return f"graph io: initializer {t.name!r} also an input"
    if what == 5:
        t = _pick(rng, graph.initializer)
        graph.initializer.remove(t)
        return f"graph io: initializer {t.name!r} removed"
    t = _pick(rng, graph.initializer)
    twin = graph.initializer.add()
    twin.CopyFrom(t)
    twin.ClearField("raw_data")
    return f"graph io: initializer {t.name!r} given twice (the second empty)"


def mutate_nodes(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """A node removed or duplicated, or the nodes' order reversed."""
    graph = _pick(rng, [g for g in _graphs(model) if g.node])
    what = int(rng.integers(3))
    node = _node(model, rng) if rng.random() < 0.5 else _pick(rng, graph.node)
    graph = next(g for g in _graphs(model) if any(n is node for n in g.node))
    if what == 0:
        graph.node.remove(node)
        return f"nodes: {node.op_type} {node.name!r} removed"
    if what == 1:
        graph.node.add().CopyFrom(node)
        return f"nodes: {node.op_type} {node.name!r} duplicated"
    nodes = list(graph.node)[::-1]
    del graph.node[:]
    graph.node.extend(nodes)
    return "nodes: order reversed"


def mutate_submessage_bytes(model: onnx.ModelProto, rng: np.random.Generator) -> str:
    """The serialised bytes of one node, attribute or value info changed and parsed back
    (where they still parse): byte-level noise aimed at the structure, not the weights."""
    node = _node(model, rng)
    target = _pick(
        rng,
        [
            node,
            *[a for a in node.attribute if a.type != AttributeProto.GRAPH],
            *_value_infos(model)[:8],
        ],
    )
    data, how = _byte_change(target.SerializeToString(), rng)
    try:
        parsed = type(target)()
        parsed.ParseFromString(data)
    except Exception:
        raise _NotApplicable from None
    target.CopyFrom(parsed)
    return f"submessage bytes: {type(target).__name__} of {node.op_type} {node.name!r}: {how}"


FIELD_MUTATIONS: dict[str, tuple[Callable, float]] = {
    "dims": (mutate_dims, 1.0),
    "elem_type": (mutate_elem_type, 0.8),
    "tensor_dims": (mutate_tensor_dims, 0.8),
    "tensor_data": (mutate_tensor_data, 0.8),
    "attribute": (mutate_attribute, 2.0),
    "node_inputs": (mutate_node_inputs, 1.2),
    "node_outputs": (mutate_node_outputs, 0.6),
    "op_type": (mutate_op_type, 0.5),
    "versions": (mutate_versions, 0.5),
    "graph_io": (mutate_graph_io, 0.6),
    "nodes": (mutate_nodes, 0.5),
    "submessage_bytes": (mutate_submessage_bytes, 0.7),
}


# -- byte mutations -------------------------------------------------------------------


def _byte_change(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """One change to ``data``: truncated, bytes flipped, a chunk spliced elsewhere,
    inserted or deleted."""
    size = len(data)
    if size == 0:
        return bytes(int(rng.integers(1, 4))), "bytes added to nothing"
    what = int(rng.integers(5))
    if what == 0:
        cut = int(rng.integers(size))
        return data[:cut], f"truncated to {cut} of {size} bytes"
    buf = bytearray(data)
    if what == 1:
        k = int(rng.integers(1, 17))
        for i in rng.integers(size, size=k):
            buf[int(i)] ^= 1 << int(rng.integers(8)) if rng.random() < 0.5 else 0xFF
        return bytes(buf), f"{k} bytes flipped"
    start = int(rng.integers(size))
    length = int(rng.integers(1, max(2, min(64, size - start + 1))))
    if what == 2:
        to = int(rng.integers(size))
        chunk = bytes(buf[start : start + length])
        buf[to : to + len(chunk)] = chunk
        return bytes(buf), f"{len(chunk)} bytes at {start} spliced at {to}"
    if what == 3:
        junk = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        return bytes(buf[:start]) + junk + bytes(buf[start:]), f"{length} bytes inserted"
    del buf[start : start + length]
    return bytes(buf), f"{length} bytes at {start} deleted"


def _structure_positions(model: onnx.ModelProto) -> int:
    """The serialised size of the model without its weights: byte changes land in it
    half of the time (a model's bytes are mostly weights)."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    for t in _tensors(light):
        t.ClearField("raw_data")
    return len(light.SerializeToString())


# -- mutants --------------------------------------------------------------------------


@dataclass
class Mutant:
    seed: int
    name: str
    model: onnx.ModelProto | bytes
    feeds: dict[str, np.ndarray]
    mutations: list[str] = field(default_factory=list)


def mutant(seed: int) -> Mutant:
    """Mutant number ``seed``: a corpus model, one to three mutations, and feeds (the
    corpus model's, or, half of the time, made to match the mutant's declared inputs)."""
    rng = np.random.default_rng([14, seed])
    seeds = corpus()
    weights = np.array([0.5 if s.name == "silero" else 1.0 for s in seeds])
    base = seeds[int(rng.choice(len(seeds), p=weights / weights.sum()))]
    model = onnx.ModelProto()
    model.CopyFrom(base.model)
    mutations: list[str] = []
    data: bytes | None = None
    count = 1 + int(rng.integers(3) if rng.random() < 0.5 else 0)
    names = list(FIELD_MUTATIONS)
    p = np.array([FIELD_MUTATIONS[n][1] for n in names])
    for _ in range(count):
        if rng.random() < 0.15:
            raw = model.SerializeToString() if data is None else data
            data, how = _byte_change(raw, rng)
            mutations.append(f"bytes: {how}")
            continue
        if data is not None:
            break  # field changes need a parsed model
        for _attempt in range(8):
            name = names[int(rng.choice(len(names), p=p / p.sum()))]
            trial = onnx.ModelProto()
            trial.CopyFrom(model)
            try:
                mutations.append(FIELD_MUTATIONS[name][0](trial, rng))
            except _NotApplicable:
                continue
            model = trial
            break
    feeds = dict(base.feeds)
    if data is None and rng.random() < 0.5:
        feeds = conform_feeds(model, feeds, rng)
        mutations.append("feeds made to match the declared inputs")
    if feeds and rng.random() < 0.2:
        mutations.append(mutate_feed(feeds, rng))
    return Mutant(seed, base.name, model if data is None else data, feeds, mutations)


def mutate_feed(feeds: dict[str, np.ndarray], rng: np.random.Generator) -> str:
    """One feed changed in place: another dtype, an axis added or dropped, a dim
    changed, values made NaN or (integers) out of range."""
    name = _pick(rng, sorted(feeds, key=repr))  # a corrupt model's names may be bytes
    value = feeds[name]
    what = int(rng.integers(5))
    if what == 0:
        dtype = np.dtype(_pick(rng, ["float16", "float32", "float64", "int32", "int64"]))
        feeds[name] = value.astype(dtype)
        return f"feed {name!r} as {dtype}"
    if what == 1:
        feeds[name] = value[..., None]
        return f"feed {name!r} given an axis"
    if what == 2 and value.ndim:
        axis = int(rng.integers(value.ndim))
        feeds[name] = np.resize(value, value.shape[:axis] + value.shape[axis + 1 :])
        return f"feed {name!r} lost an axis"
    if what == 3 and value.ndim:
        axis = int(rng.integers(value.ndim))
        size = int(_pick(rng, [0, 1, value.shape[axis] + 1]))
        shape = list(value.shape)
        shape[axis] = size
        feeds[name] = np.resize(value, shape).astype(value.dtype)
        return f"feed {name!r} of shape {shape}"
    changed = value.copy()
    if changed.size:
        flat = changed.reshape(-1)
        i = int(rng.integers(flat.size))
        if changed.dtype.kind == "f":
            flat[i] = _pick(rng, [math.nan, math.inf, 1e30])
        elif changed.dtype.kind in "iu":
            info = np.iinfo(changed.dtype)
            flat[i] = _pick(rng, [info.min, min(info.max, 10**6), info.max])
    feeds[name] = changed
    return f"feed {name!r}: a value made extreme"


def conform_feeds(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Feeds for the model's declared inputs: the given ones where they fit, cast to
    the declared type, or random ones of the declared shape (unknown dims as the
    given feed has them, or 2)."""
    initializers = {t.name for t in model.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in initializers or not vi.type.HasField("tensor_type"):
            continue
        t = vi.type.tensor_type
        given = feeds.get(vi.name)
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        except Exception:
            if given is not None:
                out[vi.name] = given
            continue
        if not t.HasField("shape"):
            shape = None if given is None else given.shape
        else:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if given is not None and given.ndim == len(dims):
                shape = tuple(
                    g if d is None else d for d, g in zip(dims, given.shape, strict=True)
                )
            else:
                shape = tuple(2 if d is None else d for d in dims)
        if shape is None or any(d < 0 for d in shape) or math.prod(shape) > MAX_FEED:
            if given is not None:
                out[vi.name] = given
            continue
        if given is not None and given.shape == shape:
            try:
                out[vi.name] = given.astype(dtype)
                continue
            except (TypeError, ValueError):
                pass
        if dtype.kind in "fc":
            value = rng.standard_normal(shape)
        elif dtype.kind in "iu":
            value = rng.integers(0, 4, shape)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            value = np.full(shape, "x")
        try:
            out[vi.name] = np.asarray(value).astype(dtype)
        except (TypeError, ValueError):  # a type NumPy cannot cast to (strings to some)
            out[vi.name] = np.zeros(shape, dtype)
    return out


# -- outcomes -------------------------------------------------------------------------


def _frame_key(filename: str) -> str | None:
    """``runtime/bound.py`` for a file of onnx_recurrent, None for others."""
    marker = f"{os.sep}onnx_recurrent{os.sep}"
    if marker not in filename:
        return None
    return filename.split(marker, 1)[1].replace(os.sep, "/")


def _package(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("site-packages", "dist-packages", "src"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1 :]
            if rest:
                return rest[0].removesuffix(".py")
    return Path(filename).stem


def classify(error: BaseException) -> dict:
    """An exception as an outcome: ``error`` or a defect (``unclear``, ``leak``)."""
    cls = type(error)
    name = f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins.")
    message = str(error).strip()
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if _frame_key(f.filename)]
    raised = frames[-1] if frames else None
    where = f"{_package(raised.filename)}:{raised.name}:{raised.lineno}" if raised else "?"
    outcome = {"type": name, "message": message.splitlines()[0][:300] if message else ""}
    outcome["where"] = where
    engine = cls.__module__ in ENGINE_ERRORS and cls.__name__ in ENGINE_ERRORS[cls.__module__]
    clear = isinstance(error, CLEAR_ERRORS) and not isinstance(error, UnicodeError)
    if not (clear or engine) or not message:
        return {**outcome, "kind": "unclear"}
    if raised is not None and not _frame_key(raised.filename) and ours:
        last = ours[-1]
        key = (_frame_key(last.filename), last.name)
        if not any(key[0].endswith(f) and key[1] == n for f, n in ENGINE_CALLS):
            via = f"{key[0]}:{last.name}:{last.lineno}"
            return {**outcome, "kind": "leak", "where": f"{where} via {via}"}
    return {**outcome, "kind": "error"}


def _expected_shapes(session, feeds: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """The shapes of the graph outputs that a top-level recurrent node gives directly,
    where its X is a fed graph input: ``Y`` [T, D, N, H] and the states [D, N, H]
    (batch first with ``layout=1``)."""
    outputs = {o.name for o in session.get_outputs()}
    expected: dict[str, list[int]] = {}
    for b in session.recurrent_nodes:
        node = b.node
        X = feeds.get(node.input("X"))
        if node.graph is not session.model.graph or X is None or X.ndim != 3:
            continue
        layout = int(b.attributes.get("layout", 0))
        direction = str(b.attributes.get("direction", "forward")).lower()  # as spec.py reads it
        D = 2 if direction == "bidirectional" else 1
        H = b.layer.hidden_size if b.layer is not None else b.attributes.get("hidden_size")
        if H is None:
            continue
        N, T = (X.shape[0], X.shape[1]) if layout else (X.shape[1], X.shape[0])
        state = [N, D, H] if layout else [D, N, H]
        shapes = [[N, T, D, H] if layout else [T, D, N, H], state, state]
        for i, name in enumerate(node.node.output[: b.n_outputs]):
            if name in outputs:
                expected[name] = shapes[i]
    return expected


def check_outputs(session, outputs, feeds: dict[str, np.ndarray]) -> dict:
    """``outputs``, or a ``shape`` defect: a count or type other than declared, or a
    recurrent node's graph output of another shape than the node gives
    (:func:`_expected_shapes`)."""
    names = [o.name for o in session.get_outputs()]
    if not isinstance(outputs, list) or len(outputs) != len(names):
        return {"kind": "shape", "message": f"{len(outputs)} outputs for {len(names)}"}
    expected = _expected_shapes(session, feeds)
    shapes = []
    for name, value in zip(names, outputs, strict=True):
        if not isinstance(value, np.ndarray):
            return {"kind": "shape", "message": f"output {name!r} is a {type(value).__name__}"}
        shapes.append(list(value.shape))
        if name in expected and list(value.shape) != expected[name]:
            return {
                "kind": "shape",
                "message": f"output {name!r} of shape {list(value.shape)}, "
                f"the node gives {expected[name]}",
            }
    return {"kind": "outputs", "shapes": shapes}


def run_mutant(m: Mutant, host: str) -> tuple[dict, list | None]:
    """What a session does with mutant ``m`` under ``host``, in this process: the
    outcome, and the outputs if any."""
    from onnx_recurrent import InferenceSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            session = InferenceSession(m.model, host=host)
            outputs = session.run(None, m.feeds)
        except Exception as e:
            return classify(e), None
        outcome = check_outputs(session, outputs, m.feeds)
        return outcome, outputs if outcome["kind"] == "outputs" else None


def compare(first: list, second: list) -> str:
    """How two hosts' outputs differ ('' where they agree: same shapes and dtypes,
    values within 1e-4, NaN where NaN)."""
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
        if a.dtype.kind in "fc":
            with np.errstate(all="ignore"):
                a64, b64 = a.astype(np.float64), b.astype(np.float64)
                close = np.isclose(a64, b64, rtol=1e-4, atol=1e-4, equal_nan=True)
            if not close.all():
                return f"output {i}: values differ at {int((~close).sum())} places"
        elif not np.array_equal(a, b):
            return f"output {i}: values differ"
    return ""


# -- workers --------------------------------------------------------------------------


def _limit_memory() -> None:
    """Large allocations in a worker fail (MemoryError) instead of taking the machine:
    at most 6 GiB of address space, or ``FUZZ_MEMORY_GB``."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    limit = int(float(os.environ.get("FUZZ_MEMORY_GB", "6")) * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def worker_main(hosts: list[str]) -> None:
    """Read seeds, one a line, from stdin; answer one JSON line each on stdout."""
    import faulthandler

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    if hasattr(signal, "SIGUSR1"):  # a hang: the parent asks where each thread is
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    warnings.simplefilter("ignore")
    for s in corpus():  # compile what the corpus needs, before the clock runs
        for host in hosts:
            outcome, _ = run_mutant(Mutant(-1, s.name, s.model, s.feeds), host)
            if outcome["kind"] != "outputs":
                raise RuntimeError(f"corpus model {s.name} under {host}: {outcome}")
    _limit_memory()
    out.write("ready\n")
    for line in sys.stdin:
        seed = int(line)
        try:
            m = mutant(seed)
        except Exception:  # a fault of this module: reported as such
            outcome = {"kind": "fuzzer", "type": "fuzzer", "message": traceback.format_exc()}
            out.write(json.dumps({"seed": seed, "hosts": {"?": outcome}}) + "\n")
            continue
        result = {"seed": seed, "model": m.name, "mutations": m.mutations, "hosts": {}}
        given = []
        for host in hosts:
            out.write(json.dumps({"running": host}) + "\n")
            result["hosts"][host], outputs = run_mutant(m, host)
            if outputs is not None:
                given.append(outputs)
        if len(given) == 2 and (why := compare(*given)):
            result["hosts"][hosts[-1]] = {"kind": "disagree", "message": why}
        out.write(json.dumps(result) + "\n")


class Worker:
    """A worker process; ``ask(seed)`` returns its result, or a ``crash``/``hang``."""

    def __init__(self, hosts: list[str], timeout: float, start_timeout: float = 600.0):
        self.hosts, self.timeout = hosts, timeout
        env = {**os.environ, "ONNX_RECURRENT_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), "worker", ",".join(hosts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env,
        )
        self._buffer = b""
        self._tail: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        line = self._line(start_timeout)
        if line != "ready":
            self.close()
            raise RuntimeError(
                f"fuzz worker did not start ({line!r}): {''.join(self._tail[-20:])}"
            )

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._tail.append(line.decode(errors="replace"))
            del self._tail[:-80]

    def _line(self, timeout: float) -> str | None:
        """The worker's next line; None on timeout, '' when it died."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return ""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()

    def ask(self, seed: int) -> dict:
        self.proc.stdin.write(f"{seed}\n".encode())
        deadline = time.monotonic() + self.timeout
        host = None
        while True:
            line = self._line(max(0.0, deadline - time.monotonic()))
            if line is None or line == "":
                kind = "hang" if line is None else "crash"
                if kind == "hang" and hasattr(signal, "SIGUSR1"):
                    self.proc.send_signal(signal.SIGUSR1)
                    time.sleep(1.0)
                self.close()
                time.sleep(0.05)
                code = self.proc.returncode
                outcome = {
                    "kind": kind,
                    "type": kind,
                    "message": f"exit code {code}" if kind == "crash" else "timeout",
                    "where": "".join(self._tail[-60:]).strip()[-4000:],
                }
                return {"seed": seed, "hosts": {host or "?": outcome}, "dead": True}
            record = json.loads(line)
            if "running" in record:
                host = record["running"]
                deadline = time.monotonic() + self.timeout
                continue
            return record

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def fuzz(
    seeds: Iterable[int],
    hosts: list[str],
    *,
    jobs: int = 2,
    timeout: float = 60.0,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Every seed's result (:func:`worker_main`'s, or a crash/hang), from ``jobs``
    worker processes; a dead worker is replaced."""
    pending = list(seeds)
    lock = threading.Lock()
    results: list[dict] = []
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            worker = Worker(hosts, timeout)
            while True:
                with lock:
                    if not pending:
                        break
                    seed = pending.pop(0)
                result = worker.ask(seed)
                with lock:
                    results.append(result)
                if progress:
                    progress(result)
                if result.get("dead"):
                    worker = Worker(hosts, timeout)
            worker.close()
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=loop) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return sorted(results, key=lambda r: r["seed"])


def outcome_label(outcome: dict) -> str:
    """A result line's key in a summary: ``outputs``, ``error RecurrentError``, or
    ``DEFECT leak ValueError``."""
    kind = outcome["kind"]
    if kind == "outputs":
        return "outputs"
    if kind == "error":
        return f"error {outcome['type'].rsplit('.', 1)[-1]}"
    return f"DEFECT {kind} {outcome.get('type', '').rsplit('.', 1)[-1]}".rstrip()


def replay(seed: int, hosts: Iterable[str]) -> None:
    """Run one mutant in this process, printing its mutations and each host's outcome
    with the full traceback (for debugging a defect)."""
    from onnx_recurrent import InferenceSession

    m = mutant(seed)
    print(f"seed {seed}: {m.name}; " + "; ".join(m.mutations))
    for host in hosts:
        print(f"--- {host}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session = InferenceSession(m.model, host=host)
                print(check_outputs(session, session.run(None, m.feeds), m.feeds))
        except Exception as e:
            traceback.print_exc()
            print(classify(e))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if sys.argv[1] == "worker":
        worker_main(sys.argv[2].split(","))
    elif sys.argv[1] == "replay":
        replay(int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else ["reference"])
