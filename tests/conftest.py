"""Fixtures shared by the test modules."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings


@pytest.fixture(params=["onnxruntime", "reference"])
def host(request) -> str:
    """Each graph host of :class:`onnx_recurrent.InferenceSession` in turn."""
    if request.param == "onnxruntime":
        for package in ("onnxruntime", "onnxruntime_extensions"):
            if importlib.util.find_spec(package) is None:
                pytest.skip(f"the onnxruntime host needs {package}")
    return request.param


# Hypothesis: derandomized (the same examples on every run, as CI needs) unless
# HYPOTHESIS_PROFILE says otherwise ("dev": random examples); a failure prints its blob.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
