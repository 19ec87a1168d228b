"""Comparing outputs, the cell step in float64 gate by gate, and the trace of a node
whose ``Y`` differs to its first diverging step and gate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from ... import cells
from ...activations import TABLE, Activation
from ...errors import one_line
from ...runtime.graph import (
    RECURRENT_OPS,
    Namer,
    attributes,
    element_types,
    subgraphs,
    walk,
    walk_paths,
)
from ...runtime.loop import reference_fixes
from ...runtime.reference import reference_ops
from ...spec import RecSpec, make_spec
from .lint import CELLS, bound_activations
from .peers import PEERS

#: gate letters in W order, and the activation slot (0 f, 1 g, 2 h) of each (the cells')
GATES = {name: cell.gates for name, cell in CELLS.items()}


@dataclass(frozen=True)
class Comparison:
    """One output of one peer against onnx-recurrent's."""

    output: str
    peer: str
    max_abs: float | None = None
    max_rel: float | None = None
    exceeds: bool = False
    error: str | None = None
    widened: bool = False  # judged at two of its type's epsilons (float16, bfloat16)


def _excess(ours: np.ndarray, theirs: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Where ``theirs`` leaves ``atol + rtol * |ours|``; where either is not finite,
    where they are not the same (an inf of the same sign, or NaN in both): an inf
    against a finite value was within ``rtol * inf``."""
    a = np.asarray(ours, np.float64)
    b = np.asarray(theirs, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = np.abs(a - b) > atol + rtol * np.abs(a)
    finite = np.isfinite(a) & np.isfinite(b)
    return np.where(finite, bad, ~_same(a, b))


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where ``a`` and ``b`` are equal, NaN and NaN included."""
    return (a == b) | (np.isnan(a) & np.isnan(b))


def compare(
    name: str, peer: str, ours: Any, theirs: Any, atol: float, rtol: float, eps: float = 0.0
) -> Comparison:
    """Max absolute and relative difference of one output (relative to ours): a tensor,
    or a sequence or map through its numbers, whose structure (lengths, keys, shapes)
    and text must be equal. An integer or bool tensor must be equal (ids 30000 apart
    by 30 were within the float tolerances). ``eps``: the epsilon of a 16-bit type the
    output is computed through (:func:`low_precision_upstream`), widened to as its own."""
    if isinstance(ours, np.ndarray) and not isinstance(theirs, list | dict):
        theirs = np.asarray(theirs)
        if theirs.shape != ours.shape:
            shapes = f"shape {list(theirs.shape)}, ours {list(ours.shape)}"
            return Comparison(name, peer, exceeds=True, error=shapes)
    ours_numbers, ours_rest = _walk(ours)
    their_numbers, their_rest = _walk(theirs)
    if ours_rest != their_rest:
        return Comparison(name, peer, exceeds=True, error="not the same structure or text")
    if ours_numbers.size == 0:
        return Comparison(name, peer, 0.0, 0.0)
    a, b = ours_numbers, their_numbers
    ulp = max(low_precision_eps(ours), eps)
    atol, rtol = widened(ours, atol, rtol, eps)
    if isinstance(ours, np.ndarray) and ours.dtype.kind in "iub":
        atol = rtol = 0.0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = np.where(_same(a, b), 0.0, np.abs(a - b))  # the same inf: 0, not inf - inf
        d = np.where(np.isnan(d), np.inf, d)
        rel = np.where(d == 0, 0.0, d / np.abs(a))
        rel = np.where(np.isnan(rel), np.inf, rel)  # inf / inf: ours inf, theirs not
    exceeds = bool(_excess(a, b, atol, rtol).any())
    return Comparison(name, peer, float(d.max()), float(rel.max()), exceeds, widened=ulp > 0)


#: an output of a float type of 16 bits or fewer differs beyond ``atol`` and ``rtol``
#: widened to this many of its machine epsilons (a bfloat16 result rounded once from
#: float32 against a peer's computed in bfloat16, step by step: 1-2 of them off)
LOW_PRECISION_STEPS = 2


def widened(value: Any, atol: float, rtol: float, eps: float = 0.0) -> tuple[float, float]:
    """``atol`` and ``rtol`` for ``value``'s element type: for a float of 16 bits or
    fewer, at least :data:`LOW_PRECISION_STEPS` of its epsilons (or of ``eps``, a 16-bit
    type it was computed through, where larger)."""
    ulp = max(low_precision_eps(value), eps)
    return max(atol, LOW_PRECISION_STEPS * ulp), max(rtol, LOW_PRECISION_STEPS * ulp)


def low_precision_upstream(model: onnx.ModelProto) -> dict[str, float]:
    """Each graph output's largest epsilon of a float16 or bfloat16 recurrent node it
    is computed from (0.0: none), through any nodes: a float32 output of a float16 GRU
    between Casts holds float16 roundings (every peer was called wrong at float32's
    tolerance)."""
    types = element_types(model)

    def own(node: onnx.NodeProto) -> float:  # the node's, or its subgraphs' nodes'
        nodes = [node] + [n for sub in subgraphs(node) for _, n in walk(sub)]
        elements = [
            next((types[i] for i in n.input[:2] if i in types), 0)
            for n in nodes
            if n.op_type in RECURRENT_OPS
        ]
        return max((_LOW_ELEMENTS.get(e, 0.0) for e in elements), default=0.0)

    reached: dict[str, float] = {}
    for node in model.graph.node:
        eps = max([own(node)] + [reached.get(i, 0.0) for i in node.input])
        for o in node.output:
            reached[o] = eps
    return {o.name: reached.get(o.name, 0.0) for o in model.graph.output}


#: the epsilons of the 16-bit element types a recurrent node may have
_LOW_ELEMENTS = {
    onnx.TensorProto.FLOAT16: float(np.finfo(np.float16).eps),
    onnx.TensorProto.BFLOAT16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps),
}


