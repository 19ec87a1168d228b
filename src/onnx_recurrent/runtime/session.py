"""An onnxruntime-shaped session that runs whole ONNX models.

A host runs the graph: onnxruntime (:mod:`.hosts.onnxruntime`), with the recurrent
nodes as custom nodes, or onnx.reference (:mod:`.hosts.reference`); either way the
recurrent nodes run through the layers bound when the session is made
(:mod:`.bound`). Feeds are checked against the graph's declared inputs before
anything runs, the same way under both hosts.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model
from onnx.helper import tensor_dtype_to_np_dtype

from ..errors import RecurrentError, RecurrentTypeError
from .bound import BoundNode, bind
from .graph import all_graphs
from .hosts import HOSTS, make_host


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
        """Raises ``TypeError`` for an element type that ONNX does not define."""
        t = value_info.type.tensor_type
        if t.elem_type not in onnx.TensorProto.DataType.values():
            raise RecurrentTypeError(
                f"tensor {value_info.name!r} is declared of an unknown element type {t.elem_type}"
            )
        shape = None
        if t.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in t.shape.dim
            ]
        type_name = onnx.TensorProto.DataType.Name(t.elem_type).lower()
        return cls(value_info.name, shape, f"tensor({type_name})", t.elem_type)


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """The model given as a path, serialised bytes or a ``ModelProto`` (as is).

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A directory, an empty file or bytes, or data that is not an ONNX model
        (protobuf cannot parse it, or it has no graph), or external data (tensors kept
        in files beside the model, read from the model's folder) that cannot be read;
        the message names the model.
    OSError
        The file cannot be read.
    TypeError
        ``model`` is none of these.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray):
        return _parse(bytes(model), "given as bytes")
    if isinstance(model, str | os.PathLike):
        name = os.fspath(model)
        if not os.path.exists(name):
            raise FileNotFoundError(f"model: no such file {name!r}")
        if os.path.isdir(name):
            raise RecurrentError(f"model {name!r} is a directory, not an .onnx file")
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as e:  # named, whether open or read failed
            raise type(e)(e.errno, e.strerror, name) from None
        loaded = _parse(data, repr(name))
        try:  # tensors kept in files beside the model (none: nothing to do)
            load_external_data_for_model(loaded, os.path.dirname(os.path.abspath(name)))
        except Exception as e:  # onnx's errors for a missing or misplaced file
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise RecurrentError(
                f"model {name!r}: its external data cannot be read ({why})"
            ) from None
        return loaded
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _parse(data: bytes, name: str) -> onnx.ModelProto:
    if not data:
        raise RecurrentError(f"model {name} is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf's DecodeError, and what else its versions raise
        text = str(e).strip().splitlines()
        why = text[0] if text else type(e).__name__
        raise RecurrentError(f"model {name} is not an ONNX model ({why})") from None
    if not model.HasField("graph"):
        raise RecurrentError(f"model {name} is not an ONNX model (it has no graph)")
    return model


def _input(value_info: onnx.ValueInfoProto) -> NodeArg:
    """A graph input a caller feeds: a tensor of an element type arrays can have."""
    name = value_info.name
    if not name:
        raise RecurrentError("a graph input has no name")
    kind = value_info.type.WhichOneof("value")
    if kind not in (None, "tensor_type"):
        raise RecurrentTypeError(
            f"input {name!r} is a {kind.removesuffix('_type')}, not a tensor: "
            "InferenceSession feeds tensors only"
        )
    arg = NodeArg.of(value_info)
    try:
        tensor_dtype_to_np_dtype(arg.elem_type)
    except KeyError:
        raise RecurrentTypeError(
            f"input {name!r} has element type {arg.type}, which no array can have"
        ) from None
    return arg


def _check_text(model: onnx.ModelProto) -> None:
    """Every name in the model is text: protobuf hands a string field that is not UTF-8
    back as bytes (a corrupt model), which no later step expects.

    Raises
    ------
    ValueError
        The first such name, and where it is.
    """

    def check(what: str, values) -> None:
        for value in values:
            if not isinstance(value, str):
                raise RecurrentError(f"model: {what} {value!r} is not UTF-8 text")

    check("opset domain", [o.domain for o in model.opset_import])
    for g in all_graphs(model.graph):
        check("graph name", [g.name])
        for values in (g.input, g.output, g.value_info, g.initializer):
            check("tensor name", [v.name for v in values])
        for n in g.node:
            check("node name", [n.name])
            check(f"operator of node {n.name!r}", [n.op_type, n.domain])
            check(f"input of node {n.name!r}", n.input)
            check(f"output of node {n.name!r}", n.output)
            check(f"attribute name of node {n.name!r}", [a.name for a in n.attribute])


def _not_picklable(cls: type) -> str:
    """What pickling a session says: onnxruntime's words, and what to do instead."""
    name = f"onnx_recurrent.{cls.__name__}"
    return (
        f"cannot pickle {name!r} object: like onnxruntime's InferenceSession, it holds "
        "onnxruntime's native session and code compiled in this process; make one in "
        f"each process instead, e.g. {name}(path) there, from the model's path or "
        "bytes, which pickle (onnx_recurrent.dask.run makes one per worker)"
    )


@dataclass(frozen=True)
class ModelMetadata:
    """The model's metadata, as onnxruntime's ``ModelMetadata``."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelMetadata:
        return cls(
            model.producer_name,
            model.graph.name,
            model.domain,
            model.doc_string,
            model.graph.doc_string,
            model.model_version,
            {p.key: p.value for p in model.metadata_props},
        )


class InferenceSession:
    """Run an ONNX model with onnx-recurrent's recurrent operators: a drop-in for
    ``onnxruntime.InferenceSession``.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        A path to a ``.onnx`` file, its serialised bytes, or a loaded model.
    sess_options : onnxruntime.SessionOptions, optional
        For the onnxruntime host (ignored by the reference host). They are read, never
        changed, so one object may serve several sessions, ours and onnxruntime's: the
        host makes its own ``SessionOptions`` with onnxruntime-extensions' library
        registered, the graph run sequentially, and your settings copied in, all
        those onnxruntime lets one read (``intra_op_num_threads``,
        ``inter_op_num_threads``, ``graph_optimization_level``,
        ``log_severity_level``... and the configuration entries listed in
        :data:`~onnx_recurrent.runtime.hosts.onnxruntime.SESSION_CONFIG_KEYS`).
        What onnxruntime gives no way to read is not carried over: initializers,
        free-dimension overrides and custom-op libraries added to them; options that
        hold execution providers (``add_provider``) are refused (pass ``providers``).
        Without them, the host's options keep onnxruntime's idle threads from
        spinning long (:data:`~onnx_recurrent.runtime.hosts.onnxruntime.SESSION_CONFIG`);
        with your own, set ``session.intra_op.spin_duration_us`` yourself if a
        recurrent node runs on several threads.
    providers : list, optional
        onnxruntime's execution providers (default ``["CPUExecutionProvider"]``).
    host : {"auto", "onnxruntime", "reference"}
        Who runs the graph. ``"onnxruntime"``: onnxruntime, with every GRU, RNN and
        LSTM node (``If``, ``Loop`` and ``Scan`` bodies included) computed by
        onnx-recurrent as a custom node (needs onnxruntime and
        onnxruntime-extensions). ``"reference"``: onnx.reference, slow but needing
        neither. ``"auto"``: onnxruntime where it can, else reference, with one
        :class:`RuntimeWarning` saying why. :attr:`host` tells which runs.

    The recurrent nodes' weights that are initializers, or computed from initializers
    only, are checked and prepared once, here; a call passes only X, the lengths and
    the states.

    Raises
    ------
    FileNotFoundError
        ``model`` is a path that does not exist.
    TypeError
        ``model`` is none of the accepted types; a graph input that is not a tensor, or
        of an element type no array has; ``sess_options`` not an
        ``onnxruntime.SessionOptions`` (where the onnxruntime host is tried).
    ValueError
        An unknown ``host``; a model that cannot be read (corrupt, not UTF-8 names, an
        unnamed graph input or output, an initializer whose data do not fit its dims);
        a recurrent node with a bad attribute or constant weights that disagree (the
        message names the node).
    RuntimeError
        ``host="onnxruntime"`` where onnxruntime or onnxruntime-extensions is missing,
        ``sess_options`` hold execution providers, or onnxruntime refuses the model
        (the message says which).

    Notes
    -----
    ``run`` may be called from several threads at once, as with onnxruntime.

    A session cannot be pickled (nor copied), as onnxruntime's cannot: it holds
    onnxruntime's native session and layers compiled in this process. Make one in
    each process from the model, whose path or bytes pickle
    (:func:`onnx_recurrent.dask.run` does so on each worker); pickling raises
    ``TypeError``.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        *,
        host: str = "auto",
        _zero_size_states: bool = False,
    ) -> None:
        if host not in HOSTS:
            raise RecurrentError(f"host must be one of {list(HOSTS)}, got {host!r}")
        self._model = load_model(model)
        _check_text(self._model)
        graph = self._model.graph
        initializers = {i.name for i in graph.initializer}
        self._inputs = [_input(v) for v in graph.input if v.name not in initializers]
        # per input, checked on every run: the element type and the fixed dims
        self._feed_checks = {
            arg.name: (
                arg,
                np.dtype(tensor_dtype_to_np_dtype(arg.elem_type)),
                None
                if arg.shape is None
                else [
                    (axis, d) for axis, d in enumerate(arg.shape) if isinstance(d, int) and d > 0
                ],
            )
            for arg in self._inputs
        }
        self._outputs = [NodeArg.of(v) for v in graph.output]
        self._output_names = [o.name for o in self._outputs]
        for i, v in enumerate(graph.output):
            if not v.name:
                raise RecurrentError(f"graph output {i} has no name")
        self._bound = bind(self._model, zero_size_states=_zero_size_states)
        self._host, why = make_host(host, self._model, self._bound, sess_options, providers)
        if why:
            warnings.warn(
                f"onnx-recurrent: the reference host runs this model ({why})",
                RuntimeWarning,
                stacklevel=2,
            )

    def __reduce__(self):
        raise TypeError(_not_picklable(type(self)))

    @property
    def model(self) -> onnx.ModelProto:
        """The loaded model."""
        return self._model

    @property
    def host(self) -> str:
        """Who runs the graph: ``"onnxruntime"`` or ``"reference"``."""
        return self._host.name

    @property
    def recurrent_nodes(self) -> list[BoundNode]:
        """The model's recurrent nodes as bound at creation (top level first)."""
        return list(self._bound.values())

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a caller feeds (initializers excluded), in graph order."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in graph order."""
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        """onnxruntime's execution providers; ``["CPUExecutionProvider"]`` under the
        reference host."""
        return self._host.providers()

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, descriptions, version and custom
        metadata."""
        return ModelMetadata.of(self._model)

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise TypeError(
                f"feeds must be a dict of input name to array, got {type(feeds).__name__}"
            )
        known = self._feed_checks
        if feeds.keys() != known.keys():
            unknown = sorted(set(feeds) - set(known))
            if unknown:
                raise RecurrentError(
                    f"unknown input name(s) {unknown}; the model's inputs are {list(known)}"
                )
            missing = [name for name in known if name not in feeds]
            raise RecurrentError(
                f"missing input(s) {missing}; the model's inputs are {list(known)}"
            )
        checked = {}
        for name, value in feeds.items():
            arg, expected, fixed = known[name]
            array = value if type(value) is np.ndarray else np.asarray(value)
            checked[name] = array
            if array.dtype != expected:
                raise RecurrentTypeError(
                    f"input {name!r}: expected element type {arg.type} ({expected}), "
                    f"got {array.dtype}"
                )
            if fixed is not None:
                if array.ndim != len(arg.shape):
                    raise RecurrentError(
                        f"input {name!r}: expected rank {len(arg.shape)} (shape {arg.shape}), "
                        f"got shape {list(array.shape)}"
                    )
                for axis, want in fixed:
                    if array.shape[axis] != want:
                        raise RecurrentError(
                            f"input {name!r}: expected shape {arg.shape}, got {list(array.shape)} "
                            f"(axis {axis})"
                        )
        return checked

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Run the model.

        Parameters
        ----------
        output_names : list of str or None
            The outputs to return, in this order; None for all, in graph order.
        input_feed : dict of str to ndarray
            One array per graph input, of the declared element type and rank.
        run_options : onnxruntime.RunOptions, optional
            Passed to onnxruntime under its host; ignored by the reference host.

        Returns
        -------
        list of ndarray

        Raises
        ------
        ValueError
            A missing or unknown input name, a wrong rank or fixed dimension, an
            unknown output name; a recurrent node's (``sequence_lens`` out of range...),
            naming the node, the same under both hosts.
        TypeError
            ``output_names`` a string, a feed of the wrong element type.
        KeyboardInterrupt
            Ctrl-C during the call; the session stays usable.
        """
        if output_names is not None and isinstance(output_names, (str, bytes)):
            raise TypeError(
                f"output_names must be a list of names or None, got the string "
                f"{output_names!r} (write [{output_names!r}])"
            )
        host = self._host
        refused = None
        if (
            type(input_feed) is dict
            and host.checks_feeds
            and len(input_feed) == len(self._feed_checks)  # no initializer fed
        ):  # the host checks arrays: ours word its refusal (the same errors, less code
            # on a call's path: 1 µs, 40 µs when a call finds the caches cold)
            refused = self._check_feeds
            for value in input_feed.values():
                if type(value) is not np.ndarray:
                    refused = None
                    break
        checked = input_feed if refused is not None else self._check_feeds(input_feed)
        names = self._output_names
        if output_names is None:
            output_names = names
        else:
            output_names = list(output_names)
            unknown = [n for n in output_names if n not in names]
            if unknown:
                raise RecurrentError(
                    f"unknown output name(s) {unknown}; the model's outputs are {names}"
                )
        if refused is None:
            return host.run(output_names, checked, run_options)
        return host.run(output_names, checked, run_options, refused)
