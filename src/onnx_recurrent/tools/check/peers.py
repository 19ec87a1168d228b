"""The peers: onnxruntime, onnx.reference and OpenVINO, each run lazily where installed."""

from __future__ import annotations

import importlib.util
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
