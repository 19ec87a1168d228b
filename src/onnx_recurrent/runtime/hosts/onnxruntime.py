"""The onnxruntime host: onnxruntime runs the graph, onnx-recurrent the recurrent nodes.

Every GRU, RNN and LSTM node (subgraphs included) becomes one custom node of domain
``ai.onnx.contrib`` computed by a Python callback (onnxruntime-extensions' custom ops)
with one attribute, the key of its :class:`~..bound.BoundNode`. It takes only the
inputs the node is given, bound weights excepted, and gives only the outputs it names
(each tensor crossing costs ~3 µs): one custom operator per such signature, made on
first use, e.g. ``OnnxRecurrentFloat_XHC_YHC``. onnxruntime-extensions passes
float32 and float64 only: a float16 or bfloat16 node is computed on float32 between
``Cast`` nodes, which is what onnx-recurrent does inside for those types (one rounding
at the end).

Faults. An exception escaping a callback aborts the process (onnxruntime-extensions
0.15, onnxruntime 1.32), so the callback catches everything, hands onnxruntime
placeholder outputs, skips the node's later calls in the same ``run``, and ``run``
raises the exception itself, unchanged. A Ctrl-C is kept out of onnxruntime's frames:
while ``run`` is in onnxruntime the main thread's SIGINT handler raises only inside a
callback's guarded part and is otherwise remembered, then raised when onnxruntime
returns.
"""

from __future__ import annotations

import itertools
import signal as signal_module
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ...errors import RecurrentTypeError
from ...threads import interrupts_held
from ..bound import BoundNode, node_key
from ..graph import INPUTS, WEIGHTS, element_types, prune, subgraphs

DOMAIN = "ai.onnx.contrib"
#: the custom operators' name per element type computed
OP_TYPES = {TensorProto.FLOAT: "OnnxRecurrentFloat", TensorProto.DOUBLE: "OnnxRecurrentDouble"}
#: a node's inputs and outputs as they cross, by letter
INPUT_LETTERS = {
    "X": "X",
    "sequence_lens": "L",
    "initial_h": "H",
    "initial_c": "C",
    "W": "W",
    "R": "R",
    "B": "B",
    "P": "P",
}
OUTPUT_LETTERS = "YHC"
#: element types computed on float32 between Cast nodes
CAST_TO_FLOAT = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
#: onnxruntime's session options under this host when the caller gives none, and why
SESSION_CONFIG = {
    # idle pool threads spin 200 µs, not onnxruntime's default (longer), before they
    # block: spinning ones took a core from a recurrent node computed inside run (M
    # forward in a graph: 13.4 ms, against 8.5 ms), while blocking at once made every
    # parallel node wait for a wake-up (Silero, one stream: 0.24 ms against 0.20 ms)
    "session.intra_op.spin_duration_us": "200",
}
#: onnxruntime-extensions versions whose C++ side was seen to take arrays back (a
#: version that does not would abort the process, so others get its own dispatcher)
FAST_HOOK_VERSIONS = ("0.15.",)

_BOUND: dict[str, BoundNode] = {}
# the C module under ``signal``: ``signal.signal`` wraps numbers in enums (11 µs a run)
_signal = getattr(signal_module, "_signal", signal_module)
_SIGINT = int(signal_module.SIGINT)
_keys = itertools.count()
_state = threading.local()  # per thread inside run: .error, .interrupted, .guarded
_setup_lock = threading.Lock()
_library: str | None = None


class HostUnavailable(RuntimeError):
    """The onnxruntime host cannot run this model here (the message says why)."""


# -- the callback ---------------------------------------------------------------------


