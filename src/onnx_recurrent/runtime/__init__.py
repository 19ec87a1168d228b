"""Running whole ONNX models: InferenceSession, StreamingSession
(:mod:`.streaming`), and onnx.reference operators backed by the layers
(``reference_ops``)."""

from typing import TYPE_CHECKING, Any

from .session import InferenceSession, NodeArg

if TYPE_CHECKING:
    from .reference import reference_ops

__all__ = ["InferenceSession", "NodeArg", "reference_ops"]


def __getattr__(name: str) -> Any:
    if name == "reference_ops":  # imports onnx.reference (30 ms): only when asked for
        from .reference import reference_ops

        globals()[name] = reference_ops
        return reference_ops
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
