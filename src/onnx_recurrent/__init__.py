"""onnx-recurrent: the ONNX recurrent operators on NumPy, complete to the specification.

Faces: prepared layers (:class:`Layer`: weights checked and arranged once, run many
times), functions on arrays (:func:`gru`, :func:`rnn`, :func:`lstm`, :func:`gru_cell`), an
onnxruntime-style :class:`InferenceSession` for whole ONNX models, and
:func:`reference_ops` for ``onnx.reference.ReferenceEvaluator(new_ops=...)``.
:class:`StreamingSession` runs any recurrent model chunk by chunk with its states
carried; :mod:`onnx_recurrent.convert` moves weights between PyTorch, Keras and ONNX.
"""

from __future__ import annotations

from . import convert
from .errors import RecurrentError, RecurrentTypeError
from .layers import Layer
from .ops import gru, gru_cell, lstm, rnn
from .runtime import InferenceSession, NodeArg, reference_ops
from .runtime.streaming import StreamingSession, expose_states

__all__ = [
    "InferenceSession",
    "Layer",
    "NodeArg",
    "RecurrentError",
    "RecurrentTypeError",
    "StreamingSession",
    "convert",
    "expose_states",
    "gru",
    "gru_cell",
    "lstm",
    "reference_ops",
    "rnn",
]
__version__ = "0.1.0"
