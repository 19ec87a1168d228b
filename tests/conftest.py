"""Fixtures shared by the test modules."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(params=["onnxruntime", "reference"])
def host(request) -> str:
    """Each graph host of :class:`onnx_recurrent.InferenceSession` in turn."""
    if request.param == "onnxruntime":
        for package in ("onnxruntime", "onnxruntime_extensions"):
            if importlib.util.find_spec(package) is None:
                pytest.skip(f"the onnxruntime host needs {package}")
    return request.param
