"""Models onnxruntime refuses, or takes, as the session should (issue 23, item 5).

- An error about a recurrent node's opset names the node.
- A model that imports no opset, or none of the default domain while it has nodes of
  that domain, is a ``ValueError`` saying what is missing, under both hosts (was:
  outputs under the onnxruntime host, from a guessed opset; a ``RuntimeError`` from
  onnx.reference).
- The reference host runs ``onnx.checker.check_model`` first, and refuses what
  onnxruntime refuses with the checker's message (was: ran such models); what the
  checker refuses and onnxruntime takes still runs (nodes out of order are sorted).
- An initializer that is also a graph input (onnxruntime's overridable initializer)
  can be fed, under both hosts, a recurrent node's weights included (was: "unknown
  input name").
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_recurrent as orc
from onnx_recurrent import RecurrentError, RecurrentTypeError

from models import node_model, over_constants_model, random_inputs

HAS_ORT = importlib.util.find_spec("onnxruntime") is not None


def _gru(opset: int = 22, name: str = "gru1") -> tuple[onnx.ModelProto, dict]:
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, {"hidden_size": 3}, opset=opset)
    model.graph.node[0].name = name
    return model, feeds


def _plain_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # "initializer appears in graph inputs" warnings
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)


def _session(model: onnx.ModelProto, host: str) -> orc.InferenceSession:
    return orc.InferenceSession(model, host=host)


# -- (a) the opset error names the node -----------------------------------------------


@pytest.mark.parametrize(
    ("opset", "match"),
    [
        (30, r"^GRU node 'gru1': the model imports opset 30, newer than any"),
        (0, r"^GRU node 'gru1': GRU has no version <= opset 0$"),
    ],
)
def test_an_opset_error_names_the_node(host, opset, match):
    model, _ = _gru(opset=opset)
    with pytest.raises(RecurrentError, match=match):
        _session(model, host)


def test_an_opset_error_names_a_node_inside_a_subgraph(host):
    # an LSTM in an If branch: the label is the node's, not the If's
    feeds = random_inputs("LSTM", full=False)
    inner = node_model("LSTM", feeds, {}, opset=22, outputs=("", "Y_h", ""))
    body = inner.graph
    lstm = body.node[0]
    lstm.name = "inner_lstm"
    branch = helper.make_graph(
        [lstm], "branch", [], [helper.make_tensor_value_info("Y_h", 1, None)]
    )
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    node = helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph(
        [node],
        "g",
        [cond, *body.input],
        [helper.make_tensor_value_info("out", 1, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 99)], ir_version=8)
    with pytest.raises(
        RecurrentError, match=r"^LSTM node 'inner_lstm': the model imports opset 99"
    ):
        _session(model, host)


def test_the_reference_operators_name_the_node():
    # onnx_recurrent.runtime.reference's classes, as onnx.reference loads a node
    from onnx_recurrent.runtime.reference import reference_ops

    model, _ = _gru()
    gru = next(c for c in reference_ops() if c.__name__ == "GRU")
    with pytest.raises(RecurrentError, match=r"^GRU node 'gru1': GRU has no version"):
        gru(model.graph.node[0], {"opsets": {"": 0}})


@pytest.mark.parametrize(
    ("op", "opset", "attributes", "lengths", "error", "match"),
    [
        ("LSTM", 7, {"direction": "foward"}, None, ValueError, r"direction must be one of"),
        ("GRU", 7, {"direction": "foward"}, None, ValueError, r"direction must be one of"),
        ("GRU", 22, {"clip": 1}, None, ValueError, r"'clip' must be of type FLOAT"),
        ("GRU", 3, {"output_sequence": 1.0}, None, ValueError, r"must be of type INT"),
        ("GRU", 22, {}, np.int64, TypeError, r"sequence_lens must be tensor\(int32\)"),
        ("GRU", 1000, {}, None, ValueError, r"imports opset 1000, newer than any"),
    ],
)
def test_the_reference_operators_refuse_what_the_sessions_refuse(
    op, opset, attributes, lengths, error, match
):
    # onnx.reference with reference_ops() computed each of these (its own reading of
    # the attributes), where both sessions refuse them
    from onnx.reference import ReferenceEvaluator

    G = {"GRU": 3, "LSTM": 4}[op]
    rng = np.random.default_rng(0)
    T, N, I, H = 3, 2, 3, 4
    feeds = {
        "X": rng.standard_normal((T, N, I)).astype(np.float32),
        "W": rng.standard_normal((1, G * H, I)).astype(np.float32),
        "R": rng.standard_normal((1, G * H, H)).astype(np.float32),
    }
    names = ["X", "W", "R"]
    if lengths is not None:
        feeds["sl"] = np.array([3, 2], lengths)
        names += ["", "sl"]
    node = helper.make_node(op, names, ["Y", "Y_h"], hidden_size=H)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attributes.items())
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    with pytest.raises(error, match=match):
        ReferenceEvaluator(model, new_ops=orc.reference_ops()).run(None, feeds)
    with pytest.raises(error, match=match):
        orc.InferenceSession(model.SerializeToString(), host="reference").run(None, feeds)


# -- (b) a model without the default domain's opset import ----------------------------


def test_a_model_importing_no_opset_is_an_error(host):
    # was: outputs under onnxruntime (the rewrite's own import made its session, the
    # GRU's version guessed), RuntimeError "Domain '' ... is not specified" under reference
    model, _ = _gru()
    del model.opset_import[:]
    with pytest.raises(RecurrentError, match=r"^model: it imports no opset .*make_opsetid"):
        _session(model, host)
    if HAS_ORT:  # onnxruntime refuses it too
        with pytest.raises(Exception, match="Missing opset in the model"):
            _plain_ort(model, {})


@pytest.mark.parametrize("op", ["GRU", "Relu"])
def test_a_model_without_the_default_domain_import_is_an_error(host, op):
    model, _ = _gru()
    if op == "Relu":  # the GRU of a custom domain: the Relu is the default domain's
        model.graph.node[0].domain = "my.domain"
        model.graph.node.append(helper.make_node("Relu", ["Y_h"], ["Z"], name="relu1"))
        model.graph.output.append(helper.make_tensor_value_info("Z", 1, None))
    del model.opset_import[:]
    model.opset_import.extend(
        [helper.make_opsetid("ai.onnx.ml", 3), helper.make_opsetid("my.domain", 1)]
    )
    label = "GRU node 'gru1'" if op == "GRU" else "Relu node 'relu1'"
    with pytest.raises(
        RecurrentError,
        match=rf"^model: no opset import for the default domain \('' or 'ai.onnx'\), "
        rf"which {label} need\(s\) \(the model imports only 'ai.onnx.ml' 3, 'my.domain' 1\)",
    ):
        _session(model, host)


def test_a_model_of_another_domain_only_needs_no_default_import(host):
    # onnx's node suite has such models (test_ai_onnx_ml_binarizer...): onnxruntime runs them
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [3])],
        [helper.make_tensor_value_info("y", 1, [3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8
    )
    x = np.array([0.2, 0.5, 0.9], np.float32)
    (y,) = _session(model, host).run(None, {"x": x})
    np.testing.assert_array_equal(y, [0, 0, 1])


def test_recurrent_nodes_of_a_model_without_the_default_import():
    # the graph helper itself (check, streaming): no version guessed
    from onnx_recurrent.runtime.graph import recurrent_nodes

    model, _ = _gru()
    model.opset_import[0].domain = "ai.onnx.ml"
    with pytest.raises(RecurrentError, match=r"^GRU node 'gru1': the model imports no opset"):
        recurrent_nodes(model)


# -- (c) the reference host checks the model as onnxruntime does ------------------------


def _with_relu(**attributes) -> tuple[onnx.ModelProto, dict]:
    model, feeds = _gru()
    model.graph.node.append(helper.make_node("Relu", ["Y_h"], ["Z"], name="relu1", **attributes))
    model.graph.output.append(helper.make_tensor_value_info("Z", 1, None))
    return model, feeds


def _unknown_attribute():
    return _with_relu(bogus=1)


def _output_defined_twice():
    model, feeds = _with_relu()
    model.graph.node.append(helper.make_node("Sigmoid", ["Y_h"], ["Z"], name="sigmoid1"))
    return model, feeds


def _too_many_inputs():
    model, feeds = _with_relu()
    model.graph.node[1].input.append("Y_h")
    return model, feeds


def _unknown_operator():
    model, feeds = _with_relu()
    model.graph.node[1].op_type = "NoSuchOp"
    return model, feeds


REFUSED = {
    "unknown attribute": (_unknown_attribute, r"Unrecognized attribute: bogus for operator Relu"),
    "output defined twice": (_output_defined_twice, r"single static assignment \(SSA\)"),
    "too many inputs": (_too_many_inputs, r"Relu.*(input|Input)"),
    "unknown operator": (_unknown_operator, r"No Op registered for NoSuchOp"),
}


@pytest.mark.parametrize("fault", sorted(REFUSED))
def test_the_reference_host_refuses_what_the_checker_refuses(fault):
    # was: onnx.reference ran these (a Relu with an unknown attribute, a name that two
    # nodes compute) or failed later; onnxruntime refuses each when it loads the model
    make, match = REFUSED[fault]
    model, feeds = make()
    with pytest.raises(ValueError, match=r"^model: onnx.checker refuses it .*" + match):
        _session(model, "reference")
    if HAS_ORT:
        with pytest.raises(Exception):  # noqa: B017 (onnxruntime's own exception types)
            _plain_ort(model, feeds)


def _with_reduce_mean(keepdims: int) -> tuple[onnx.ModelProto, dict]:
    model, feeds = _gru()
    reduce = helper.make_node("ReduceMean", ["Y_h"], ["Z"], name="mean1", keepdims=keepdims)
    model.graph.node.append(reduce)
    model.graph.output.append(helper.make_tensor_value_info("Z", 1, None))
    return model, feeds


@pytest.mark.parametrize("keepdims", [-1, 2])
def test_the_reference_host_refuses_a_flag_neither_0_nor_1(keepdims):
    # was: the checker takes keepdims=-1; onnx.reference kept the axes, onnxruntime
    # dropped them: the hosts gave outputs of different shapes (fuzz seed 703459)
    model, _ = _with_reduce_mean(keepdims)
    match = rf"^ReduceMean node 'mean1': attribute keepdims={keepdims}, expected 0 or 1"
    with pytest.raises(ValueError, match=match):
        _session(model, "reference")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_flag_of_0_or_1_runs_alike_under_both_hosts(keepdims):
    model, feeds = _with_reduce_mean(keepdims)
    hosts = ["reference", "onnxruntime"] if HAS_ORT else ["reference"]
    if HAS_ORT:
        pytest.importorskip("onnxruntime_extensions")
    outputs = [_session(model, host).run(["Z"], feeds)[0] for host in hosts]
    assert outputs[0].ndim == (3 if keepdims else 0)  # every axis reduced (no axes given)
    for other in outputs[1:]:
        assert other.shape == outputs[0].shape
        np.testing.assert_allclose(other, outputs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not HAS_ORT, reason="needs onnxruntime")
def test_auto_falls_back_to_a_refusal_with_the_checker_message():
    # onnxruntime refuses the model; "auto" tried the reference host, which ran it
    pytest.importorskip("onnxruntime_extensions")
    model, _ = _unknown_attribute()
    with pytest.raises(ValueError, match=r"onnx.checker refuses it .*Unrecognized attribute"):
        orc.InferenceSession(model)


def test_a_recurrent_node_with_an_attribute_set_twice_is_an_error(host):
    # onnxruntime (plain) refuses it; both hosts took the last value
    model, _ = _gru()
    model.graph.node[0].attribute.append(helper.make_attribute("hidden_size", 3))
    with pytest.raises(
        RecurrentError, match=r"^GRU node 'gru1': attribute\(s\) \['hidden_size'\] set more"
    ):
        _session(model, host)


@pytest.mark.parametrize("outputs", [["Y"], ["Y", ""]])
def test_a_gru_1_node_without_its_required_y_h_is_an_error(host, outputs):
    """GRU-1 requires Y_h (later versions make it optional): the onnxruntime host ran
    such a node, which plain onnxruntime and the reference host refuse."""
    model, feeds = _gru(opset=1)
    del model.graph.node[0].output[:]
    model.graph.node[0].output.extend(outputs)
    del model.graph.output[1:]
    if HAS_ORT:
        with pytest.raises(Exception, match="GRU"):  # plain onnxruntime refuses it too
            _plain_ort(model, feeds)
    with pytest.raises(
        RecurrentError, match=r"^GRU node 'gru1': output 1 \(Y_h\) is required by GRU-1, got"
    ):
        _session(model, host)


def _shapeless_io(model):
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.ClearField("shape")


def _typeless_output(model):
    model.graph.output[0].ClearField("type")


def _unnamed_graph(model):
    model.graph.name = ""


def _ir_version_3(model):
    model.ir_version = 3  # the initializer k is not a graph input


def _duplicate_metadata(model):
    model.metadata_props.add(key="k", value="1")
    model.metadata_props.add(key="k", value="2")


def _two_data_fields(model):
    k = next(t for t in model.graph.initializer if t.name == "k")
    k.raw_data = np.array([2.0], np.float32).tobytes()  # read; float_data is not
    k.float_data.append(5.0)


def _out_of_order(model):
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))


def _ai_onnx_domain(model):
    model.graph.node[1].domain = "ai.onnx"


TAKEN = {
    "inputs and outputs without a shape": _shapeless_io,
    "an output without a type": _typeless_output,
    "a graph without a name": _unnamed_graph,
    "IR version 3": _ir_version_3,
    "duplicate metadata keys": _duplicate_metadata,
    "a tensor with two data fields": _two_data_fields,
    "nodes out of order": _out_of_order,
    "a node of domain ai.onnx": _ai_onnx_domain,
}


@pytest.mark.parametrize("change", sorted(TAKEN))
def test_the_reference_host_runs_what_onnxruntime_takes(change):
    """What the checker refuses and onnxruntime takes still runs under the reference
    host, with onnxruntime's results (nodes out of order: was a RuntimeError)."""
    model, feeds = _gru()
    model.graph.node.append(helper.make_node("Mul", ["Y_h", "k"], ["Z"], name="mul1"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([2.0], np.float32), "k"))
    model.graph.output.append(helper.make_tensor_value_info("Z", 1, None))
    expected = _session(model, "reference").run(None, feeds)
    TAKEN[change](model)
    got = _session(model, "reference").run(None, feeds)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if HAS_ORT:
        for a, b in zip(_plain_ort(model, feeds), got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _if_model(inner_sorted: bool, outer_sorted: bool) -> onnx.ModelProto:
    """``out = If(cond)`` whose branch computes ``-abs(X)``, ``X = Identity(x)`` an
    outer name the branch reads; either graph's nodes in order or reversed."""
    inner = [
        helper.make_node("Abs", ["X"], ["m"], name="abs"),
        helper.make_node("Neg", ["m"], ["out_b"], name="neg"),
    ]
    branch = helper.make_graph(
        inner if inner_sorted else inner[::-1],
        "b",
        [],
        [helper.make_tensor_value_info("out_b", 1, None)],
    )
    nodes = [
        helper.make_node("Identity", ["x"], ["X"], name="identity"),
        helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(
        nodes if outer_sorted else nodes[::-1],
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", 1, [2, 3]),
        ],
        [helper.make_tensor_value_info("out", 1, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=8)


def test_the_main_graph_out_of_order_is_sorted(host):
    # the If comes before the node computing the X its branch reads: onnxruntime sorts
    # the main graph; onnx.reference ran the nodes as given (a RuntimeError)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    (out,) = _session(_if_model(True, False), host).run(None, {"cond": np.array(True), "x": x})
    np.testing.assert_array_equal(out, -np.abs(x))


def test_a_subgraph_out_of_order_is_refused(host):
    # onnxruntime refuses a branch whose nodes are out of order, as the checker does
    error = RuntimeError if host == "onnxruntime" else ValueError
    with pytest.raises(error, match=r"Nodes in a graph must be topologically sorted"):
        _session(_if_model(False, True), host)


# -- (d) overridable initializers -------------------------------------------------------


def _overridable_gru(names=("W", "R", "B"), ir_version: int = 8):
    """A GRU whose ``names`` are initializers that the graph lists as inputs too."""
    feeds = random_inputs("GRU", full=True)
    del feeds["sequence_lens"], feeds["initial_h"]
    model = node_model("GRU", feeds, {"hidden_size": 3})
    model.graph.node[0].name = "gru1"
    model.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in names)
    model.ir_version = ir_version
    return model, feeds


def test_get_inputs_and_get_overridable_initializers(host):
    model, _ = _overridable_gru(names=("W", "B"))
    session = _session(model, host)
    assert [i.name for i in session.get_inputs()] == ["X", "R"]
    overridable = session.get_overridable_initializers()
    assert [(a.name, a.type, a.shape) for a in overridable] == [
        ("W", "tensor(float)", [1, 9, 4]),
        ("B", "tensor(float)", [1, 18]),
    ]
    if HAS_ORT:  # as onnxruntime lists them
        ort = pytest.importorskip("onnxruntime")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        theirs = ort.InferenceSession(model.SerializeToString(), options)
        assert [i.name for i in theirs.get_inputs()] == ["X", "R"]
        assert [(a.name, a.type, a.shape) for a in theirs.get_overridable_initializers()] == [
            (a.name, a.type, a.shape) for a in overridable
        ]


@pytest.mark.parametrize("names", [("W",), ("W", "R", "B")])
def test_a_fed_recurrent_weight_replaces_the_initializer(host, names):
    # was: "unknown input name(s) ['W']"
    model, feeds = _overridable_gru(names=names)
    session = _session(model, host)
    given = {"X": feeds["X"], **{n: feeds[n] for n in ("R", "B") if n not in names}}
    default = session.run(None, given)
    W2 = (feeds["W"] * -1.5).astype(np.float32)
    fed = session.run(None, {**given, "W": W2})
    assert not np.allclose(default[1], fed[1])  # the fed W is used, not the prepared one
    again = session.run(None, given)  # for that call only
    for a, b in zip(default, again, strict=True):
        np.testing.assert_array_equal(a, b)
    # the same as the weights fed as plain inputs, and as onnxruntime computes
    plain = node_model("GRU", feeds, {"hidden_size": 3})
    expected = _session(plain, host).run(None, {**feeds, "W": W2})
    for a, b in zip(expected, fed, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    if HAS_ORT:
        theirs = _plain_ort(model, {**given, "W": W2})
        for a, b in zip(theirs, fed, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        for a, b in zip(_plain_ort(model, given), default, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_an_overridable_initializer_of_another_node_can_be_fed(host):
    model, feeds = _gru()
    model.graph.node.append(helper.make_node("Mul", ["Y_h", "k"], ["Z"], name="mul1"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([2.0], np.float32), "k"))
    model.graph.input.append(helper.make_tensor_value_info("k", 1, [1]))
    model.graph.output.append(helper.make_tensor_value_info("Z", 1, None))
    session = _session(model, host)
    _, Y_h, Z = session.run(None, feeds)
    np.testing.assert_allclose(Z, 2 * Y_h)
    _, Y_h, Z = session.run(None, {**feeds, "k": np.array([-3.0], np.float32)})
    np.testing.assert_allclose(Z, -3 * Y_h)


def test_an_overridable_feed_is_checked(host):
    model, feeds = _overridable_gru(names=("W",))
    session = _session(model, host)
    given = {n: feeds[n] for n in ("X", "R", "B")}
    with pytest.raises(RecurrentTypeError, match=r"^input 'W': expected element type tensor"):
        session.run(None, {**given, "W": feeds["W"].astype(np.float64)})
    with pytest.raises(RecurrentError, match=r"^input 'W': expected shape \[1, 9, 4\]"):
        session.run(None, {**given, "W": np.zeros((1, 9, 5), np.float32)})
    with pytest.raises(
        RecurrentError,
        match=r"unknown input name\(s\) \['V'\].* \(and the overridable initializers \['W'\]\)",
    ):
        session.run(None, {**given, "V": feeds["W"]})
    with pytest.raises(RecurrentError, match=r"missing input\(s\) \['R'\]"):
        session.run(None, {"X": feeds["X"], "W": feeds["W"], "B": feeds["B"]})


def test_initializers_are_not_overridable_before_ir_version_4(host):
    # onnxruntime takes every initializer as a constant under IR 3: so do we, and the
    # node's layer is prepared from it
    model, feeds = _overridable_gru(names=("W", "R", "B"), ir_version=3)
    session = _session(model, host)
    assert session.get_overridable_initializers() == []
    assert [i.name for i in session.get_inputs()] == ["X"]
    assert session.recurrent_nodes[0].layer is not None
    with pytest.raises(RecurrentError, match=r"\['W'\] are initializers, .* IR version 4"):
        session.run(None, {"X": feeds["X"], "W": feeds["W"]})
    got = session.run(None, {"X": feeds["X"]})
    if HAS_ORT:
        ort = pytest.importorskip("onnxruntime")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        theirs = ort.InferenceSession(model.SerializeToString(), options)
        assert theirs.get_overridable_initializers() == []
        for a, b in zip(theirs.run(None, {"X": feeds["X"]}), got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_an_initializer_of_a_negative_dim_is_an_error(host):
    # numpy read dims [1, -1, 4] as (1, 9, 4): the onnxruntime host ran the node on it
    # (the weights are bound, the initializer left out of onnxruntime's graph), where
    # onnxruntime refuses the model and the checker too
    model, _ = _overridable_gru(names=("W",))
    del model.graph.input[1]  # W: an initializer only
    model.graph.initializer[0].dims[1] = -1
    with pytest.raises(RecurrentError, match=r"tensor 'W' has a negative dim: dims \[1, -1, 4\]"):
        _session(model, host)


# -- weights computed in the graph, and odd tensors (twenty-second session) ----------


def _folded_gru_model(**first: object) -> tuple[onnx.ModelProto, dict, np.ndarray]:
    """``gru1`` over constants only (with ``first``'s attributes) gives ``Y_h``, reshaped
    into ``gru2``'s B; returns the model, the feeds and the float64 oracle's ``Y_h``."""
    from oracle import gru_ref

    rng = np.random.default_rng(5)
    T, N, I, H = 5, 2, 4, 3
    H1 = 6 * H  # gru1's Y_h [1, 1, 6H] is gru2's B [1, 6H]
    X1 = (rng.standard_normal((4, 1, 2)) * 3).astype(np.float32)
    W1 = (rng.standard_normal((1, 3 * H1, 2)) * 1.5).astype(np.float32)
    R1 = (rng.standard_normal((1, 3 * H1, H1)) * 0.5).astype(np.float32)
    W = (rng.uniform(-1, 1, (1, 3 * H, I)) * 0.5).astype(np.float32)
    R = (rng.uniform(-1, 1, (1, 3 * H, H)) * 0.5).astype(np.float32)
    X = rng.standard_normal((T, N, I)).astype(np.float32)
    nodes = [
        helper.make_node("GRU", ["X1", "W1", "R1"], ["", "Yh1"], hidden_size=H1, **first),
        helper.make_node("Reshape", ["Yh1", "shape"], ["B"]),
        helper.make_node("GRU", ["X", "W", "R", "B"], ["", "Y_h"], name="gru2", hidden_size=H),
    ]
    arrays = {"X1": X1, "W1": W1, "R1": R1, "W": W, "R": R}
    arrays["shape"] = np.array([1, 6 * H], np.int64)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, N, I])],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    f64 = {k: v.astype(np.float64) for k, v in arrays.items()}
    _, B = gru_ref(f64["X1"], f64["W1"], f64["R1"], hidden_size=H1, **first)[:2]
    _, want = gru_ref(X.astype(np.float64), f64["W"], f64["R"], B.reshape(1, -1), hidden_size=H)
    return model, {"X": X}, want


@pytest.mark.parametrize(
    "first", [{"clip": 0.2}, {"activations": ["HardSigmoid", "Relu"]}], ids=["clip", "acts"]
)
def test_a_recurrent_node_over_constants_is_folded_by_ours(host, first):
    """A weight computed by a recurrent node from initializers only was folded by plain
    onnx.reference, whose GRU ignores clip and activations: 0.58 and 0.77 off under
    both hosts (and check blamed onnxruntime)."""
    model, feeds, want = _folded_gru_model(**first)
    (got,) = _session(model, host).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_learned_initial_state_computed_by_a_recurrent_node_streams_right(host):
    # the same folding gave StreamingSession's first chunk a state 0.45 off
    N, I, H = 2, 4, 3
    nodes = [
        helper.make_node("GRU", ["X1", "W1", "R1"], ["", "h0"], hidden_size=H, clip=0.2),
        helper.make_node("GRU", ["X", "W", "R", "", "", "h0"], ["Y", ""], hidden_size=H),
    ]
    model, rng = over_constants_model(nodes, "Y", N, I, H)
    X = rng.standard_normal((6, N, I)).astype(np.float32)
    whole = _session(model, host).run(None, {"X": X})[0]
    stream = orc.StreamingSession(model, host=host)
    steps = [stream.step({"X": X[t : t + 2]})[0] for t in range(0, 6, 2)]
    np.testing.assert_allclose(np.concatenate(steps), whole, rtol=1e-5, atol=1e-6)
    if HAS_ORT:
        np.testing.assert_allclose(whole, _plain_ort(model, {"X": X})[0], rtol=1e-5, atol=1e-6)


def test_a_dropout_in_training_mode_is_not_folded():
    """``W = Dropout(W0, ratio, training_mode=True)``: folded once by onnx.reference, so
    the onnxruntime host kept one mask (onnxruntime draws one per run; seeded, its own
    mask: 0.47 off)."""
    ort = pytest.importorskip("onnxruntime")
    _, feeds = _gru()
    nodes = [
        helper.make_node("Dropout", ["W0", "ratio", "train"], ["W"], seed=5),
        helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=3),
    ]
    constants = {"W0": feeds.pop("W"), "R": feeds.pop("R"), "ratio": np.float32(0.5)}
    constants["train"] = np.array(True)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, feeds["X"].shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    got = _session(model, "onnxruntime").run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _gru_of_initializers(initializers, attribute=None, elem=TensorProto.FLOAT, sparse=()):
    """GRU(X, W, R) with hidden size 3, its weights ``initializers`` (and ``sparse``);
    ``attribute``: one more AttributeProto for the node."""
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], name="gru", hidden_size=3)
    if attribute is not None:
        node.attribute.append(attribute)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", elem, [5, 3, 4])],
        [helper.make_tensor_value_info("Y_h", elem, None)],
        list(initializers),
        sparse_initializer=list(sparse),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def test_of_two_initializers_of_one_name_the_first_is_taken(host):
    """onnxruntime takes the first: the onnxruntime host took the last (1.2 off), the
    reference host refused, saying onnxruntime would too."""
    _, feeds = _gru()
    W, R = feeds.pop("W"), feeds.pop("R")
    first = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(-2 * W, "W")]
    model = _gru_of_initializers([*first, numpy_helper.from_array(R, "R")])
    got = _session(model, host).run(None, feeds)[0]
    want = orc.gru(feeds["X"], W, R)[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if HAS_ORT:
        np.testing.assert_allclose(_plain_ort(model, feeds)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("attribute", "match"),
    [
        (
            onnx.AttributeProto(name="linear_before_reset", type=onnx.AttributeProto.INT, f=1.0),
            r"^GRU node 'gru': type field and data field mismatch in attribute "
            r"linear_before_reset \(onnx's checker and onnxruntime refuse it\)$",
        ),
        (
            onnx.AttributeProto(name="clip", type=onnx.AttributeProto.FLOAT, f=0.5, i=7),
            r"^GRU node 'gru': type field and data field mismatch in attribute clip ",
        ),
        (
            onnx.AttributeProto(
                name="clip", type=onnx.AttributeProto.FLOAT, f=0.5, ref_attr_name="x"
            ),
            r"^GRU node 'gru': attribute 'clip' refers to a function's attribute \('x'\) "
            "outside any function$",
        ),
    ],
    ids=["int-in-f", "float-and-i", "ref_attr_name"],
)
def test_an_attribute_with_its_value_elsewhere_is_refused(host, attribute, match):
    """The onnxruntime host read a mismatched attribute by its type (lbr=0 where the
    value said 1) where onnxruntime refuses the model; a reference to a function's
    attribute outside a function was onnx's bare 'Cannot get value'."""
    _, feeds = _gru()
    model = _gru_of_initializers(
        [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")], attribute
    )
    with pytest.raises(RecurrentError, match=match):
        _session(model, host)


@pytest.mark.parametrize("bad", [-1, 0x10000 + 0x3C00])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_16_bit_weights_out_of_16_bits_are_refused(host, bad, elem):
    # were wrapped: -1 read as 0xFFFF (a NaN), 0x13C00 as 1.0; onnxruntime: data overflow
    _, feeds = _gru()
    tensors = []
    for name in ("W", "R"):
        t = onnx.TensorProto(name=name, data_type=elem, dims=feeds[name].shape)
        t.int32_data.extend([0x3C00] * feeds[name].size)
        tensors.append(t)
    tensors[0].int32_data[3] = bad
    model = _gru_of_initializers(tensors, elem=elem)
    kind = TensorProto.DataType.Name(elem)
    with pytest.raises(RecurrentError, match=rf"tensor 'W' \({kind}\) holds {bad} in int32_data"):
        _session(model, host)


@pytest.mark.parametrize("how", ["sparse_initializer", "Constant"])
def test_sparse_weights_run_under_both_hosts(host, how):
    # the reference host failed: onnx.reference runs no sparse tensor
    _, feeds = _gru()
    W, R = feeds.pop("W"), feeds.pop("R")
    W = np.where(np.abs(W) < 0.5, 0, W).astype(np.float32)
    flat = np.flatnonzero(W)
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(W.ravel()[flat], "W"),
        numpy_helper.from_array(flat.astype(np.int64), "W_indices"),
        list(W.shape),
    )
    dense = [numpy_helper.from_array(R, "R")]
    if how == "Constant":
        model = _gru_of_initializers(dense)
        constant = helper.make_node("Constant", [], ["W"], sparse_value=sparse)
        model.graph.node.insert(0, constant)
    else:
        model = _gru_of_initializers(dense, sparse=[sparse])
    got = _session(model, host).run(None, feeds)[0]
    np.testing.assert_allclose(got, orc.gru(feeds["X"], W, R)[1], rtol=1e-5, atol=1e-6)
