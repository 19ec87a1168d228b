"""``onnx-recurrent check``: one model on onnx-recurrent and on every installed peer.

The peers are onnxruntime, onnx.reference and OpenVINO (CPU, ``INFERENCE_PRECISION_HINT``
f32), each imported lazily and skipped when absent. Before running, each recurrent node
is linted against what a peer is known to get wrong for it (SEMANTICS.md, last
section). The report is a table of the largest absolute and relative difference per
output and peer, or the peer's error. With ``trace``, each main-graph recurrent node
whose ``Y`` differs is located: the first time step, direction and batch entry where
the peer leaves the tolerance, and the gate that explains it, recomputed in float64
from the node's inputs (:func:`cell_step`).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from . import cells
from .activations import TABLE, Activation
from .errors import RecurrentError, RecurrentTypeError
from .runtime.feeds import load_feeds, parse_pairs, random_feeds
from .runtime.reference import reference_ops
from .runtime.session import InferenceSession, _load
from .runtime.streaming import RECURRENT_OPS, Namer, attributes, elem_types, walk
from .spec import RecSpec, make_spec

__all__ = ["PEERS", "Report", "add_parser", "cell_step", "check", "lint", "trace"]

CELLS = {"GRU": cells.GRU, "RNN": cells.RNN, "LSTM": cells.LSTM}
#: gate letters in W order, and the activation slot (0 f, 1 g, 2 h) of each
GATES = {
    "GRU": {"z": 0, "r": 0, "h": 1},
    "RNN": {"i": 0},
    "LSTM": {"i": 0, "o": 0, "f": 0, "c": 1},
}
#: activations whose missing alpha/beta onnxruntime takes as 0, not the ONNX default
_ORT_ZERO_DEFAULTS = ("Affine", "ScaledTanh", "ThresholdedRelu")


# -- peers --------------------------------------------------------------------------------


def _run_onnxruntime(model: onnx.ModelProto, feeds, names):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are reported in the table, not logged
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(list(names), dict(feeds))


def _run_reference(model: onnx.ModelProto, feeds, names):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(list(names), dict(feeds))


def _run_openvino(model: onnx.ModelProto, feeds, names):
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(model.SerializeToString()), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    result = compiled(dict(feeds))
    return [np.asarray(result[compiled.output(n)]) for n in names]


#: peer name -> (module that must be importable, runner)
PEERS: dict[str, tuple[str, Callable]] = {
    "onnxruntime": ("onnxruntime", _run_onnxruntime),
    "onnx.reference": ("onnx", _run_reference),
    "openvino": ("openvino", _run_openvino),
}


def installed_peers() -> list[str]:
    """The peers whose package can be imported here."""
    return [name for name, (module, _) in PEERS.items() if importlib.util.find_spec(module)]


def _one_line(error: BaseException, width: int = 140) -> str:
    """The error on one line: OpenVINO's chain of source locations dropped, truncated."""
    while error.__cause__ is not None and str(error).startswith("Issues with types"):
        error = error.__cause__  # onnx.reference's wrapper around the operator's error
    lines = [
        line.strip()
        for line in str(error).splitlines()
        if line.strip() and not re.fullmatch(r"Exception from \S+:\d+:?", line.strip())
    ]
    text = re.split(r"HAS THROWN:\s*", " ".join(" ".join(lines).split()))[-1]
    # onnxruntime: its source paths and C++ signatures, then its error-code prefix
    text = re.sub(r"/\S+\.(?:h|cc|cpp):\d+\s*|\S+::\S+\([^)]*\)\s*", "", text)
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= width else text[: width - 3] + "..."


# -- lint ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """What a peer is known to get wrong for one node (``peer`` None: a general warning)."""

    node: str
    peer: str | None
    message: str

    def __str__(self) -> str:
        who = f"{self.peer}: " if self.peer else "warning: "
        return f"{self.node}: {who}{self.message}"


def _node_label(node: onnx.NodeProto, version: int | None, path: tuple, index: int) -> str:
    where = f" in {'/'.join(path)}" if path else ""
    v = f"-{version}" if version else ""
    return f"{node.op_type}{v} {node.name or f'{node.op_type}_{index}'!r}{where}"