def low_precision_eps(value: Any) -> float:
    """The machine epsilon of ``value``'s element type where it is a float of 16 bits
    or fewer (float16, ml_dtypes' bfloat16 and float8s), else 0."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or dtype.itemsize > 2 or (dtype.kind != "f" and dtype not in _ML_FLOATS):
        return 0.0
    return float(ml_dtypes.finfo(dtype).eps)


#: float types of ml_dtypes (NumPy's kind 'V'), compared as numbers
_ML_FLOATS = {
    np.dtype(getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
}


def _walk(value: Any) -> tuple[np.ndarray, list]:
    """An output's numbers (float64, in order) and the rest of it: the lengths of its
    sequences, its maps' keys, its tensors' shapes and their text (not numbers)."""
    numbers: list[np.ndarray] = []
    rest: list = []

    def visit(v: Any) -> None:
        if isinstance(v, dict):
            rest.append(("map", sorted(v, key=repr)))
            for key in sorted(v, key=repr):
                visit(v[key])
        elif isinstance(v, list | tuple):
            rest.append(("sequence", len(v)))
            for item in v:
                visit(item)
        else:
            array = np.asarray(v)
            # ml_dtypes' bfloat16 and float8s are numbers too, of kind 'V'
            numeric = array.dtype.kind in "biuf" or array.dtype in _ML_FLOATS
            rest.append((array.shape, numeric))
            if numeric:
                numbers.append(array.astype(np.float64).ravel())
            else:
                rest.append(array.ravel().tolist())

    visit(value)
    return (np.concatenate(numbers) if numbers else np.zeros(0)), rest


def _gate_act(spec: RecSpec, op: str, d: int, overrides: Mapping | None = None) -> dict:
    acts = spec.activations[d]
    table = {g: (acts[slot], spec.clip) for g, slot in GATES[op].items()}
    if op == "LSTM":
        table["h(C)"] = (acts[2], None)  # the cell state itself is not clipped
    table.update(overrides or {})
    return table


def cell_step(
    spec: RecSpec,
    d: int,
    x: np.ndarray,
    h: np.ndarray,
    c: np.ndarray | None,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray,
    P: np.ndarray | None = None,
    overrides: Mapping[str, tuple[Activation, float | None]] | None = None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray | None]:
    """One step of one direction for one batch entry, in float64, every gate kept.

    The library's own cell step (:mod:`onnx_recurrent.cells`), watched by a
    :class:`~onnx_recurrent.cells.Probe`.

    Parameters
    ----------
    spec : RecSpec
        The node's attributes (:func:`onnx_recurrent.spec.make_spec`).
    d : int
        The direction (its activations are ``spec.activations[d]``).
    x : (input_size,) ndarray
    h, c : (hidden_size,) ndarray
        The previous hidden (and, for LSTM, cell) state; ``c`` None otherwise.
    W, R, B, P : ndarray
        This direction's weights: ``W[d]``, ``R[d]``, ``B[d]`` (zeros if absent), ``P[d]``.
    overrides : dict of gate letter to (Activation, clip), optional
        Replaces a gate's activation and clip (``"h(C)"``: LSTM's output activation).

    Returns
    -------
    gates : dict of gate letter to (pre-activation, activation)
    h, c : ndarray
        The new states (``c`` None except for LSTM).
    """
    cell = spec.cell

    def f64(a):
        return np.array(a, np.float64)

    w = cell.prepare(spec, f64(W), f64(R), f64(B), None if P is None else f64(P))
    xw = (f64(x) @ w.W.T + w.bias)[None]
    states = (f64(h)[None],) + ((f64(c)[None],) if cell.name == "LSTM" else ())
    probe = cells.Probe(dict(overrides or {}))
    work = cell.workspace(spec, 1, np.dtype(np.float64))
    cell.step(spec, w, spec.activations[d], xw, states, work, probe)
    gates = {g: (pre[0], post[0]) for g, (pre, post) in probe.gates.items()}
    return gates, states[0][0], states[1][0] if len(states) > 1 else None


def _variants(spec: RecSpec, op: str, d: int, bound: Sequence) -> dict[str, dict]:
    """Peer behaviours to try, per gate: label -> {gate: (Activation, clip)}: no clip,
    the default activations, 0 for an unset alpha/beta whose default is not 0."""
    table = _gate_act(spec, op, d)
    n = CELLS[op].n_activations
    defaults = CELLS[op].default_activations
    slots = {**GATES[op], "h(C)": 2} if op == "LSTM" else GATES[op]
    out: dict[str, dict] = {}
    for gate, slot in slots.items():
        act, clip = table[gate]
        if clip is not None:
            out.setdefault("without clip", {})[gate] = (act, None)
        if act.name != defaults[slot]:
            default = Activation(TABLE[defaults[slot].lower()])
            out.setdefault(f"with the default activations {list(defaults)}", {})[gate] = (
                default,
                clip,
            )
        _, alpha_given, beta_given = bound[d * n + slot]
        kind = TABLE.get(act.name.lower())
        if kind is not None and (
            (not alpha_given and kind.alpha) or (not beta_given and kind.beta)
        ):  # an unset parameter whose default is not 0 (onnxruntime: 0, probed by lint)
            zeroed = replace(
                act,
                alpha=act.alpha if alpha_given else 0.0,
                beta=act.beta if beta_given else 0.0,
            )
            out.setdefault("with 0 for the unset alpha/beta", {})[gate] = (zeroed, clip)
    return out


@dataclass
class Divergence:
    """Where a peer's ``Y`` of one node first leaves the tolerance."""

    node: str
    peer: str
    message: str
    step: int | None = None
    direction: int | None = None
    batch: int | None = None
    gate: str | None = None
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{self.node} vs {self.peer}: {self.message}", *(f"  {d}" for d in self.details)]


