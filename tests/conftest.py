"""Fixtures shared by the test modules."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable

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


@pytest.fixture
def no_thread_named(monkeypatch) -> Callable[[str], None]:
    """``no_thread_named(name)``: from then on, starting a thread of that name fails as
    at the process's limit of threads; other threads start."""

    def refuse(name: str) -> None:
        start = threading.Thread.start

        def start_unless_named(self):
            if self.name == name:
                raise RuntimeError("can't start new thread")
            return start(self)

        monkeypatch.setattr(threading.Thread, "start", start_unless_named)

    return refuse


# Hypothesis: derandomized (the same examples on every run, as CI needs) unless
# HYPOTHESIS_PROFILE says otherwise ("dev": random examples); a failure prints its blob.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
