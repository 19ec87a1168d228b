"""An onnxruntime-shaped session that runs whole ONNX models.

A host runs the graph: onnxruntime (:mod:`.hosts.onnxruntime`), with the recurrent
nodes as custom nodes, or onnx.reference (:mod:`.hosts.reference`); either way the
recurrent nodes run through the layers bound when the session is made
(:mod:`.bound`). Feeds are checked against the graph's declared inputs before
anything runs, the same way under both hosts.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model
from onnx.helper import tensor_dtype_to_np_dtype

from .. import backends, threads
from ..errors import RecurrentError, RecurrentTypeError, one_line
from ..spec import native_order, numpy_of
from .bound import BoundNode, bind, node_key
from .graph import (
    INPUTS,
    all_graphs,
    check_no_custom_nodes,
    check_opset_imports,
    hosted,
    overridable_initializers,
)
from .hosts import HOSTS, make_host
from .hosts.onnxruntime import check_written_paths


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output, as onnxruntime's ``NodeArg``.

    ``type`` is onnxruntime's string: ``'tensor(float)'``, ``'seq(tensor(float))'``,
    ``'optional(tensor(int64))'``, ``'map(string,tensor(float))'``... ``shape`` lists
    ints for fixed dims, str for named dims and None for unknown ones, for a tensor or
    an optional tensor (None: no shape declared; the session's ``get_inputs`` and
    ``get_outputs`` give ``[]`` there, as onnxruntime does); ``[]`` for a sequence or a
    map, as onnxruntime gives. ``elem_type`` is the ONNX element type of the tensors the value
    is or holds (a map: of its values).
    """

    name: str
    shape: list[int | str | None] | None
    type: str
    elem_type: int

    @classmethod
    def of(cls, value_info: onnx.ValueInfoProto) -> NodeArg:
        """Raises ``TypeError`` for an element type that ONNX does not define."""
        t = value_info.type
        inner = t.optional_type.elem_type if t.WhichOneof("value") == "optional_type" else t
        shape = [] if inner.WhichOneof("value") not in (None, "tensor_type") else None
        if shape is None and inner.tensor_type.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in inner.tensor_type.shape.dim
            ]
        elem = _held_tensor(t).elem_type
        return cls(value_info.name, shape, _type_text(t, value_info.name), elem)

    def __hash__(self) -> int:  # its shape's list hashed as a tuple
        shape = None if self.shape is None else tuple(self.shape)
        return hash((self.name, shape, self.type, self.elem_type))


def _held_tensor(t: onnx.TypeProto):
    """The tensor type that ``t`` is or holds (a map: its values')."""
    while True:
        kind = t.WhichOneof("value")
        if kind == "sequence_type":
            t = t.sequence_type.elem_type
        elif kind == "optional_type":
            t = t.optional_type.elem_type
        elif kind == "map_type":
            t = t.map_type.value_type
        elif kind == "sparse_tensor_type":
            return t.sparse_tensor_type
        else:
            return t.tensor_type


def _element_name(elem: int, name: str) -> str:
    if elem not in onnx.TensorProto.DataType.values():
        raise RecurrentTypeError(f"tensor {name!r} is declared of an unknown element type {elem}")
    return onnx.TensorProto.DataType.Name(elem).lower()


def _type_text(t: onnx.TypeProto, name: str) -> str:
    """onnxruntime's name for the type ``t`` of the value ``name``.

    Raises
    ------
    TypeError
        An element type that ONNX does not define.
    """
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return f"seq({_type_text(t.sequence_type.elem_type, name)})"
    if kind == "optional_type":
        return f"optional({_type_text(t.optional_type.elem_type, name)})"
    if kind == "map_type":
        key = _element_name(t.map_type.key_type, name)
        return f"map({key},{_type_text(t.map_type.value_type, name)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({_element_name(t.sparse_tensor_type.elem_type, name)})"
    return f"tensor({_element_name(t.tensor_type.elem_type, name)})"


def load_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """The model given as a path, serialised bytes or a ``ModelProto`` (as is).

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A directory, a device, a file past 2 GiB (protobuf's limit), an empty file or
        bytes, or data that is not an ONNX model
        (protobuf cannot parse it, it has no graph, or it is an ORT-format model:
        onnxruntime's flatbuffer), or external data (tensors kept
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
                data = _model_bytes(f, name)
        except OSError as e:  # named, whether open or read failed
            raise type(e)(e.errno, e.strerror, name) from None
        loaded = _parse(data, repr(name))
        try:  # tensors kept in files beside the model (none: nothing to do)
            load_external_data_for_model(loaded, os.path.dirname(os.path.abspath(name)))
        except Exception as e:  # onnx's errors for a missing or misplaced file
            raise RecurrentError(
                f"model {name!r}: its external data cannot be read ({one_line(e, typed=False)})"
            ) from None
        return loaded
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


#: the most an ONNX model file holds (protobuf's limit: larger weights go in external
#: data beside it)
MODEL_FILE_LIMIT = onnx.checker.MAXIMUM_PROTOBUF


def _model_bytes(f: Any, name: str) -> bytes:
    """The bytes of the open model file ``f``: a regular file or a pipe of at most
    :data:`MODEL_FILE_LIMIT` bytes; a device (``/dev/zero`` was read until memory ran
    out) or a larger file refused, naming it (``ValueError``)."""
    status = os.fstat(f.fileno())
    if not (stat.S_ISREG(status.st_mode) or stat.S_ISFIFO(status.st_mode)):
        raise RecurrentError(f"model {name!r} is not a file (a device), not an ONNX model")
    if status.st_size > MODEL_FILE_LIMIT:
        raise RecurrentError(_too_large(name))
    data = f.read(MODEL_FILE_LIMIT + 1)
    if len(data) > MODEL_FILE_LIMIT:  # a pipe that goes on
        raise RecurrentError(_too_large(name))
    return data


def _too_large(name: str) -> str:
    return (
        f"model {name!r} holds more than {MODEL_FILE_LIMIT} bytes, more than an ONNX model "
        "file can (protobuf's limit: larger weights go in external data beside it)"
    )


#: the file identifier of onnxruntime's ORT-format models (bytes 4-8 of a flatbuffer)
ORT_FORMAT_ID = b"ORTM"


def _parse(data: bytes, name: str) -> onnx.ModelProto:
    if not data:
        raise _no_graph(f"model {name} is empty (0 bytes), not an ONNX model")
    if data[4:8] == ORT_FORMAT_ID:
        raise RecurrentError(
            f"model {name} is in onnxruntime's ORT format (a flatbuffer, as "
            "optimized_model_filepath='*.ort' writes), not an ONNX model: onnx-recurrent "
            "reads ONNX models only; give the .onnx model it was made from"
        )
    try:
        model = onnx.load_from_string(data)
    except TimeoutError:  # a timer's handler raised here: the caller's, not the model's
        raise
    except Exception as e:  # protobuf's DecodeError, and what else its versions raise
        why = one_line(e, typed=False)
        raise RecurrentError(f"model {name} is not an ONNX model ({why})") from None
    if not model.HasField("graph"):
        raise _no_graph(f"model {name} is not an ONNX model (it has no graph)")
    return model


def check_feed_names(
    feeds: Mapping[str, Any],
    names: list[str],
    optional: Collection[str] = (),
    accepted: Collection[str] = (),
    hint: Callable[[list[str]], str] | None = None,
    note: str = "",
) -> None:
    """Refuse ``feeds`` naming an input not in ``names`` (nor in ``accepted``: the
    initializers a feed may replace), or missing one of ``names`` (those in
    ``optional`` aside). The messages list ``names`` (and ``note``); ``hint`` adds to
    the first what it says of the unknown names.

    Raises
    ------
    onnx_recurrent.errors.RecurrentError
        (a ``ValueError``) naming the unknown or missing inputs.
    """
    unknown = sorted(set(feeds) - set(names) - set(accepted))
    if unknown:
        raise RecurrentError(
            f"unknown input name(s) {unknown}; the model's inputs are {names}{note}"
            + (hint(unknown) if hint is not None else "")
        )
    missing = [n for n in names if n not in feeds and n not in optional]
    if missing:
        raise RecurrentError(f"missing input(s) {missing}; the model's inputs are {names}{note}")


def _check_providers_type(providers: Any) -> None:
    if isinstance(providers, (str, bytes)):  # onnxruntime takes each letter for one
        raise RecurrentTypeError(
            f"providers must be a list of execution providers, got the string "
            f"{providers!r} (write [{providers!r}])"
        )
    if providers is not None and not isinstance(providers, Iterable):
        # onnxruntime's TypeError, which host="auto" took for a refusal of the model
        raise RecurrentTypeError(
            "providers must be a list of execution providers or None, got "
            f"{type(providers).__name__} {providers!r}"
        )


def _no_graph(message: str) -> RecurrentError:
    """onnxruntime's "No graph was found in the protobuf" (``InvalidArgument``)."""
    error = RecurrentError(message)
    error.onnxruntime_type = "InvalidArgument"  # type: ignore[attr-defined]
    return error


