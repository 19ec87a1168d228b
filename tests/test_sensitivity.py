"""Every attribute and optional input changes the result: none is accepted and ignored.

Each pair of single-node models differs in one attribute (or input) only, and runs
through InferenceSession, so an attribute dropped by the runtime adapter is caught too.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnx_recurrent as orc

from models import node_model, random_inputs

COMMON = [
    ("direction", {"direction": "forward"}, {"direction": "reverse"}),
    ("clip", {}, {"clip": 0.3}),
    ("layout", {"layout": 0}, {"layout": 1}),
    (
        "activation_alpha",
        {"activations": "leaky"},
        {"activations": "leaky", "activation_alpha": [0.5]},
    ),
    (
        "activation_beta",
        {"activations": "hard"},
        {"activations": "hard", "activation_beta": [0.1]},
    ),
]
ACTIVATIONS = {
    "GRU": (
        ["Sigmoid", "Tanh"],
        ["HardSigmoid", "Tanh"],
        ["Sigmoid", "LeakyRelu"],
        ["HardSigmoid", "Tanh"],
    ),
    "RNN": (["Tanh"], ["Softsign"], ["LeakyRelu"], ["HardSigmoid"]),
    "LSTM": (
        ["Sigmoid", "Tanh", "Tanh"],
        ["Sigmoid", "Elu", "Tanh"],
        ["Sigmoid", "LeakyRelu", "Tanh"],
        ["HardSigmoid", "Tanh", "Tanh"],
    ),
}
SPECIFIC = {
    "GRU": [("linear_before_reset", {"linear_before_reset": 0}, {"linear_before_reset": 1})],
    "RNN": [],
    "LSTM": [("input_forget", {"input_forget": 0}, {"input_forget": 1})],
}
INPUTS = {
    "GRU": ["B", "sequence_lens", "initial_h"],
    "RNN": ["B", "sequence_lens", "initial_h"],
    "LSTM": ["B", "sequence_lens", "initial_h", "initial_c", "P"],
}
CASES = [
    (op, name, a, b)
    for op in ("GRU", "RNN", "LSTM")
    for name, a, b in [*COMMON, ("activations", {}, {"activations": "other"}), *SPECIFIC[op]]
]


def _activations(op, attributes):
    _default, other, leaky, hard = ACTIVATIONS[op]
    choice = attributes.get("activations")
    table = {"other": other, "leaky": leaky, "hard": hard}
    if choice in table:
        attributes = {**attributes, "activations": table[choice]}
    return attributes


def _run(op, feeds, attributes):
    return orc.InferenceSession(node_model(op, feeds, attributes, opset=22)).run(None, feeds)


def _differ(a, b):
    return any(
        x.shape != y.shape or not np.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize(("op", "name", "a", "b"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_attribute_changes_the_result(op, name, a, b):
    feeds = random_inputs(op, T=4, N=4, I=4, H=4, full=False, seed=1)
    feeds["W"] *= 3  # large enough pre-activations for clip to bite
    assert _differ(_run(op, feeds, _activations(op, a)), _run(op, feeds, _activations(op, b)))


@pytest.mark.parametrize(("op", "name"), [(op, n) for op, names in INPUTS.items() for n in names])
def test_optional_input_changes_the_result(op, name):
    full = random_inputs(op, T=4, N=4, I=4, H=4, seed=2)
    full["sequence_lens"] = np.array([4, 1, 0, 3], np.int32)
    without = {k: v for k, v in full.items() if k != name}
    assert _differ(_run(op, full, {}), _run(op, without, {}))
