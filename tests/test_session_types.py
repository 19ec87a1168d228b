"""Sequence, optional and map inputs and outputs of InferenceSession, under both hosts.

- A sequence input is fed as a list (or tuple) of arrays, an optional one as None or
  its value (or left out), a map as a dict; outputs come back as lists, None, dicts.
- The feed checks (element type, rank, fixed dims) apply to the tensors inside, and the
  message names the element that failed; tensors keep their messages.
- ``get_inputs``/``get_outputs`` give onnxruntime's type strings.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_recurrent as orc
from onnx_recurrent import RecurrentError, RecurrentTypeError

N, I, H = 3, 4, 5  # batch, input and hidden sizes of the GRU below


def _model(inputs, outputs, nodes, initializers=(), opset=18, ml=False) -> onnx.ModelProto:
    imports = [helper.make_opsetid("", opset)]
    if ml:
        imports.append(helper.make_opsetid("ai.onnx.ml", 3))
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def _chunked_gru() -> onnx.ModelProto:
    """``chunks``, a sequence of (T_i, N, I) arrays, concatenated on time into one GRU;
    outputs: the GRU's Y_h and the sequence as given."""
    rng = np.random.default_rng(3)
    W = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, 3 * H, I)).astype(np.float32), "W")
    R = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, 3 * H, H)).astype(np.float32), "R")
    chunks = helper.make_tensor_sequence_value_info("chunks", TensorProto.FLOAT, [None, N, I])
    nodes = [
        helper.make_node("ConcatFromSequence", ["chunks"], ["X"], axis=0),
        helper.make_node("GRU", ["X", "W", "R"], ["", "Y_h"], hidden_size=H, name="gru"),
        helper.make_node("Identity", ["chunks"], ["same"]),
    ]
    outputs = [
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, N, H]),
        helper.make_tensor_sequence_value_info("same", TensorProto.FLOAT, None),
    ]
    return _model([chunks], outputs, nodes, [W, R])


def _chunks(*lengths: int) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(lengths))
    return [rng.uniform(-1, 1, (t, N, I)).astype(np.float32) for t in lengths]


def test_a_sequence_feeds_a_gru_and_comes_back(host):
    model = _chunked_gru()
    session = orc.InferenceSession(model, host=host)
    chunks = _chunks(2, 5, 1)
    Y_h, same = session.run(None, {"chunks": chunks})
    W = numpy_helper.to_array(model.graph.initializer[0])
    R = numpy_helper.to_array(model.graph.initializer[1])
    _, expected = orc.gru(np.concatenate(chunks), W, R)
    np.testing.assert_allclose(Y_h, expected, rtol=1e-5, atol=1e-6)
    assert isinstance(same, list) and len(same) == 3
    for a, b in zip(same, chunks, strict=True):
        np.testing.assert_array_equal(a, b)
    (again,) = session.run(["Y_h"], {"chunks": tuple(chunks)})  # a tuple is a sequence too
    np.testing.assert_array_equal(again, Y_h)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            lambda c: c.__setitem__(2, c[2].astype(np.int64)),
            RecurrentTypeError,
            r"input 'chunks' element 2: expected element type tensor\(float\) \(float32\), "
            r"got int64",
        ),
        (
            lambda c: c.__setitem__(1, c[1][:, :2]),
            RecurrentError,
            r"input 'chunks' element 1: expected shape \[None, 3, 4\], got \[5, 2, 4\] "
            r"\(axis 1\)",
        ),
        (
            lambda c: c.__setitem__(0, c[0][0]),
            RecurrentError,
            r"input 'chunks' element 0: expected rank 3 \(shape \[None, 3, 4\]\), got shape",
        ),
    ],
)
def test_the_tensors_in_a_sequence_are_checked_and_named(host, change, error, match):
    session = orc.InferenceSession(_chunked_gru(), host=host)
    chunks = _chunks(2, 5, 1)
    change(chunks)
    with pytest.raises(error, match=match):
        session.run(None, {"chunks": chunks})


def test_a_sequence_fed_as_an_array_is_a_type_error(host):
    # under the onnxruntime host an array goes to onnxruntime first: ours word its refusal
    session = orc.InferenceSession(_chunked_gru(), host=host)
    with pytest.raises(
        RecurrentTypeError,
        match=r"input 'chunks': expected a list for seq\(tensor\(float\)\), got ndarray",
    ):
        session.run(None, {"chunks": _chunks(2)[0]})


def _optional_model(element: onnx.TypeProto, echo: bool = True) -> onnx.ModelProto:
    """``x``, an optional ``element``: whether it has one, and (``echo``) itself."""
    optional = helper.make_optional_type_proto(element)
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"])]
    outputs = [helper.make_tensor_value_info("has", TensorProto.BOOL, [])]
    if echo:
        nodes.append(helper.make_node("Identity", ["x"], ["same"]))
        outputs.append(helper.make_value_info("same", optional))
    return _model([helper.make_value_info("x", optional)], outputs, nodes)


