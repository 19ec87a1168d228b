"""The reference host: onnx.reference runs the graph, the bound layers the recurrent nodes.

Slow on the non-recurrent nodes, but needs neither onnxruntime nor
onnxruntime-extensions. ``Loop`` is onnx-recurrent's (:mod:`..loop`): onnx.reference
runs a ``Loop`` whose ``cond`` input is omitted for zero iterations. Sparse tensors
(``sparse_initializer``, ``Constant``'s ``sparse_value``), which onnx.reference does
not run, are made dense first.

Broken models: a tensor whose data cannot be read is named before onnx.reference
loads the model; then ``onnx.checker.check_model`` checks it, and a model it refuses (or
a standard node's flag attribute other than 0 or 1, which it takes) is refused with its
message (a ``ValueError``), as onnxruntime refuses such models when it
loads them (its own graph checks, and onnx's node checks); what onnx.reference raises as
``AttributeError``, ``IndexError``, ``KeyError``... on a malformed node is raised as a
``RuntimeError`` naming the node, as is its own ``RuntimeError`` (``Inconsistent
permutation``), and its ``ValueError`` or ``TypeError`` (often NumPy's, such as
``repeated axis in transpose``) as one of the same kind naming the node.

The checker is stricter than onnxruntime in a few ways, which the copy it checks
smooths over (the model run is not changed by it): graph inputs and outputs declared
without a shape or without a type, a graph without a name, an IR version below 4 (an
initializer that is not a graph input, opset imports under IR 2), duplicate metadata
keys, a tensor holding its data in two fields (onnxruntime reads ``raw_data``, or the
data type's field). The main graph's nodes out of topological order, which onnxruntime
sorts, are sorted here too (a subgraph's, which it refuses, are not).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ...errors import RecurrentError, RecurrentTypeError, one_line
from ..bound import BoundNode, node_key
from ..graph import all_graphs, is_default_domain, opset_version, subgraphs, tensor_array, walk
from ..loop import reference_fixes
from ..reference import reference_ops


def _bound_ops(bound: Mapping[tuple[str, ...], BoundNode]) -> list[type]:
    """``reference_ops()`` whose nodes run through the session's bound nodes."""

    def run(self, *args: Any, **kwargs: Any) -> tuple:
        node = self.onnx_node
        X, *rest = (*args, *([None] * (8 - len(args))))
        W, R, B, sequence_lens, initial_h = rest[:5]
        initial_c, P = rest[5:7]
        b = bound[node_key(node)]
        if sequence_lens is not None and np.asarray(sequence_lens).dtype != np.int32:
            # a value the graph computed (a feed's type is checked against the graph's):
            # onnxruntime refuses such a model
            raise RecurrentTypeError(
                f"{b.label}: sequence_lens must be tensor(int32), as the operator's "
                f"schema says, got {np.asarray(sequence_lens).dtype}"
            )
        results = b(X, sequence_lens, initial_h, initial_c, {"W": W, "R": R, "B": B, "P": P})
        outputs = node.output
        return tuple(
            r if i < len(outputs) and outputs[i] else None for i, r in enumerate(results)
        )[: max(len(outputs), 1)]

    classes = []
    for family in reference_ops():
        bound_family = type(family.__name__, (family,), {"versions": {}})
        for v, cls in family.versions.items():
            bound_family.versions[v] = type(
                cls.__name__, (cls, bound_family), {"since_version": v, "run": run}
            )
        classes.append(bound_family)
    return classes