def _placeholders(node: BoundNode, X: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    """Zeros of the outputs' shapes (Y, Y_h, Y_c), for onnxruntime after a failed call."""
    empty = np.zeros(0, dtype)
    try:
        layout = int(node.attributes.get("layout", 0))
        T, N = (X.shape[1], X.shape[0]) if layout else X.shape[:2]
        D = 2 if node.attributes.get("direction") == "bidirectional" else 1
        H = node.layer.hidden_size if node.layer else int(node.attributes["hidden_size"])
        state = (N, D, H) if layout else (D, N, H)
        Y = (N, T, D, H) if layout else (T, D, N, H)
        return (np.zeros(Y, dtype), np.zeros(state, dtype), np.zeros(state, dtype))
    except Exception:  # no shape to give: empty ones
        return (empty, empty, empty)


def _compute(inputs: tuple[str, ...], outputs: tuple[int, ...], arrays, key: str):
    """The callback: the bound node on the arrays given (named by ``inputs``), the
    outputs at positions ``outputs`` of ``(Y, Y_h, Y_c)``."""
    node = None
    # a float32 placeholder where there is no X (a custom node always gets it)
    X = arrays[0] if arrays else np.zeros((0, 0, 0), np.float32)
    try:
        _state.guarded = True
        node = _BOUND[key]
        if getattr(_state, "error", None) is not None:
            raise _Skipped  # the run has failed: skip the work
        if getattr(_state, "interrupted", False):
            _state.interrupted = False
            raise KeyboardInterrupt
        given = dict(zip(inputs, arrays, strict=True))
        lengths = given.get("sequence_lens")
        if lengths is not None and lengths.size == 0:
            lengths = None  # an empty batch
        weights = {w: given.get(w) for w in node.dynamic} if node.dynamic else None
        results = node(X, lengths, given.get("initial_h"), given.get("initial_c"), weights)
        _state.guarded = False
        return tuple(results[i] for i in outputs)
    except BaseException as e:  # anything escaping aborts the process
        _state.guarded = False
        if getattr(_state, "error", None) is None and not isinstance(e, _Skipped):
            _state.error = e
        if node is None:
            return tuple(np.zeros(0, X.dtype) for _ in outputs)
        made = _placeholders(node, X, X.dtype)
        return tuple(made[i] for i in outputs)


class _Skipped(Exception):
    pass


def _signatures() -> list[tuple[int, tuple[str, ...], tuple[int, ...]]]:
    """Every (element type, inputs, outputs) a custom node can have."""
    weights = ((), ("W", "R"), ("W", "R", "B"), ("W", "R", "P"), ("W", "R", "B", "P"))
    outputs = ((1,), (0, 1), (1, 2), (0, 1, 2))
    optional = [((), (name,)) for name in ("sequence_lens", "initial_h", "initial_c")]
    return [
        (compute, ("X", *sum(states, ()), *w), out)
        for compute in OP_TYPES
        for states in itertools.product(*optional)
        for w in weights
        for out in outputs
    ]


_SIGNATURES = frozenset(_signatures())


def _type_name(elem: int) -> str:
    if elem in TensorProto.DataType.values():
        return TensorProto.DataType.Name(elem).lower()
    return f"unknown type {elem}"


_op_lock = threading.Lock()
_op_types: set[str] = set()


def _op_type(compute: int, inputs: tuple[str, ...], outputs: tuple[int, ...]) -> str:
    """The custom operator of this signature, registered on first use."""
    name = "_".join(
        (
            OP_TYPES[compute],
            "".join(INPUT_LETTERS[i] for i in inputs),
            "".join(OUTPUT_LETTERS[i] for i in outputs),
        )
    )
    with _op_lock:
        if name not in _op_types:
            from onnxruntime_extensions import PyCustomOpDef, onnx_op

            t = PyCustomOpDef.dt_float if compute == TensorProto.FLOAT else PyCustomOpDef.dt_double
            types = [PyCustomOpDef.dt_int32 if i == "sequence_lens" else t for i in inputs]

            def body(*arrays, key):
                return _compute(inputs, outputs, arrays, key)

            onnx_op(
                op_type=name,
                inputs=types,
                outputs=[t] * len(outputs),
                attrs={"key": PyCustomOpDef.dt_string},
            )(body)
            _op_types.add(name)
    return name


def _fast_hook(ocos):
    """onnxruntime-extensions' dispatcher, returning arrays rather than lists.

    Its own turns every output into a Python list (60 ns an element: 3 ms for a
    128-stream Silero LSTM's outputs); its C++ side takes arrays as well.
    """
    odlist = ocos.Opdef._odlist

    def invoke(k_id, feed, attributes):
        op = odlist[k_id]
        rv = op.body(*feed, **op.cast_attributes(attributes))
        res: list[Any] = []
        for r in rv if isinstance(rv, tuple) else (rv,):
            r = np.asarray(r)
            res.append(r.shape)
            res.append(
                np.ascontiguousarray(r).reshape(-1)
                if r.dtype.kind in "fiub"
                else r.flatten().tolist()
            )
        return (k_id, *res)

    return invoke


def _setup() -> str:
    """Register the custom operators once per process; the library's path."""
    global _library
    # Ctrl-C held off: an import (torch's, from the extensions) or a registration
    # stopped half-way cannot be done again in this process
    with _setup_lock, interrupts_held():
        if _library is not None:
            return _library
        try:
            import onnxruntime  # noqa: F401
            from onnxruntime_extensions import PyCustomOpDef, _ocos, get_library_path
        except ImportError as e:
            raise HostUnavailable(f"{e.name or e} is not installed") from None
        import onnxruntime_extensions

        # every signature now: an operator registered after a session was made moved
        # the ones that session holds, and freeing it then crashed
        for signature in _signatures():
            _op_type(*signature)
        if onnxruntime_extensions.__version__.startswith(FAST_HOOK_VERSIONS):
            PyCustomOpDef.install_hooker(_fast_hook(_ocos))
        _library = get_library_path()
        return _library


def _register(node: BoundNode) -> str:
    key = f"onnx-recurrent-{next(_keys)}"
    _BOUND[key] = node
    return key


def _forget(keys: Sequence[str]) -> None:
    for key in keys:
        _BOUND.pop(key, None)


# -- the rewrite ----------------------------------------------------------------------


def rewrite(
    model: onnx.ModelProto, bound: Mapping[tuple[str, ...], BoundNode], keys: dict
) -> onnx.ModelProto:
    """A copy of ``model`` whose recurrent nodes are custom nodes; ``keys`` receives
    each bound node's registry key.

    Raises
    ------
    HostUnavailable
        A node whose element type cannot be told, or one onnxruntime-extensions
        cannot pass.
    TypeError
        A float16 or bfloat16 node (computed on float32 between ``Cast`` nodes) given
        weights or states of another element type than X (the message names it).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = element_types(model)
    counter = itertools.count()

    def replace(graph: onnx.GraphProto) -> None:
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            for sub in subgraphs(node):
                replace(sub)
            b = bound.get(node_key(node)) if node.domain in ("", "ai.onnx") else None
            if b is None:
                nodes.append(node)
                continue
            nodes.extend(_custom_nodes(b, node, types, keys, counter))
        del graph.node[:]
        graph.node.extend(nodes)

    replace(out.graph)
    prune(out)
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


def _custom_nodes(b, node, types, keys, counter) -> list[onnx.NodeProto]:
    rn = b.node
    elem = types.get(rn.input("X"))
    if elem is None and b.layer is not None:
        elem = helper.np_dtype_to_tensor_dtype(b.layer.dtype)
    if elem is None:
        raise HostUnavailable(f"{b.label}: the element type of X cannot be told")
    compute = TensorProto.FLOAT if elem in CAST_TO_FLOAT else elem
    if compute not in OP_TYPES:
        name = TensorProto.DataType.Name(elem).lower()
        raise HostUnavailable(f"{b.label}: X is {name}, which a recurrent node cannot take")
    tag = f"onnx_recurrent::{next(counter)}"
    nodes = []

    def fed(spec_name: str) -> str:
        name = rn.input(spec_name)
        if spec_name == "sequence_lens" or compute == elem:
            return name
        if types.get(name, elem) != elem:  # the Cast would take it: say what it is
            raise RecurrentTypeError(
                f"{b.label}: {spec_name} must have X's element type {_type_name(elem)}, "
                f"got {_type_name(types[name])}"
            )
        cast = f"{tag}::{spec_name}::float"
        nodes.append(helper.make_node("Cast", [name], [cast], to=TensorProto.FLOAT))
        return cast

    present = [
        i
        for i in INPUT_LETTERS
        if i in INPUTS[rn.op] and rn.input(i) and (i not in WEIGHTS or i in b.dynamic)
    ]
    inputs = [fed(i) for i in present]
    outputs, casts = [], []
    # Y if named, Y_h (and Y_c) always: fewer signatures to register
    positions = ((0,) if rn.output(0) else ()) + tuple(range(1, b.n_outputs))
    for i in positions:
        name = rn.output(i) or f"{tag}::unused{i}"
        if compute != elem and rn.output(i):
            computed = f"{tag}::out{i}::float"
            casts.append(helper.make_node("Cast", [computed], [name], to=elem))
            name = computed
        outputs.append(name)
    if compute != elem:
        b = b.computing(np.dtype(np.float32), helper.tensor_dtype_to_np_dtype(elem))
    if (compute, tuple(present), positions) not in _SIGNATURES:  # registering one now
        # would move those the live sessions hold
        raise HostUnavailable(f"{b.label}: no custom operator takes {present}")
    key = _register(b)
    keys[key] = b
    op_type = _op_type(compute, tuple(present), positions)
    nodes.append(
        helper.make_node(op_type, inputs, outputs, name=node.name or tag, domain=DOMAIN, key=key)
    )
    return nodes + casts


# -- the host -------------------------------------------------------------------------


#: onnxruntime's session configuration entries carried from a caller's options to this
#: host's own (onnxruntime cannot list the entries set, only read one by its key): the
#: keys of ``onnxruntime_session_options_config_keys.h`` that a CPU session reads, less
#: those that mirror a ``SessionOptions`` attribute (copied as attributes)
SESSION_CONFIG_KEYS = (
    "session.intra_op.spin_duration_us",
    "session.inter_op.spin_duration_us",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.intra_op.spin_backoff_max",
    "session.inter_op.spin_backoff_max",
    "session.force_spinning_stop",
    "session.intra_op_thread_affinities",
    "session.dynamic_block_base",
    "session.set_denormal_as_zero",
    "session.disable_prepacking",
    "session.prepack.enable_parallel",
    "session.use_env_allocators",
    "session.use_device_allocator_for_initializers",
    "session.disable_cpu_ep_fallback",
    "session.load_model_format",
    "session.save_model_format",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file",
    "session.node_partition_config_file",
    "session.graph_optimizations_loop_level",
    "session.disable_aot_function_inlining",
    "session.function_expansion_byte_limit",
    "session.function_expansion_node_limit",
    "session.strict_shape_type_inference",
    "session.allow_released_opsets_only",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.disable_qdq_constant_folding",
    "session.enable_quant_qdq_cleanup",
    "session.enable_dq_matmulnbits_fusion",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "session.qdq_matmulnbits_accuracy_level",
    "session.qdq_matmulnbits_block_size",
    "session.kernel_dispatch_policy",
    "session.record_ep_graph_assignment_info",
    "optimization.disable_specified_optimizers",
    "optimization.enable_gelu_approximation",
    "optimization.enable_cast_chain_elimination",
    "optimization.minimal_build_optimizations",
    "optimization.constant_folding_max_output_size_in_bytes",
    "mlas.disable_kleidiai",
    "mlas.use_lut_gemm",
    "ep.context_enable",
    "ep.context_file_path",
    "ep.context_embed_mode",
)


def _session_options(sess_options):
    """onnxruntime's options for this host: a ``SessionOptions`` of its own, with the
    caller's settings copied in, and onnxruntime-extensions' library registered.

    The caller's ``sess_options`` are only read: a library registered on them once more
    for every session made clashed with itself ("Conflicting with a registered
    kernel"), for this host and for any onnxruntime session made on them after.
    Copied: every attribute onnxruntime lets one read and write
    (``intra_op_num_threads``, ``graph_optimization_level``, ``log_severity_level``...,
    ``execution_mode`` excepted: the graph runs sequentially) and the configuration
    entries of :data:`SESSION_CONFIG_KEYS` that are set.

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
    if sess_options is not None and not isinstance(sess_options, ort.SessionOptions):
        raise TypeError(
            "sess_options must be an onnxruntime.SessionOptions or None, "
            f"got {type(sess_options).__name__}"
        )
    options = ort.SessionOptions()
    if sess_options is None:
        for entry, value in SESSION_CONFIG.items():
            options.add_session_config_entry(entry, value)
    else:
        _copy_options(sess_options, options)
    # callbacks must run on the thread that called run (their errors are per thread)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.register_custom_ops_library(library)
    return options


def _copy_options(source: Any, target: Any) -> None:
    """The caller's settings that onnxruntime lets one read, onto ``target``."""
    has_providers = getattr(source, "has_providers", None)
    if has_providers is not None and has_providers():
        raise HostUnavailable(
            "sess_options hold execution providers (add_provider, "
            "set_provider_selection_policy...), which onnx-recurrent cannot copy onto "
            "its own SessionOptions: pass providers=[...] to the session instead"
        )
    for name, attribute in vars(type(target)).items():
        if isinstance(attribute, property) and attribute.fset is not None:
            setattr(target, name, getattr(source, name))
    for key in SESSION_CONFIG_KEYS:
        try:
            value = source.get_session_config_entry(key)
        except Exception:  # not set: onnxruntime raises
            continue
        target.add_session_config_entry(key, value)


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
    ):
        keys: dict[str, BoundNode] = {}
        try:
            _setup()  # HostUnavailable where a package is missing
            edges = [*model.graph.input, *model.graph.output]
            if any(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in edges):
                raise HostUnavailable("onnxruntime's Python API takes no bfloat16 arrays")
            rewritten = rewrite(model, bound, keys)
            import onnxruntime as ort

            options = _session_options(sess_options)
            self._options = options  # they hold the custom-op library's domains
            try:
                self._session = ort.InferenceSession(
                    rewritten.SerializeToString(),
                    options,
                    providers=list(providers) if providers else ["CPUExecutionProvider"],
                )
            except Exception as e:  # onnxruntime's own exception types
                raise HostUnavailable(
                    f"onnxruntime refuses the model: {str(e).strip().splitlines()[0]}"
                ) from None
        except BaseException:
            _forget(list(keys))
            raise
        self._finalizer = weakref.finalize(self, _forget, list(keys))

    def providers(self) -> list[str]:
        return self._session.get_providers()

    def run(
        self, output_names: Sequence[str], feeds: dict[str, np.ndarray], run_options: Any
    ) -> list[np.ndarray]:
        state = _state
        state.error, state.interrupted, state.guarded = None, False, False
        guard = (
            threading.current_thread() is threading.main_thread()
            and _signal.getsignal(_SIGINT) is _signal.default_int_handler
        )
        if guard:
            _signal.signal(_SIGINT, _on_sigint)
        try:
            try:
                outputs = self._session.run(list(output_names), feeds, run_options)
            except Exception:
                if state.error is None:
                    raise
                outputs = None
        finally:
            if guard:
                _signal.signal(_SIGINT, _signal.default_int_handler)
            error, interrupted = state.error, state.interrupted
            state.error, state.interrupted = None, False
        if error is not None:
            raise error
        if interrupted:
            raise KeyboardInterrupt
        return outputs


def _on_sigint(signum, frame):
    if getattr(_state, "guarded", False):
        raise KeyboardInterrupt
    _state.interrupted = True
