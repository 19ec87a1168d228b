"""Differential tests of the library against onnxruntime on the subspace it computes like
the spec: float32, layout 0, every alpha/beta given (see docs/semantics.md)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnx_recurrent as orc

from strategies import OPS, assert_close, cases, run_onnxruntime


@pytest.mark.parametrize(
    ("op", "opset", "n"),
    [(op, 14, 200) for op in OPS] + [(op, 7, 50) for op in OPS],
)
def test_matches_onnxruntime(op, opset, n):
    if not hasattr(orc, op):
        pytest.skip(f"no orc.{op} yet")

    @settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(data=st.data())
    def check(data):
        case = data.draw(
            cases(op, dtypes=[np.float32], layouts=[0], complete_params=True, opset=opset)
        )
        sensitivities = case.sensitivity(case.reference())  # rejects diverging draws
        outputs = case.call(getattr(orc, op))
        expected = run_onnxruntime(case, opset)
        for got, exp, sensitivity in zip(outputs, expected, sensitivities, strict=True):
            assert got.dtype == np.float32
            # two float32 computations: twice the error of one
            assert_close(got, exp, np.float32, factor=2, sensitivity=sensitivity)

    check()