class ReferenceHost:
    """onnx.reference's evaluator with the session's bound recurrent nodes.

    Raises
    ------
    ValueError
        A tensor whose data cannot be read (:func:`_read_tensors`); a model that
        ``onnx.checker.check_model`` refuses, or a flag attribute neither 0 nor 1
        (:func:`check`).
    RuntimeError
        onnx.reference cannot load the model (the message names the node).
    """

    name = "reference"
    checks_feeds = False  # the session checks them first

    def __init__(self, model: onnx.ModelProto, bound: Mapping[tuple[str, ...], BoundNode]):
        _read_tensors(model)
        model = _sorted(_default_domain(_dense(model)))
        check(model)
        for node in bound.values():  # every node runs its layer: compiled now
            if node.layer is not None:
                node.layer.prepare()
        try:
            self._evaluator = ReferenceEvaluator(
                model, new_ops=[*_bound_ops(bound), *reference_fixes()]
            )
        except (*_UNCLEAR, ValueError, TypeError, RuntimeError) as e:
            if _raised_here(e):
                raise
            raise _engine_error(e) from e

    def providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def run(
        self, output_names: Sequence[str], feeds: dict[str, np.ndarray], run_options: Any
    ) -> list[np.ndarray]:
        if run_options is not None:  # its type, and its terminate flag, as onnxruntime
            if type(run_options).__name__ != "RunOptions":
                raise RecurrentTypeError(
                    f"run_options must be an onnxruntime.RunOptions or None, got "
                    f"{type(run_options).__name__}"
                )
            if getattr(run_options, "terminate", False):
                stop = RecurrentError("Exiting due to terminate flag being set to true.")
                stop.onnxruntime_type = "Fail"  # type: ignore[attr-defined]
                raise stop
        try:
            fed = [f for f in feeds.values() if isinstance(f, np.ndarray)]
            return [_owned(r, fed) for r in self._evaluator.run(list(output_names), feeds)]
        except (*_UNCLEAR, ValueError, TypeError, RuntimeError) as e:
            if _raised_here(e):
                raise
            raise _engine_error(e) from e


def _owned(value: Any, fed: Sequence[np.ndarray] = ()) -> Any:
    """An output the caller may write into, as onnxruntime's are, and apart from the
    feeds: onnx.reference hands back an initializer that is a graph output as the
    read-only array it keeps, and a graph input that is a graph output as the caller's
    own array."""
    if isinstance(value, np.ndarray) and (
        not value.flags.writeable or any(np.may_share_memory(value, f) for f in fed)
    ):
        return value.copy()
    if isinstance(value, list):
        return [_owned(v, fed) for v in value]
    return value


def _default_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose ``ai.onnx`` domain is written ``''``, imported once
    (its last version, :func:`~onnx_recurrent.runtime.graph.opset_version`): onnx.reference
    knows the default domain by the empty name only (onnxruntime, by either)."""
    nodes = [node for _, node in walk(model.graph)]
    defaults = [o for o in model.opset_import if is_default_domain(o.domain)]
    if not any(n.domain == "ai.onnx" for n in nodes) and [o.domain for o in defaults] in (
        [],
        [""],
    ):
        return model
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    for _, node in walk(copied.graph):
        if node.domain == "ai.onnx":
            node.domain = ""
    version = opset_version(model)
    if version is not None:
        others = [o for o in model.opset_import if not is_default_domain(o.domain)]
        del copied.opset_import[:]
        copied.opset_import.extend([onnx.helper.make_opsetid("", version), *others])
    return copied


def check(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model`` on (a copy of) ``model``, where onnxruntime checks
    the same when it loads a model: node schemas (attributes, input and output counts),
    the opset imports, SSA form, initializers' fields, the IR version.

    The copy smooths over what the checker refuses and onnxruntime takes
    (:func:`_for_checker`); a model of 2 GiB or more, which the checker cannot take
    whole, is not checked.

    Raises
    ------
    ValueError
        The checker's message, e.g. ``model: onnx.checker refuses it (onnxruntime would
        too): Unrecognized attribute: bogus for operator Relu ==> Context: Bad node spec
        for node. Name: r OpType: Relu``.
    """
    _check_flags(model)
    checked = _for_checker(model)
    try:
        size = checked.ByteSize()
    except Exception:  # protobuf's EncodeError: past what it can serialise
        return
    if size >= onnx.checker.MAXIMUM_PROTOBUF:
        return
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError as e:
        raise RecurrentError(
            f"model: onnx.checker refuses it (onnxruntime would too): {one_line(e, typed=False)}"
        ) from None


#: the standard operators' attributes that are flags, 0 or 1 (ONNX's ``int`` for a bool)
_FLAGS = frozenset(
    {"keepdims", "noop_with_empty_axes", "select_last_index", "transA", "transB", "upper",
     "exclusive", "reverse", "ceil_mode", "count_include_pad", "largest", "sorted",
     "detect_negative", "detect_positive", "center_point_box"}
)  # fmt: skip