def test_an_optional_tensor_is_none_its_value_or_left_out(host):
    model = _optional_model(helper.make_tensor_type_proto(TensorProto.FLOAT, [3]))
    session = orc.InferenceSession(model, host=host)
    x = np.arange(3, dtype=np.float32)
    has, same = session.run(None, {"x": x})
    assert has.item() is True and has.dtype == bool
    np.testing.assert_array_equal(same, x)
    # onnx.reference's operators return no None (its Identity refuses to): "has" only
    echo = host == "onnxruntime"
    element = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    empty = orc.InferenceSession(_optional_model(element, echo=echo), host=host)
    for feeds in ({"x": None}, {}):
        has, *same = empty.run(None, feeds)
        assert has.item() is False and same == ([None] if echo else [])
    with pytest.raises(RecurrentTypeError, match=r"input 'x': expected element type tensor"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(RecurrentError, match=r"input 'x': expected shape \[3\], got \[4\]"):
        session.run(None, {"x": np.zeros(4, np.float32)})
    arg = session.get_inputs()[0]
    assert (arg.type, arg.shape, arg.elem_type) == ("optional(tensor(float))", [3], 1)


def test_an_optional_sequence_names_the_element(host):
    element = helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.INT32, [4])
    )
    session = orc.InferenceSession(_optional_model(element), host=host)
    value = [np.arange(4, dtype=np.int32), np.ones(4, np.int32)]
    has, same = session.run(None, {"x": value})
    assert has.item() is True and len(same) == 2
    with pytest.raises(RecurrentError, match=r"input 'x' element 1: expected shape \[4\]"):
        session.run(None, {"x": [value[0], np.ones(2, np.int32)]})
    arg = session.get_inputs()[0]
    assert (arg.type, arg.shape) == ("optional(seq(tensor(int32)))", [])


def _dict_vectorizer() -> onnx.ModelProto:
    value = helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    inputs = [helper.make_value_info("m", helper.make_map_type_proto(TensorProto.STRING, value))]
    node = helper.make_node(
        "DictVectorizer", ["m"], ["v"], domain="ai.onnx.ml", string_vocabulary=["a", "b", "c"]
    )
    outputs = [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)]
    return _model(inputs, outputs, [node], ml=True)


def test_a_map_is_a_dict_of_scalars(host):
    session = orc.InferenceSession(_dict_vectorizer(), host=host)
    (v,) = session.run(None, {"m": {"a": 1.0, "c": np.float32(2)}})
    # onnxruntime gives (1, 3), onnx.reference (3,): the values agree
    np.testing.assert_array_equal(v.ravel(), [1, 0, 2])
    arg = session.get_inputs()[0]
    assert (arg.type, arg.shape) == ("map(string,tensor(float))", [])
    with pytest.raises(
        RecurrentTypeError,
        match=r"input 'm' key 1: expected str keys for map\(string,tensor\(float\)\), got int",
    ):
        session.run(None, {"m": {1: 1.0}})
    with pytest.raises(
        RecurrentTypeError, match=r"input 'm' value at key 'a': expected a number .* got str"
    ):
        session.run(None, {"m": {"a": "x"}})
    with pytest.raises(RecurrentTypeError, match=r"input 'm': expected a dict .* got list"):
        session.run(None, {"m": [("a", 1.0)]})


def test_outputs_describe_sequences(host):
    session = orc.InferenceSession(_chunked_gru(), host=host)
    (arg,) = session.get_inputs()
    assert (arg.name, arg.type, arg.shape, arg.elem_type) == (
        "chunks",
        "seq(tensor(float))",
        [],
        1,
    )
    assert [(o.type, o.shape) for o in session.get_outputs()] == [
        ("tensor(float)", [1, N, H]),
        ("seq(tensor(float))", []),
    ]


def test_a_sparse_input_is_refused_by_name(host):
    sparse = onnx.TypeProto()
    sparse.sparse_tensor_type.elem_type = TensorProto.FLOAT
    model = _model(
        [helper.make_value_info("sp", sparse)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
        [helper.make_node("Identity", ["sp"], ["o"])],
    )
    with pytest.raises(RecurrentTypeError, match=r"input 'sp' is a sparse_tensor\(float\)"):
        orc.InferenceSession(model, host=host)


def test_a_required_input_is_still_required_beside_an_optional_one(host):
    optional = helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    )
    model = _model(
        [helper.make_value_info("x", optional), helper.make_tensor_value_info("y", 1, [3])],
        [helper.make_tensor_value_info("has", TensorProto.BOOL, [])],
        [helper.make_node("OptionalHasElement", ["x"], ["has"])],
    )
    session = orc.InferenceSession(model, host=host)
    (has,) = session.run(None, {"y": np.zeros(3, np.float32)})
    assert has.item() is False
    with pytest.raises(RecurrentError, match=r"missing input\(s\) \['y'\]"):
        session.run(None, {"x": np.zeros(3, np.float32)})


def test_a_string_tensor_is_fed_as_str_or_object_array(host):
    # the reference host refused NumPy's str arrays (<U) that onnxruntime takes, and the
    # onnxruntime host too: host="auto" falling back failed the same call
    rng = np.random.default_rng(0)
    W = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, 3 * H, I)).astype(np.float32), "W")
    R = numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, 3 * H, H)).astype(np.float32), "R")
    nodes = [
        helper.make_node("Identity", ["S"], ["S_out"]),
        helper.make_node("GRU", ["X", "W", "R"], ["", "Y_h"], hidden_size=H),
    ]
    inputs = [
        helper.make_tensor_value_info("S", TensorProto.STRING, [2]),
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, N, I]),
    ]
    outputs = [
        helper.make_tensor_value_info("S_out", TensorProto.STRING, [2]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None),
    ]
    session = orc.InferenceSession(_model(inputs, outputs, nodes, [W, R]), host=host)
    X = rng.standard_normal((2, N, I)).astype(np.float32)
    for S in (np.array(["a", "bc"]), np.array(["a", "bc"], dtype=object), ["a", "bc"]):
        S_out, _ = session.run(None, {"S": S, "X": X})
        assert S_out.tolist() == ["a", "bc"]