# -- what a feed must be: a tensor, or a sequence, optional or map of them -------------


@dataclass(frozen=True)
class _Tensor:
    """A tensor feed (or one held in a sequence, optional or map): its element type
    (``type`` as onnxruntime names it, ``dtype`` as an array's), its declared
    ``shape`` and, where declared, its fixed dims as ``(axis, size)`` pairs."""

    type: str
    dtype: np.dtype
    shape: list[int | str | None] | None
    fixed: list[tuple[int, int]] | None


@dataclass(frozen=True)
class _Sequence:
    """A list (or tuple) of values of ``element``; given on as a list."""

    type: str
    element: _Tensor | _Sequence | _Optional | _Map


@dataclass(frozen=True)
class _Optional:
    """None, or a value of ``element``."""

    type: str
    element: _Tensor | _Sequence | _Optional | _Map


@dataclass(frozen=True)
class _Map:
    """A dict of ``key`` (``str`` or ``int``) to scalars of ``value``'s element type,
    given on as is (onnxruntime reads Python scalars)."""

    type: str
    key: type
    value: _Tensor


_Feed = _Tensor | _Sequence | _Optional | _Map


def _feed(t: onnx.TypeProto, name: str, outer: str) -> _Feed:
    """What a feed of type ``t`` for the input ``name`` must be (``outer``: the
    input's whole type, for the messages).

    Raises
    ------
    TypeError
        A sparse tensor (onnxruntime's ``run`` takes none), an element type that ONNX
        does not define or that no array can have.
    """
    kind = t.WhichOneof("value")
    text = _type_text(t, name)
    if kind == "sequence_type":
        return _Sequence(text, _feed(t.sequence_type.elem_type, name, outer))
    if kind == "optional_type":
        return _Optional(text, _feed(t.optional_type.elem_type, name, outer))
    if kind == "map_type":
        value = _feed(t.map_type.value_type, name, outer)
        if not isinstance(value, _Tensor):
            raise RecurrentTypeError(
                f"input {name!r} is a {outer}: InferenceSession feeds maps of tensors only"
            )
        key = str if t.map_type.key_type == onnx.TensorProto.STRING else int
        return _Map(text, key, value)
    if kind == "sparse_tensor_type":
        raise RecurrentTypeError(
            f"input {name!r} is a {text}: InferenceSession feeds tensors, sequences, "
            "optionals and maps (onnxruntime's run takes no sparse tensor)"
        )
    t = t.tensor_type
    try:
        dtype = np.dtype(tensor_dtype_to_np_dtype(t.elem_type))
    except KeyError:
        inside = f" ({outer})" if outer != text else ""
        raise RecurrentTypeError(
            f"input {name!r}{inside} has element type {text}, which no array can have"
        ) from None
    shape = None
    if t.HasField("shape"):
        shape = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
        ]
    fixed = None  # a declared scalar, shape [], checks nothing: as onnxruntime (Silero's
    if shape:  # sr is fed as [16000]); a dim of 0 is fixed, as there
        fixed = [(axis, d) for axis, d in enumerate(shape) if isinstance(d, int) and d >= 0]
    return _Tensor(text, dtype, shape, fixed)


def _input(value_info: onnx.ValueInfoProto) -> tuple[NodeArg, _Feed]:
    """A graph input a caller feeds, and what its feeds must be."""
    name = value_info.name
    if not name:
        raise RecurrentError("a graph input has no name")
    arg = NodeArg.of(value_info)
    return arg, _feed(value_info.type, name, arg.type)


