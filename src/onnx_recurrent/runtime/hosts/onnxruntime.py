"""The onnxruntime host: onnxruntime runs the graph, onnx-recurrent the recurrent nodes.

Every GRU, RNN and LSTM node (subgraphs included) becomes one native custom node of
domain ``ai.onnx.contrib`` (:mod:`.native`: one operator per element type, compiled
code, no Python per call) with one attribute, the key of its
:class:`~..bound.BoundNode`; weights bound when the session is made are left out of
its inputs. float16 and bfloat16 nodes are typed as such (no Cast nodes).

Faults. A node that fails returns an error status, and ``run`` raises the node's own
exception (kept by :mod:`.native`), unchanged. A Ctrl-C is kept out of onnxruntime's
frames: while ``run`` is in onnxruntime, SIGINT sets the word the compiled loops read
between blocks (:func:`.native.interrupt_watch_start`), the main thread's SIGINT handler
raises only inside a node's Python path and is otherwise remembered, then raised when
onnxruntime returns.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import re
import signal as signal_module
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from threading import get_ident as _get_ident
from time import perf_counter as _clock
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ... import interrupts, threads
from ...errors import RecurrentError, RecurrentTypeError, one_line
from ...threads import interrupts_held
from ..bound import BoundNode, node_key
from ..files import external_data_files, same_file, saving
from ..graph import (
    INPUTS,
    WEIGHTS,
    dead_nodes,
    element_types,
    is_custom_node,
    prune,
    subgraphs,
)
from . import native
from .native import DOMAIN, OP_TYPES
from .session_options import (
    PROVIDERS_HELD,
    check_session_options,
    holds_providers,
    readable_settings,
)

#: calls expected shorter than this run without the SIGINT watch (3 µs a call): a
#: Ctrl-C then waits at most for the call's end
UNGUARDED_SECONDS = 0.02
#: onnxruntime's own variable for its default intra-op threads (1.32 reads it): left to it
ORT_THREADS_ENV = "ORT_INTRA_OP_NUM_THREADS"
#: onnxruntime's session options under this host when the caller gives none, and why
SESSION_CONFIG = {
    # idle pool threads spin 200 µs, not onnxruntime's default (longer), before they
    # block: spinning ones took a core from a recurrent node computed inside run (M
    # forward in a graph: 13.4 ms, against 8.5 ms), while blocking at once made every
    # parallel node wait for a wake-up (Silero, one stream: 0.24 ms against 0.20 ms)
    "session.intra_op.spin_duration_us": "200",
}

# the C module under ``signal``: ``signal.signal`` wraps numbers in enums (11 µs a run);
# private to Python, guarded by tests/test_foreign_names.py
_signal = getattr(signal_module, "_signal", signal_module)
_SIGINT = int(signal_module.SIGINT)
_keys = itertools.count()
_state = native.state
#: onnxruntime's registration and the options' cache: a fork waits for it
_setup_lock = threads.COMPILING
_library: str | None = None


class HostUnavailable(RuntimeError):
    """The onnxruntime host cannot run this model here (the message says why);
    ``onnxruntime_type``: the class of onnxruntime's own exception, where it refused."""

    onnxruntime_type: type | None = None


def ort_session_class() -> type:
    """onnxruntime's own ``InferenceSession`` class, also where a caller has put ours
    in its place (``onnxruntime.InferenceSession = onnx_recurrent.InferenceSession``, a
    drop-in's usual install): the host then made a session of ours, which made
    another, 140 deep (a recursion error, the reference host at the bottom).

    Raises
    ------
    RuntimeError
        onnxruntime's module that defines the class holds ours there too.
    """
    from onnxruntime.capi import onnxruntime_inference_collection as collection

    cls = collection.InferenceSession
    if getattr(cls, "__module__", "").split(".")[0] == __name__.split(".")[0]:  # ours
        raise RuntimeError(
            "onnxruntime.capi.onnxruntime_inference_collection.InferenceSession is "
            "onnx_recurrent's InferenceSession: the onnxruntime host needs onnxruntime's "
            "own class (replace onnxruntime.InferenceSession alone)"
        )
    return cls


def _type_name(elem: int) -> str:
    if elem in TensorProto.DataType.values():
        return TensorProto.DataType.Name(elem).lower()
    return f"unknown type {elem}"


#: what brings the onnxruntime host
INSTALL = "pip install 'onnx-recurrent[onnxruntime]'"


def _setup() -> str:
    """Register the native operators once per process; the library's path."""
    global _library
    # Ctrl-C held off: a registration stopped half-way cannot be done again
    with _setup_lock, interrupts_held():
        if _library is not None:
            return _library
        try:
            import onnxruntime  # noqa: F401
        except Exception as e:  # installed but broken too: its shared library missing...
            if isinstance(e, ModuleNotFoundError) and e.name == "onnxruntime":
                raise HostUnavailable(f"onnxruntime is not installed: {INSTALL}") from None
            raise HostUnavailable(f"onnxruntime failed to import ({one_line(e)})") from None
        try:
            _library = native.register()
        except ImportError as e:  # onnxruntime-extensions: its message says what is missing
            why = one_line(e, typed=False)
            if isinstance(e, ModuleNotFoundError) or e.name == "onnxruntime_extensions":
                why = f"{why}: {INSTALL}"
            raise HostUnavailable(why) from None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        return _library


