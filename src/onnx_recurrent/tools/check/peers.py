"""The peers: onnxruntime, onnx.reference and OpenVINO, each run lazily where installed."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable

import numpy as np
import onnx


def _run_onnxruntime(model: onnx.ModelProto, feeds, names):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are reported in the table, not logged
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(list(names), dict(feeds))


def _run_reference(model: onnx.ModelProto, feeds, names):
    """onnx.reference's own operators, recurrent ones included, ``Loop`` corrected.

    Its ``Loop`` runs zero iterations when ``cond`` is omitted (``runtime/loop.py``): a
    mistake in no recurrent operator, which would otherwise show as this peer differing
    on any such model.
    """
    from onnx.reference import ReferenceEvaluator

    from ...runtime.loop import reference_fixes

    return ReferenceEvaluator(model, new_ops=reference_fixes()).run(list(names), dict(feeds))


def _run_openvino(model: onnx.ModelProto, feeds, names):
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(model.SerializeToString()), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    result = compiled(dict(feeds))
    outputs = []
    for n in names:
        port = compiled.output(n)
        value = np.asarray(result[port])
        if port.get_element_type() == ov.Type.bf16:  # handed back as float16 bits
            import ml_dtypes

            value = value.view(np.uint16).view(ml_dtypes.bfloat16)
        outputs.append(value)
    return outputs


#: peer name -> (module that must be importable, runner)
PEERS: dict[str, tuple[str, Callable]] = {
    "onnxruntime": ("onnxruntime", _run_onnxruntime),
    "onnx.reference": ("onnx", _run_reference),
    "openvino": ("openvino", _run_openvino),
}


def installed_peers() -> list[str]:
    """The peers whose package can be imported here."""
    return [name for name, (module, _) in PEERS.items() if importlib.util.find_spec(module)]


def one_line(error: BaseException, width: int = 140) -> str:
    """The error on one line: OpenVINO's chain of source locations dropped, truncated."""
    while error.__cause__ is not None and str(error).startswith("Issues with types"):
        error = error.__cause__  # onnx.reference's wrapper around the operator's error
    lines = [
        line.strip()
        for line in str(error).splitlines()
        if line.strip() and not re.fullmatch(r"Exception from \S+:\d+:?", line.strip())
    ]
    text = re.split(r"HAS THROWN:\s*", " ".join(" ".join(lines).split()))[-1]
    # onnxruntime: its source paths and C++ signatures, then its error-code prefix
    text = re.sub(r"/\S+\.(?:h|cc|cpp):\d+\s*|\S+::\S+\([^)]*\)\s*", "", text)
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= width else text[: width - 3] + "..."