def _bound_activations(op: str, attrs: Mapping[str, Any]) -> list[tuple[str, bool, bool]]:
    """Each activation's name and whether its alpha / beta were given (consumed in order)."""
    D = 2 if str(attrs.get("direction", "forward")).lower() == "bidirectional" else 1
    names = list(attrs.get("activations") or CELLS[op].default_activations * D)
    n_alpha = len(attrs.get("activation_alpha") or ())
    n_beta = len(attrs.get("activation_beta") or ())
    out, ia, ib = [], 0, 0
    for name in names:
        kind = TABLE.get(str(name).lower())
        alpha_given = beta_given = True
        if kind is not None and kind.alpha is not None:
            alpha_given, ia = ia < n_alpha, ia + 1
        if kind is not None and kind.beta is not None:
            beta_given, ib = ib < n_beta, ib + 1
        out.append((kind.name if kind else str(name), alpha_given, beta_given))
    return out


def lint(model: onnx.ModelProto) -> list[Finding]:
    """What each peer is known to get wrong for the model's recurrent nodes.

    Every GRU, RNN and LSTM node is visited, subgraphs included. The known behaviours
    are those measured in SEMANTICS.md (onnxruntime 1.31, OpenVINO 2026.4, onnx 1.23),
    plus a warning for a GRU with ``linear_before_reset=0`` in a PyTorch-exported model.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    list of Finding
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    types = elem_types(model)
    pytorch = "torch" in model.producer_name.lower()
    findings = []
    for node, path, index in walk(model.graph):
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        op = node.op_type
        try:
            version = onnx.defs.get_schema(op, opset or 22).since_version
        except Exception:  # an opset onnx does not know
            version = None
        label = _node_label(node, version, path, index)
        attrs = attributes(node)

        def add(peer: str | None, message: str, label: str = label) -> None:
            findings.append(Finding(label, peer, message))

        given = [i < len(node.input) and bool(node.input[i]) for i in range(8)]
        elem = next((types[n] for n in node.input[:3] if n in types), None)
        clip = attrs.get("clip")
        clipped = clip is not None and not math.isinf(clip)
        bound = _bound_activations(op, attrs)
        names = [b[0].lower() for b in bound]
        D = 2 if str(attrs.get("direction", "forward")).lower() == "bidirectional" else 1
        defaults = [a.lower() for a in CELLS[op].default_activations] * D
        layout = attrs.get("layout", 0)

        if pytorch and op == "GRU" and not attrs.get("linear_before_reset", 0):
            add(
                None,
                "linear_before_reset=0 in a model exported from PyTorch: nn.GRU computes "
                "linear_before_reset=1 (a known exporter mistake; outputs will not match "
                "PyTorch)",
            )
        # onnx.reference
        if given[4]:
            add("onnx.reference", "ignores sequence_lens (runs every sequence to the end)")
        if clipped:
            add("onnx.reference", f"ignores clip={clip:g}")
        if op in ("GRU", "LSTM") and names != defaults:
            add(
                "onnx.reference",
                f"ignores activations {[b[0] for b in bound]} (uses the defaults)",
            )
        if op == "LSTM" and attrs.get("input_forget", 0):
            add("onnx.reference", "ignores input_forget=1")
        if op == "RNN":
            unknown = sorted({b[0] for b in bound} - {"Tanh", "Affine"})
            if unknown:
                add("onnx.reference", f"knows only Tanh and Affine for RNN: fails on {unknown}")
            elif D == 2 and names[0] != names[1]:
                add("onnx.reference", "applies the forward activation to both directions")
            if "affine" in names and any(
                len(attrs.get(k) or ()) != D for k in ("activation_alpha", "activation_beta")
            ):
                add(
                    "onnx.reference",
                    f"reads RNN's activation_alpha/beta by position and needs {D} of each "
                    "(fails or misreads Affine's parameters here)",
                )
        # onnxruntime
        if layout == 1:
            add("onnxruntime", "does not implement layout=1")
        if elem in (onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16):
            add("onnxruntime", f"has no {onnx.TensorProto.DataType.Name(elem).lower()} kernel")
        if op == "GRU" and version is not None and version < 7:
            add("onnxruntime", f"has no GRU before version 7 (this node is GRU-{version})")
        for name, alpha_given, beta_given in bound:
            kind = TABLE[name.lower()] if name.lower() in TABLE else None
            if kind is None or name not in _ORT_ZERO_DEFAULTS:
                continue
            for param, was_given, default in (
                ("alpha", alpha_given, kind.alpha),
                ("beta", beta_given, kind.beta),
            ):
                if not was_given and default:
                    add(
                        "onnxruntime",
                        f"uses 0 for {name}'s {param} when not given "
                        f"(the ONNX default is {default:g})",
                    )
        # OpenVINO (layout, hidden_size: measured with 2026.4, not yet in SEMANTICS.md)
        if layout == 1:
            add("openvino", "ignores layout=1: computes batch-first X as time-major")
        if "hidden_size" not in attrs:
            add("openvino", "fails without the hidden_size attribute")
            add("onnxruntime", "fails without the hidden_size attribute")
        odd = sorted({b[0] for b in bound} - {"Sigmoid", "Tanh", "Relu"})
        if odd:  # SEMANTICS.md says so for GRU; RNN and LSTM measured the same
            add("openvino", f"supports only Sigmoid/Tanh/Relu activations, not {odd}")
        if op == "RNN" and D == 2 and names[0] != names[1]:
            add("openvino", "does not honour per-direction activations of a bidirectional RNN")
    return list(dict.fromkeys(findings))  # a bidirectional node repeats its activations


# -- comparing outputs --------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One output of one peer against onnx-recurrent's."""

    output: str
    peer: str
    max_abs: float | None = None
    max_rel: float | None = None
    exceeds: bool = False
    error: str | None = None