def _check_recurrent_inputs(
    graph: onnx.GraphProto,
    bound: Mapping[tuple[str, ...], BoundNode],
    inputs: Sequence[tuple[NodeArg, _Feed]],
) -> None:
    """No recurrent node of the top level takes a graph input that is no tensor (a
    model onnxruntime refuses as invalid; onnx.reference would hand the node a list).

    Raises
    ------
    TypeError
        The node, its input and the input's type.
    """
    held = {arg.name: arg.type for arg, feed in inputs if type(feed) is not _Tensor}
    if not held:
        return
    top = {node_key(node) for node in graph.node}
    for key, b in bound.items():
        if key not in top:
            continue
        for role in INPUTS[b.op]:
            name = b.node.input(role)
            if name in held:
                raise RecurrentTypeError(
                    f"{b.label}: its {role} is the graph input {name!r}, a {held[name]}, "
                    "not a tensor"
                )


def feed_array(value: Any, dtype: np.dtype, name: str, path: str = "") -> np.ndarray:
    """A tensor fed as a list (or tuple, or another array-like), as onnxruntime takes it:
    in the input's element type where NumPy casts its values so within their kind
    (integers or floats to floats; a float to an integer is refused, not truncated).

    Raises
    ------
    ValueError
        A ragged nested list, or a list's integer outside the element type's range
        (NumPy would wrap it).
    TypeError
        A masked array (its mask would be ignored), or what NumPy cannot read (a torch
        tensor that needs grad...); the message names the input.
    """
    if isinstance(value, np.ma.MaskedArray):
        raise RecurrentTypeError(
            f"input {name!r}{path}: a masked array, whose mask would be ignored: feed an "
            "ndarray (its filled(value))"
        )
    try:
        array = numpy_of(value)
    except ValueError as e:  # a ragged nested list
        raise RecurrentError(f"input {name!r}{path}: not a tensor: {e}") from None
    except (TypeError, RuntimeError) as e:  # a tensor that needs grad...
        raise RecurrentTypeError(
            f"input {name!r}{path}: cannot be read as a tensor ({type(value).__name__}): "
            f"{one_line(e, typed=False)}"
        ) from None
    if (
        isinstance(value, list | tuple)
        and array.dtype != dtype
        and np.can_cast(array.dtype, dtype, "same_kind")
    ):
        if array.dtype.kind in "iu" and dtype.kind in "iu" and array.size:
            info = np.iinfo(dtype)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:  # astype would wrap them
                raise RecurrentError(
                    f"input {name!r}{path}: {low if low < info.min else high} is outside "
                    f"{dtype.name}'s range [{info.min}, {info.max}]"
                )
        return array.astype(dtype)
    return array


def _strings(array: np.ndarray, name: str, path: str) -> np.ndarray:
    """A string tensor's feed of ``str`` (``U``), UTF-8 ``bytes`` (``S``) or raw bytes
    (``V``, each element's bytes) as an object array of ``str``, as onnxruntime takes
    them (their trailing NULs dropped, as NumPy's ``bytes`` elements drop them).

    Raises
    ------
    ValueError
        Bytes that are not UTF-8 text (the message names the input).
    """
    if array.dtype.kind == "V":
        array = array.view(f"S{array.dtype.itemsize}") if array.dtype.itemsize else array
    if array.dtype.kind == "S":
        try:
            array = np.char.decode(array, "utf-8")
        except UnicodeDecodeError as e:
            raise RecurrentError(
                f"input {name!r}{path}: a string tensor's bytes must be UTF-8 text ({e})"
            ) from None
    return array.astype(object)


def _checked(spec: _Feed, value: Any, name: str, path: str = "") -> Any:
    """``value``, fed for the input ``name`` (``path``: where inside it, e.g.
    ``" element 2"``), as the host takes it: arrays for tensors, lists for sequences.

    Raises
    ------
    ValueError
        A tensor of the wrong rank or fixed dims.
    TypeError
        A tensor of the wrong element type; a sequence that is not a list (or tuple),
        a map that is not a dict, keys or values of the wrong kind. The message names
        the input and the element, key or value that failed.
    """
    if type(spec) is _Tensor:
        if value is None:
            raise RecurrentTypeError(f"input {name!r}{path}: a tensor is required, got None")
        array = value if type(value) is np.ndarray else feed_array(value, spec.dtype, name, path)
        array = native_order(array)
        if array.dtype.kind in "USV" and spec.dtype == object:  # str, as onnxruntime takes it
            array = _strings(array, name, path)
        if array.dtype != spec.dtype:
            raise RecurrentTypeError(
                f"input {name!r}{path}: expected element type {spec.type} ({spec.dtype}), "
                f"got {array.dtype}"
            )
        shape = spec.shape
        if spec.fixed is not None:
            if array.ndim != len(shape):
                raise RecurrentError(
                    f"input {name!r}{path}: expected rank {len(shape)} (shape {shape}), "
                    f"got shape {list(array.shape)}"
                )
            for axis, want in spec.fixed:
                if array.shape[axis] != want:
                    raise RecurrentError(
                        f"input {name!r}{path}: expected shape {shape}, "
                        f"got {list(array.shape)} (axis {axis})"
                    )
        return array
    if type(spec) is _Optional:
        return None if value is None else _checked(spec.element, value, name, path)
    if type(spec) is _Sequence:
        if not isinstance(value, list | tuple):
            raise RecurrentTypeError(
                f"input {name!r}{path}: expected a list for {spec.type}, "
                f"got {type(value).__name__}"
            )
        sep = "," if path else ""
        return [
            _checked(spec.element, v, name, f"{path}{sep} element {i}")
            for i, v in enumerate(value)
        ]
    if not isinstance(value, Mapping):  # a map
        raise RecurrentTypeError(
            f"input {name!r}{path}: expected a dict for {spec.type}, got {type(value).__name__}"
        )
    strings = spec.value.dtype == object
    for k, v in value.items():
        if not (isinstance(k, str) if spec.key is str else _is_int(k)):
            raise RecurrentTypeError(
                f"input {name!r}{path} key {k!r}: expected {spec.key.__name__} keys for "
                f"{spec.type}, got {type(k).__name__}"
            )
        if not (isinstance(v, str) if strings else _is_number(v)):
            what = "a str" if strings else "a number"
            raise RecurrentTypeError(
                f"input {name!r}{path} value at key {k!r}: expected {what} for {spec.type}, "
                f"got {type(v).__name__}"
            )
    return value


def _is_int(key: Any) -> bool:
    return isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_)


def _is_number(value: Any) -> bool:
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"


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