def _check_flags(model: onnx.ModelProto) -> None:
    """Refuse a standard node whose flag attribute (:data:`_FLAGS`) is neither 0 nor 1:
    the checker takes any integer there, and onnxruntime and onnx.reference read the
    others differently (``ReduceMean`` with ``keepdims=-1``: onnxruntime drops the axis,
    onnx.reference keeps it), so the hosts would give different outputs.

    Raises
    ------
    ValueError
        Naming the node, the attribute and its value.
    """
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            for a in node.attribute:
                if a.name in _FLAGS and a.type == onnx.AttributeProto.INT and a.i not in (0, 1):
                    raise RecurrentError(
                        f"{node.op_type} node {node.name!r}: attribute {a.name}={a.i}, expected"
                        " 0 or 1 (onnxruntime and onnx.reference read other values differently)"
                    )


#: the tensor fields that hold data (one of them, the checker says)
_DATA_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "raw_data",
    "double_data",
    "uint64_data",
)


def _one_data_field(tensor: onnx.TensorProto) -> None:
    """Leave ``tensor`` (a copy) the data field onnxruntime reads where it has several:
    ``raw_data``, else its data type's."""
    present = [f for f in _DATA_FIELDS if len(getattr(tensor, f))]
    if len(present) > 1:
        try:
            typed = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        except (KeyError, ValueError):  # an unknown data type: the checker says so
            typed = present[0]
        keep = "raw_data" if "raw_data" in present else typed
        for f in present:
            if f != keep:
                tensor.ClearField(f)


