"""onnx's backend API over onnx-recurrent's :class:`~onnx_recurrent.InferenceSession`.

The functions of ``onnxruntime.backend``, with onnx-recurrent computing every GRU, RNN
and LSTM node: :func:`prepare` makes a :class:`RecurrentBackendRep` whose ``run``
takes the inputs as a list (mapped by position onto the graph inputs that are not
initializers, as onnxruntime's backend maps them), a dict of input name to value, or
one array for a model of one input; :func:`run_model` prepares and runs at once;
:func:`run_node` runs one GRU, RNN or LSTM node (onnxruntime's backend runs no single
node); :func:`supports_device` and :func:`is_compatible` answer for the CPU, the one
device. Built on onnx's :class:`onnx.backend.base.Backend`, so onnx's own test runner
(``onnx.backend.test.BackendTest``) can run it.

Examples
--------
A whole model, the one bundled with the package (a GRU between two matrix products):

>>> from importlib.resources import files
>>> import numpy as np
>>> from onnx_recurrent import backend
>>> model = (files("onnx_recurrent") / "data" / "example_gru.onnx").read_bytes()
>>> rep = backend.prepare(model)
>>> x = np.zeros((2, 20, 16), np.float32)  # (batch, seq, features)
>>> logits, h_n = rep.run([x])  # by position onto the graph's input 'x'
>>> logits.shape, h_n.shape
((2, 20, 4), (4, 2, 32))
>>> [a.shape for a in rep.run({"x": x})]  # or by name
[(2, 20, 4), (4, 2, 32)]

One node:

>>> from onnx import helper
>>> node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=3)
>>> X = np.ones((5, 2, 4), np.float32)  # (seq_length, batch_size, input_size)
>>> W = np.full((1, 9, 4), 0.1, np.float32)  # (num_directions, 3*hidden_size, input_size)
>>> R = np.full((1, 9, 3), 0.1, np.float32)  # (num_directions, 3*hidden_size, hidden_size)
>>> Y, Y_h = backend.run_node(node, [X, W, R])
>>> Y.shape, Y_h.shape  # (seq_length, num_directions, batch_size, hidden_size)
((5, 1, 2, 3), (1, 2, 3))
>>> backend.supports_device("CPU"), backend.supports_device("CUDA")
(True, False)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from .errors import RecurrentError, RecurrentTypeError
from .runtime.graph import INPUTS, RECURRENT_OPS, is_default_domain, node_model
from .runtime.session import InferenceSession
from .spec import as_array, native_order

__all__ = [
    "RecurrentBackend",
    "RecurrentBackendRep",
    "is_compatible",
    "prepare",
    "run",
    "run_model",
    "run_node",
    "supports_device",
]

#: the one device
DEVICE = "CPU"
#: :class:`InferenceSession`'s keyword arguments that :func:`prepare` passes on (read
#: from its signature: ``sess_options``, ``providers``, ``provider_options``, ``host``;
#: not its ``**kwargs``)
SESSION_KWARGS = tuple(
    name
    for name, parameter in inspect.signature(InferenceSession).parameters.items()
    if name != "model"
    and not name.startswith("_")
    and parameter.kind is not inspect.Parameter.VAR_KEYWORD
)
#: what onnx's test runner (``BackendTest``) passes to ``prepare`` besides the model:
#: its comparison's tolerances, when a case is given its own; accepted, not used
RUNNER_KWARGS = ("rtol", "atol")


class RecurrentBackendRep(BackendRep):
    """A model prepared by :func:`prepare`: an :class:`~onnx_recurrent.InferenceSession`
    ready to run many times.

    Parameters
    ----------
    session : onnx_recurrent.InferenceSession
    """

    def __init__(self, session: InferenceSession) -> None:
        if not isinstance(session, InferenceSession):
            raise TypeError(
                f"session must be an onnx_recurrent.InferenceSession, got {type(session).__name__}"
            )
        self._session = session

    @property
    def session(self) -> InferenceSession:
        """The session that runs the model."""
        return self._session

    def run(self, inputs: Any, run_options: Any = None) -> list[Any]:
        """Run the model.

        Parameters
        ----------
        inputs : list, tuple, dict or ndarray
            A list (or tuple) of values, one per graph input that is not an
            initializer, in the graph's order (:meth:`InferenceSession.get_inputs`);
            optional inputs at the end may be left out. Or a dict of input name to
            value. Or one value, for a model of one input. A value is an ndarray of the
            input's element type (``X : (seq_length, batch_size, input_size) float32
            ndarray`` for a GRU's X), a list of arrays for a sequence input, None for
            an empty optional, a dict for a map (see :meth:`InferenceSession.run`).
            A list is always positional: a model whose one input is a sequence takes
            ``[[a, b]]`` or ``{"name": [a, b]}``.
        run_options : onnxruntime.RunOptions, optional
            Passed to onnxruntime under its host.

        Returns
        -------
        list
            One value per graph output, in graph order: an ndarray for a tensor (of
            the declared element type), a list of arrays for a sequence, None for an
            empty optional.

        Raises
        ------
        ValueError
            More inputs than the model takes; one value, not in a list, for a model of
            several inputs; and as :meth:`InferenceSession.run` (missing or unknown
            names, a wrong rank or fixed dimension, a recurrent node's error).
        TypeError
            As :meth:`InferenceSession.run` (a wrong element type, a sequence not
            given as a list).
        """
        return self._session.run(None, self._feeds(inputs), run_options)

    def _feeds(self, inputs: Any) -> Mapping[str, Any]:
        if isinstance(inputs, Mapping):
            return inputs
        names = [arg.name for arg in self._session.get_inputs()]
        if isinstance(inputs, list | tuple):
            if len(inputs) > len(names):
                raise RecurrentError(
                    f"{len(inputs)} inputs given; the model takes {len(names)}: {names}"
                )
            return dict(zip(names, inputs, strict=False))
        if len(names) != 1:
            raise RecurrentError(
                f"one input given, not in a list; the model takes {len(names)}: {names} "
                "(pass a list, or a dict of name to value)"
            )
        return {names[0]: inputs}


#: what :meth:`RecurrentBackend.prepare` and ``run_model`` take as the model
ModelLike = onnx.ModelProto | str | os.PathLike | bytes | InferenceSession | RecurrentBackendRep


class RecurrentBackend(Backend):
    """onnx's backend API (:class:`onnx.backend.base.Backend`) over
    :class:`~onnx_recurrent.InferenceSession`, as ``onnxruntime.backend`` over
    onnxruntime's. Its class methods are also this module's functions."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Whether the backend runs on ``device``: ``"CPU"`` only.

        Parameters
        ----------
        device : str
            onnx's device name (``"CPU"``, ``"CUDA"``, ``"CUDA:1"``...).

        Returns
        -------
        bool
        """
        return device == DEVICE

    @classmethod
    def is_compatible(cls, model: Any, device: str = DEVICE, **kwargs: Any) -> bool:
        """Whether the backend can run ``model`` on ``device``: whether it supports the
        device (as onnxruntime's backend answers; the model is not read).

        Parameters
        ----------
        model : onnx.ModelProto, str, os.PathLike or bytes
            Not read.
        device : str
        **kwargs
            Not read.

        Returns
        -------
        bool
        """
        return cls.supports_device(DEVICE if device is None else device)

    @classmethod
    def prepare(
        cls,
        model: ModelLike,
        device: str = DEVICE,
        **kwargs: Any,
    ) -> RecurrentBackendRep:
        """Make a session of ``model``, to run it many times.

        Parameters
        ----------
        model : onnx.ModelProto, str, os.PathLike, bytes, InferenceSession or RecurrentBackendRep
            A loaded model (checked by ``onnx.checker.check_model`` first, as
            onnxruntime's backend checks one), a path to a ``.onnx`` file, its
            serialised bytes, a session (wrapped), or a prepared model (returned as
            is).
        device : str
            ``"CPU"`` (or None, the same).
        **kwargs
            :class:`~onnx_recurrent.InferenceSession`'s keyword arguments
            ``sess_options``, ``providers``, ``provider_options`` and ``host``;
            ``rtol`` and ``atol``, which onnx's test runner passes for a case with its
            own tolerances, are accepted and not used.

        Returns
        -------
        RecurrentBackendRep

        Raises
        ------
        RuntimeError
            A device other than the CPU; and as :class:`~onnx_recurrent.InferenceSession`
            (``host="onnxruntime"`` where that host cannot run the model).
        TypeError
            A keyword argument other than those above, or one of
            :class:`~onnx_recurrent.InferenceSession`'s with a session or prepared
            model (made already); and as :class:`~onnx_recurrent.InferenceSession`.
        onnx.checker.ValidationError
            A ``ModelProto`` that onnx's checker refuses.
        ValueError, FileNotFoundError
            As :class:`~onnx_recurrent.InferenceSession`.
        """
        unknown = sorted(set(kwargs) - set(SESSION_KWARGS) - set(RUNNER_KWARGS))
        if unknown:
            raise TypeError(
                f"prepare() got unexpected keyword argument(s) {unknown}; it takes "
                f"{list(SESSION_KWARGS)} (InferenceSession's) and {list(RUNNER_KWARGS)} "
                "(onnx's test runner's, not used)"
            )
        if device is not None and not cls.supports_device(device):
            raise RuntimeError(f"onnx-recurrent runs on the {DEVICE} only, got device {device!r}")
        options = {k: v for k, v in kwargs.items() if k in SESSION_KWARGS}
        if isinstance(model, RecurrentBackendRep | InferenceSession) and options:
            raise TypeError(
                f"prepare() got {sorted(options)} for a model given as its "
                f"{type(model).__name__}, made already: they apply where a session is "
                "made (give the model instead)"
            )
        if isinstance(model, RecurrentBackendRep):
            return model
        if isinstance(model, InferenceSession):
            return RecurrentBackendRep(model)
        if isinstance(model, onnx.ModelProto):
            onnx.checker.check_model(model)
        return RecurrentBackendRep(InferenceSession(model, **options))

    @classmethod
    def run_model(
        cls,
        model: ModelLike,
        inputs: Any,
        device: str = DEVICE,
        **kwargs: Any,
    ) -> list[Any]:
        """Prepare ``model`` and run it once: :func:`prepare` then
        :meth:`RecurrentBackendRep.run`.

        Parameters
        ----------
        model, device, **kwargs
            As :func:`prepare`.
        inputs : list, tuple, dict or ndarray
            As :meth:`RecurrentBackendRep.run`.

        Returns
        -------
        list
            One value per graph output.

        Raises
        ------
        As :func:`prepare` and :meth:`RecurrentBackendRep.run`.
        """
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[Any] | Mapping[str, Any],
        device: str = DEVICE,
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> list[np.ndarray]:
        """Run one GRU, RNN or LSTM node: as a one-node model, through the session.

        Parameters
        ----------
        node : onnx.NodeProto
            A GRU, RNN or LSTM node of the default domain (other operators: run a
            whole model).
        inputs : list or dict
            One value per name of ``node.input``, in order (None, or nothing past the
            last, for a name left empty), or a dict of input name to array:
            ``X : (seq_length, batch_size, input_size) ndarray`` (``layout=1``:
            ``(batch_size, seq_length, input_size)``), ``W : (num_directions,
            gates*hidden_size, input_size)``, ``R : (num_directions,
            gates*hidden_size, hidden_size)``, optional ``B``, ``sequence_lens :
            (batch_size,) int32``, ``initial_h``, ``initial_c`` and ``P`` (LSTM), all
            of X's float type but ``sequence_lens``.
        device : str
            ``"CPU"``.
        outputs_info : list of (dtype, shape), optional
            The outputs' declared element types (X's) and shapes (None: unknown
            dims), one per name of ``node.output``; by default X's type and unknown
            dims.
        **kwargs
            ``opset_version``: the default domain's opset the node is of (default:
            the latest the installed onnx knows); the rest as :func:`prepare`.

        Returns
        -------
        list of ndarray
            One array per non-empty name of ``node.output``: ``Y : (seq_length,
            num_directions, batch_size, hidden_size)``, ``Y_h : (num_directions,
            batch_size, hidden_size)``, ``Y_c`` (LSTM), of X's element type.

        Raises
        ------
        NotImplementedError
            A node of another operator (as onnxruntime's backend raises for every
            node).
        onnx.checker.ValidationError
            A node that onnx's checker refuses.
        ValueError
            A value given for an input name left empty, more values than
            ``node.input`` names, no value for an input the node names (X, W, R or an
            optional one); a bad attribute or shape (the message names the node).
        TypeError
            ``node`` not a ``NodeProto``, ``inputs`` neither a list nor a dict, an
            ``outputs_info`` entry not ``(dtype, shape)`` or of another type than X's,
            inputs of mixed float types, ``opset_version`` not a positive integer; and
            as :func:`prepare`.
        RuntimeError
            A device other than the CPU.
        """
        if not isinstance(node, onnx.NodeProto):
            raise TypeError(f"node must be an onnx.NodeProto, got {type(node).__name__}")
        if not isinstance(inputs, list | tuple | Mapping):
            raise TypeError(
                "inputs must be a list (one value per name of node.input) or a dict of "
                f"input name to array, got {type(inputs).__name__}"
            )
        if node.op_type not in RECURRENT_OPS or not is_default_domain(node.domain):
            raise NotImplementedError(
                f"run_node runs GRU, RNN and LSTM nodes only, not {node.op_type!r} "
                f"(domain {node.domain!r}): run a whole model with prepare or run_model"
            )
        if not cls.supports_device(DEVICE if device is None else device):
            raise RuntimeError(f"onnx-recurrent runs on the {DEVICE} only, got device {device!r}")
        opset = kwargs.pop("opset_version", None)
        if opset is not None and (
            isinstance(opset, bool) or not isinstance(opset, int | np.integer) or opset < 1
        ):
            raise RecurrentTypeError(
                f"opset_version must be a positive integer, got {type(opset).__name__} {opset!r}"
            )
        checked = {} if opset is None else {"opset_version": int(opset)}
        super().run_node(node, inputs, device, outputs_info, **checked)  # onnx's checker
        feeds = _node_feeds(node, inputs)
        for i, (name, role) in enumerate(zip(node.input, INPUTS[node.op_type], strict=False)):
            if (i < 3 or name) and name not in feeds:  # X, W, R; any other it names
                raise RecurrentError(
                    f"{node.op_type} node {node.name!r}: no value given for its input "
                    f"{role} ({name!r})" + ("" if i < 3 else "; or name it '' in the node")
                )
        if len(node.input) < 3:
            raise RecurrentError(
                f"{node.op_type} node {node.name!r} names {len(node.input)} inputs; "
                "it needs X, W and R"
            )
        if outputs_info is None:  # X's type; Y: 4 dims, Y_h and Y_c: 3
            elem = helper.np_dtype_to_tensor_dtype(feeds[node.input[0]].dtype)
            types = [(elem, [None] * (4 if i == 0 else 3)) for i in range(len(node.output))]
        elif len(outputs_info) != len(node.output):
            raise RecurrentError(
                f"outputs_info gives {len(outputs_info)} outputs; the node has "
                f"{len(node.output)}: {list(node.output)}"
            )
        else:
            x = feeds[node.input[0]].dtype
            types = []
            for k, info in enumerate(outputs_info):
                try:
                    dtype = np.dtype(info[0])
                    shape = [None] * (4 if k == 0 else 3) if info[1] is None else list(info[1])
                except (TypeError, ValueError, IndexError):
                    raise TypeError(
                        f"outputs_info[{k}] must be (dtype, shape), got {info!r}"
                    ) from None
                if dtype != x:  # the spec: every output of X's type
                    raise RecurrentTypeError(
                        f"outputs_info[{k}] declares {dtype}; the node's outputs are of "
                        f"X's type {x}"
                    )
                types.append((helper.np_dtype_to_tensor_dtype(dtype), shape))
        version = onnx.defs.onnx_opset_version() if opset is None else int(opset)
        model = node_model(node, feeds, output_types=types, opset=version, ir_version=None)
        return cls.prepare(model, device, **kwargs).run(feeds)


def _node_feeds(node: onnx.NodeProto, inputs: Sequence[Any] | Mapping[str, Any]) -> dict:
    """``inputs`` of ``node`` as a dict of its input names to arrays.

    Raises
    ------
    ValueError
        A value for an input left empty, more values than the node has inputs, a
        name the node does not take, or a ragged nested list.
    TypeError
        A masked array (its mask would be ignored), or what NumPy cannot read (a torch
        tensor that needs grad); the message names the input.
    """
    if isinstance(inputs, Mapping):
        if inputs.get("") is not None:
            raise RecurrentError("inputs[''] is given a value, but '' names an input left empty")
        unknown = sorted(set(inputs) - set(node.input) - {""})
        if unknown:
            raise RecurrentError(
                f"unknown input name(s) {unknown}; the node's inputs are {list(node.input)}"
            )
        items = [(name, inputs[name]) for name in node.input if name and name in inputs]
    else:
        inputs = list(inputs)
        if len(inputs) > len(node.input):
            raise RecurrentError(
                f"{len(inputs)} inputs given; the node takes {len(node.input)}: {list(node.input)}"
            )
        items = []
        for i, (name, value) in enumerate(zip(node.input, inputs, strict=False)):
            if not name:
                if value is not None:
                    raise RecurrentError(
                        f"input {i} of the node is left empty (''), but a value was given for it"
                    )
                continue
            if value is not None:
                items.append((name, value))
    return {name: native_order(as_array(name, value)) for name, value in items}


#: what :func:`prepare` takes as a model
ModelLike = onnx.ModelProto | str | os.PathLike | bytes | InferenceSession | RecurrentBackendRep

prepare = RecurrentBackend.prepare
run_model = RecurrentBackend.run_model
#: as ``onnxruntime.backend.run``
run = RecurrentBackend.run_model
run_node = RecurrentBackend.run_node
supports_device = RecurrentBackend.supports_device
is_compatible = RecurrentBackend.is_compatible
