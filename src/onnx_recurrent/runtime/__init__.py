"""Running whole ONNX models: OpRun adapters for onnx.reference, and InferenceSession."""

from .reference import reference_ops
from .session import InferenceSession, NodeArg

__all__ = ["InferenceSession", "NodeArg", "reference_ops"]
