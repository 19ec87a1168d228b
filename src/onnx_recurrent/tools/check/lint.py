"""Lint: what each installed peer gets wrong for a model's recurrent nodes, probed.

Nothing here is a table of versions: for each node, the probes of :mod:`.probes` that
its attributes call for (its form; ``sequence_lens``, ``clip``, its activations,
``input_forget``, LSTM's peepholes, ``layout=1``, a missing ``hidden_size``) run once
per process on each peer, in the node's form (X's dims fixed or symbolic, the weights
constant or fed), and a peer is named only where its probe differs from
onnx-recurrent or is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import numpy_helper

from ...activations import TABLE
from ...runtime.folding import is_constant
from ...runtime.graph import RECURRENT_OPS, attributes, element_types, walk_paths
from . import probes
from .peers import PEERS, installed_peers
from .probes import CELLS


@dataclass(frozen=True)
class Finding:
    """What a peer gets wrong for one node (``peer`` None: a general warning).

    ``feature``: the probe that showed it (``"form"``, ``"sequence_lens"``, ``"clip"``,
    ``"activations"``, ``"input_forget"``, ``"peepholes"``, ``"layout"``,
    ``"no_hidden_size"``), None for a warning.
    """

    node: str
    peer: str | None
    message: str
    feature: str | None = None

    def __str__(self) -> str:
        who = f"{self.peer}: " if self.peer else "warning: "
        return f"{self.node}: {who}{self.message}"


def _node_label(node: onnx.NodeProto, version: int | None, path: tuple, index: int) -> str:
    where = f" in {'/'.join(path)}" if path else ""
    v = f"-{version}" if version else ""
    return f"{node.op_type}{v} {node.name or f'{node.op_type}_{index}'!r}{where}"


def bound_activations(op: str, attrs: Mapping[str, Any]) -> list[tuple[str, bool, bool]]:
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


#: a ``Loop(M, "")`` whose body's cond may turn false; the peers that stop are probed
LOOP_COND = (
    "M given, cond omitted and a body cond that may turn false: the spec ignores it and "
    "runs M iterations (so do check's onnx.reference and onnx-recurrent's reference host)"
)


def _loop_ignores_cond(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a ``Loop(M, "")`` whose body's cond output may be false."""
    if len(node.input) < 2 or not node.input[0] or node.input[1]:
        return False
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None or len(body.input) < 2 or not body.output:
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    for n in body.node:  # passed through (onnxruntime passes true), or a constant true
        if cond_out in n.output and n.op_type == "Identity" and list(n.input) == [cond_in]:
            cond_out = cond_in
        elif cond_out in n.output and n.op_type == "Constant" and n.attribute:
            a = n.attribute[0]
            if a.name == "value" and bool(numpy_helper.to_array(a.t).all()):
                cond_out = cond_in
    return cond_out != cond_in


def _fixed_shapes(model: onnx.ModelProto) -> dict[str, bool]:
    """Tensor name -> whether its shape is known with every dim a number."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a requirement
        inferred = model
    fixed: dict[str, bool] = {}

    def visit(graph: onnx.GraphProto) -> None:
        for v in (*graph.input, *graph.output, *graph.value_info):
            t = v.type.tensor_type
            if v.type.HasField("tensor_type") and t.HasField("shape"):
                fixed[v.name] = all(d.HasField("dim_value") for d in t.shape.dim)
        for t in graph.initializer:
            fixed[t.name] = True
        for node in graph.node:
            for a in node.attribute:
                for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                    visit(sub)

    visit(inferred.graph)
    return fixed


def _probe_messages(
    probed: probes.Probed, what: str, ignored: str, findings: list[tuple[str, str]]
) -> None:
    """What a wrong probe says: ``ignored`` if the peer's outputs match ours without the
    feature, else that it refuses (does not support) or gets ``what`` wrong."""
    if not probed.wrong:
        return
    if probed.refused is not None:
        message = f"does not support {what}"
    elif probed.explained is not None:
        message = ignored
    else:
        message = f"gets {what} wrong"
    findings.append((message, probed.evidence()))


def _activation_messages(
    probed: probes.Probed, bound: list[tuple[str, bool, bool]]
) -> list[tuple[str, str]]:
    names = [b[0] for b in bound]
    if not probed.wrong:
        return []
    evidence = probed.evidence()
    if probed.refused is not None:
        return [(f"does not support activations {names}", evidence)]
    if probed.explained == "defaults":
        return [(f"ignores activations {names} (uses the defaults)", evidence)]
    if probed.explained == "forward_both":
        return [("applies the forward direction's activations to both directions", evidence)]
    if probed.explained == "zero_defaults":
        out = []
        for name, alpha_given, beta_given in bound:
            kind = TABLE.get(name.lower())
            for param, was_given, default in (
                ("alpha", alpha_given, kind.alpha if kind else None),
                ("beta", beta_given, kind.beta if kind else None),
            ):
                if not was_given and default:
                    message = (
                        f"uses 0 for {name}'s {param} when not given "
                        f"(the ONNX default is {default:g})"
                    )
                    out.append((message, evidence))
        return out
    return [(f"gets activations {names} wrong", evidence)]


def _node_findings(
    peer: str, form: probes.Form, op: str, attrs: Mapping[str, Any], given: list[bool]
) -> list[tuple[str, str, str]]:
    """``(feature, message, evidence)`` for what ``peer``'s probes show of one node."""
    plain = probes.probe(peer, form, probes.FORM)
    if plain.wrong:  # every other probe would say the same: report the form alone
        if plain.refused is not None:
            message = f"cannot run {form.title()}"
        else:
            message = f"computes {form.title()} differently"
        return [("form", message, plain.evidence())]
    out: list[tuple[str, str, str]] = []

    def add(feature: tuple, what: str, ignored: str) -> None:
        found: list[tuple[str, str]] = []
        _probe_messages(probes.probe(peer, form, feature), what, ignored, found)
        out.extend((feature[0], m, e) for m, e in found)

    clip = attrs.get("clip")
    if given[4]:
        ignored = "ignores sequence_lens (runs every sequence to the end)"
        add(probes.SEQUENCE_LENS, "sequence_lens", ignored)
    if clip is not None and not math.isinf(clip):
        add(probes.CLIP, f"clip={clip:g}", f"ignores clip={clip:g}")
    if op == "LSTM" and attrs.get("input_forget", 0):
        add(probes.INPUT_FORGET, "input_forget=1", "ignores input_forget=1")
    if op == "LSTM" and given[7]:
        add(probes.PEEPHOLES, "peepholes (P)", "ignores the peepholes (P)")
    if attrs.get("layout", 0) == 1:
        add(probes.LAYOUT, "layout=1", "ignores layout=1: computes batch-first X as time-major")
    if "hidden_size" not in attrs:
        probed = probes.probe(peer, form, probes.NO_HIDDEN_SIZE)
        if probed.wrong:
            message = (
                "fails without the hidden_size attribute"
                if probed.refused is not None
                else "gets a node without hidden_size wrong"
            )
            out.append(("no_hidden_size", message, probed.evidence()))
    D = form.D
    bound = bound_activations(op, attrs)
    defaults = list(CELLS[op].default_activations) * D
    names = attrs.get("activations")
    alpha, beta = attrs.get("activation_alpha"), attrs.get("activation_beta")
    if [b[0].lower() for b in bound] != [d.lower() for d in defaults] or alpha or beta:
        feature = probes.activations(
            [str(n) for n in (names or defaults)],
            None if alpha is None else list(alpha),
            None if beta is None else list(beta),
        )
        found = _activation_messages(probes.probe(peer, form, feature), bound)
        out.extend(("activations", m, e) for m, e in found)
    return out


