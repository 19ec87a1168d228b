"""ONNX's own node test cases, and every operator version through the runtime adapters."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx.backend.test.case.node import collect_testcases
from onnx.reference import ReferenceEvaluator

import onnx_recurrent as orc

from models import node_model, random_inputs

RECURRENT = {"GRU", "RNN", "LSTM"}
CASES = [c for c in collect_testcases() if RECURRENT & {n.op_type for n in c.model.graph.node}]
FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}
VERSIONS = {"GRU": (1, 3, 7, 14, 22), "RNN": (1, 7, 14, 22), "LSTM": (1, 7, 14, 22)}


def test_node_cases_found():
    assert {n.op_type for c in CASES for n in c.model.graph.node} == RECURRENT
    assert len(CASES) >= 18


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("face", ["session", "reference_ops"])
def test_onnx_node_case(case, face):
    for inputs, expected in case.data_sets:
        feeds = {i.name: x for i, x in zip(case.model.graph.input, inputs, strict=False)}
        if face == "session":
            got = orc.InferenceSession(case.model).run(None, feeds)
        else:
            got = ReferenceEvaluator(case.model, new_ops=orc.reference_ops()).run(None, feeds)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("op", "version"), [(op, v) for op, vs in VERSIONS.items() for v in vs])
def test_every_version_runs_the_latest_semantics(op, version):
    feeds = random_inputs(op, D=2, seed=version)
    attributes = {"hidden_size": 3, "direction": "bidirectional", "clip": 0.8}
    if op == "GRU" and version >= 3:
        attributes["linear_before_reset"] = 1
    session = orc.InferenceSession(node_model(op, feeds, attributes, opset=version))
    got = session.run(None, feeds)
    kwargs = {k: v for k, v in attributes.items() if k != "hidden_size"}
    expected = FUNCTIONS[op](*feeds.values(), **kwargs)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    (node,) = ReferenceEvaluator(session.model, new_ops=orc.reference_ops()).rt_nodes_
    assert type(node).__name__ == f"{op}_{version}"
    assert type(node).__module__ == "onnx_recurrent.runtime.reference"  # was abc


def _run(op, feeds, attributes, opset, outputs=None):
    model = node_model(op, feeds, attributes, opset=opset, outputs=outputs)
    return orc.InferenceSession(model).run(None, feeds)


def test_gru1_foward_spelling_and_output_sequence():
    feeds = random_inputs("GRU")
    Y, Y_h = _run("GRU", feeds, {"direction": "foward", "output_sequence": 0}, opset=1)
    expected = orc.gru(*feeds.values())
    np.testing.assert_array_equal(Y, expected[0])
    np.testing.assert_array_equal(Y_h, expected[1])


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_gru1_foward_in_any_case_and_output_sequence_0_or_1(host):
    # direction is case-insensitive ('Forward'), and so is GRU-1's spelling ('Foward'
    # was refused); output_sequence 2 or -1 is true, as linear_before_reset=2 is
    feeds = random_inputs("GRU")
    expected = orc.gru(*feeds.values())
    for spelling in ("Foward", "FOWARD"):
        model = node_model("GRU", feeds, {"direction": spelling}, opset=1)
        got = orc.InferenceSession(model, host=host).run(None, feeds)
        np.testing.assert_array_equal(got[1], expected[1])
    for value in (2, -1):
        model = node_model("GRU", feeds, {"output_sequence": value}, opset=3)
        got = orc.InferenceSession(model, host=host).run(None, feeds)
        np.testing.assert_array_equal(got[0], expected[0])
    model = node_model("GRU", feeds, {"output_sequence": 0.5}, opset=3)
    with pytest.raises(ValueError, match=r"'output_sequence' must be of type INT"):
        orc.InferenceSession(model, host=host).run(None, feeds)


@pytest.mark.parametrize(("op", "version"), [("GRU", 3), ("GRU", 22), ("LSTM", 22), ("RNN", 14)])
@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_foward_is_gru1_alone(op, version, host):
    """Only GRU-1's schema spells its default ``'foward'``; every other operator and
    version refuses it, as onnxruntime does, and as the functions do."""
    feeds = random_inputs(op)
    model = node_model(op, feeds, {"direction": "foward"}, opset=version)
    with pytest.raises(ValueError, match=r"direction must be one of .*got 'foward'"):
        orc.InferenceSession(model, host=host).run(None, feeds)  # weights fed: at run


def test_optional_outputs_named_empty_are_not_returned_to_later_nodes():
    feeds = random_inputs("LSTM", full=False)
    (Y_c,) = _run("LSTM", feeds, {"hidden_size": 3}, opset=14, outputs=("", "", "Y_c"))
    np.testing.assert_array_equal(Y_c, orc.lstm(*feeds.values())[2])


def test_layout_1_from_version_14():
    feeds = random_inputs("RNN", full=False)
    feeds["X"] = np.ascontiguousarray(feeds["X"].transpose(1, 0, 2))
    Y, Y_h = _run("RNN", feeds, {"layout": 1}, opset=14)
    eY, eY_h = orc.rnn(*feeds.values(), layout=1)
    assert Y.shape == (3, 5, 1, 3)
    np.testing.assert_array_equal(Y, eY)
    np.testing.assert_array_equal(Y_h, eY_h)


def test_bfloat16_needs_version_22():
    feeds = random_inputs("GRU", dtype=ml_dtypes.bfloat16)
    Y, _ = _run("GRU", feeds, {}, opset=22)
    assert Y.dtype == ml_dtypes.bfloat16
    with pytest.raises(TypeError, match="bfloat16 needs GRU version 22"):
        _run("GRU", feeds, {}, opset=14)


def test_attributes_unknown_to_the_version_are_rejected():
    feeds = random_inputs("GRU")
    with pytest.raises(ValueError, match=r"unknown attribute\(s\) \['layout'\]; GRU-7 has"):
        _run("GRU", feeds, {"layout": 0}, opset=7)
    with pytest.raises(ValueError, match=r"unknown attribute\(s\) \['input_forget'\]"):
        _run("GRU", feeds, {"input_forget": 1}, opset=22)


def test_the_hosts_warning_names_the_callers_line():
    """The warning that the reference host runs a model points at the line that made
    the session (it pointed into session.py once the constructor gained a frame)."""
    feeds = random_inputs("GRU", dtype=ml_dtypes.bfloat16)
    with pytest.warns(RuntimeWarning, match="the reference host runs this model") as caught:
        orc.InferenceSession(node_model("GRU", feeds, {}, opset=22))
    assert caught[0].filename == __file__
