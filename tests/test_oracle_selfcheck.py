"""Validate the oracle independently of the library: against onnxruntime and against the
node test cases shipped with ONNX."""

import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies import OPS, REFS, Case, assert_close, cases, run_onnxruntime

OPSET_CASES = [(op, opset) for op in OPS for opset in (14, 7)]


@pytest.mark.parametrize(("op", "opset"), OPSET_CASES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_oracle_vs_onnxruntime(op, opset, data):
    case = data.draw(
        cases(op, dtypes=[np.float32], layouts=[0], complete_params=True, opset=opset)
    )
    reference = case.reference()
    outputs = run_onnxruntime(case, opset)
    for got, ref, sensitivity in zip(outputs, reference, case.sensitivity(reference), strict=True):
        assert_close(got, ref, np.float32, sensitivity=sensitivity)


def _onnx_node_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        return [c for c in collect_testcases(None) if c.model.graph.node[0].op_type.lower() in OPS]


@pytest.mark.parametrize("case", _onnx_node_cases(), ids=lambda c: c.name)
def test_oracle_vs_onnx_node_cases(case):
    node = case.model.graph.node[0]
    op = node.op_type.lower()
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    for key in ("direction", "activations"):
        if key in attrs:
            value = attrs[key]
            attrs[key] = (
                value.decode() if isinstance(value, bytes) else [v.decode() for v in value]
            )
    names = ["X", "W", "R", *OPS[op][2]]
    for inputs, expected in case.data_sets:
        present = [n for n, i in zip(names, node.input, strict=False) if i]
        outputs = REFS[op](**dict(zip(present, inputs, strict=True)), **attrs)
        wanted = [o for o, name in zip(outputs, node.output, strict=False) if name]
        assert len(wanted) == len(expected)
        for got, exp in zip(wanted, expected, strict=True):
            np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


#: docs/semantics.md's defaults, (alpha, beta), of the activations that take parameters
DEFAULTS = {
    "Affine": (1.0, 0.0),
    "LeakyRelu": (0.01, None),
    "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", DEFAULTS)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_oracle_default_parameters(op, name, data):
    """The oracle without alpha/beta equals onnxruntime given docs/semantics.md's defaults."""
    case = data.draw(cases(op, dtypes=[np.float32], layouts=[0], opset=14))
    k, n_dir = OPS[op][1], 2 if case.attrs["direction"] == "bidirectional" else 1
    position = data.draw(st.integers(0, k - 1))
    others = ["Sigmoid", "Tanh", "Softsign"][:k]
    names = [*others[:position], name, *others[position + 1 :]] * n_dir
    case.attrs = {"direction": case.attrs["direction"], "activations": names}
    explicit = Case(op, case.inputs, dict(case.attrs))
    for key, value in zip(("activation_alpha", "activation_beta"), DEFAULTS[name], strict=True):
        if value is not None:
            explicit.attrs[key] = [value] * n_dir
    for got, expected in zip(case.reference(), run_onnxruntime(explicit), strict=True):
        assert_close(expected, got, np.float32)


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_oracle_layout_1_is_transposed_layout_0(op, data):
    """onnxruntime has no layout 1: check the oracle's against its own layout 0."""
    case = data.draw(cases(op, dtypes=[np.float64], layouts=[1]))
    swapped = {
        k: None if v is None or k not in ("X", "initial_h", "initial_c") else v.swapaxes(0, 1)
        for k, v in case.inputs.items()
    }
    inputs0 = {k: case.inputs[k] if swapped[k] is None else swapped[k] for k in case.inputs}
    attrs0 = {k: v for k, v in case.attrs.items() if k != "layout"}
    Y, *finals = Case(op, inputs0, attrs0).reference(bound=np.inf)
    Y1, *finals1 = case.reference(bound=np.inf)
    np.testing.assert_array_equal(Y1, Y.transpose(2, 0, 1, 3))
    for f1, f in zip(finals1, finals, strict=True):
        np.testing.assert_array_equal(f1, f.swapaxes(0, 1))