def lint(model: onnx.ModelProto, peers: Sequence[str] | None = None) -> list[Finding]:
    """What each peer gets wrong for the model's recurrent nodes, probed.

    Every GRU, RNN and LSTM node is visited, subgraphs included. For each, the probes
    its attributes call for (:mod:`onnx_recurrent.tools.check.probes`) run once per process
    on each peer, in the node's form: its operator version, element type, direction,
    ``linear_before_reset``, whether X's dims are all fixed and whether its weights are
    constant. A peer is named only where a probe's outputs differ from onnx-recurrent's
    or the peer refuses it: the finding says what it does (matched against ours without
    the feature where it can) and gives the evidence (``probed: max |diff| ...`` or
    ``refused: its error``). Also warned: a GRU with ``linear_before_reset=0`` in a
    PyTorch-exported model, and a ``Loop`` with M given and ``cond`` omitted whose
    body's cond may turn false, where a probed peer stops there (the spec runs M
    iterations).

    Parameters
    ----------
    model : onnx.ModelProto
    peers : sequence of str, optional
        The peers to probe (default: every installed one); those not installed are
        not probed and never named.

    Returns
    -------
    list of Finding
    """
    available = set(installed_peers())
    peers = [p for p in (list(PEERS) if peers is None else peers) if p in available]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    types = element_types(model)
    pytorch = "torch" in model.producer_name.lower()
    fixed: dict[str, bool] | None = None
    constants: Callable[[str], bool] | None = None
    findings = []
    for node, path, index in walk_paths(model.graph):
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and _loop_ignores_cond(node):
            loopers = [p for p in dict.fromkeys([*peers, "onnxruntime"]) if p in available]
            stop = [p for p in loopers if probes.loop_stops(p)]
            if stop:
                message = f"{LOOP_COND}; {' and '.join(stop)} stop there (probed)"
                if "onnxruntime" in stop:
                    message += "; so does onnx-recurrent's onnxruntime host"
                findings.append(Finding(_node_label(node, None, path, index), None, message))
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        op = node.op_type
        try:
            version = onnx.defs.get_schema(op, opset or 22).since_version
        except Exception:  # an opset onnx does not know
            version = None
        label = _node_label(node, version, path, index)
        attrs = attributes(node)
        given = [i < len(node.input) and bool(node.input[i]) for i in range(8)]

        if pytorch and op == "GRU" and not attrs.get("linear_before_reset", 0):
            findings.append(
                Finding(
                    label,
                    None,
                    "linear_before_reset=0 in a model exported from PyTorch: nn.GRU computes "
                    "linear_before_reset=1 (a known exporter mistake; outputs will not match "
                    "PyTorch)",
                )
            )
        if not peers or version is None:
            continue
        if fixed is None or constants is None:
            fixed, constants = _fixed_shapes(model), is_constant(model)
        direction = str(attrs.get("direction", "forward"))
        weights = [node.input[i] for i in (1, 2, 3) if given[i]]
        form = probes.Form(
            op,
            version,
            next((types[n] for n in node.input[:3] if n in types), onnx.TensorProto.FLOAT),
            "forward" if direction == "foward" else direction,
            int(attrs.get("linear_before_reset", 0)) if op == "GRU" else 0,
            static=fixed.get(node.input[0], False),
            constant=all(constants(w) for w in weights),
            constant_peepholes=constants(node.input[7]) if given[7] else None,
        )
        for peer in peers:
            try:
                found = _node_findings(peer, form, op, attrs, given)
            except Exception:  # a probe we cannot build or compute shows nothing
                continue
            for feature, message, evidence in found:
                findings.append(Finding(label, peer, f"{message} ({evidence})", feature))
    return list(dict.fromkeys(findings))  # a node repeated in If branches, once