def _excess(ours: np.ndarray, theirs: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """Where ``theirs`` leaves ``atol + rtol * |ours|`` (a NaN in one only counts too)."""
    a = np.asarray(ours, np.float64)
    b = np.asarray(theirs, np.float64)
    with np.errstate(invalid="ignore"):
        bad = np.abs(a - b) > atol + rtol * np.abs(a)
    return bad | (np.isnan(a) != np.isnan(b))


def compare(
    name: str, peer: str, ours: np.ndarray, theirs: Any, atol: float, rtol: float
) -> Comparison:
    """Max absolute and relative difference of one output (relative to ours)."""
    theirs = np.asarray(theirs)
    if theirs.shape != ours.shape:
        shapes = f"shape {list(theirs.shape)}, ours {list(ours.shape)}"
        return Comparison(name, peer, exceeds=True, error=shapes)
    if ours.size == 0:
        return Comparison(name, peer, 0.0, 0.0)
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        d = np.where(np.isnan(d), np.inf, d)
        rel = np.where(d == 0, 0.0, d / np.abs(a))
    exceeds = bool(_excess(a, b, atol, rtol).any())
    return Comparison(name, peer, float(d.max()), float(rel.max()), exceeds)


# -- the cell step, in float64, gate by gate ----------------------------------------------


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
    """Known peer behaviours, per gate: label -> {gate: (Activation, clip)}."""
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
        if act.name in _ORT_ZERO_DEFAULTS and not (alpha_given and beta_given):
            zeroed = replace(
                act,
                alpha=act.alpha if alpha_given else 0.0,
                beta=act.beta if beta_given else 0.0,
            )
            out.setdefault("with 0 for the unset alpha/beta", {})[gate] = (zeroed, clip)
    return out


# -- trace --------------------------------------------------------------------------------


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


def _traced_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """A copy whose main-graph recurrent nodes have every output named and a graph output."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    name = Namer(copy)
    types = elem_types(copy)
    outputs = {o.name for o in copy.graph.output}
    named: dict[str, list[str]] = {}
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
    return copy, named


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

    ``step(overrides)`` runs :func:`cell_step` from the peer's previous state and
    returns ``(gates, max |h - peer's h|)``. Each behaviour (no clip, the default
    activations, onnxruntime's 0 for unset alpha/beta) is tried on every gate at once
    and on each gate alone; the best one that halves the difference explains it, and
    the gate it moves most is the gate that differs most. Returns that gate (None if
    nothing explains the step) and the lines that say so.
    """
    op = node.op_type
    gates, base = step(None)
    lines = [f"recomputed from the peer's previous state, ours differs by {base:.3g} there"]
    candidates = []  # (residual, description, gates under the hypothesis)
    for what, per_gate in _variants(spec, op, d, _bound_activations(op, attributes(node))).items():
        scopes = [(f"gate {g}", {g: o}) for g, o in per_gate.items()]
        if len(per_gate) > 1:
            scopes.insert(0, ("every gate", per_gate))
        for scope, override in scopes:
            their_gates, r = step(override)
            candidates.append((r, f"{scope} computed {what}", their_gates))
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


def _trace_node(node, spec, values, ours, theirs, peer, atol, rtol) -> Divergence | None:
    """Locate the first divergence of ``theirs`` (the peer's Y, Y_h[, Y_c]) from ours."""
    op, label = node.op_type, f"{node.op_type} {node.name!r}"
    tm = (lambda a: np.asarray(a).transpose(1, 2, 0, 3)) if spec.layout else np.asarray
    Y, Yp = tm(ours[0]).astype(np.float64), tm(theirs[0]).astype(np.float64)
    if Y.shape != Yp.shape:
        return Divergence(label, peer, f"Y has shape {list(Yp.shape)}, ours {list(Y.shape)}")
    bad = _excess(Y, Yp, atol, rtol)
    if not bad.any():
        for name, a, b in zip(("Y_h", "Y_c"), ours[1:], theirs[1:], strict=False):
            if np.asarray(a).shape != np.asarray(b).shape or _excess(a, b, atol, rtol).any():
                return Divergence(label, peer, f"Y agrees at every step but {name} differs")
        return None
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
    c = initial(6) if op == "LSTM" else None
    for j in range(k):  # LSTM: the cell state along the peer's hidden states
        h_prev = h0 if j == 0 else Yp[order[j - 1], d, b]
        _, _, c = cell_step(spec, d, X[order[j], b], h_prev, c, W, R, B, P)
    h_prev = h0 if k == 0 else Yp[order[k - 1], d, b]

    def step(overrides):
        gates, h_new, _ = cell_step(spec, d, X[t, b], h_prev, c, W, R, B, P, overrides)
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

    traced, named = _traced_model(model)
    nested = [
        n.name or n.op_type
        for n, path, _ in walk(model.graph)
        if path and n.op_type in RECURRENT_OPS
    ]
    notes = [f"not traced (inside subgraphs): {', '.join(nested)}"] if nested else []
    if not named:
        return [], [*notes, "no recurrent node in the main graph to trace"]
    values = ReferenceEvaluator(traced, new_ops=reference_ops()).run(
        None, dict(feeds), intermediate=True
    )
    wanted = [n for outs in named.values() for n in outs]
    found, errors = [], notes
    nodes = {n.name: n for n in traced.graph.node if n.name in named}
    for peer in peers:
        try:
            got = dict(zip(wanted, PEERS[peer][1](traced, feeds, wanted), strict=True))
        except Exception as e:
            errors.append(f"{peer}: {_one_line(e)}")
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
            )
            if div is not None:
                found.append(div)
    return found, errors


