"""Graph surgery shared by the hosts, streaming and check.

- :func:`recurrent_nodes`: every GRU, RNN and LSTM node of a model, at the top level
  and inside ``If``, ``Loop`` and ``Scan`` bodies, with its operator version.
- :func:`node_attributes`: a node's attributes as the keywords of the functions, with
  the version differences settled (GRU-1's ``'foward'``, ``output_sequence`` of
  versions 1 and 3 dropped: ``Y`` is produced whenever the node names it).
- :func:`node_model`: a model of one recurrent node (the backend's ``run_node``, the
  check's probes, the tests).
- :func:`hosted`: the model with recurrent nodes in local functions inlined, each
  value named once across sibling scopes, and subgraph outputs given inferred shapes.
- :func:`subgraphs`, :func:`walk`, :func:`walk_paths`, :func:`element_types`,
  :func:`attributes`, :class:`Namer`: walking, typing and naming helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.helper import get_attribute_value

from ..cells import CELLS
from ..errors import RecurrentError, RecurrentTypeError, one_line
from ..spec import check_flag, is_bfloat16

#: the recurrent operators and their versions (the cells')
VERSIONS = {name: cell.versions for name, cell in CELLS.items()}
RECURRENT_OPS = frozenset(VERSIONS)
#: inputs by position, as the spec names them (the cells')
INPUTS = {name: cell.inputs for name, cell in CELLS.items()}
WEIGHTS = ("W", "R", "B", "P")
#: the onnxruntime host's custom nodes (:mod:`.hosts.native`): their domain, and the
#: operator for each element type
CUSTOM_DOMAIN = "ai.onnx.contrib"
CUSTOM_OPS = {
    TensorProto.FLOAT: "OnnxRecurrentFloat",
    TensorProto.DOUBLE: "OnnxRecurrentDouble",
    TensorProto.FLOAT16: "OnnxRecurrentFloat16",
    TensorProto.BFLOAT16: "OnnxRecurrentBFloat16",
}
#: operators whose result is not a function of their inputs
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"}
_RANDOM |= {"Multinomial", "Bernoulli"}


def is_default_domain(domain: str) -> bool:
    return domain in ("", "ai.onnx")


def opset_version(model: onnx.ModelProto) -> int | None:
    """The model's opset of the default domain (``''`` or ``'ai.onnx'``); None if it
    imports none. Of several imports of it, the last, as onnx's checker and
    onnxruntime take it."""
    versions = [o.version for o in model.opset_import if is_default_domain(o.domain)]
    return versions[-1] if versions else None


def node_label(node: onnx.NodeProto) -> str:
    """How errors name a node: ``LSTM node 'name'``."""
    return f"{node.op_type} node {node.name!r}"


def check_opset_imports(model: onnx.ModelProto) -> None:
    """The model imports an opset, and the default domain's where a node of that domain
    is in it (any graph): onnxruntime refuses a model that imports none ("Missing opset
    in the model"); without the default domain's version, which version of each
    operator a node is (a GRU-1 computes otherwise than a GRU-7) cannot be told.

    Raises
    ------
    ValueError
        No opset import at all; or a node of the default domain and no import of
        ``''`` or ``'ai.onnx'`` (the message names the nodes and the imports there
        are).
    """
    fix = "add the one the model was made for, e.g. onnx.helper.make_opsetid('', 22)"
    if not model.opset_import:
        raise RecurrentError(
            "model: it imports no opset (its opset_import is empty), which onnxruntime "
            f"refuses too: {fix}"
        )
    if opset_version(model) is not None:
        return
    users = [node_label(node) for _, node in walk(model.graph) if is_default_domain(node.domain)]
    if users:
        more = f" and {len(users) - 3} more" if len(users) > 3 else ""
        imports = ", ".join(f"{o.domain!r} {o.version}" for o in model.opset_import)
        raise RecurrentError(
            "model: no opset import for the default domain ('' or 'ai.onnx'), which "
            f"{', '.join(users[:3])}{more} need(s) (the model imports only {imports}): "
            f"{fix}"
        )


def is_custom_node(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is one of the onnxruntime host's custom nodes."""
    return node.domain == CUSTOM_DOMAIN and node.op_type in CUSTOM_OPS.values()


def check_no_custom_nodes(model: onnx.ModelProto) -> None:
    """The model holds none of the onnxruntime host's custom nodes: such a node names
    its weights by a key of the process that made it (earlier onnx-recurrent let
    onnxruntime write such nodes to ``sess_options.optimized_model_filepath``), so it
    can be run nowhere else.

    Raises
    ------
    ValueError
        A custom node in any graph or local function (the message names it).
    """
    nodes = [node for _, node in walk(model.graph)]
    nodes += [node for f in model.functions for _, node in walk(onnx.GraphProto(node=f.node))]
    for node in nodes:
        if is_custom_node(node):
            raise RecurrentError(
                f"model: node {node.name!r} is {node.op_type} ({CUSTOM_DOMAIN}), a "
                "recurrent node as one onnx-recurrent session's process hosts it; its "
                "weights are not in the model, so no other process can run it (earlier "
                "onnx-recurrent wrote such nodes to sess_options.optimized_model_filepath): "
                "load the original model"
            )


def node_version(op: str, opset: int) -> int:
    """The version of operator ``op`` that a model of ``opset`` runs.

    Raises
    ------
    ValueError
        No version of ``op`` is as old as ``opset``; or ``opset`` is newer than the
        opsets the installed onnx knows, or selects a version of ``op`` newer than
        those onnx-recurrent implements (it may compute something else).
    """
    versions = ", ".join(map(str, VERSIONS[op]))
    latest = onnx.defs.onnx_opset_version()
    if opset > latest:
        raise RecurrentError(
            f"the model imports opset {opset}, newer than any the installed onnx "
            f"{onnx.__version__} knows (up to {latest}): its {op} may differ from the "
            f"versions onnx-recurrent implements ({op} {versions})"
        )
    known = [v for v in VERSIONS[op] if v <= opset]
    if not known:
        raise RecurrentError(f"{op} has no version <= opset {opset}")
    since = onnx.defs.get_schema(op, opset).since_version
    if since > max(known):
        raise RecurrentError(
            f"opset {opset} selects {op}-{since}, newer than the versions onnx-recurrent "
            f"implements ({op} {versions})"
        )
    return max(known)


#: the default domain's operators whose attributes hold graphs
GRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held by a node's attributes (``If`` branches, ``Loop``/``Scan`` bodies;
    any attribute of another domain's operator)."""
    if node.domain in ("", "ai.onnx") and node.op_type not in GRAPH_OPS:
        return  # reading every node's attributes through protobuf: ms a model
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def walk(graph: onnx.GraphProto) -> Iterator[tuple[onnx.GraphProto, onnx.NodeProto]]:
    """Every node of ``graph`` and of its subgraphs, each with the graph that holds it."""
    for node in graph.node:
        yield graph, node
        for sub in subgraphs(node):
            yield from walk(sub)


def all_graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every graph nested in it, at any depth."""
    return [graph] + [sub for _, node in walk(graph) for sub in subgraphs(node)]


def walk_paths(
    graph: onnx.GraphProto, path: tuple[str, ...] = ()
) -> Iterator[tuple[onnx.NodeProto, tuple[str, ...], int]]:
    """``(node, path, index)`` for every node of ``graph`` and of its subgraphs.

    ``path`` names the enclosing nodes (``()`` at the top level); ``index`` is the
    node's position in its graph.
    """
    for index, node in enumerate(graph.node):
        yield node, path, index
        for sub in subgraphs(node):
            yield from walk_paths(sub, (*path, node.name or f"{node.op_type}_{index}"))


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every name used in ``graph`` and its subgraphs: tensors, nodes, values."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names |= {v.name for v in (*g.input, *g.output, *g.value_info)}
        names |= {t.name for t in g.initializer}
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


class Namer:
    """Fresh names in a model: ``base``, else ``base_1``, ``base_2``, ..."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.taken = all_names(model.graph)

    def __call__(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def with_functions_inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy with its model-local functions inlined where one holds a
    recurrent node (so that the node is seen, bound and streamed as any other).

    Raises
    ------
    ValueError
        (``RecurrentError``) such a function, and an onnx without ``onnx.inliner``.
    """
    body = onnx.GraphProto()  # the functions' nodes, to walk with their subgraphs
    for function in model.functions:
        body.node.extend(function.node)
    if not any(
        node.op_type in RECURRENT_OPS and is_default_domain(node.domain) for _, node in walk(body)
    ):
        return model
    try:
        from onnx.inliner import inline_local_functions
    except ImportError:  # an onnx older than the project asks for
        raise RecurrentError(
            "the model has recurrent nodes inside local functions, which need "
            f"onnx.inliner to be computed (onnx {onnx.__version__} has none: "
            "pip install -U onnx)"
        ) from None
    return inline_local_functions(_with_function_defaults(model))


def _with_function_defaults(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy in which every call of a local function gives the
    attributes the function declares with a default (``attribute_proto``) and the call
    leaves out: onnx's inliner drops those defaults (onnx 1.23), and a node inside
    would take its operator's default instead (a GRU's ``direction``, silently)."""
    defaults = {
        (f.domain, f.name, f.overload): f.attribute_proto
        for f in model.functions
        if f.attribute_proto
    }
    if not defaults:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graphs = [out.graph, *(f for f in out.functions)]
    for graph in graphs:
        for _, node in walk(graph):
            declared = defaults.get((node.domain, node.op_type, node.overload), ())
            given = {a.name for a in node.attribute}
            node.attribute.extend(a for a in declared if a.name not in given)
    return out


def hosted(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as the session binds and hosts it: a copy where needed (the caller's
    proto is never changed), in which

    - model-local functions are inlined where one holds a recurrent node (which then
      runs as onnx-recurrent's, as any other);
    - of a graph's initializers of one name, the first is kept (onnxruntime's);
    - every value has one name across the model: ONNX lets sibling scopes (an ``If``'s
      two branches, two ``Loop`` bodies) define the same names, with other values
      (initializers) and nodes; a subgraph's name defined earlier elsewhere is renamed
      there, so that a node's key and a constant's name stand for one thing;
    - a subgraph output declared without a shape has the shape ONNX inference gives
      it, as onnxruntime infers it for itself: a ``Loop`` of zero iterations gives its
      scan output that shape (a recurrent node's output has none under either host).
    """
    given = model
    model = with_functions_inlined(model)  # a new proto where it inlines anything

    def own() -> onnx.ModelProto:
        """The model to change: the caller's copied, once."""
        nonlocal model
        if model is given:
            copy = onnx.ModelProto()
            copy.CopyFrom(given)
            model = copy
        return model

    if any(_repeats_initializers(g) for g in all_graphs(model.graph)):
        for graph in all_graphs(own().graph):
            if _repeats_initializers(graph):  # onnxruntime takes the first
                first = list(initializer_tensors(graph, set()).values())
                del graph.initializer[:]
                graph.initializer.extend(first)
    seen: set[str] = set()
    repeated = False
    for graph in all_graphs(model.graph):
        for name in _defined(graph):
            repeated |= name in seen
            seen.add(name)
    if repeated:
        mine = own()
        _distinct(mine.graph, {}, set(), Namer(mine))
    _give_subgraph_outputs_shapes(model, own)
    return model


def _repeats_initializers(graph: onnx.GraphProto) -> bool:
    """Whether ``graph`` holds initializers of one name (the checker refuses that)."""
    return len({t.name for t in graph.initializer}) < len(graph.initializer)


def _give_subgraph_outputs_shapes(
    model: onnx.ModelProto, own: Callable[[], onnx.ModelProto]
) -> None:
    """The subgraph outputs of ``model`` declared without a shape given the inferred one
    (where inference gives one), in ``own()``: ``model`` itself or its copy."""

    def shapeless(graph: onnx.GraphProto) -> list[int]:
        return [
            i
            for i, v in enumerate(graph.output)
            if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
        ]

    if not any(shapeless(g) for g in all_graphs(model.graph)[1:]):
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a requirement
        return
    pairs = zip(all_graphs(own().graph)[1:], all_graphs(inferred.graph)[1:], strict=True)
    for graph, known in pairs:
        for i in shapeless(graph):
            got = known.output[i].type
            if got.HasField("tensor_type") and got.tensor_type.HasField("shape"):
                graph.output[i].type.tensor_type.shape.CopyFrom(got.tensor_type.shape)


def _defined(graph: onnx.GraphProto) -> list[str]:
    """The names ``graph`` itself defines: inputs, initializers, node outputs (each
    once: an overridable initializer is an input as well)."""
    names = [v.name for v in graph.input]
    names += [t.name for t in graph.initializer]
    names += [t.values.name for t in graph.sparse_initializer]
    names += [out for node in graph.node for out in node.output]
    return list(dict.fromkeys(n for n in names if n))  # an input that is an initializer too


def _distinct(graph: onnx.GraphProto, outer: dict[str, str], taken: set[str], fresh) -> None:
    """Rename, in ``graph`` and below, the names defined in an earlier scope (``taken``);
    ``outer``: the renames visible from enclosing graphs."""
    renames = dict(outer)
    for name in _defined(graph):
        if name in taken:
            renames[name] = fresh(name)
        else:
            taken.add(name)
            renames.pop(name, None)

    def rename(names) -> None:
        for i, name in enumerate(names):
            if name in renames:
                names[i] = renames[name]

    for values in (graph.input, graph.output, graph.value_info):
        for v in values:
            v.name = renames.get(v.name, v.name)
    for t in graph.initializer:
        t.name = renames.get(t.name, t.name)
    for t in graph.sparse_initializer:
        t.values.name = renames.get(t.values.name, t.values.name)
    for node in graph.node:
        rename(node.input)
        rename(node.output)
        for sub in subgraphs(node):
            _distinct(sub, renames, taken, fresh)


@dataclass(frozen=True)
class RecurrentNode:
    """A GRU, RNN or LSTM node of a model and the version its opset selects."""

    node: onnx.NodeProto
    graph: onnx.GraphProto
    version: int

    @property
    def op(self) -> str:
        return self.node.op_type

    @property
    def label(self) -> str:
        """How errors name the node: ``LSTM node 'name'``."""
        return node_label(self.node)

    def input(self, name: str) -> str:
        """The tensor name feeding spec input ``name`` ('' if absent)."""
        position = INPUTS[self.op].index(name)
        inputs = self.node.input
        return inputs[position] if position < len(inputs) else ""

    def output(self, position: int) -> str:
        outputs = self.node.output
        return outputs[position] if position < len(outputs) else ""


def recurrent_nodes(model: onnx.ModelProto) -> list[RecurrentNode]:
    """Every recurrent node, top level first, then inside subgraphs (depth first).

    Raises
    ------
    ValueError
        A recurrent node whose operator has no version as old as the model's opset,
        of an opset newer than the installed onnx knows or selecting a version newer
        than onnx-recurrent implements, or in a model that imports no opset of the
        default domain; the message names the node (``GRU node 'gru1': ...``).
    """
    opset = opset_version(model)
    found = []
    for graph, node in walk(model.graph):
        if node.op_type not in VERSIONS or not is_default_domain(node.domain):
            continue
        if opset is None:
            raise RecurrentError(
                f"{node_label(node)}: the model imports no opset of the default domain "
                "('' or 'ai.onnx'), so which version of the operator the node is cannot "
                "be told: add the one the model was made for, e.g. "
                "onnx.helper.make_opsetid('', 22)"
            )
        try:
            version = node_version(node.op_type, opset)
        except RecurrentError as e:
            raise RecurrentError(f"{node_label(node)}: {e}") from None
        found.append(RecurrentNode(node, graph, version))
    return found


_TYPE_NAMES = {
    onnx.AttributeProto.FLOAT: "FLOAT",
    onnx.AttributeProto.INT: "INT",
    onnx.AttributeProto.STRING: "STRING",
    onnx.AttributeProto.FLOATS: "FLOATS",
    onnx.AttributeProto.INTS: "INTS",
    onnx.AttributeProto.STRINGS: "STRINGS",
    onnx.AttributeProto.TENSOR: "TENSOR",
    onnx.AttributeProto.GRAPH: "GRAPH",
    onnx.AttributeProto.UNDEFINED: "UNDEFINED",
}


def _decoded(value, name: str):
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise RecurrentError(f"attribute {name!r} is not UTF-8 text: {value!r}") from None
    if isinstance(value, list):
        return [_decoded(v, name) for v in value]
    return value


def attributes(node: onnx.NodeProto) -> dict:
    """Every attribute the node sets, as Python values (strings decoded), unchecked.

    Raises
    ------
    ValueError
        A string attribute that is not UTF-8 text.
    """
    return {a.name: _decoded(get_attribute_value(a), a.name) for a in node.attribute}


def node_attributes(op: str, version: int, node: onnx.NodeProto) -> dict:
    """The node's attributes as keywords of :func:`~onnx_recurrent.gru` and the others.

    Only the attributes the node sets (the schemas' defaults are not all the spec's);
    ``output_sequence`` dropped; GRU-1's ``'foward'`` (its schema's default) read as
    ``'forward'``, which other operators and versions refuse, as onnxruntime does.

    Raises
    ------
    ValueError
        An attribute the operator's version does not have, or of another type than
        its schema's (as the onnx checker has it: ``clip`` a float, ``hidden_size`` an
        int, ``direction`` a string, ...), set more than once, or holding its value
        in the field of another type (which the checker and onnxruntime refuse); an
        attribute that refers to a function's (``ref_attr_name``) outside a function.
    """
    schema = onnx.defs.get_schema(op, version)
    names = [a.name for a in node.attribute]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RecurrentError(
            f"attribute(s) {twice} set more than once (onnx's checker and onnxruntime "
            "refuse such a node)"
        )
    unknown = {a.name for a in node.attribute} - set(schema.attributes)
    if unknown:
        raise RecurrentError(
            f"unknown attribute(s) {sorted(unknown)}; "
            f"{op}-{version} has {sorted(schema.attributes)}"
        )
    for a in node.attribute:
        expected = schema.attributes[a.name].type
        if a.type != expected:
            raise RecurrentError(
                f"attribute {a.name!r} must be of type {_TYPE_NAMES.get(expected, expected)} "
                f"(the {op}-{version} schema), got {_TYPE_NAMES.get(a.type, a.type)}"
            )
        if a.ref_attr_name:  # a function's node (inlined before this)
            raise RecurrentError(
                f"attribute {a.name!r} refers to a function's attribute "
                f"({a.ref_attr_name!r}) outside any function"
            )
        try:  # its value in the field of its type, and in no other
            onnx.checker.check_attribute(a, onnx.checker.DEFAULT_CONTEXT)
        except onnx.checker.ValidationError as e:
            raise RecurrentError(
                f"{one_line(e, typed=False).rstrip('.')} (onnx's checker and onnxruntime "
                "refuse it)"
            ) from None
    given = attributes(node)
    if "output_sequence" in given:  # versions 1 and 3: Y is made whenever named
        check_flag("output_sequence", given.pop("output_sequence"))
    direction = given.get("direction")
    if (op, version) == ("GRU", 1) and str(direction).lower() == "foward":  # its schema's
        given["direction"] = "forward"
    return given


def check_required_outputs(op: str, version: int, node: onnx.NodeProto) -> None:
    """The outputs the operator's version requires are named (GRU-1's ``Y_h``: the
    later versions make every output optional).

    Raises
    ------
    ValueError
        A required output absent or named ``''`` (onnx's checker and onnxruntime
        refuse such a node).
    """
    for position, output in enumerate(onnx.defs.get_schema(op, version).outputs):
        if output.option != onnx.defs.OpSchema.FormalParameterOption.Single:
            continue
        if position >= len(node.output) or not node.output[position]:
            given = "''" if position < len(node.output) else f"absent ({len(node.output)} outputs)"
            raise RecurrentError(
                f"output {position} ({output.name}) is required by {op}-{version}, got "
                f"{given} (onnx's checker and onnxruntime refuse such a node)"
            )


def check_element_type(op: str, version: int, dtype: np.dtype) -> None:
    """``X``'s element type is one the operator's version takes: bfloat16 from version
    22 (the earlier schemas list float16, float and double).

    Raises
    ------
    onnx_recurrent.errors.RecurrentTypeError
        bfloat16 for a version before 22, naming both.
    """
    if is_bfloat16(dtype) and version < 22:
        raise RecurrentTypeError(
            f"X: bfloat16 needs {op} version 22, this node is version {version}"
        )


def overridable_initializers(model: onnx.ModelProto) -> list[str]:
    """The main graph's inputs that are also initializers, in graph order: onnxruntime's
    *overridable initializers*, which a caller may feed (the feed replaces the
    initializer's value for that run). Only from IR version 4: before, every
    initializer had to be listed as an input too, and onnxruntime takes them all as
    constants."""
    if model.ir_version < 4:
        return []
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name in initializers]


def initializer_tensors(graph: onnx.GraphProto, fed: set[str]) -> dict[str, onnx.TensorProto]:
    """``graph``'s initializers by name, but those ``fed`` (an overridable initializer is
    a default the caller may replace: not a constant); of two of one name, the first
    (onnxruntime's)."""
    found: dict[str, onnx.TensorProto] = {}
    for t in graph.initializer:
        if t.name not in fed:
            found.setdefault(t.name, t)
    return found


def is_random(node: onnx.NodeProto) -> bool:
    """Whether ``node`` draws random numbers: a random operator, or a ``Dropout`` given
    a ``training_mode`` input."""
    if node.op_type == "Dropout":
        return len(node.input) > 2 and bool(node.input[2])
    return node.op_type in _RANDOM


#: element types whose ``int32_data`` holds 16-bit patterns
_16_BIT = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})


def tensor_array(tensor: onnx.TensorProto, what: str = "") -> np.ndarray:
    """A tensor's value as an array (``what`` names it in errors, by default by its
    name).

    Raises
    ------
    ValueError
        The tensor's data cannot be read: an unknown element type, a negative dim, data
        that disagree with its dims or type (a float16 or bfloat16 value outside 16
        bits), or data in an external file that was not read (the message names the
        tensor).
    """
    what = what or f"tensor {tensor.name!r}"
    if tensor.data_type not in onnx.TensorProto.DataType.values():
        raise RecurrentError(f"{what} has an unknown element type {tensor.data_type}")
    if any(d < 0 for d in tensor.dims):  # numpy would read -1 as "the rest"
        raise RecurrentError(
            f"{what} has a negative dim: dims {list(tensor.dims)} (onnxruntime refuses it)"
        )
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        raise RecurrentError(
            f"{what} keeps its data in an external file ({location!r}) that was not read: "
            "give the model's path, or the model as onnx.load read it from its path"
        )
    held = np.asarray(tensor.int32_data if tensor.data_type in _16_BIT else [], np.int64)
    if ((held < 0) | (held > 0xFFFF)).any():
        bad = held[(held < 0) | (held > 0xFFFF)][0]
        raise RecurrentError(
            f"{what} ({onnx.TensorProto.DataType.Name(tensor.data_type)}) holds {bad} in "
            "int32_data, where each value is 16 bits, 0 to 65535 (onnxruntime: data overflow)"
        )
    try:
        return numpy_helper.to_array(tensor)
    except TimeoutError:  # a timer's handler raised here: the caller's, not the data's
        raise
    except Exception as e:  # numpy's and onnx's errors for data that do not fit
        type_name = onnx.TensorProto.DataType.Name(tensor.data_type)
        raise RecurrentError(
            f"{what} ({type_name}, dims {list(tensor.dims)}) cannot be read: {e}"
        ) from None


def node_model(
    op: str | onnx.NodeProto,
    feeds: Mapping[str, np.ndarray],
    attributes: Mapping[str, Any] | None = None,
    *,
    outputs: Sequence[str] | None = None,
    output_types: Sequence[tuple[int, Sequence | None]] | None = None,
    shapes: Mapping[str, Sequence] | None = None,
    constants: Iterable[str] = (),
    opset: int = 22,
    ir_version: int | None = 8,
    name: str = "",
) -> onnx.ModelProto:
    """A model of one recurrent node (GRU, RNN, LSTM) whose inputs are ``feeds``.

    Parameters
    ----------
    op : str or onnx.NodeProto
        The operator: its node is made, named ``name``, with ``attributes``, its inputs
        the names of ``feeds`` in the operator's order (an optional one absent: '').
        Or a node, taken as it is (its inputs named as ``feeds`` are).
    feeds : mapping of str to numpy.ndarray
        The node's inputs: graph inputs of their element type and shape.
    outputs : sequence of str, optional
        The node's outputs ('' skips one); by default all of the operator's.
    output_types : sequence of (element type, shape), optional
        One per output (a shape None: not given); by default X's element type and no
        shape.
    shapes : mapping of str to shape, optional
        The graph input's shape for these feeds (symbolic dims as strings or None).
    constants : iterable of str
        The feeds kept as initializers rather than graph inputs.
    opset : int, default 22
        The default domain's version imported.
    ir_version : int or None, default 8
        None: the lowest that ``opset`` allows.

    Returns
    -------
    onnx.ModelProto
    """
    if isinstance(op, onnx.NodeProto):
        node = op
    else:
        order = CELLS[op].inputs
        last = max(order.index(n) for n in feeds)
        node_inputs = [n if n in feeds else "" for n in order[: last + 1]]
        outputs = CELLS[op].outputs if outputs is None else outputs
        node = onnx.helper.make_node(op, node_inputs, list(outputs), name, **(attributes or {}))
    constants, shapes = set(constants), shapes or {}
    x_type = onnx.helper.np_dtype_to_tensor_dtype(feeds[node.input[0]].dtype)
    if output_types is None:
        output_types = [(x_type, None)] * len(node.output)
    graph = onnx.helper.make_graph(
        [node],
        f"{node.op_type}_node",
        [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), shapes.get(n, v.shape)
            )
            for n, v in feeds.items()
            if n not in constants
        ],
        [
            onnx.helper.make_tensor_value_info(n, elem, shape)
            for n, (elem, shape) in zip(node.output, output_types, strict=True)
            if n
        ],
        initializer=[numpy_helper.from_array(feeds[n], n) for n in feeds if n in constants],
    )
    imports = [onnx.helper.make_opsetid("", opset)]
    if ir_version is None:
        try:
            ir_version = onnx.helper.find_min_ir_version_for(imports)
        except ValueError:  # onnx's table lacks opsets 2-4 (onnx 1.1-1.2: IR version 3)
            if not 1 <= opset <= 6:
                raise
            ir_version = 3
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type, as declared, inferred or held by a
    ``Constant`` (names whose type cannot be told are absent)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a requirement
        inferred = model
    types: dict[str, int] = {}

    def note(values: Sequence[onnx.ValueInfoProto]) -> None:
        for v in values:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type

    for g in all_graphs(inferred.graph):
        note(g.input)
        note(g.output)
        note(g.value_info)
        for t in g.initializer:
            types[t.name] = t.data_type
        for node in g.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value":
                        types[node.output[0]] = a.t.data_type
    return types


