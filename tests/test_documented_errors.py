"""The errors the docstrings promise are the ones raised, of the class they name.

- ``output_sequence`` and ``reset_after`` take a bool or 0 / 1; anything else is a
  TypeError.
- An attribute of another type than the specification's is a TypeError; ``layout``
  other than 0 or 1 a ValueError, whatever the type, and ``linear_before_reset`` and
  ``input_forget`` other than an integer; an unknown ``ONNX_RECURRENT_BACKEND`` a ValueError.
- ``Layer``'s ``attributes`` not a mapping: a TypeError naming it.
- ``backend.prepare``'s message lists the keywords it takes (not ``kwargs``).
- W and R both of the wrong number of directions: W named first, then R.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnx_recurrent as orc
from onnx_recurrent import backend, convert

from models import random_inputs

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}


def _call(op, **keywords):
    f = random_inputs(op, full=False)
    return FUNCTIONS[op](f["X"], f["W"], f["R"], **keywords)


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("value", [0, 1, np.bool_(True)])
def test_output_sequence_takes_a_bool_or_0_or_1(op, value):
    Y = _call(op, output_sequence=value)[0]
    assert (Y is None) == (not value)
    f = random_inputs(op, full=False)
    layer = orc.Layer(op, f["W"], f["R"])
    assert (layer(f["X"], output_sequence=value)[0] is None) == (not value)


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("value", ["no", 2, 0.0])
def test_output_sequence_of_another_value_is_a_type_error(op, value):
    with pytest.raises(TypeError, match=r"output_sequence must be a bool"):
        _call(op, output_sequence=value)


@pytest.mark.parametrize("value", [0, 1, True, False])
def test_reset_after_takes_a_bool_or_0_or_1(value):
    H, I = 5, 3
    kernel, recurrent = np.ones((I, 3 * H), np.float32), np.ones((H, 3 * H), np.float32)
    layer = convert.from_keras(kernel, recurrent, kind="gru", reset_after=value)
    assert layer.spec.linear_before_reset == bool(value)
    assert len(convert.to_keras(layer, reset_after=value)) == 2
    with pytest.raises(TypeError, match=r"reset_after must be a bool"):
        convert.from_keras(kernel, recurrent, kind="gru", reset_after="False")


#: the TypeErrors that gru, lstm and rnn's Raises list (gru_cell's cases)
TYPE_CASES = [
    {"hidden_size": 3.0},
    {"hidden_size": "3"},
    {"clip": "1"},
    {"clip": True},
    {"activations": "Sigmoid"},
    {"direction": None},
    {"direction": 1},
    {"activation_alpha": 0.5},
]


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("attributes", TYPE_CASES, ids=str)
def test_attributes_of_another_type_are_type_errors(op, attributes):
    (name,) = attributes
    with pytest.raises(TypeError, match=rf"^{name} must be"):
        _call(op, **attributes)
    assert "TypeError" in FUNCTIONS[op].__doc__.split("Raises")[1]


@pytest.mark.parametrize(
    ("op", "attributes"),
    [
        ("GRU", {"linear_before_reset": "x"}),
        ("GRU", {"linear_before_reset": 0.5}),
        ("LSTM", {"input_forget": "x"}),
        ("RNN", {"layout": "1"}),
        ("GRU", {"layout": 1.0}),
    ],
    ids=str,
)
def test_flags_other_than_0_or_1_are_value_errors(op, attributes):
    with pytest.raises(ValueError, match=r"must be (an integer \(nonzero|0 or 1)") as caught:
        _call(op, **attributes)
    assert not isinstance(caught.value, TypeError)


@pytest.mark.parametrize("op", FUNCTIONS)
def test_an_unknown_backend_is_a_value_error_the_docstring_names(op, monkeypatch):
    monkeypatch.setenv("ONNX_RECURRENT_BACKEND", "foo")
    with pytest.raises(ValueError, match=r"ONNX_RECURRENT_BACKEND must be one of"):
        _call(op)
    assert "ONNX_RECURRENT_BACKEND" in FUNCTIONS[op].__doc__


def test_a_layer_attribute_of_another_type_is_a_type_error():
    f = random_inputs("GRU", full=False)
    with pytest.raises(TypeError, match=r"hidden_size must be an integer, got 3.0"):
        orc.Layer("GRU", f["W"], f["R"], attributes={"hidden_size": 3.0})


@pytest.mark.parametrize(
    ("attributes", "kind"),
    [([("hidden_size", 3)], "list"), ((("direction", "forward"),), "tuple"), ("x", "str")],
)
def test_layer_attributes_not_a_mapping_are_a_type_error(attributes, kind):
    f = random_inputs("GRU", full=False)
    match = rf"^attributes must be a mapping \(a dict\) .*got {kind}$"
    with pytest.raises(TypeError, match=match):
        orc.Layer("GRU", f["W"], f["R"], attributes=attributes)
    layer = orc.Layer("GRU", f["W"], f["R"])
    with pytest.raises(TypeError, match=match):
        layer.replace(attributes=attributes)
    # weights given one place too far: P taken for the attributes
    with pytest.raises(TypeError, match=r"^attributes must be a mapping .*got ndarray$"):
        orc.Layer("GRU", f["W"], f["R"], None, np.zeros((1, 9), np.float32))


def test_prepare_lists_the_keywords_it_takes():
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['foo'\]") as caught:
        backend.prepare("m.onnx", foo=1)
    message = str(caught.value)
    assert "'kwargs'" not in message and "'provider_options'" in message
    with pytest.raises(TypeError, match=r"^prepare\(\) got unexpected .*\['kwargs'\]"):
        backend.prepare("m.onnx", kwargs={})
    assert "provider_options" in backend.prepare.__doc__


@pytest.mark.parametrize("op", FUNCTIONS)
def test_w_and_r_of_two_directions_for_one_name_both(op):
    f = random_inputs(op, D=2, full=False)
    G = {"GRU": 3, "LSTM": 4, "RNN": 1}[op]
    match = (
        rf"^W must have shape \[1, {3 * G}, 4\] .*got \[2, {3 * G}, 4\]; "
        rf"R must have shape \[1, {3 * G}, 3\] .*got \[2, {3 * G}, 3\]$"
    )
    with pytest.raises(ValueError, match=match):
        FUNCTIONS[op](f["X"], f["W"], f["R"], direction="forward")
    with pytest.raises(ValueError, match=match):
        orc.Layer(op, f["W"], f["R"], attributes={"direction": "forward"})


def test_r_at_odds_with_itself_is_named_alone():
    f = random_inputs("GRU", full=False)
    wider = np.concatenate([f["R"], f["R"][:, :, :1]], axis=2)  # hidden_size 4 from R
    with pytest.raises(ValueError, match=r"^R must have shape \[1, 12, 4\] [^;]*$"):
        orc.gru(f["X"], f["W"], wider)