def _for_checker(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for ``onnx.checker.check_model``, without what the checker
    refuses and onnxruntime takes: graph inputs and outputs without a shape or a type
    (given an empty shape, an undefined element type), graphs without a name (named),
    IR versions below 4 (made 4: under IR 3 every initializer had to be an input, under
    IR 2 no opset could be imported), duplicate metadata keys (the last kept), tensors
    with data in several fields (the one onnxruntime reads kept)."""
    checked = onnx.ModelProto()
    checked.CopyFrom(model)
    metadata = {p.key: p.value for p in model.metadata_props}
    del checked.metadata_props[:]
    for key, value in metadata.items():
        checked.metadata_props.add(key=key, value=value)
    checked.ir_version = max(checked.ir_version, 4)
    for value in (*checked.graph.input, *checked.graph.output):
        kind = value.type.WhichOneof("value")
        if kind is None:
            value.type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
            kind = "tensor_type"
        if kind in ("tensor_type", "sparse_tensor_type"):
            declared = getattr(value.type, kind)
            if not declared.HasField("shape"):
                declared.shape.SetInParent()
    for graph in all_graphs(checked.graph):
        if not graph.name:
            graph.name = "graph"
        for tensor in graph.initializer:
            _one_data_field(tensor)
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("t"):
                    _one_data_field(a.t)
                for tensor in a.tensors:
                    _one_data_field(tensor)
    return checked


def _given(graph: onnx.GraphProto) -> set[str]:
    """The names a graph's inputs and initializers give."""
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    return names | {t.values.name for t in graph.sparse_initializer}


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` (a subgraph) reads from the graphs around it."""
    defined = _given(graph)
    used: set[str] = set()
    for node in graph.node:
        used.update(name for name in node.input if name)
        for sub in subgraphs(node):
            used |= _free_names(sub)
        defined.update(node.output)
    return used - defined


def _order(graph: onnx.GraphProto) -> list[int] | None:
    """The order in which to run the nodes of ``graph`` so that each comes after those
    computing its inputs and the names its subgraphs read, each as early as that
    allows; None where the nodes are in such an order already, where two nodes compute
    one name, or where they form a cycle (the checker says which)."""
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if name:
                if name in producer:
                    return None
                producer[name] = i
    needs: list[set[int]] = []
    for i, node in enumerate(graph.node):
        names = {name for name in node.input if name}
        for sub in subgraphs(node):
            names |= _free_names(sub)
        needs.append({producer[n] for n in names if n in producer} - {i})
    if all(all(j < i for j in need) for i, need in enumerate(needs)):
        return None
    waiting = [len(need) for need in needs]
    users: list[list[int]] = [[] for _ in needs]
    for i, need in enumerate(needs):
        for j in need:
            users[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    return order if len(order) == len(needs) else None


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy of it whose main graph's nodes are sorted where some are out
    of topological order: onnxruntime sorts them, onnx.reference runs them in the order
    given. A subgraph's are not (onnxruntime refuses them out of order, as the checker
    does)."""
    order = _order(model.graph)
    if order is None:
        return model
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    nodes = [onnx.NodeProto() for _ in order]
    for target, i in zip(nodes, order, strict=True):
        target.CopyFrom(model.graph.node[i])
    del copied.graph.node[:]
    copied.graph.node.extend(nodes)
    return copied


def _sparse_constants(graph: onnx.GraphProto) -> list[onnx.AttributeProto]:
    return [
        a
        for node in graph.node
        if node.op_type == "Constant" and is_default_domain(node.domain)
        for a in node.attribute
        if a.name == "sparse_value"
    ]


def _dense(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose sparse tensors (``sparse_initializer``, ``Constant``'s
    ``sparse_value``) are dense ones: onnx.reference runs neither (onnxruntime does).

    Raises
    ------
    ValueError
        A sparse tensor that cannot be read (the message names it).
    """
    if not any(g.sparse_initializer or _sparse_constants(g) for g in all_graphs(model.graph)):
        return model
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    for graph in all_graphs(copied.graph):
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            value = _sparse_array(sparse, f"sparse initializer {name!r}")
            graph.initializer.append(numpy_helper.from_array(value, name))
        del graph.sparse_initializer[:]
        for a in _sparse_constants(graph):
            value = _sparse_array(a.sparse_tensor, "a Constant's sparse_value")
            a.Clear()
            a.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
    return copied


def _sparse_array(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    """A sparse tensor's dense value: indices ``[NNZ]`` into the flat array, or
    ``[NNZ, rank]``, as ONNX has them."""
    values = tensor_array(sparse.values, what)
    indices = tensor_array(sparse.indices, f"the indices of {what}").astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), values.dtype)
    try:
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values.reshape(-1)
        else:
            dense[tuple(indices.T)] = values.reshape(-1)
    except (IndexError, ValueError) as e:
        raise RecurrentError(
            f"{what} (dims {list(sparse.dims)}) cannot be read: {one_line(e, typed=False)}"
        ) from None
    return dense


def _read_tensors(model: onnx.ModelProto) -> None:
    """Read every initializer and tensor attribute once: onnx.reference reads them all
    when it loads the model, and does not say which one it could not read.

    Raises
    ------
    ValueError
        A tensor whose data cannot be read (the message names it).
    """
    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            tensor_array(tensor, f"initializer {tensor.name!r}")
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    tensor_array(a.t, f"attribute {a.name!r} of {node.op_type} node {node.name!r}")


#: what onnx.reference raises on some broken models (a ``Constant`` without a value,
#: a ``Slice`` with too many inputs...): re-raised as a RuntimeError naming the node
_UNCLEAR = (AttributeError, IndexError, KeyError, AssertionError, ArithmeticError)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _raised_here(error: Exception) -> bool:
    """Whether onnx-recurrent's own code raised ``error`` (a fault of ours: left as is)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(
        _PACKAGE + os.sep
    )


def _engine_error(error: Exception) -> Exception:
    """``error``, raised inside onnx.reference (or NumPy under it), naming the node that
    onnx.reference was loading or running (when its frames tell): a ``ValueError`` or
    ``TypeError`` stays one (a ``Transpose`` with a repeated axis, an operator given
    types it does not take), the others (:data:`_UNCLEAR`, onnx.reference's own
    ``RuntimeError``) become a ``RuntimeError``."""
    node = None
    tb = error.__traceback__
    while tb is not None:  # the innermost operator's frame
        found = getattr(tb.tb_frame.f_locals.get("self"), "onnx_node", None)
        node = found if isinstance(found, onnx.NodeProto) else node
        tb = tb.tb_next
    where = f" at {node.op_type} node {node.name!r}" if node is not None else ""
    kind = next((k for k in (ValueError, TypeError) if isinstance(error, k)), RuntimeError)
    if isinstance(error, _UNCLEAR):  # numpy's AxisError is a ValueError and an IndexError
        kind = RuntimeError
    return kind(f"onnx.reference cannot run this model{where}: {type(error).__name__}: {error}")
