"""The sizes of the free dims of the inputs ``check`` draws at random.

A free dim of an input (named, or unknown: ``--dim`` names it ``INPUT:AXIS``) takes its
``--dim`` value, else the size of a given input (``-i``) that shares it, else the size
the model fixes, else a guess: 1 where a dim of its set is named like a batch, 8
otherwise (one guess for each set of dims the model ties together).

What the model fixes is solved as equalities between dims, read from the shapes that
onnx shape inference gives with the dims known so far substituted (inference carries a
dim through Transpose, Cast, elementwise operators, Unsqueeze, Slice, ...; a dim newly
fixed is substituted and inference runs again, so that a shape computed in the graph
can resolve). The equalities:

- at each GRU, RNN and LSTM node, on the axes its ``layout`` gives them: input_size
  (W's last axis) on X; num_directions (W's first, and the direction) and hidden_size
  (R's last, and the attribute) on the initial states and outputs; one batch_size and
  one seq_length shared by X, the states, ``sequence_lens`` and the outputs;
- the broadcast of elementwise operators (a free dim against a size above 1 or against
  another free dim), the inner dims of MatMul and Gemm, the input channels of Conv.

A dim tied to two different sizes is left to the guess; when the run then fails,
:meth:`Dims.advice` names it with both sizes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from ...cells import CELLS
from ...runtime.graph import (
    INPUTS,
    all_graphs,
    attributes,
    is_default_domain,
    recurrent_nodes,
    subgraphs,
    walk,
)
from ...runtime.session import NodeArg
from ..arguments import dim_key, free_dims, with_given_dims

__all__ = ["Dims", "solve_dims"]

#: a dim: a size, a symbol, or unknown
Term = int | str | None

#: inference and solving run at most this many times (each round substitutes new sizes)
_ROUNDS = 4

#: the roles of a recurrent node's inputs' and outputs' axes, by layout
_AXES = {
    0: {
        "X": ("seq", "batch", "input"),
        "initial_h": ("dirs", "batch", "hidden"),
        "initial_c": ("dirs", "batch", "hidden"),
        "sequence_lens": ("batch",),
        "Y": ("seq", "dirs", "batch", "hidden"),
        "Y_h": ("dirs", "batch", "hidden"),
        "Y_c": ("dirs", "batch", "hidden"),
    },
    1: {
        "X": ("batch", "seq", "input"),
        "initial_h": ("batch", "dirs", "hidden"),
        "initial_c": ("batch", "dirs", "hidden"),
        "sequence_lens": ("batch",),
        "Y": ("batch", "seq", "dirs", "hidden"),
        "Y_h": ("batch", "dirs", "hidden"),
        "Y_c": ("batch", "dirs", "hidden"),
    },
}
_ROLES = {
    "seq": "seq_length",
    "batch": "batch_size",
    "input": "input_size",
    "dirs": "num_directions",
    "hidden": "hidden_size",
}
_OUTPUTS = max((cell.outputs for cell in CELLS.values()), key=len)  # every operator's: a prefix

#: operators whose inputs broadcast against each other (numpy style)
_BROADCAST = frozenset(
    "Add Sub Mul Div Pow Mod Max Min Sum Mean Where PRelu BitShift Equal Less LessOrEqual "
    "Greater GreaterOrEqual And Or Xor BitwiseAnd BitwiseOr BitwiseXor".split()
)

#: how our own errors name a recurrent node and its input: "LSTM node 'lstm': X must"
_OUR_ERROR = re.compile(r"(GRU|RNN|LSTM) node '(.*?)': (\w+) ")


@dataclass
class Dims:
    """The sizes chosen for the free dims of the inputs drawn at random, and why.

    Attributes
    ----------
    values : dict of str to int
        Every free dim of those inputs, by its ``--dim`` name.
    inferred : dict of str to str
        Those the model fixes, with what fixes them.
    guessed : list of str
        Those neither given nor fixed by the model.
    places : dict of str to list of (str, int)
        The (input, axis) pairs each free dim sizes.
    conflicts : dict of str to dict of int to str
        Guessed dims the model ties to two sizes or more, with what ties them.
    """

    values: dict[str, int] = field(default_factory=dict)
    inferred: dict[str, str] = field(default_factory=dict)
    guessed: list[str] = field(default_factory=list)
    places: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    conflicts: dict[str, dict[int, str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """What to tell before the run: the dims inferred, with why, and the guesses."""
        lines = [f"dim {k}={self.values[k]}: {why}" for k, why in self.inferred.items()]
        if self.guessed:
            sizes = ", ".join(f"{k}={self.values[k]}" for k in self.guessed)
            lines.append(f"dims guessed: {sizes} (--dim NAME=VALUE sets them)")
        return lines

    def advice(self, error: BaseException, model: onnx.ModelProto) -> str | None:
        """For a run that failed with ``error``, which ``--dim`` to pass: the guessed
        dims of the inputs the failing recurrent node's input comes from (of every drawn
        input when the error names no such node); None when nothing was guessed."""
        keys = list(self.guessed)
        upstream = _failing_sources(str(error), model)
        if upstream:
            near = [k for k in keys if any(name in upstream for name, _ in self.places[k])]
            keys = near or keys
        if not keys:
            return None
        items = []
        for k in keys:
            where = ", ".join(f"input {name!r} axis {axis}" for name, axis in self.places[k])
            item = f"--dim {k}=VALUE ({where}, drawn as {self.values[k]}"
            if k in self.conflicts:
                ties = "; ".join(f"{size}: {why}" for size, why in self.conflicts[k].items())
                item += f"; the model ties it to {ties}"
            items.append(item + ")")
        return "the run failed on random inputs whose dims were guessed: pass " + " or ".join(
            items
        )


def solve_dims(
    model: onnx.ModelProto,
    inputs: Sequence[NodeArg],
    given: Mapping[str, int],
    feeds: Mapping[str, np.ndarray],
) -> Dims:
    """The sizes of the free dims of the ``inputs`` not in ``feeds``.

    Parameters
    ----------
    model : onnx.ModelProto
    inputs : sequence of NodeArg
        The model's inputs (those of :meth:`InferenceSession.get_inputs`).
    given : dict of str to int
        ``--dim`` values, by ``--dim`` name (:func:`~onnx_recurrent.tools.arguments.dim_key`).
    feeds : dict of str to ndarray
        The inputs given (``-i``): their shapes size the dims they share.

    Returns
    -------
    Dims
    """
    places = free_dims(inputs)
    drawn = free_dims([a for a in inputs if a.name not in feeds])
    named = {d for a in inputs for d in a.shape or [] if isinstance(d, str)}
    fixed = with_given_dims(given, inputs, feeds)
    dims = Dims(places={k: places[k] for k in drawn})
    if all(k in fixed for k in drawn):
        dims.values = {k: fixed[k] for k in drawn}
        return dims
    ties = _Ties()
    for _ in range(_ROUNDS):
        ties = _tie(_inferred(model, inputs, fixed))
        new = {}
        for key in places:
            sizes = ties.sizes(key) if key not in fixed else {}
            if len(sizes) == 1:
                [(size, why)] = sizes.items()
                new[key] = size
                if key in drawn:
                    dims.inferred[key] = why
            elif len(sizes) > 1 and key in drawn:
                dims.conflicts[key] = sizes
        if not new:
            break
        fixed.update(new)
    guesses: dict[str, int] = {}
    for key in drawn:
        if key in fixed:
            dims.values[key] = fixed[key]
            continue
        group = ties.find(key)
        if group not in guesses:
            together = [k for k in places if k not in fixed and ties.find(k) == group]
            batch = any(k in named and "batch" in k.lower() for k in together)
            guesses[group] = 1 if batch else 8
        dims.values[key] = guesses[group]
        dims.guessed.append(key)
    dims.conflicts = {k: v for k, v in dims.conflicts.items() if k in dims.guessed}
    return dims


class _Ties:
    """Sets of symbols known equal (union-find), each with the sizes it is tied to and,
    for each size, the first reason given."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.known: dict[str, dict[int, str]] = {}

    def find(self, symbol: str) -> str:
        parent = self.parent.setdefault(symbol, symbol)
        while parent != symbol:
            grand = self.parent[parent]
            self.parent[symbol] = grand
            symbol, parent = parent, grand
        return symbol

    def sizes(self, symbol: str) -> dict[int, str]:
        return self.known.get(self.find(symbol), {})

    def tie(self, a: Term, b: Term, why: str) -> None:
        """``a`` and ``b`` are equal (``why`` says so when one is a size)."""
        if a is None or b is None or (isinstance(a, int) and isinstance(b, int)):
            return
        if isinstance(a, int):
            a, b = b, a
        root = self.find(a)
        if isinstance(b, int):
            if b > 0:  # a size of 0 or below is nothing to draw
                self.known.setdefault(root, {}).setdefault(b, why)
            return
        other = self.find(b)
        if other != root:
            self.parent[other] = root
            merged = self.known.setdefault(root, {})
            for size, reason in self.known.pop(other, {}).items():
                merged.setdefault(size, reason)