# -- the report ---------------------------------------------------------------------------


@dataclass
class Report:
    """What :func:`check` found."""

    findings: list[Finding]
    comparisons: list[Comparison]
    divergences: list[Divergence] = field(default_factory=list)
    trace_errors: list[str] = field(default_factory=list)
    atol: float = 1e-4
    rtol: float = 1e-3

    @property
    def exceeds(self) -> bool:
        """Whether any peer's output leaves the tolerance."""
        return any(c.exceeds for c in self.comparisons)

    def table(self) -> list[str]:
        """The comparisons as aligned text lines, a header first."""
        numbers = {
            id(c): (f"{c.max_abs:.3g}", f"{c.max_rel:.3g}")
            for c in self.comparisons
            if c.error is None
        }
        w_out = max([len("output")] + [len(c.output) for c in self.comparisons])
        w_peer = max([len("peer")] + [len(c.peer) for c in self.comparisons])
        w_abs = max([len("max abs")] + [len(a) for a, _ in numbers.values()])
        w_rel = max([len("max rel")] + [len(r) for _, r in numbers.values()])
        lines = [f"  {'output':<{w_out}}  {'peer':<{w_peer}}  {'max abs':>{w_abs}}  max rel"]
        for c in self.comparisons:
            line = f"  {c.output:<{w_out}}  {c.peer:<{w_peer}}  "
            if c.error is not None:
                line += ("DIFFERS: " if c.exceeds else "error: ") + c.error
            else:
                a, r = numbers[id(c)]
                line += f"{a:>{w_abs}}  {r:>{w_rel}}  {'DIFFERS' if c.exceeds else 'ok'}"
            lines.append(line)
        return lines


def check(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    peers: Sequence[str] | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    trace_nodes: bool = False,
) -> Report:
    """Run ``model`` on onnx-recurrent and on each peer, and compare every output.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
    feeds : dict of str to ndarray
        Every graph input.
    peers : sequence of str, optional
        Names from :data:`PEERS`; default every installed one.
    atol, rtol : float
        A peer differs where ``|theirs - ours| > atol + rtol * |ours|``.
    trace_nodes : bool
        Also locate the first divergent step of each recurrent node (:func:`trace`).

    Returns
    -------
    Report

    Raises
    ------
    ValueError
        Bad feeds, an unknown peer, or a model onnx-recurrent rejects.
    """
    proto = _load(model)
    peers = installed_peers() if peers is None else list(peers)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise RecurrentError(f"unknown peer(s) {unknown}; known: {list(PEERS)}")
    if atol < 0 or rtol < 0:
        raise RecurrentError(f"atol and rtol must be >= 0, got {atol}, {rtol}")
    session = InferenceSession(proto)
    names = [o.name for o in session.get_outputs()]
    ours = session.run(None, feeds)
    report = Report(lint(proto), [], atol=atol, rtol=rtol)
    for peer in peers:
        try:
            theirs = PEERS[peer][1](proto, feeds, names)
        except Exception as e:
            report.comparisons.append(Comparison("(all)", peer, error=_one_line(e)))
            continue
        for name, a, b in zip(names, ours, theirs, strict=True):
            report.comparisons.append(compare(name, peer, np.asarray(a), b, atol, rtol))
    if trace_nodes:
        differing = [p for p in peers if any(c.exceeds for c in report.comparisons if c.peer == p)]
        report.divergences, report.trace_errors = trace(
            proto, feeds, differing, atol=atol, rtol=rtol
        )
    return report