#: the hosts alive in this process (weakly): their sessions outlive a fork's child
_hosts: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child must not destroy what onnxruntime made before the fork: its
    sessions' thread pools (and its own at ``exit()``) wait forever on condition
    variables whose threads were not forked (onnxruntime 1.32 hangs the child so, with
    or without onnx-recurrent, when the child ends normally; multiprocessing's
    ``os._exit`` skips it). The parent's sessions stay usable in the child and are never
    freed there; ``exit()`` ends before onnxruntime's handlers."""
    for host in list(_hosts):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(host._session))
    _exit_before_onnxruntime_handlers()


def _exit_before_onnxruntime_handlers() -> None:
    """End ``exit()`` with its status before the C exit handlers registered so far
    (onnxruntime's among them): glibc's ``on_exit`` runs the last one registered
    first; Python has finished (its files flushed) when ``exit()`` runs. Where there is
    no ``on_exit`` (not glibc), nothing is done."""
    try:
        libc = ctypes.CDLL(None)
        on_exit, end = libc.on_exit, libc["_exit"]  # POSIX _exit: a C name
    except (OSError, AttributeError):
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # _exit(status) called as on_exit's handler(status, arg): the extra argument unread
    on_exit(ctypes.cast(end, ctypes.c_void_p), None)


def _register(node: BoundNode) -> str:
    key = f"onnx-recurrent-{next(_keys)}"
    native.BOUND[key] = node
    return key


def _forget(keys: Sequence[str]) -> None:
    for key in keys:
        native.BOUND.pop(key, None)


# -- the rewrite ----------------------------------------------------------------------


def rewrite(
    model: onnx.ModelProto,
    bound: Mapping[tuple[str, ...], BoundNode],
    keys: dict,
    threads: int = 0,
    offloaded: dict | None = None,
) -> onnx.ModelProto:
    """A copy of ``model`` whose recurrent nodes are native custom nodes; ``keys``
    receives each bound node's registry key; ``threads``: the session's
    ``intra_op_num_threads`` (0: none set), the most threads a node's call takes;
    ``offloaded`` (where given) receives the initializers moved out of a copy too large
    to serialise (:func:`offload`).

    Raises
    ------
    HostUnavailable
        A node whose element type cannot be told, or is not a float type.
    TypeError
        Weights or states of another element type than X (the message names them).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if offloaded is not None:
        offloaded.update(offload(out))
    dead = dead_nodes(model.graph)  # kept: onnxruntime checks them (and runs them)
    types = element_types(out)  # (a copy fit to serialise: offloaded)
    counter = itertools.count()

    elems = {name: elem for elem, name in OP_TYPES.items()}

    def replace(graph: onnx.GraphProto) -> None:
        nodes: list[onnx.NodeProto] = []
        declared = {v.name: v for v in (*graph.value_info, *graph.output)}
        for node in graph.node:
            for sub in subgraphs(node):
                replace(sub)
            b = bound.get(node_key(node)) if node.domain in ("", "ai.onnx") else None
            if b is None:
                nodes.append(node)
                continue
            custom = _custom_node(b, node, types, keys, counter, threads)
            nodes.append(custom)
            # a custom node's outputs have no inferred shape: their ranks given, as
            # onnxruntime needs them where they leave a Scan body
            # (also a body output declared without a shape)
            for position, name in enumerate(custom.output):
                given = declared.get(name)
                if not name or (given is not None and given.type.tensor_type.HasField("shape")):
                    continue
                rank = 4 if position == 0 else 3
                if given is None:
                    graph.value_info.append(
                        helper.make_tensor_value_info(name, elems[custom.op_type], [None] * rank)
                    )
                elif given.type.HasField("tensor_type"):  # its element type kept: a wrong
                    for _ in range(rank):  # one is the model's fault, for onnxruntime
                        given.type.tensor_type.shape.dim.add()
        del graph.node[:]
        graph.node.extend(nodes)

    replace(out.graph)
    before = list(out.graph.node)
    prune(out.graph, dead)
    left = {tuple(n.output) for n in out.graph.node}
    check_dropped(model, [n for n in before if tuple(n.output) not in left])
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


#: a model whose main graph's initializers take half of protobuf's limit (2 GiB) or
#: more has its large ones handed to onnxruntime beside it (:func:`offload`)
PROTOBUF_LIMIT = onnx.checker.MAXIMUM_PROTOBUF
#: the initializers moved out are this large or more
OFFLOAD_BYTES = 1 << 20
#: the external-data location of an initializer moved out (onnxruntime reads no file)
OFFLOADED = "onnx_recurrent_offloaded"


def offload(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Where ``model``'s main graph's initializers take ``PROTOBUF_LIMIT / 2`` bytes
    or more (exporters put such weights in external data, which onnxruntime maps and
    protobuf cannot serialise inline): its initializers of ``OFFLOAD_BYTES`` or more,
    largest first, until the rest fit, moved out of ``model`` (in place), each left as
    an external-data entry that onnxruntime fills from the array returned for it
    (``SessionOptions.add_external_initializers``). Returns name -> array."""
    sizes = []
    for index, tensor in enumerate(model.graph.initializer):
        try:
            size = tensor.ByteSize()
        except Exception:  # past what protobuf can serialise
            size = PROTOBUF_LIMIT
        sizes.append((size, index))
    total = sum(size for size, _ in sizes)
    arrays: dict[str, np.ndarray] = {}
    for size, index in sorted(sizes, reverse=True):
        if total < PROTOBUF_LIMIT // 2 or size < OFFLOAD_BYTES:
            break
        tensor = model.graph.initializer[index]
        if tensor.data_type == TensorProto.STRING:
            continue
        array = onnx.numpy_helper.to_array(tensor)
        if type(array.dtype).__module__.split(".")[0] != "numpy":  # bfloat16, float8
            continue  # (ml_dtypes): no OrtValue of NumPy's for them
        arrays[tensor.name] = array
        _to_external(tensor, OFFLOADED, 0, array.nbytes)
        total -= size
    return arrays