def _liveness(
    graph: onnx.GraphProto, keep: frozenset[tuple[str, ...]]
) -> tuple[set[int], set[str]]:
    """The indices of ``graph``'s nodes that :func:`prune` keeps, and the names they
    and the graph's outputs read (outer-scope ones included); nothing is changed.

    Passes from the outputs back until none keeps another node: one, and one to
    confirm it, where the nodes are in topological order (a main graph may list them
    in any order: onnxruntime sorts it)."""
    used = {o.name for o in graph.output}
    kept: set[int] = set()
    grown = True
    while grown:
        grown = False
        for index in reversed(range(len(graph.node))):
            if index in kept:
                continue
            node = graph.node[index]
            subs = list(subgraphs(node))
            if (
                subs
                or is_random(node)
                or not is_default_domain(node.domain)
                or tuple(node.output) in keep
                or any(o in used for o in node.output)
            ):
                kept.add(index)
                grown = True
                used.update(node.input)
                for sub in subs:
                    used |= _liveness(sub, keep)[1]
    return kept, used


def dead_nodes(graph: onnx.GraphProto) -> frozenset[tuple[str, ...]]:
    """The nodes of ``graph`` and its subgraphs whose outputs nothing uses (those
    :func:`prune` removes), named by their outputs; ``graph`` is not changed."""
    kept, _ = _liveness(graph, frozenset())
    dead = {tuple(node.output) for index, node in enumerate(graph.node) if index not in kept}
    for index in kept:
        for sub in subgraphs(graph.node[index]):
            dead |= dead_nodes(sub)
    return frozenset(dead)


def prune(graph: onnx.GraphProto, keep: frozenset[tuple[str, ...]] = frozenset()) -> set[str]:
    """Remove, in place, the nodes whose outputs nothing uses and the initializers no
    node uses (a bound layer's weights and the nodes that computed them), in ``graph``
    and its subgraphs; return the names it reads (outer-scope ones included).

    Nodes with subgraphs, random ones, those of other domains and those named in
    ``keep`` by their outputs (:func:`dead_nodes` of the model as given: onnxruntime
    checks those) stay; so do the graph inputs (the model's signature: streaming's
    rewrite drops those it replaced)."""
    kept, used = _liveness(graph, keep)
    for index in kept:
        for sub in subgraphs(graph.node[index]):
            prune(sub, keep)
    if len(kept) < len(graph.node):
        keep_nodes = [node for index, node in enumerate(graph.node) if index in kept]
        del graph.node[:]
        graph.node.extend(keep_nodes)
    fed = {i.name for i in graph.input}
    kept_tensors = [t for t in graph.initializer if t.name in used or t.name in fed]
    if len(kept_tensors) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept_tensors)
    return used