# -- the command line ---------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    """``onnx-recurrent check``: print the lint, the table and the trace; 1 if a peer differs."""
    try:
        return _cmd_check(args)
    except (RecurrentError, RecurrentTypeError, FileNotFoundError) as e:
        print(f"onnx-recurrent check: error: {e}", file=sys.stderr)
        return 2


def _cmd_check(args: argparse.Namespace) -> int:
    path = Path(args.model)
    if not path.exists():
        raise FileNotFoundError(f"model: no such file {args.model!r}")
    try:
        model = onnx.load(path)
    except Exception as e:
        raise RecurrentError(f"model {args.model!r}: not an ONNX model ({_one_line(e)})") from None
    feeds = load_feeds(parse_pairs(args.input, "-i"))
    session = InferenceSession(model)
    missing = [i for i in session.get_inputs() if i.name not in feeds]
    opset = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = " ".join(filter(None, (model.producer_name, model.producer_version)))
    print(f"model: {args.model} (producer {producer or 'unknown'}; opset {opset})")
    drawn = {}
    if missing:
        try:
            dims = {k: int(v) for k, v in parse_pairs(args.dim, "--dim").items()}
        except ValueError as e:
            raise RecurrentError(f"--dim: {e}") from None
        drawn = random_feeds(missing, dims, seed=args.seed)
        feeds.update(drawn)
    for name, value in feeds.items():
        how = f"random (seed {args.seed})" if name in drawn else "given"
        print(f"input {name}: {list(value.shape)} {value.dtype}, {how}")
    peers = args.peer or installed_peers()
    print(f"peers: {', '.join(peers) if peers else 'none installed'}")

    report = check(
        model, feeds, peers=peers, atol=args.atol, rtol=args.rtol, trace_nodes=args.trace
    )
    print("\nlint:" if report.findings else "\nlint: nothing known to go wrong for these nodes")
    for f in report.findings:
        print(f"  {f}")
    print(f"\ndifferences from onnx-recurrent (atol {args.atol:g}, rtol {args.rtol:g}):")
    for line in report.table():
        print(line)
    if args.trace:
        print("\ntrace:")
        if not report.divergences and not report.trace_errors:
            print("  no recurrent node's outputs differ")
        for div in report.divergences:
            for line in div.lines():
                print(f"  {line}")
        for err in report.trace_errors:
            print(f"  {err}")
    failing = list(dict.fromkeys(c.peer for c in report.comparisons if c.exceeds))
    failed = [c.peer for c in report.comparisons if c.error is not None and not c.exceeds]
    note = f" ({', '.join(failed)} could not run it)" if failed else ""
    if failing:
        print(f"\nresult: {', '.join(failing)} beyond the tolerance{note}")
        return 1
    print(f"\nresult: every peer that ran agrees within the tolerance{note}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Register the ``check`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "check",
        help="compare a model's outputs on onnx-recurrent and every installed peer",
        description=(
            "Run MODEL on onnx-recurrent and on onnxruntime, onnx.reference and OpenVINO "
            "(those installed), lint its recurrent nodes for what each peer is known to "
            "get wrong, and print the largest differences. Exit status 1 when a peer "
            "differs beyond --atol/--rtol, 2 for a usage error."
        ),
    )
    p.add_argument("model", help="path to an .onnx model")
    p.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file (repeatable); float inputs not given are random",
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="value of a named dimension for random inputs (default 1 for batch, else 8)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (1e-4)")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (1e-3)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="for each recurrent node that differs, the first step and the gate",
    )
    p.add_argument(
        "--peer",
        action="append",
        choices=list(PEERS),
        help="compare with this peer only (repeatable; default every installed one)",
    )
    p.set_defaults(handler=cmd_check)