def check_dropped(model: onnx.ModelProto, dropped: Sequence[onnx.NodeProto]) -> None:
    """The main graph's nodes the rewrite drops (they computed weights now folded into
    a layer) checked as onnxruntime checks a model it loads, by ONNX's type inference
    (strict): onnxruntime never sees them, and would refuse the model for them (a
    ``Reshape`` of an int32 shape, a ``Cast`` to another type than its output's
    declared one). Nodes of other domains, or that read what has no declared type, are
    left unchecked.

    Raises
    ------
    HostUnavailable
        "onnxruntime refuses the model", with ONNX's reason (of onnxruntime's class:
        ``InvalidGraph``, or ``Fail`` for an output against its declared type).
    """
    if not dropped or any(n.domain not in ("", "ai.onnx") for n in dropped):
        return
    graph = model.graph
    made = {o for n in dropped for o in n.output}
    needed = {i for n in dropped for i in n.input if i and i not in made}
    tensors = [t for t in graph.initializer if t.name in needed]
    typed = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
    inputs = [typed[name] for name in needed - {t.name for t in tensors} if name in typed]
    if len(inputs) + len(tensors) < len(needed):
        return
    declared = [typed[name] for name in made if name in typed]
    mini = helper.make_model(
        helper.make_graph(list(dropped), "dropped", inputs, [], tensors, value_info=declared),
        opset_imports=list(model.opset_import),
        ir_version=model.ir_version,
    )
    try:
        onnx.shape_inference.infer_shapes(mini, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        why = one_line(e, typed=False)
        # onnxruntime: an input's type is INVALID_GRAPH; an output's, against the type
        # declared for it, FAIL
        kind = "FAIL" if "existing elem type" in why else "INVALID_GRAPH"
        refusal = HostUnavailable(
            f"onnxruntime refuses the model: {kind}: a node that computes a recurrent "
            f"node's weight: {why}"
        )
        refusal.onnxruntime_type = ort_state.Fail if kind == "FAIL" else ort_state.InvalidGraph
        raise refusal from None


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _graphs(sub)


def _custom_node(b, node, types, keys, counter, threads: int = 0) -> onnx.NodeProto:
    rn = b.node
    elem = types.get(rn.input("X"))
    if elem is None and b.layer is not None:
        elem = helper.np_dtype_to_tensor_dtype(b.layer.dtype)
    if elem is None:  # X from an op ONNX inference does not know: the other T inputs'
        t_inputs = [n for n in INPUTS[rn.op] if n not in ("X", "sequence_lens")]
        elem = next((types[rn.input(n)] for n in t_inputs if rn.input(n) in types), None)
    if elem is None:
        raise HostUnavailable(f"{b.label}: the element type of X cannot be told")
    if elem not in OP_TYPES:
        raise HostUnavailable(
            f"{b.label}: X is {_type_name(elem)}, which a recurrent node cannot take"
        )
    inputs = [
        rn.input(name)
        if name in INPUTS[rn.op] and (name not in WEIGHTS or name in b.dynamic)
        else ""
        for name in native.INPUTS
    ]
    for spec_name, name in zip(native.INPUTS, inputs, strict=True):
        given = types.get(name, elem) if name and spec_name != "sequence_lens" else elem
        if given != elem:  # onnxruntime would refuse the custom node: say what it is
            raise RecurrentTypeError(
                f"{b.label}: {spec_name} must have X's element type {_type_name(elem)}, "
                f"got {_type_name(given)}"
            )
    while inputs and not inputs[-1]:
        inputs.pop()
    key = _register(b)
    keys[key] = b
    tag = f"onnx_recurrent::{next(counter)}"
    return helper.make_node(
        OP_TYPES[elem],
        inputs,
        list(node.output),
        name=node.name or tag,
        domain=DOMAIN,
        key=key,
        threads=str(threads),  # a string: the attribute the kernel reads as text
    )


# -- the host -------------------------------------------------------------------------


def _session_options(sess_options, shared: bool = True):
    """onnxruntime's options for this host: a ``SessionOptions`` of its own, with the
    caller's settings copied in, and onnxruntime-extensions' library registered.

    The caller's ``sess_options`` are only read: a library registered on them once more
    for every session made clashed with itself ("Conflicting with a registered
    kernel"), for this host and for any onnxruntime session made on them after.
    Copied: every attribute onnxruntime lets one read and write
    (``intra_op_num_threads``, ``graph_optimization_level``, ``log_severity_level``...,
    ``execution_mode`` excepted: the graph runs sequentially) and the configuration
    entries set (:func:`.session_options.readable_settings`). ``intra_op_num_threads``
    left 0 (or no options) becomes :func:`_intra_op_num_threads` where that is not 0.
    ``shared``: the options of the same settings made before (else new ones, for a
    session that adds to them).

    Raises
    ------
    HostUnavailable
        ``sess_options`` hold execution providers (``add_provider``, a provider
        selection policy...), which onnxruntime gives no way to read or copy.
    TypeError
        ``sess_options`` is not an ``onnxruntime.SessionOptions``.
    """
    import onnxruntime as ort

    library = _setup()
    check_session_options(sess_options)
    options = ort.SessionOptions()
    if sess_options is None:
        for entry, value in SESSION_CONFIG.items():
            options.add_session_config_entry(entry, value)
        key: tuple = ()
    else:
        key = _copy_options(sess_options, options)
    if not options.intra_op_num_threads:  # 0: onnxruntime's default, left to us
        count = _intra_op_num_threads()
        if count:
            options.intra_op_num_threads = count
            key += (("intra_op_num_threads (CPUs of this process)", str(count)),)
    # a node's Python path runs on the thread that called run (errors are per thread)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not shared:
        options.register_custom_ops_library(library)
        return options
    with _setup_lock:
        known = _options.get(key)
        if known is None:
            # the library registers its domains anew on every SessionOptions it is
            # given and keeps them for the process: once per settings
            options.register_custom_ops_library(library)
            known = _options[key] = options
    return known


def _intra_op_num_threads() -> int:
    """onnxruntime's intra-op threads under this host where the caller sets none.

    onnxruntime sizes its pool from the machine (one thread per physical core, each
    pinned to its core, outside a narrower affinity mask such as ``taskset``'s) and
    ignores a cgroup's CPU quota: in a container with less CPU time than CPUs, its
    threads wait for each other at every parallel step.

    Returns
    -------
    int
        The default threads of onnx-recurrent's own calls (the CPUs the process may
        run on, fewer under a CPU quota) where those are fewer than the machine's
        (:func:`onnx_recurrent.threads.confined_pool_size`); else 0 (onnxruntime's own
        default, unchanged), and 0 where ``ORT_INTRA_OP_NUM_THREADS`` is set
        (onnxruntime sizes its default pool from it).
    """
    if os.environ.get(ORT_THREADS_ENV, "").strip():
        return 0
    return threads.confined_pool_size()


#: the host's SessionOptions by the caller's settings copied (:func:`_copy_options`;
#: ``()``: none given), the library registered on each once
_options: dict[tuple, Any] = {}


def _copy_options(source: Any, target: Any) -> tuple:
    """The caller's settings that onnxruntime lets one read, onto ``target``; what was
    copied, as ``(name, value)`` pairs."""
    if holds_providers(source):
        raise HostUnavailable(
            f"{PROVIDERS_HELD}, which onnx-recurrent cannot copy onto its own "
            "SessionOptions: pass providers=[...] to the session instead"
        )
    copied = []
    attributes, entries = readable_settings(source)
    for name, value in attributes:
        if name != OPTIMIZED_MODEL_FILEPATH:  # written by the host itself (write_model)
            setattr(target, name, value)
            copied.append((name, str(value)))
    for key, value in entries:
        target.add_session_config_entry(key, value)
        copied.append((key, value))
    return tuple(copied)


#: the option whose file onnxruntime would write with the custom nodes in it
OPTIMIZED_MODEL_FILEPATH = "optimized_model_filepath"


#: the session config entries that send an optimized model's initializers to one file
EXTERNAL_FILE_NAME = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_SIZE = "session.optimized_model_external_initializers_min_size_in_bytes"


def _config_entry(sess_options: Any, key: str) -> str:
    """``sess_options``' config entry ``key``; "" where it is not set."""
    try:
        return sess_options.get_session_config_entry(key)
    except Exception:  # not set: onnxruntime raises
        return ""


def _external(model: onnx.ModelProto, path: str, location: str, min_size: int) -> onnx.ModelProto:
    """A copy of ``model`` whose graph initializers of ``min_size`` bytes or more are
    in the file ``location`` beside ``path`` (written anew), one after another, as
    onnxruntime writes them (:data:`EXTERNAL_FILE_NAME`, :data:`EXTERNAL_MIN_SIZE`)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    offset = 0
    data_path = os.path.join(os.path.dirname(os.path.abspath(path)), location)
    with saving(data_path) as f:  # replaced whole: a failure keeps the file there
        for tensor in copy.graph.initializer:
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            if tensor.HasField("raw_data"):
                data = tensor.raw_data
            else:
                data = onnx.numpy_helper.to_array(tensor).tobytes()
            if len(data) < min_size:
                continue
            f.write(data)
            _to_external(tensor, location, offset, len(data))
            offset += len(data)
    return copy


_DATA_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)


def _to_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """``tensor``'s data left out (in place) for an external-data entry: ``length``
    bytes at ``offset`` of the file ``location``."""
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = TensorProto.EXTERNAL


def check_written_paths(sess_options: Any, model: str | os.PathLike) -> None:
    """Refuse a ``sess_options.optimized_model_filepath`` (or the file its external
    initializers go to) that names the model file ``model`` or its external data, by
    any link or spelling: :func:`write_model` would destroy the model it reads
    (onnxruntime does; a model whose external data was so replaced then loaded and
    computed with the bytes written there).

    Raises
    ------
    ValueError
        Such a path (onnxruntime's ``InvalidArgument``); the message names both files.
    """
    path = getattr(sess_options, OPTIMIZED_MODEL_FILEPATH, "") if sess_options else ""
    if not path:
        return
    read = [model, *external_data_files(os.fspath(model))]
    written = {f"sess_options.{OPTIMIZED_MODEL_FILEPATH}": path}
    location = _config_entry(sess_options, EXTERNAL_FILE_NAME)
    if location:
        folder = os.path.dirname(os.path.abspath(path))
        written[f"sess_options' {EXTERNAL_FILE_NAME}"] = os.path.join(folder, location)
    for option, target in written.items():
        clash = same_file(target, read)
        if clash is not None:
            error = RecurrentError(
                f"{option}: {os.fspath(target)!r} is the file "
                f"{os.fspath(clash)!r} the model is read from: writing it would destroy the "
                "model; give another path"
            )
            error.onnxruntime_type = "InvalidArgument"  # type: ignore[attr-defined]
            raise error


def write_model(model: onnx.ModelProto, sess_options: Any) -> None:
    """Write ``model`` to the caller's ``sess_options.optimized_model_filepath``, if set.

    onnxruntime would write the rewritten model there: custom nodes that name their
    weights by a key of this process, which no other process can run (and which another
    session's process resolved to its own weights). What is written is the model as
    the session loaded it, recurrent nodes and all, not optimized by onnxruntime; in
    ONNX's format, or in onnxruntime's own where onnxruntime would write that (a path
    ending in ``.ort``, or ``session.save_model_format`` set to ``ORT``), then by a
    plain onnxruntime session of it, optimized as onnxruntime optimizes it.

    Raises
    ------
    OSError
        The file cannot be written (the message names it), also of onnxruntime's class
        (``InvalidArgument`` for a missing directory, as onnxruntime; else
        ``RuntimeError``).
    RuntimeError
        ORT's format asked for, and onnxruntime refuses the model as given (its class).
    """
    path = getattr(sess_options, OPTIMIZED_MODEL_FILEPATH, "") if sess_options else ""
    if not path:
        return
    chosen = _config_entry(sess_options, "session.save_model_format")
    if chosen.upper() == "ORT" or (not chosen and str(path).lower().endswith(".ort")):
        try:  # onnxruntime writes it, as it would have
            ort_session_class()(model.SerializeToString(), sess_options, ["CPUExecutionProvider"])
        except Exception as e:
            error = RuntimeError(
                f"sess_options.optimized_model_filepath: {path!r} in onnxruntime's format "
                "is written by onnxruntime, which refuses the model as given: "
                f"{one_line(e, typed=False)}"
            )
            error.onnxruntime_type = type(e)  # type: ignore[attr-defined]
            raise error from None
        return
    location = _config_entry(sess_options, EXTERNAL_FILE_NAME)
    try:
        if location:
            min_size = _config_entry(sess_options, EXTERNAL_MIN_SIZE) or "1024"
            model = _external(model, path, location, int(min_size))
        with saving(os.fspath(path)) as f:  # replaced whole: a failure keeps the file
            f.write(model.SerializeToString())
    except OSError as e:
        error = type(e)(
            e.errno,
            f"sess_options.optimized_model_filepath: cannot write {e.filename or path!r}: "
            f"{e.strerror}",
        )
        # onnxruntime's: InvalidArgument for a missing directory, else RuntimeError
        theirs = "InvalidArgument" if isinstance(e, FileNotFoundError) else RuntimeError
        error.onnxruntime_type = theirs  # type: ignore[attr-defined]
        raise error from None


class OnnxruntimeHost:
    """An onnxruntime session of the rewritten model.

    Raises
    ------
    HostUnavailable
        onnxruntime or onnxruntime-extensions is missing, or onnxruntime refuses the
        rewritten model (the message gives its reason).
    TypeError
        As :func:`rewrite`; ``sess_options`` not an ``onnxruntime.SessionOptions``.
    """

    name = "onnxruntime"

    def __init__(
        self,
        model: onnx.ModelProto,
        bound: Mapping[tuple[str, ...], BoundNode],
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict] | None = None,
        session_kwargs: Mapping[str, Any] | None = None,
    ):
        keys: dict[str, BoundNode] = {}
        #: seconds per byte of feeds of the last call (:meth:`run`): a call expected
        #: shorter than :data:`UNGUARDED_SECONDS` runs without the SIGINT watch
        self._rate = math.inf
        try:
            _setup()  # HostUnavailable where a package is missing
            edges = [*model.graph.input, *model.graph.output]
            if any(_held_elem_type(v.type) == TensorProto.BFLOAT16 for v in edges):
                raise HostUnavailable("onnxruntime's Python API takes no bfloat16 arrays")
            options = _session_options(sess_options)
            offloaded: dict[str, np.ndarray] = {}
            rewritten = rewrite(model, bound, keys, options.intra_op_num_threads, offloaded)
            if offloaded:  # options of this session's own, holding them
                import onnxruntime as ort

                options = _session_options(sess_options, shared=False)
                values = [ort.OrtValue.ortvalue_from_numpy(a) for a in offloaded.values()]
                options.add_external_initializers(list(offloaded), values)
                self._offloaded = (offloaded, values)  # alive while the session is
            used = {
                n.op_type for g in _graphs(rewritten.graph) for n in g.node if n.domain == DOMAIN
            }
            try:
                native.prepare({e for e, name in OP_TYPES.items() if name in used})
            except ImportError as e:  # numba's compiler turned off (NUMBA_DISABLE_JIT)
                raise HostUnavailable(
                    f"the native nodes cannot be compiled: {one_line(e, typed=False)}"
                ) from None
            self._options = options  # they hold the custom-op library's domains
            refused = None
            # signals held off: onnxruntime calls our custom op's callbacks meanwhile,
            # and one interrupted returned nothing (onnxruntime then crashed, or refused
            # the model, so host="auto" fell back); a held handler's exception comes
            # at the end of the with, outside the try (not a refusal)
            with interrupts_held():
                try:
                    session = ort_session_class()(
                        rewritten.SerializeToString(),
                        options,
                        providers=list(providers) if providers else ["CPUExecutionProvider"],
                        provider_options=provider_options,
                        **(session_kwargs or {}),
                    )
                except Exception as e:  # onnxruntime's own exception types
                    refused = e
            if refused is not None:
                why = _their_names(one_line(refused, typed=False), _custom_names(rewritten, keys))
                refusal = HostUnavailable(f"onnxruntime refuses the model: {why}")
                refusal.onnxruntime_type = type(refused)
                raise refusal from None
        except BaseException:
            _forget(list(keys))
            raise
        self._finalizer = weakref.finalize(self, _forget, list(keys))
        #: the custom nodes' names -> the recurrent nodes' (onnxruntime's errors reworded)
        self._names = _custom_names(rewritten, keys)
        self._session = session
        write_model(model, sess_options)
        _hosts.add(self)
        #: the IOBindings this host's io_binding() made (weakly)
        self._bindings: weakref.WeakSet = weakref.WeakSet()
        # onnxruntime's Python run() first reads the graph's inputs and outputs again
        # (pybind11 calls: 1-2 µs, 30 µs when a call finds the caches cold); with arrays
        # fed on the CPU alone its C++ session, which checks the feeds itself, is run
        core = getattr(session, "_sess", None)
        cpu = session.get_providers() == ["CPUExecutionProvider"]
        self._run_arrays = core.run if cpu and callable(getattr(core, "run", None)) else None

    @property
    def session(self) -> Any:
        """onnxruntime's session of the rewritten model."""
        return self._session

    def providers(self) -> list[str]:
        return self._session.get_providers()

    @staticmethod
    def check_providers(providers: Any, provider_options: Any) -> None:
        """Refuse what onnxruntime's ``set_providers``, which has no fall back, refuses:
        ``provider_options`` of another length (ValueError), a provider that is not
        available here (RuntimeError); a new session from them would fall back."""
        import onnxruntime as ort
        from onnxruntime.capi.onnxruntime_inference_collection import (
            check_and_normalize_provider_args,
        )

        available = ort.get_available_providers()
        names, _ = check_and_normalize_provider_args(providers, provider_options, available)
        for name in names:
            if name not in available:
                raise RuntimeError(f"Unknown Provider Type: {name}")

    # onnxruntime's own session, for the entry points that hand its objects out
    def session_options(self) -> Any:
        return self._session.get_session_options()

    def provider_options(self) -> dict:
        return self._session.get_provider_options()

    def end_profiling(self) -> str:
        return self._session.end_profiling()

    def profiling_start_time_ns(self) -> int:
        return self._session.get_profiling_start_time_ns()

    def io_binding(self) -> Any:
        binding = self._session.io_binding()
        self._bindings.add(binding)
        return binding

    def run_with_iobinding(self, iobinding: Any, run_options: Any) -> None:
        try:
            ours = iobinding in self._bindings
        except TypeError:  # not weakly referable: no IOBinding
            ours = False
        if not ours and type(iobinding).__name__ == "IOBinding":
            raise RecurrentError(
                "iobinding was made by another session's io_binding(): bind the inputs "
                "and outputs on one made by this session's"
            )
        if not ours:
            raise RecurrentTypeError(
                "iobinding must be an IOBinding made by this session's io_binding(), "
                f"got {type(iobinding).__name__}"
            )
        self.guarded(_run_with_iobinding, self._session, iobinding, run_options, None)

    def run_with_ort_values(
        self,
        output_names: Sequence[str],
        feeds: dict[str, Any],
        run_options: Any,
        refused: Callable[[dict], Any] | None,
    ) -> list[Any]:
        run = self._session.run_with_ort_values
        return self.guarded(run, output_names, feeds, run_options, None, refused)

    #: onnxruntime checks the feeds' names, element types, ranks and fixed dims itself:
    #: the session's own checks run only to word an error where onnxruntime refuses them
    checks_feeds = True

    def run(
        self,
        output_names: Sequence[str],
        feeds: dict[str, np.ndarray],
        run_options: Any,
        refused: Callable[[dict], Any] | None = None,
    ) -> list[np.ndarray]:
        """``refused(feeds)``, where given, is called when onnxruntime fails the call
        by itself (no node's error, no interrupt): it raises the session's error for
        feeds it would have refused, before onnxruntime's own is raised."""
        nbytes = 0
        for value in feeds.values():
            try:
                nbytes += value.nbytes
            except AttributeError:  # a sequence, map or empty optional
                nbytes += _nbytes(value)
        run = (self._run_arrays if refused is not None else None) or self._session.run
        return self.guarded(run, output_names, feeds, run_options, nbytes, refused)

    def guarded(
        self,
        invoke: Callable[[Any, Any, Any], Any],
        output_names: Any,
        feeds: Any,
        run_options: Any,
        nbytes: int | None,
        refused: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``invoke(output_names, feeds, run_options)``, a call into the onnxruntime
        session, with a node's error raised as itself and Ctrl-C as
        ``KeyboardInterrupt`` (the SIGINT watch skipped for a call expected short from
        ``nbytes`` of feeds; None: unknown, always watched); ``refused(feeds)`` as in
        :meth:`run`."""
        # a node's error or an interrupt is recorded in ``_state`` during a call and
        # taken from it by the end of that call: it is clear when a call starts
        main = _get_ident() == threading.main_thread().ident
        handler = _signal.getsignal(_SIGINT)
        if main and handler is _on_sigint and not getattr(_state, "guarded", False):
            # left by a call that an exception tore as its watch opened (no call runs
            # on this thread now): every later Ctrl-C was dropped
            _signal.signal(_SIGINT, _signal.default_int_handler)
            handler = _signal.default_int_handler
        watched = not (
            (nbytes is not None and self._rate * (nbytes or 1) < UNGUARDED_SECONDS)
            or not main
            or handler is not _signal.default_int_handler
        )  # not a short call (a Ctrl-C waits for its end), and SIGINT ours to watch
        if watched:
            state = _state
            state.error = None
            state.interrupted = False
            try:
                _signal.signal(_SIGINT, _on_sigint)
                previous = native.interrupt_watch_start()
            except interrupts.Unavailable:  # no fd or thread left for the watcher
                _signal.signal(_SIGINT, _signal.default_int_handler)
                if state.interrupted:
                    state.interrupted = False
                    raise KeyboardInterrupt from None
                watched = False
            except BaseException:  # another handler's exception (a timer's) meanwhile
                try:
                    _signal.signal(_SIGINT, _signal.default_int_handler)
                finally:
                    native.interrupt_watch_abandon()
                raise
        if not watched:
            start = _clock()
            for attempt in itertools.count():
                try:
                    outputs = invoke(output_names, feeds, run_options)
                    break
                except Exception as e:
                    state = _state
                    error, state.error = getattr(state, "error", None), None
                    if error is None and native.INTERRUPTED in str(e):
                        if _get_ident() == threading.main_thread().ident or attempt >= 3:
                            raise KeyboardInterrupt from None
                        # another thread: stopped by the main thread's Ctrl-C (one
                        # word stops every node); nobody interrupted this call
                        _wait_for_abort_clear()
                        continue
                    if error is None:
                        if refused is not None:
                            refused(feeds)
                        raise _renamed(e, self._names) from None
                    raise error from None
            if nbytes is not None:
                self._rate = (_clock() - start) / (nbytes or 1)
            return outputs
        start = _clock()
        try:
            outputs = invoke(output_names, feeds, run_options)
            if nbytes is not None:
                self._rate = (_clock() - start) / (nbytes or 1)
        except Exception as e:
            if state.error is None and not native.ABORT[0]:
                if native.INTERRUPTED not in str(e):
                    if refused is not None:
                        refused(feeds)
                    raise _renamed(e, self._names) from None
                state.interrupted = True
            outputs = None
        finally:
            try:
                aborted = native.interrupt_watch_end(previous)
            finally:  # Python's handler back, whatever a handler raised in there
                _signal.signal(_SIGINT, _signal.default_int_handler)
            error, interrupted = state.error, state.interrupted or aborted
            state.error = None
            state.interrupted = False
        if error is not None:
            raise error
        if interrupted:
            raise KeyboardInterrupt
        return outputs


def _wait_for_abort_clear(seconds: float = 5.0) -> None:
    """Wait (at most ``seconds``) until the main thread's interrupted call has ended
    and :data:`native.ABORT` is clear again."""
    deadline = _clock() + seconds
    while native.ABORT[0] and _clock() < deadline:
        time.sleep(0.001)


def _run_with_iobinding(session: Any, iobinding: Any, run_options: Any) -> None:
    session.run_with_iobinding(iobinding, run_options)


def _custom_names(rewritten: onnx.ModelProto, keys: Mapping[str, Any]) -> dict:
    """Each custom node's name in the rewritten model -> the operator and name of the
    recurrent node it computes."""
    nodes = {}
    for graph in _graphs(rewritten.graph):
        for node in graph.node:
            b = _bound_of(node, keys)
            if b is not None:
                nodes[node.name] = (b.op, b.node.node.name)
    return nodes


def _their_names(message: str, nodes: Mapping[str, tuple[str, str]]) -> str:
    """onnxruntime's ``message`` about the rewritten model, with each custom node's
    operator and name (``OnnxRecurrentFloat``, ``onnx_recurrent::0``) as the model has
    them (``GRU``, ``''``); ``nodes``: :func:`_custom_names`."""

    def named(match: re.Match) -> str:
        op, name = nodes.get(match[2], (None, None))
        return match[0] if op is None else f"operator ({op}) in node ({name})"

    def running(match: re.Match) -> str:  # a node's failure in a run
        op, name = nodes.get(match[2], (None, None))
        return match[0] if op is None else f"running {op} node. Name:'{name}'"

    message = re.sub(r"operator \((OnnxRecurrent\w*)\) in node \(([^)]*)\)", named, message)
    message = re.sub(r"running (OnnxRecurrent\w*) node\. Name:'([^']*)'", running, message)
    for custom, (op, name) in nodes.items():
        if custom.startswith("onnx_recurrent::"):
            message = message.replace(custom, f"{op} node {name!r}")
    return message


def _renamed(error: Exception, nodes: Mapping[str, tuple[str, str]]) -> Exception:
    """onnxruntime's own ``error`` of a run, of its class, worded with the recurrent
    nodes' operators and names (:func:`_their_names`); a recurrent node out of memory
    (its scratch, or onnxruntime's allocation of its outputs): a ``MemoryError``, as
    under the reference host."""
    message = str(error)
    worded = _their_names(message, nodes)
    ours = re.search(r"running OnnxRecurrent\w* node", message) is not None
    if native.OUT_OF_MEMORY in message or (ours and "Failed to allocate memory" in message):
        return MemoryError(worded)  # its own scratch, or onnxruntime's for its outputs
    if worded == message:
        return error
    try:
        return type(error)(worded)
    except Exception:  # a class that takes no message: as it was
        return error


def _bound_of(node: onnx.NodeProto, keys: Mapping[str, Any]) -> Any:
    """The :class:`~..bound.BoundNode` of one of this host's custom nodes (by its key
    in ``keys``), or None for any other node."""
    if not is_custom_node(node):
        return None
    key = next((a.s.decode() for a in node.attribute if a.name == "key"), None)
    return keys.get(key)


def _nbytes(value: Any) -> int:
    """The bytes of the arrays a feed holds (a sequence's, a map's values')."""
    if isinstance(value, list):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return 8 * len(value)
    return getattr(value, "nbytes", 0)


def _held_elem_type(t: onnx.TypeProto) -> int:
    """The element type of the tensors that a value of type ``t`` is or holds."""
    while t.WhichOneof("value") in ("sequence_type", "optional_type", "map_type"):
        kind = t.WhichOneof("value")
        t = t.map_type.value_type if kind == "map_type" else getattr(t, kind).elem_type
    return t.tensor_type.elem_type


def _on_sigint(signum, frame):
    if getattr(_state, "guarded", False):
        raise KeyboardInterrupt
    _state.interrupted = True