def _inferred(
    model: onnx.ModelProto, inputs: Sequence[NodeArg], fixed: Mapping[str, int]
) -> onnx.ModelProto:
    """A copy of ``model`` with the ``fixed`` sizes in its inputs' shapes, the other
    free dims named by their ``--dim`` names, and onnx shape inference run on it (the
    copy as it is where inference fails)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    wanted = {a.name for a in inputs}
    for v in copy.graph.input:
        if v.name not in wanted or not v.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(v.type.tensor_type.shape.dim):
            key = dim_key(v.name, axis, _term(d))
            if key is None:
                continue
            if key in fixed:
                d.dim_value = fixed[key]
            else:
                d.dim_param = key
    try:
        return onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except Exception:  # inference is a help (a model over 2 GB, an op it rejects)
        return copy


def _term(d: onnx.TensorShapeProto.Dimension) -> Term:
    if d.HasField("dim_value"):
        return d.dim_value
    return d.dim_param or None


def _shapes(model: onnx.ModelProto) -> dict[str, list[Term]]:
    """Tensor name -> its dims as declared, inferred, or held by an initializer or a
    ``Constant`` (names of unknown rank absent)."""
    shapes: dict[str, list[Term]] = {}
    for g in all_graphs(model.graph):
        for v in (*g.input, *g.value_info, *g.output):
            if v.type.tensor_type.HasField("shape"):
                shapes[v.name] = [_term(d) for d in v.type.tensor_type.shape.dim]
        for t in g.initializer:
            shapes[t.name] = list(t.dims)
        for node in g.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value":
                        shapes[node.output[0]] = list(a.t.dims)
    return shapes


def _tie(model: onnx.ModelProto) -> _Ties:
    """The equalities between the dims of ``model`` (see the module's docstring)."""
    shapes = _shapes(model)
    ties = _Ties()
    for k, rec in enumerate(recurrent_nodes(model)):
        _tie_recurrent(ties, shapes, rec, f"\0{k}:")
    for _, node in walk(model.graph):
        if not is_default_domain(node.domain):
            continue
        label = f"{node.op_type} node {node.name!r}"
        ins = [shapes.get(name) if name else None for name in node.input]
        if node.op_type in _BROADCAST:
            named = [(n, s) for n, s in zip(node.input, ins, strict=True) if s is not None]
            _tie_broadcast(ties, named, label)
        elif node.op_type in ("MatMul", "Gemm", "Conv") and len(ins) >= 2:
            a, b = ins[0], ins[1]
            if not a or not b:
                continue
            attrs = {x.name: x.i for x in node.attribute if x.type == onnx.AttributeProto.INT}
            if node.op_type == "MatMul":
                ties.tie(a[-1], b[-2] if len(b) > 1 else b[0], f"inner dim of {label}")
            elif node.op_type == "Gemm" and len(a) == len(b) == 2:
                inner_b = b[1 if attrs.get("transB") else 0]
                ties.tie(a[0 if attrs.get("transA") else 1], inner_b, f"inner dim of {label}")
            elif node.op_type == "Conv" and len(a) > 1 and len(b) > 1:
                group = attrs.get("group", 1)
                channels = b[1] * group if isinstance(b[1], int) else None
                ties.tie(a[1], channels, f"input channels of {label} (W's axis 1 x group)")
    return ties


def _tie_recurrent(ties: _Ties, shapes: Mapping[str, list[Term]], rec, var: str) -> None:
    """The dims of a recurrent node's inputs and outputs to its roles (``var`` prefixes
    the symbols of its roles)."""
    attrs = attributes(rec.node)
    layout = attrs.get("layout", 0) if rec.version >= 14 else 0
    label = rec.label
    W = shapes.get(rec.input("W")) or []
    R = shapes.get(rec.input("R")) or []
    if len(W) == 3:
        ties.tie(var + "input", W[2], f"input_size of {label} (W's axis 2)")
        ties.tie(var + "dirs", W[0], f"num_directions of {label} (W's axis 0)")
    if len(R) == 3:
        ties.tie(var + "hidden", R[2], f"hidden_size of {label} (R's axis 2)")
        ties.tie(var + "dirs", R[0], f"num_directions of {label} (R's axis 0)")
    if isinstance(attrs.get("hidden_size"), int):
        ties.tie(var + "hidden", attrs["hidden_size"], f"hidden_size of {label}")
    direction = attrs.get("direction", "forward")
    ties.tie(
        var + "dirs",
        2 if direction == "bidirectional" else 1,
        f"num_directions of {label} (direction {direction!r})",
    )
    names = {spec: rec.input(spec) for spec in INPUTS[rec.op]}
    names |= {spec: rec.output(position) for position, spec in enumerate(_OUTPUTS)}
    for spec, roles in _AXES.get(layout, {}).items():
        shape = shapes.get(names.get(spec, ""))
        if shape is None or len(shape) != len(roles):
            continue
        for axis, (dim, role) in enumerate(zip(shape, roles, strict=True)):
            ties.tie(dim, var + role, f"{_ROLES[role]} of {label} ({spec}'s axis {axis})")


def _tie_broadcast(ties: _Ties, shapes: Sequence[tuple[str, list[Term]]], label: str) -> None:
    """Right-aligned dims of the broadcasting inputs (name, shape) of node ``label``: a
    free dim equals the others' free dims and their sizes above 1."""
    rank = max((len(s) for _, s in shapes), default=0)
    for back in range(1, rank + 1):
        column = [(name, s[-back]) for name, s in shapes if len(s) >= back]
        free = [d for _, d in column if isinstance(d, str)]
        if not free:
            continue
        for name, d in column:
            if isinstance(d, str) or (isinstance(d, int) and d > 1):
                ties.tie(free[0], d, f"broadcast against {name!r} in {label}")


def _failing_sources(message: str, model: onnx.ModelProto) -> set[str]:
    """The tensors upstream of the recurrent node input that our error ``message`` names
    (empty if it names none)."""
    match = _OUR_ERROR.match(message)
    if not match:
        return set()
    op, name, spec = match.groups()
    for rec in recurrent_nodes(model):
        if rec.op == op and rec.node.name == name and spec in INPUTS[op]:
            return _upstream(model, [rec.input(spec)])
    return set()


def _upstream(model: onnx.ModelProto, names: Iterable[str]) -> set[str]:
    """``names`` and every tensor they are computed from (a node with subgraphs reads
    what its subgraphs read)."""
    producers: dict[str, list[str]] = {}
    for _, node in walk(model.graph):
        reads = list(node.input)
        for body in subgraphs(node):
            for inner in all_graphs(body):
                reads += [i for n in inner.node for i in n.input]
        for out in node.output:
            producers[out] = reads
    seen: set[str] = set()
    stack = [n for n in names if n]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack += [i for i in producers.get(name, []) if i and i not in seen]
    return seen
