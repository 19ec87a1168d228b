"""onnx-recurrent: the ONNX recurrent operators on NumPy, complete to the specification.

Faces: prepared layers (:class:`Layer`: weights checked and arranged once, run many
times), functions on arrays (:func:`gru`, :func:`rnn`, :func:`lstm`, :func:`gru_cell`), an
onnxruntime-style :class:`InferenceSession` for whole ONNX models, and
:func:`reference_ops` for ``onnx.reference.ReferenceEvaluator(new_ops=...)``;
:mod:`onnx_recurrent.backend`, onnx's backend API (``prepare(model).run(inputs)``).
:class:`StreamingSession` runs any recurrent model chunk by chunk with its states
carried; :mod:`onnx_recurrent.convert` moves weights between PyTorch, Keras and ONNX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import RecurrentError, RecurrentTypeError

if TYPE_CHECKING:
    from . import backend, convert, runtime
    from .layers import Layer
    from .ops import gru, gru_cell, lstm, rnn
    from .runtime import InferenceSession, NodeArg, reference_ops
    from .runtime.streaming import StreamingSession, expose_states

#: attribute -> the module that holds it, imported on first use (PEP 562): the layers
#: and functions need NumPy and llvmlite (a command's Ctrl-C while they loaded was a
#: traceback: nothing can catch it before the package is imported), the runtime onnx,
#: convert the frameworks' conventions; ``vad`` and ``dask`` are the old paths of two
#: tools (``onnx_recurrent.tools``, aliases there), which need audio I/O and Dask
_LAZY = {
    "Layer": "layers",
    "gru": "ops",
    "gru_cell": "ops",
    "lstm": "ops",
    "rnn": "ops",
    "InferenceSession": "runtime",
    "NodeArg": "runtime",
    "reference_ops": "runtime",
    "StreamingSession": "runtime.streaming",
    "expose_states": "runtime.streaming",
}
_SUBMODULES = ("backend", "convert", "dask", "runtime", "vad")

__all__ = [
    "InferenceSession",
    "Layer",
    "NodeArg",
    "RecurrentError",
    "RecurrentTypeError",
    "StreamingSession",
    "backend",
    "convert",
    "dask",
    "expose_states",
    "gru",
    "gru_cell",
    "lstm",
    "reference_ops",
    "rnn",
    "runtime",
    "vad",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _LAZY and name not in _SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .held import import_whole  # a Ctrl-C half-way: onnx broken for the process

    if name in _LAZY:
        value = getattr(import_whole(f".{_LAZY[name]}", __name__), name)
    else:
        value = import_whole(f".{name}", __name__)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
