"""Lint: what a peer is known to get wrong for a recurrent node (SEMANTICS.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import numpy_helper

from .. import cells
from ..activations import TABLE
from ..runtime.streaming import RECURRENT_OPS, attributes, elem_types, walk
from .peers import ORT_ZERO_DEFAULTS

CELLS = {"GRU": cells.GRU, "RNN": cells.RNN, "LSTM": cells.LSTM}


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


#: a ``Loop(M, "")`` whose body's cond may turn false (onnxruntime 1.32, OpenVINO 2026.4)
LOOP_COND = (
    "M given, cond omitted and a body cond that may turn false: the spec ignores it and "
    "runs M iterations (check's onnx.reference, onnx-recurrent's reference host); onnxruntime "
    "and openvino stop there (so does onnx-recurrent's onnxruntime host)"
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


def lint(model: onnx.ModelProto) -> list[Finding]:
    """What each peer is known to get wrong for the model's recurrent nodes.

    Every GRU, RNN and LSTM node is visited, subgraphs included. The known behaviours
    are those measured in SEMANTICS.md (onnxruntime 1.31, OpenVINO 2026.4, onnx 1.23),
    plus warnings for a GRU with ``linear_before_reset=0`` in a PyTorch-exported model
    and for a ``Loop`` with M given and ``cond`` omitted whose body's cond may turn
    false (the spec runs M iterations, onnxruntime and OpenVINO stop there).

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
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and _loop_ignores_cond(node):
            findings.append(Finding(_node_label(node, None, path, index), None, LOOP_COND))
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
        bound = bound_activations(op, attrs)
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
            if kind is None or name not in ORT_ZERO_DEFAULTS:
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