def _traced_model(
    model: onnx.ModelProto,
) -> tuple[onnx.ModelProto, dict[str, list[str]], list[str]]:
    """A copy whose main-graph recurrent nodes have every output named and a graph
    output; also the nodes' inputs that other nodes compute, made graph outputs (a peer
    may already differ there: then the node is not to blame)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    name = Namer(copy)
    types = element_types(copy)
    outputs = {o.name for o in copy.graph.output}
    computed = {o for node in copy.graph.node for o in node.output if o}
    named: dict[str, list[str]] = {}
    inputs: list[str] = []
    for index, node in enumerate(copy.graph.node):
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        if not node.name:
            node.name = name(f"{node.op_type}_{index}")
        wanted = 3 if node.op_type == "LSTM" else 2
        while len(node.output) < wanted:
            node.output.append("")
        elem = next((types[n] for n in node.input[:3] if n in types), onnx.TensorProto.FLOAT)
        for k, suffix in enumerate(("Y", "Y_h", "Y_c")[:wanted]):
            if not node.output[k]:
                node.output[k] = name(f"{node.name}.{suffix}")
            if node.output[k] not in outputs:
                copy.graph.output.append(helper.make_tensor_value_info(node.output[k], elem, None))
                outputs.add(node.output[k])
        named[node.name] = list(node.output)
        for name_in in node.input:
            if name_in in computed and name_in not in outputs and name_in in types:
                copy.graph.output.append(
                    helper.make_tensor_value_info(name_in, types[name_in], None)
                )
                outputs.add(name_in)
                inputs.append(name_in)
    return copy, named, inputs


def _spec_of(node: onnx.NodeProto, R: np.ndarray) -> RecSpec:
    attrs = attributes(node)
    direction = attrs.get("direction", "forward")
    kwargs = {
        k: attrs.get(k)
        for k in ("hidden_size", "activations", "activation_alpha", "activation_beta", "clip")
    }
    return make_spec(
        CELLS[node.op_type],
        R,
        direction="forward" if direction == "foward" else direction,
        layout=attrs.get("layout", 0),
        linear_before_reset=attrs.get("linear_before_reset", 0),
        input_forget=attrs.get("input_forget", 0),
        **kwargs,
    )


def _first_divergence(spec: RecSpec, bad: np.ndarray, diff: np.ndarray, lens: np.ndarray):
    """The earliest step, in each sequence's processing order, where ``bad`` holds.

    ``bad`` and ``diff`` are ``[T, D, N, H]``. Returns ``(k, t, d, b, order, length)``:
    the step ``t`` is the ``k``-th one processed in direction ``d`` of batch entry ``b``,
    whose steps are ``order`` (the valid ones first, in the direction's order).
    """
    T, D, N, _ = bad.shape
    best = None
    for d in range(D):
        reverse = spec.direction == "reverse" or d == 1
        for b in range(N):
            L = int(lens[b])
            order = [*(range(L - 1, -1, -1) if reverse else range(L)), *range(L, T)]
            k = next((k for k, t in enumerate(order) if bad[t, d, b].any()), None)
            if k is None:
                continue
            key = (k, -float(np.nanmax(diff[order[k], d, b])))
            if best is None or key < best[0]:
                best = (key, (k, order[k], d, b, order, L))
    return best[1]


def _explain(
    spec: RecSpec, node: onnx.NodeProto, d: int, step: Callable
) -> tuple[str | None, list[str]]:
    """Which gate explains a one-step difference, testing the known peer behaviours.

    ``step(overrides, peepholes=True, coupled=True)`` runs :func:`cell_step` from the
    peer's previous state and returns ``(gates, max |h - peer's h|)``. Each behaviour
    (no clip, the default activations, 0 for an unset alpha/beta) is tried on every
    gate at once and on each gate alone, and LSTM's peepholes or input_forget ignored
    on the whole step; the best one that halves the difference explains it, and
    the gate it moves most is the gate that differs most. Returns that gate (None if
    nothing explains the step) and the lines that say so.
    """
    op = node.op_type
    gates, base = step(None)
    lines = [f"recomputed from the peer's previous state, ours differs by {base:.3g} there"]
    candidates = []  # (residual, description, gates under the hypothesis)
    for what, per_gate in _variants(spec, op, d, bound_activations(op, attributes(node))).items():
        scopes = [(f"gate {g}", {g: o}) for g, o in per_gate.items()]
        if len(per_gate) > 1:
            scopes.insert(0, ("every gate", per_gate))
        for scope, override in scopes:
            their_gates, r = step(override)
            candidates.append((r, f"{scope} computed {what}", their_gates))
    if op == "LSTM":  # whole-step behaviours the lint probes too
        if len(node.input) > 7 and node.input[7]:
            their_gates, r = step(None, peepholes=False)
            candidates.append((r, "the peepholes (P) ignored", their_gates))
        if spec.input_forget:
            their_gates, r = step(None, coupled=False)
            candidates.append((r, "input_forget ignored", their_gates))
    candidates.sort(key=lambda cand: cand[0])
    if not candidates or candidates[0][0] >= 0.5 * base:
        spans = ", ".join(f"{g} [{p.min():.3g}, {p.max():.3g}]" for g, (p, _) in gates.items())
        return None, [
            *lines,
            f"no known peer behaviour explains the step; pre-activations: {spans}",
        ]
    r, what, their_gates = candidates[0]
    moved = {g: float(np.max(np.abs(their_gates[g][1] - gates[g][1]))) for g in gates}
    gate = max(moved, key=moved.get)
    pre = gates[gate][0]
    return gate, [
        *lines,
        f"gate differing most: {gate} (activation off by {moved[gate]:.3g}, "
        f"pre-activation in [{pre.min():.3g}, {pre.max():.3g}])",
        f"the peer's step equals ours with {what} (residual {r:.3g})",
    ]


def _trace_node(
    node, spec, values, ours, theirs, peer, atol, rtol, their_inputs=None
) -> Divergence | None:
    """Locate the first divergence of ``theirs`` (the peer's Y, Y_h[, Y_c]) from ours;
    ``their_inputs``: the peer's values of the node's inputs that other nodes compute
    (one that already differs is named, and the node not blamed)."""
    op, label = node.op_type, f"{node.op_type} {node.name!r}"
    atol, rtol = widened(np.asarray(ours[0]), atol, rtol)  # as compare() judges them
    if np.shape(ours[0]) != np.shape(theirs[0]):
        return Divergence(
            label, peer, f"Y has shape {list(np.shape(theirs[0]))}, ours {list(np.shape(ours[0]))}"
        )
    tm = (lambda a: np.asarray(a).transpose(1, 2, 0, 3)) if spec.layout else np.asarray
    Y, Yp = tm(ours[0]).astype(np.float64), tm(theirs[0]).astype(np.float64)
    bad = _excess(Y, Yp, atol, rtol)
    if not bad.any():
        for name, a, b in zip(("Y_h", "Y_c"), ours[1:], theirs[1:], strict=False):
            if np.asarray(a).shape != np.asarray(b).shape or _excess(a, b, atol, rtol).any():
                return Divergence(label, peer, f"Y agrees at every step but {name} differs")
        return None
    roles = CELLS[op].inputs
    for role, name in zip(roles, node.input, strict=False):
        if name and name in (their_inputs or {}):
            mine, theirs_in = np.asarray(values[name]), np.asarray(their_inputs[name])
            if mine.shape != theirs_in.shape or _excess(mine, theirs_in, atol, rtol).any():
                with np.errstate(invalid="ignore"):
                    gap = (
                        f"max |diff| {float(np.nanmax(np.abs(mine - theirs_in))):.3g}"
                        if mine.shape == theirs_in.shape and mine.size
                        else f"shape {list(theirs_in.shape)}, ours {list(mine.shape)}"
                    )
                return Divergence(
                    label,
                    peer,
                    f"its input {role} ({name!r}) already differs from ours ({gap}): the "
                    "difference comes from before this node",
                )
    inp = list(node.input) + [""] * 8

    def given(i: int) -> np.ndarray | None:
        return np.asarray(values[inp[i]]) if inp[i] else None

    T, _, N, H = Y.shape
    lens = np.full(N, T) if given(4) is None else given(4).astype(np.int64)
    k, t, d, b, order, L = _first_divergence(spec, bad, np.abs(Y - Yp), lens)
    name = "reverse" if spec.direction == "reverse" or d == 1 else "forward"
    diff = float(np.nanmax(np.abs(Y[t, d, b] - Yp[t, d, b])))
    where = f"step t={t} (direction {d} {name}, batch {b})"
    div = Divergence(label, peer, f"Y first differs at {where}: max |diff| {diff:.3g}", t, d, b)
    if t >= L:
        div.details.append(
            f"t={t} is past sequence_lens[{b}]={L}: Y is zero there (the peer ignores "
            "sequence_lens?)"
        )
        return div
    # Step t again, from the peer's own previous state, gate by gate.
    X = np.asarray(values[inp[0]], np.float64)
    X = X.transpose(1, 0, 2) if spec.layout else X
    W, R = given(1)[d], given(2)[d]
    B = given(3)[d] if inp[3] else np.zeros(2 * spec.cell.n_gates * H)
    P = given(7)[d] if op == "LSTM" and inp[7] else None

    def initial(i: int) -> np.ndarray:
        v = given(i)
        return np.zeros(H) if v is None else (v.transpose(1, 0, 2) if spec.layout else v)[d, b]

    h0 = initial(5)
    h_prev = h0 if k == 0 else Yp[order[k - 1], d, b]

    def step(overrides, peepholes=True, coupled=True):
        """Step t under a hypothesis (a gate's activation or clip; LSTM's peepholes or
        input_forget ignored), the cell state along the peer's hidden states alike."""
        s = spec if coupled else replace(spec, input_forget=False)
        p = P if peepholes else None
        c = initial(6) if op == "LSTM" else None
        for j in range(k):
            before = h0 if j == 0 else Yp[order[j - 1], d, b]
            _, _, c = cell_step(s, d, X[order[j], b], before, c, W, R, B, p)
        gates, h_new, _ = cell_step(s, d, X[t, b], h_prev, c, W, R, B, p, overrides)
        return gates, float(np.max(np.abs(h_new - Yp[t, d, b])))

    div.gate, lines = _explain(spec, node, d, step)
    div.details += lines
    return div


def trace(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    peers: Sequence[str],
    *,
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> tuple[list[Divergence], list[str]]:
    """Locate, for each main-graph recurrent node and peer, where ``Y`` first differs.

    The node's inputs come from onnx.reference with onnx-recurrent's operators
    (``intermediate=True``); the peer's node outputs from a copy of the model with
    those outputs added as graph outputs.

    Returns
    -------
    divergences : list of Divergence
    errors : list of str
        Peers that could not run the traced model, and nodes left out (those inside
        subgraphs).
    """
    from onnx.reference import ReferenceEvaluator

    traced, named, computed_inputs = _traced_model(model)
    nested = [
        n.name or n.op_type
        for n, path, _ in walk_paths(model.graph)
        if path and n.op_type in RECURRENT_OPS
    ]
    notes = [f"not traced (inside subgraphs): {', '.join(nested)}"] if nested else []
    if not named:
        return [], [*notes, "no recurrent node in the main graph to trace"]
    values = ReferenceEvaluator(traced, new_ops=[*reference_ops(), *reference_fixes()]).run(
        None, dict(feeds), intermediate=True
    )
    wanted = [*(n for outs in named.values() for n in outs), *computed_inputs]
    found, errors = [], notes
    nodes = {n.name: n for n in traced.graph.node if n.name in named}
    for peer in peers:
        try:
            got = dict(zip(wanted, PEERS[peer][1](traced, feeds, wanted), strict=True))
        except Exception as e:
            errors.append(f"{peer}: {one_line(e, 140)}")
            continue
        for node_name, outs in named.items():
            node = nodes[node_name]
            spec = _spec_of(node, np.asarray(values[node.input[2]]))
            div = _trace_node(
                node,
                spec,
                values,
                [values[o] for o in outs],
                [got[o] for o in outs],
                peer,
                atol,
                rtol,
                {n: got[n] for n in node.input if n in got},
            )
            if div is not None:
                found.append(div)
    return found, errors
