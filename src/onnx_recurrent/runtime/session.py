"""An onnxruntime-shaped session that runs whole ONNX models.

onnx.reference runs every operator but the recurrent ones, which onnx-recurrent runs
(:func:`~onnx_recurrent.runtime.reference.reference_ops`). Feeds are checked against
the graph's declared inputs before anything runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.helper import tensor_dtype_to_np_dtype
from onnx.reference import ReferenceEvaluator

from ..errors import RecurrentError, RecurrentTypeError
from .reference import reference_ops


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output, as onnxruntime's ``NodeArg``.

    ``shape`` lists ints for fixed dims, str for named dims and None for unknown ones;
    ``type`` is a string like ``'tensor(float)'``.
    """

    name: str
    shape: list[int | str | None] | None
    type: str
    elem_type: int

    @classmethod
    def of(cls, value_info: onnx.ValueInfoProto) -> NodeArg:
        t = value_info.type.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in t.shape.dim
            ]
        type_name = onnx.TensorProto.DataType.Name(t.elem_type).lower()
        return cls(value_info.name, shape, f"tensor({type_name})", t.elem_type)


def _load(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, str | os.PathLike):
        if not os.path.exists(model):
            raise FileNotFoundError(f"model: no such file {os.fspath(model)!r}")
        return onnx.load(model)
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


class InferenceSession:
    """Run an ONNX model with onnx-recurrent's recurrent operators.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        A path to a ``.onnx`` file, its serialised bytes, or a loaded model.

    Raises
    ------
    FileNotFoundError
        ``model`` is a path that does not exist.
    TypeError
        ``model`` is none of the accepted types.

    Notes
    -----
    ``run`` may be called from several threads at once, as with onnxruntime.
    """

    def __init__(self, model: str | os.PathLike | bytes | onnx.ModelProto) -> None:
        self._model = _load(model)
        graph = self._model.graph
        initializers = {i.name for i in graph.initializer}
        self._inputs = [NodeArg.of(v) for v in graph.input if v.name not in initializers]
        self._outputs = [NodeArg.of(v) for v in graph.output]
        self._evaluator = ReferenceEvaluator(self._model, new_ops=reference_ops())

    @property
    def model(self) -> onnx.ModelProto:
        """The loaded model."""
        return self._model

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a caller feeds (initializers excluded), in graph order."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in graph order."""
        return list(self._outputs)

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise TypeError(
                f"feeds must be a dict of input name to array, got {type(feeds).__name__}"
            )
        known = {i.name: i for i in self._inputs}
        unknown = sorted(set(feeds) - set(known))
        if unknown:
            raise RecurrentError(
                f"unknown input name(s) {unknown}; the model's inputs are {list(known)}"
            )
        missing = [name for name in known if name not in feeds]
        if missing:
            raise RecurrentError(
                f"missing input(s) {missing}; the model's inputs are {list(known)}"
            )
        checked = {}
        for name, value in feeds.items():
            arg = known[name]
            array = np.asarray(value)
            expected = np.dtype(tensor_dtype_to_np_dtype(arg.elem_type))
            if array.dtype != expected:
                raise RecurrentTypeError(
                    f"input {name!r}: expected element type {arg.type} ({expected}), "
                    f"got {array.dtype}"
                )
            if arg.shape is not None:
                if array.ndim != len(arg.shape):
                    raise RecurrentError(
                        f"input {name!r}: expected rank {len(arg.shape)} (shape {arg.shape}), "
                        f"got shape {list(array.shape)}"
                    )
                for axis, (want, got) in enumerate(zip(arg.shape, array.shape, strict=True)):
                    if isinstance(want, int) and want > 0 and want != got:
                        raise RecurrentError(
                            f"input {name!r}: expected shape {arg.shape}, got {list(array.shape)} "
                            f"(axis {axis})"
                        )
            checked[name] = array
        return checked

    def run(
        self,
        output_names: Sequence[str] | None,
        feeds: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Run the model.

        Parameters
        ----------
        output_names : sequence of str or None
            The outputs to return, in this order; None for all, in graph order.
        feeds : dict of str to ndarray
            One array per graph input, of the declared element type and rank.
        run_options : None
            Accepted for onnxruntime compatibility; ignored.

        Returns
        -------
        list of ndarray

        Raises
        ------
        ValueError
            A missing or unknown input name, a wrong rank or fixed dimension, or an
            unknown output name.
        TypeError
            A feed of the wrong element type.
        """
        checked = self._check_feeds(feeds)
        names = [o.name for o in self._outputs]
        if output_names is None:
            output_names = names
        else:
            unknown = [n for n in output_names if n not in names]
            if unknown:
                raise RecurrentError(
                    f"unknown output name(s) {unknown}; the model's outputs are {names}"
                )
        return list(self._evaluator.run(list(output_names), checked))