def _inferred_outputs(model: onnx.ModelProto, declared: list[NodeArg]) -> list[NodeArg]:
    """``declared``, each tensor's shape as onnx's shape inference merges it into the
    graph's outputs (as onnxruntime's ``get_outputs`` reports them); the declared ones
    where inference fails (a model over 2 GiB, a domain onnx does not know...)."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # onnx's own errors: inference is only a better guess here
        return list(declared)
    inferred = {v.name: NodeArg.of(v) for v in graph.output}
    named = {  # the model's own dim names (inference invents "unk__0"... for the rest)
        d.dim_param
        for g in all_graphs(model.graph)
        for v in (*g.input, *g.output, *g.value_info)
        for d in v.type.tensor_type.shape.dim
    }
    outputs = []
    for arg in declared:
        better = inferred.get(arg.name)
        if better is not None and better.type == arg.type and better.shape is not None:
            shape = [
                None if isinstance(d, str) and d.startswith("unk__") and d not in named else d
                for d in better.shape
            ]
            arg = NodeArg(arg.name, shape, arg.type, arg.elem_type)
        outputs.append(arg)
    return outputs


def _as_reported(args: list[NodeArg]) -> list[NodeArg]:
    """``args`` as onnxruntime reports them, new objects at each call (a caller's change
    to a shape's list stays there): a tensor of no declared shape as ``[]``."""
    return [NodeArg(a.name, list(a.shape or []), a.type, a.elem_type) for a in args]


#: the keyword arguments of onnxruntime's InferenceSession, passed to the onnxruntime
#: host's session (the reference host ignores them)
ONNXRUNTIME_KEYWORDS = ("disabled_optimizers", "enable_fallback", "read_config_from_model")


#: (our exception class, onnxruntime's) -> the class that is both
_FLAVOURS: dict[tuple[type, type], type] = {}


def _flavoured(error: BaseException, theirs: str | type) -> BaseException:
    """``error``, where onnxruntime is loaded, as an instance of its own class and of
    onnxruntime's exception ``theirs`` (a name in ``onnxruntime_pybind11_state``, such
    as ``"InvalidArgument"``, or the class), so that code written for onnxruntime's
    session (``except InvalidArgument``) catches it as it caught onnxruntime's: the
    message, class name and attributes unchanged; its cause and traceback kept."""
    state = sys.modules.get("onnxruntime.capi.onnxruntime_pybind11_state")
    if isinstance(theirs, str):
        theirs = getattr(state, theirs, None) if state is not None else None
    if not isinstance(theirs, type) or not issubclass(theirs, Exception):
        return error
    if isinstance(error, theirs):
        return error
    ours = type(error)
    both = _FLAVOURS.get((ours, theirs))
    if both is None:
        try:
            body = {"__module__": ours.__module__, "__reduce__": _reduce_flavoured}
            both = type(ours.__name__, (ours, theirs), body)
        except TypeError:  # layouts that cannot be combined
            return error
        both.__qualname__ = ours.__qualname__
        _FLAVOURS[ours, theirs] = both
    args = error.args
    if isinstance(error, OSError) and error.filename is not None:
        args = (error.errno, error.strerror, error.filename)
    flavoured = both.__new__(both, *args)
    flavoured.__dict__.update(getattr(error, "__dict__", {}))
    flavoured.__cause__, flavoured.__suppress_context__ = error.__cause__, True
    return flavoured.with_traceback(error.__traceback__)


def _reduce_flavoured(error: BaseException) -> tuple:
    """Pickle's reduction of :func:`_flavoured`'s error (its class is made at run time,
    which pickle cannot find by name: a worker process's error was a PicklingError):
    made again from its own class and onnxruntime's, its arguments and attributes."""
    ours, theirs = type(error).__bases__
    _, args, *state = BaseException.__reduce__(error)
    if isinstance(error, OSError):
        _, args, *state = OSError.__reduce__(error)
    return (_flavoured_again, (ours, theirs, args), *state)


def _flavoured_again(ours: type, theirs: type, args: tuple) -> BaseException:
    return _flavoured(ours(*args), theirs)


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

    def __hash__(self) -> int:  # its map hashed as its items
        fields = [getattr(self, f) for f in self.__dataclass_fields__]
        return hash((*fields[:-1], tuple(sorted(self.custom_metadata_map.items()))))


class InferenceSession:
    """Run an ONNX model with onnx-recurrent's recurrent operators: a drop-in for
    ``onnxruntime.InferenceSession``.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        A path to a ``.onnx`` file, its serialised bytes, or a loaded model (also
        taken as ``path_or_bytes=``, onnxruntime's name for it).
    sess_options : onnxruntime.SessionOptions, optional
        For the onnxruntime host (ignored by the reference host). They are read, never
        changed, so one object may serve several sessions, ours and onnxruntime's: the
        host makes its own ``SessionOptions`` with onnxruntime-extensions' library
        registered, the graph run sequentially, and your settings copied in, all
        those onnxruntime lets one read (``intra_op_num_threads``,
        ``inter_op_num_threads``, ``graph_optimization_level``,
        ``log_severity_level``... and the configuration entries listed in
        :data:`~onnx_recurrent.runtime.hosts.session_options.SESSION_CONFIG_KEYS`).
        ``optimized_model_filepath``: the host writes the model there as loaded,
        recurrent nodes and all, not optimized (onnxruntime would write its custom
        nodes, which only this process can run). What onnxruntime gives no way to read
        is not carried over: initializers,
        free-dimension overrides and custom-op libraries added to them; options that
        hold execution providers (``add_provider``) are refused (pass ``providers``).
        Without them, the host's options keep onnxruntime's idle threads from
        spinning long (:data:`~onnx_recurrent.runtime.hosts.onnxruntime.SESSION_CONFIG`);
        with your own, set ``session.intra_op.spin_duration_us`` yourself if a
        recurrent node runs on several threads. Where ``intra_op_num_threads`` is
        left 0 (or no options are given) and a cgroup CPU quota allows fewer CPUs
        than the process may run on, onnxruntime's intra-op threads are the quota's
        (:func:`onnx_recurrent.quota.cpus`), as onnx-recurrent's own.
    providers : list, optional
        onnxruntime's execution providers (default ``["CPUExecutionProvider"]``):
        names, or ``(name, options)`` pairs, as onnxruntime takes them.
    provider_options : list of dict, optional
        One dict of options per provider in ``providers``, as onnxruntime's
        ``provider_options`` (onnxruntime host; ignored by the reference host).
    host : {"auto", "onnxruntime", "reference"}
        Who runs the graph. ``"onnxruntime"``: onnxruntime, with every GRU, RNN and
        LSTM node (``If``, ``Loop`` and ``Scan`` bodies included) computed by
        onnx-recurrent as a custom node (needs onnxruntime and
        onnxruntime-extensions). ``"reference"``: onnx.reference, slow but needing
        neither. ``"auto"``: onnxruntime where it can, else reference, with one
        :class:`RuntimeWarning` saying why. :attr:`host` tells which runs.
    disabled_optimizers, enable_fallback, read_config_from_model : optional
        onnxruntime's keyword arguments, passed to its session under the onnxruntime
        host (ignored by the reference host).

    Raises
    ------
    FileNotFoundError
        ``model`` is a path that does not exist.
    TypeError
        ``model`` is none of the accepted types, or missing; a keyword argument neither
        ``host`` nor onnxruntime's; a graph input that is a sparse tensor
        (onnxruntime's ``run`` takes none), or holds tensors of an element type no
        array has; ``sess_options`` not an
        ``onnxruntime.SessionOptions`` (where the onnxruntime host is tried);
        ``providers`` a string (onnxruntime takes each letter for a provider).
    ValueError
        An unknown ``host``; ``ONNX_RECURRENT_NUM_THREADS`` or
        ``ONNX_RECURRENT_BACKEND`` set to what they do not take; a model that cannot
        be read (corrupt, not UTF-8 names, an
        unnamed graph input or output, an initializer whose data do not fit its dims);
        a model holding the onnxruntime host's own custom nodes
        (``OnnxRecurrentFloat`` and the like, which only the process that made them
        can run: load the original model); a model that imports no opset, or none of
        the default domain (``''`` or
        ``'ai.onnx'``) while nodes of that domain are in it; a recurrent node with a
        bad attribute, constant weights that disagree, or of an opset whose version of
        its operator onnx-recurrent does not implement (the message names the node:
        ``GRU node 'gru1': the model imports opset 30, ...``); under the reference host,
        a model that ``onnx.checker.check_model`` refuses, where onnxruntime would
        refuse it too (the checker's message).
    RuntimeError
        ``host="onnxruntime"`` where onnxruntime or onnxruntime-extensions is missing,
        ``sess_options`` hold execution providers, or onnxruntime refuses the model
        (the message says which).

    Notes
    -----
    ``run`` may be called from several threads at once, as with onnxruntime.

    The recurrent nodes' weights that are initializers, or computed from initializers
    only, are checked and prepared once, here; a call passes only X, the lengths and
    the states.

    Every kind of graph input and output that onnxruntime's ``run`` takes: tensors
    (arrays), sequences (lists of arrays), optionals (None, or the value; an optional
    input may be left out) and maps (dicts of Python scalars, where the operators take
    them: ``ai.onnx.ml``'s). The feeds are checked under both hosts, the tensors inside
    a sequence, optional or map included, and an error names the element that failed:
    ``input 'seq' element 2: expected element type tensor(float) (float32), got int64``.

    An initializer that the graph also lists as an input is onnxruntime's *overridable
    initializer* (IR version 4 and later): :meth:`get_inputs` leaves it out,
    :meth:`get_overridable_initializers` lists it, and ``run`` takes a feed of its name,
    which replaces its value for that call (a recurrent node's W, R, B or P among them:
    such a node reads its weights on every call, never a layer prepared from the
    initializer).

    Where onnxruntime is loaded, each error raised here or by :meth:`run` is also an
    instance of onnxruntime's exception class for that failure (from
    ``onnxruntime.capi.onnxruntime_pybind11_state``), as code written for its session
    catches them: ``NoSuchFile`` for a missing file, ``InvalidProtobuf`` for one that
    is not a model, onnxruntime's own class where it refuses the model, ``Fail`` for
    the rest of a session's creation; ``InvalidArgument`` for a bad call of ``run``
    or a recurrent node's error. The message and the class named above are unchanged.

    A session cannot be pickled (nor deep-copied), as onnxruntime's cannot: it holds
    onnxruntime's native session and layers compiled in this process. Make one in
    each process from the model, whose path or bytes pickle
    (:func:`onnx_recurrent.dask.run` does so on each worker); pickling raises
    ``TypeError``. ``copy.copy`` gives a second object over the same session, as
    onnxruntime's does.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto | None = None,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict] | None = None,
        *,
        host: str = "auto",
        _zero_size_states: bool = False,
        **kwargs: Any,
    ) -> None:
        if "path_or_bytes" in kwargs:  # onnxruntime's name for the first argument
            if model is not None:
                raise TypeError("InferenceSession got the model twice (model, path_or_bytes)")
            model = kwargs.pop("path_or_bytes")
        if model is None:
            raise TypeError("InferenceSession needs a model (a path, bytes or ModelProto)")
        unknown = sorted(set(kwargs) - set(ONNXRUNTIME_KEYWORDS))
        if unknown:
            raise TypeError(
                f"InferenceSession got unexpected keyword argument(s) {unknown}; besides "
                f"host, it takes onnxruntime's {list(ONNXRUNTIME_KEYWORDS)}"
            )
        #: onnxruntime's keywords, for the onnxruntime host's session
        self._session_kwargs = kwargs
        loading = False  # which of onnxruntime's exceptions a failure is
        try:
            if host not in HOSTS:
                raise RecurrentError(f"host must be one of {list(HOSTS)}, got {host!r}")
            # the variables the nodes read, here under either host: a bad one failed
            # inside onnxruntime, where "auto" took it for a refusal and fell back
            threads.num_threads()
            backends.environment_name()
            if isinstance(model, str | os.PathLike):  # before the model is read
                check_written_paths(sess_options, model)
            loading = True
            loaded = load_model(model)
            loading = False
            self._create(
                loaded, sess_options, providers, provider_options, host, _zero_size_states
            )
        except OSError as e:  # the model's file, or the optimized model's (its own)
            theirs = getattr(e, "onnxruntime_type", None)
            if theirs is None and not isinstance(e, FileNotFoundError):
                raise
            raise _flavoured(e, theirs or "NoSuchFile")  # noqa: B904 (its own cause kept)
        except (RecurrentError, RecurrentTypeError) as e:
            theirs = getattr(e, "onnxruntime_type", None)
            theirs = theirs or ("InvalidProtobuf" if loading else "Fail")
            raise _flavoured(e, theirs)  # noqa: B904
        except RuntimeError as e:
            raise _flavoured(e, getattr(e, "onnxruntime_type", None) or "Fail")  # noqa: B904

    def _create(
        self, model, sess_options, providers, provider_options, host, _zero_size_states
    ) -> None:
        """The session of the loaded ``model`` (the constructor's arguments)."""
        self._choice = host
        self._sess_options = sess_options
        self._model = model
        _check_text(self._model)
        check_opset_imports(self._model)
        check_no_custom_nodes(self._model)
        graph = self._model.graph
        initializers = {i.name for i in graph.initializer}
        inputs = [_input(v) for v in graph.input if v.name not in initializers]
        self._inputs = [arg for arg, _ in inputs]
        # per input, checked on every run: what its feeds must be
        self._feed_checks = {arg.name: feed for arg, feed in inputs}
        overridable = set(overridable_initializers(self._model))
        replaceable = [_input(v) for v in graph.input if v.name in overridable]
        self._overridable = [arg for arg, _ in replaceable]
        #: the initializers a feed may replace, and what such a feed must be
        self._override_checks = {arg.name: feed for arg, feed in replaceable}
        #: optional inputs, which a caller may leave out (fed None)
        self._optional = [arg.name for arg, feed in inputs if type(feed) is _Optional]
        self._outputs = [NodeArg.of(v) for v in graph.output]
        self._inferred_outputs: list[NodeArg] | None = None  # get_outputs' shapes
        self._output_names = [o.name for o in self._outputs]
        for i, v in enumerate(graph.output):
            if not v.name:
                raise RecurrentError(f"graph output {i} has no name")
        #: the model as bound and hosted (:func:`~.graph.hosted`)
        self._hosted = hosted(self._model)
        self._bound = bind(self._hosted, zero_size_states=_zero_size_states)
        _check_recurrent_inputs(self._hosted.graph, self._bound, inputs)
        self._make_host(providers, provider_options, stacklevel=4)  # the caller of __init__

    def _make_host(self, providers: Any, provider_options: Any, stacklevel: int = 3) -> None:
        _check_providers_type(providers)
        self._host, why = make_host(
            self._choice,
            self._hosted,
            self._bound,
            self._sess_options,
            providers,
            provider_options,
            self._session_kwargs,
        )
        #: why the reference host runs the model where "auto" chose it ('' otherwise)
        self._why = why
        if why:
            warnings.warn(
                f"onnx-recurrent: the reference host runs this model ({why})",
                RuntimeWarning,
                stacklevel=stacklevel,
            )

    def __reduce__(self):
        raise TypeError(_not_picklable(type(self)))

    def __copy__(self) -> InferenceSession:
        """A second Python object over the same host and layers, as ``copy.copy`` of
        onnxruntime's session shares its native session."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

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
        """The graph inputs a caller feeds (initializers excluded), in graph order (a
        tensor of no declared shape with ``shape`` ``[]``, as onnxruntime gives)."""
        return _as_reported(self._inputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """The initializers that are also graph inputs, in graph order, as onnxruntime's
        ``get_overridable_initializers``: a feed of one of these names replaces the
        initializer's value for that run, under either host; left out, the initializer
        is used. None before IR version 4, where onnxruntime takes every initializer as
        a constant."""
        return _as_reported(self._overridable)

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in graph order, with their shapes as onnxruntime reports
        them: the declared shape merged with what onnx's shape inference finds (a dim
        known there replaces a named or unknown one; no shape declared: the inferred
        one; a dim it cannot tell: None, and no shape at all: ``[]``), computed on the
        first call."""
        if self._inferred_outputs is None:
            self._inferred_outputs = _inferred_outputs(self._model, self._outputs)
        return _as_reported(self._inferred_outputs)

    def get_providers(self) -> list[str]:
        """onnxruntime's execution providers; ``["CPUExecutionProvider"]`` under the
        reference host."""
        return self._host.providers()

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, descriptions, version and custom
        metadata."""
        return ModelMetadata.of(self._model)

    def get_session_options(self) -> Any:
        """The ``onnxruntime.SessionOptions`` the session runs with, as onnxruntime's:
        under the onnxruntime host, its session's (the caller's settings copied onto
        the host's own: see ``sess_options`` above); under the reference host, the
        ``sess_options`` given (None if none), which it does not read."""
        if self._host.name == "onnxruntime":
            return self._host.session_options()
        return self._sess_options

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each execution provider's options, as onnxruntime's (e.g.
        ``{"CPUExecutionProvider": {}}``; that under the reference host)."""
        if self._host.name == "onnxruntime":
            return self._host.provider_options()
        return {"CPUExecutionProvider": {}}

    def set_providers(
        self,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict] | None = None,
    ) -> None:
        """Make the session's host anew with these execution providers, as
        onnxruntime's ``set_providers`` (which re-creates its session): the same
        ``sess_options`` and host choice; the recurrent nodes keep their prepared
        weights. ``providers=None``: ``["CPUExecutionProvider"]``.

        Raises
        ------
        RuntimeError, TypeError, ValueError
            As the constructor, for the host (``host="onnxruntime"`` where onnxruntime
            refuses these providers...); under the onnxruntime host also a provider
            not available here or ``provider_options`` of another length, as
            onnxruntime's ``set_providers`` (which, unlike its constructor, does not
            fall back); so under the reference host too, where onnxruntime is
            installed. The session is then unchanged.
        """
        _check_providers_type(providers)
        if providers is not None and importlib.util.find_spec("onnxruntime") is not None:
            from .hosts.onnxruntime import OnnxruntimeHost

            OnnxruntimeHost.check_providers(providers, provider_options)
        self._make_host(providers, provider_options)

    def end_profiling(self) -> str:
        """End onnxruntime's profiling (``sess_options.enable_profiling``) and return the
        file it wrote, as onnxruntime's; ``""`` where none was written (profiling off,
        or the reference host, which does not profile). The recurrent nodes appear in
        it as ``ai.onnx.contrib`` custom nodes."""
        if self._host.name == "onnxruntime":
            return self._host.end_profiling()
        return ""

    def get_profiling_start_time_ns(self) -> int:
        """When onnxruntime's profiling started, in nanoseconds (``time.monotonic_ns``'s
        clock), as onnxruntime's; 0 under the reference host, which does not profile."""
        if self._host.name == "onnxruntime":
            return self._host.profiling_start_time_ns()
        return 0

    def _theirs(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """onnxruntime's session method ``name`` on the host's session."""
        return getattr(self._onnxruntime_host(name).session, name)(*args, **kwargs)

    def get_input_memory_infos(self) -> Any:
        """onnxruntime's ``get_input_memory_infos`` (its session's; onnxruntime host)."""
        return self._theirs("get_input_memory_infos")

    def get_output_memory_infos(self) -> Any:
        """onnxruntime's ``get_output_memory_infos`` (its session's; onnxruntime host)."""
        return self._theirs("get_output_memory_infos")

    def get_input_epdevices(self) -> Any:
        """onnxruntime's ``get_input_epdevices`` (its session's; onnxruntime host)."""
        return self._theirs("get_input_epdevices")

    def get_provider_graph_assignment_info(self) -> Any:
        """onnxruntime's ``get_provider_graph_assignment_info`` (onnxruntime host; the
        recurrent nodes show as ``ai.onnx.contrib`` custom nodes)."""
        return self._theirs("get_provider_graph_assignment_info")

    def get_tuning_results(self) -> Any:
        """onnxruntime's ``get_tuning_results`` (its session's; onnxruntime host)."""
        return self._theirs("get_tuning_results")

    def set_tuning_results(self, results: Any, *, error_on_invalid: bool = False) -> None:
        """onnxruntime's ``set_tuning_results`` (its session's; onnxruntime host)."""
        self._theirs("set_tuning_results", results, error_on_invalid=error_on_invalid)

    def set_ep_dynamic_options(self, options: dict[str, str]) -> None:
        """onnxruntime's ``set_ep_dynamic_options`` (its session's; onnxruntime host)."""
        self._theirs("set_ep_dynamic_options", options)

    def release_captured_graph(self, graph_annotation_id: int = 0) -> None:
        """onnxruntime's ``release_captured_graph`` (its session's; onnxruntime host)."""
        self._theirs("release_captured_graph", graph_annotation_id)

    def disable_fallback(self) -> None:
        """onnxruntime's ``disable_fallback`` (its session's; onnxruntime host)."""
        self._theirs("disable_fallback")

    def enable_fallback(self) -> None:
        """onnxruntime's ``enable_fallback`` (its session's; onnxruntime host)."""
        self._theirs("enable_fallback")

    def _onnxruntime_host(self, what: str) -> Any:
        """The onnxruntime host, or a ``RuntimeError`` saying why ``what`` needs it."""
        if self._host.name != "onnxruntime":
            why = self._why or "host='reference' was asked for"
            raise RuntimeError(
                f"{what} needs the onnxruntime host, and the reference host runs this "
                f"session ({why}); use run() with arrays"
            )
        return self._host

    def io_binding(self) -> Any:
        """An ``onnxruntime.IOBinding`` of this session, for :meth:`run_with_iobinding`:
        inputs bound from arrays or ``OrtValue`` s, outputs into onnxruntime's or your
        buffers, as with onnxruntime (CPU memory; the recurrent nodes read and write
        it in place).

        Raises
        ------
        RuntimeError
            The reference host runs this session (the message says why).
        """
        return self._onnxruntime_host("io_binding").io_binding()

    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
        """Run the model on the inputs and into the outputs bound on ``iobinding``, as
        onnxruntime's (read the outputs with ``iobinding.copy_outputs_to_cpu()`` or
        ``get_outputs()``). onnxruntime checks the bound inputs (its own errors); a
        recurrent node's error and Ctrl-C are raised as by :meth:`run`.

        Raises
        ------
        TypeError
            ``iobinding`` is not an ``IOBinding``.
        ValueError
            ``iobinding`` was made by another session; a recurrent node's error (also a
            RuntimeError, as onnxruntime raises a node's).
        RuntimeError
            The reference host runs this session; onnxruntime refuses the bound values.
        KeyboardInterrupt
            Ctrl-C during the call; the session stays usable.
        """
        host = self._onnxruntime_host("run_with_iobinding")
        try:
            host.run_with_iobinding(iobinding, run_options)
        except (RecurrentError, RecurrentTypeError) as e:  # a node's: RuntimeError there
            raise _flavoured(e, RuntimeError)  # noqa: B904 (its own cause kept)

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[Any]:
        """Run the model on ``onnxruntime.OrtValue`` s and return ``OrtValue`` s, as
        onnxruntime's (the values stay in onnxruntime's memory between calls).

        Parameters
        ----------
        output_names : list of str or None
            As :meth:`run`.
        input_dict_ort_values : dict of str to onnxruntime.OrtValue
            One value per graph input (an optional one may be left out).
        run_options : onnxruntime.RunOptions, optional

        Returns
        -------
        list of onnxruntime.OrtValue
            One per output asked for.

        Raises
        ------
        TypeError
            A feed that is not an ``OrtValue``; as :meth:`run`, where onnxruntime
            refuses a feed (the same message as for the array it holds).
        ValueError
            A missing or unknown input or output name; as :meth:`run`.
        RuntimeError
            The reference host runs this session (the message says why).
        KeyboardInterrupt
            Ctrl-C during the call; the session stays usable.
        """
        host = self._onnxruntime_host("run_with_ort_values")

        def refused(feeds: dict[str, Any]) -> None:  # onnxruntime's refusal, as run's
            try:
                arrays = {name: value.numpy() for name, value in feeds.items()}
            except Exception:  # not a tensor: onnxruntime's error stands
                return
            self._check_feeds(arrays)

        try:  # onnxruntime's class for a bad call too, as run's (:func:`_flavoured`)
            self._check_names(input_dict_ort_values, "input_dict_ort_values", "OrtValue")
            for name, value in input_dict_ort_values.items():
                if type(value).__name__ != "OrtValue":
                    raise RecurrentTypeError(
                        f"input {name!r}: expected an onnxruntime.OrtValue, got "
                        f"{type(value).__name__} (run() takes arrays)"
                    )
            feeds = dict(input_dict_ort_values)
            return host.run_with_ort_values(
                self._output_list(output_names), feeds, run_options, refused
            )
        except (RecurrentError, RecurrentTypeError) as e:
            raise _flavoured(e, "InvalidArgument")  # noqa: B904 (its own cause kept)

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Any,
        user_data: Any,
        run_options: Any = None,
    ) -> None:
        """Run the model on another thread and hand the outputs to
        ``callback(outputs, user_data, error)``, as onnxruntime's ``run_async``: on
        success ``outputs`` is what :meth:`run` returns and ``error`` is ``""``; on a
        failure, a feed's wrong type, rank or dims included, ``outputs`` is ``[]`` and
        ``error`` the message. The callback runs on that thread; returns at once.

        Raises
        ------
        TypeError, ValueError
            Here, before any thread starts, as onnxruntime's: a missing or unknown
            input name, ``input_feed`` not a dict, ``output_names`` a string;
            ``callback`` not callable. An unknown output name, as a feed's wrong type,
            rank or dims, goes to the callback.
        RuntimeError
            No thread can be started (the process's limit of threads).
        """
        if not callable(callback):
            raise RecurrentTypeError(
                f"callback must be callable(outputs, user_data, error), got "
                f"{type(callback).__name__}"
            )
        try:
            self._check_names(input_feed, "input_feed", "array")
        except (RecurrentError, RecurrentTypeError) as e:
            raise _flavoured(e, "InvalidArgument")  # noqa: B904 (its own cause kept)
        refused = ""
        feeds: dict[str, Any] | None = None
        try:  # the values: checked now, as the caller may change them when this returns
            names = self._output_list(output_names)
            feeds = self._check_feeds(input_feed)
        except RecurrentError as e:
            refused = str(e)
        except RecurrentTypeError as e:
            if not isinstance(output_names, (str, bytes)):
                refused = str(e)
            else:
                raise _flavoured(e, "InvalidArgument")  # noqa: B904

        def work() -> None:
            if feeds is None:
                callback([], user_data, refused)
                return
            try:
                outputs = self.run(names, feeds, run_options)
            except Exception as e:
                callback([], user_data, str(e) or type(e).__name__)
                return
            callback(outputs, user_data, "")

        try:
            threading.Thread(target=work, name="onnx-recurrent run_async").start()
        except RuntimeError as e:  # the process's thread limit (ulimit -u, pids.max)
            raise RuntimeError(
                f"run_async: no thread could be started for the run ({e}); the process "
                "may be at its limit of threads: call run, or end other threads"
            ) from None

    def _check_names(self, feeds: Mapping[str, Any], what: str, kind: str) -> None:
        """Every required input in ``feeds`` and no unknown one."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise RecurrentTypeError(
                f"{what} must be a dict of input name to {kind}, got {type(feeds).__name__}"
            )
        known = self._feed_checks
        if feeds.keys() != known.keys():
            check_feed_names(
                feeds, list(known), self._optional, self._override_checks, self._unknown_hint
            )

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        self._check_names(feeds, "feeds", "array")
        known = self._feed_checks
        overrides = self._override_checks
        checked = {}
        for name, value in feeds.items():
            spec = known[name] if name in known else overrides[name]
            checked[name] = _checked(spec, value, name)
        for name in self._optional:  # left out: empty, as onnxruntime takes it
            if name not in checked:
                checked[name] = None
        return checked

    def _output_list(self, output_names: Sequence[str] | None) -> list[str]:
        """The outputs asked for: all where ``output_names`` is None or empty."""
        names = self._output_names
        if output_names is None:  # None or empty: every output, as onnxruntime's run
            return names
        if isinstance(output_names, (str, bytes)):
            raise RecurrentTypeError(
                f"output_names must be a list of names or None, got the string "
                f"{output_names!r} (write [{output_names!r}])"
            )
        try:
            output_names = list(output_names)  # an iterator too: once, under either host
        except TypeError:
            raise RecurrentTypeError(
                f"output_names must be a list of names or None, got {type(output_names).__name__}"
            ) from None
        if not output_names:
            return names
        unknown = [n for n in output_names if n not in names]
        if unknown:
            raise RecurrentError(
                f"unknown output name(s) {unknown}; the model's outputs are {names}"
            )
        return output_names

    def _unknown_hint(self, unknown: list[str]) -> str:
        """What an error about feeds of unknown names adds: the initializers a feed may
        replace, or why one named may not be."""
        if self._override_checks:
            return f" (and the overridable initializers {list(self._override_checks)})"
        constants = {t.name for t in self._model.graph.initializer} & set(unknown)
        if constants:
            return (
                f"; {sorted(constants)} are initializers, which a feed replaces only where "
                "the graph lists them as inputs too, from IR version 4 (this model: IR "
                f"{self._model.ir_version}), as onnxruntime has it"
            )
        return ""

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[Any]:
        """Run the model.

        Parameters
        ----------
        output_names : list of str or None
            The outputs to return, in this order; None (or an empty list) for all, in
            graph order.
        input_feed : dict of str to ndarray, list, dict or None
            One value per graph input: an array of the declared element type, rank and
            fixed dims for a tensor (or a nested list of numbers, cast to that type
            within their kind, as onnxruntime takes it); a list (or tuple) of such
            arrays for a sequence;
            None or the value for an optional (which may be left out); a dict of
            Python scalars for a map. Also, where wanted, a value for an overridable
            initializer (:meth:`get_overridable_initializers`), checked against its
            graph input's type, which replaces the initializer for this call.
        run_options : onnxruntime.RunOptions, optional
            Passed to onnxruntime under its host; the reference host honours only its
            ``terminate`` flag (the call fails, as onnxruntime's: ``Fail``).

        Returns
        -------
        list
            One value per output: an ndarray for a tensor, a list of them for a
            sequence, None for an empty optional, a dict for a map (as onnxruntime
            returns them).

        Raises
        ------
        ValueError
            A missing or unknown input name (an initializer that is not overridable
            included), a wrong rank or fixed dimension (of an array fed, or held in a
            sequence, optional or map: the message names it), an unknown output name;
            a recurrent node's (``sequence_lens`` out of range...),
            naming the node, the same under both hosts.
        TypeError
            ``output_names`` a string, a feed of the wrong element type, a sequence
            fed other than as a list (or tuple), a map other than as a dict of keys and
            scalars of the declared types.
        KeyboardInterrupt
            Ctrl-C during the call; the session stays usable.
        """
        try:  # onnxruntime's class for a bad call too (:func:`_flavoured`)
            output_names = self._output_list(output_names)
            host = self._host
            refused = None
            if (
                type(input_feed) is dict
                and host.checks_feeds
                # every input fed by name, no initializer: the host runs onnxruntime's C++
                # session, which checks their types and shapes but not that all are there
                and input_feed.keys() == self._feed_checks.keys()
            ):  # the host checks arrays: ours word its refusal (the same errors, less code
                # on a call's path: 1 µs, 40 µs when a call finds the caches cold)
                refused = self._check_feeds
                for value in input_feed.values():
                    if (
                        type(value) is not np.ndarray
                        or not value.dtype.isnative
                        or value.dtype.kind in "SV"  # bytes: onnxruntime reads |S8 past
                    ):  # an element's end ("identity", "test" as "identitytest")
                        refused = None
                        break
            checked = input_feed if refused is not None else self._check_feeds(input_feed)
            if refused is None:
                return host.run(output_names, checked, run_options)
            return host.run(output_names, checked, run_options, refused)
        except (RecurrentError, RecurrentTypeError) as e:
            theirs = getattr(e, "onnxruntime_type", None) or "InvalidArgument"
            raise _flavoured(e, theirs)  # noqa: B904 (its own cause kept)
