"""The reference host: onnx.reference runs the graph, the bound layers the recurrent nodes.

Slow on the non-recurrent nodes, but needs neither onnxruntime nor
onnxruntime-extensions. ``Loop`` is onnx-recurrent's (:mod:`..loop`): onnx.reference
runs a ``Loop`` whose ``cond`` input is omitted for zero iterations.

Broken models: a tensor whose data cannot be read is named before onnx.reference
loads the model; what onnx.reference raises as ``AttributeError``, ``IndexError``,
``KeyError``... on a malformed node is raised as a ``RuntimeError`` naming the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from ..bound import BoundNode, node_key
from ..graph import all_graphs, tensor_array, walk
from ..loop import reference_fixes
from ..reference import reference_ops


def _bound_ops(bound: Mapping[tuple[str, ...], BoundNode]) -> list[type]:
    """``reference_ops()`` whose nodes run through the session's bound nodes."""

    def run(self, *args: Any, **kwargs: Any) -> tuple:
        node = self.onnx_node
        X, *rest = (*args, *([None] * (8 - len(args))))
        W, R, B, sequence_lens, initial_h = rest[:5]
        initial_c, P = rest[5:7]
        results = bound[node_key(node)](
            X, sequence_lens, initial_h, initial_c, {"W": W, "R": R, "B": B, "P": P}
        )
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
    """onnx.reference's evaluator with the session's bound recurrent nodes."""

    name = "reference"
    checks_feeds = False  # the session checks them first

    def __init__(self, model: onnx.ModelProto, bound: Mapping[tuple[str, ...], BoundNode]):
        _read_tensors(model)
        for node in bound.values():  # every node runs its layer: compiled now
            if node.layer is not None:
                node.layer.prepare()
        model = _default_domain(model)
        try:
            self._evaluator = ReferenceEvaluator(
                model, new_ops=[*_bound_ops(bound), *reference_fixes()]
            )
        except _UNCLEAR as e:
            if _raised_here(e):
                raise
            raise _engine_error(e) from e

    def providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def run(
        self, output_names: Sequence[str], feeds: dict[str, np.ndarray], run_options: Any
    ) -> list[np.ndarray]:
        try:
            return list(self._evaluator.run(list(output_names), feeds))
        except _UNCLEAR as e:
            if _raised_here(e):
                raise
            raise _engine_error(e) from e


def _default_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose ``ai.onnx`` domain is written ``''``: onnx.reference
    knows the default domain by the empty name only (onnxruntime, by either)."""
    nodes = [node for _, node in walk(model.graph)]
    if not any(n.domain == "ai.onnx" for n in nodes) and not any(
        o.domain == "ai.onnx" for o in model.opset_import
    ):
        return model
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    for _, node in walk(copied.graph):
        if node.domain == "ai.onnx":
            node.domain = ""
    imports = {o.domain: o.version for o in copied.opset_import}
    version = imports.pop("ai.onnx", None)
    if version is not None:
        imports.setdefault("", version)
        del copied.opset_import[:]
        copied.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in imports.items())
    return copied


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


def _engine_error(error: Exception) -> RuntimeError:
    """``error``, raised inside onnx.reference, as a RuntimeError naming the node that
    onnx.reference was loading or running (when its frames tell)."""
    node = None
    tb = error.__traceback__
    while tb is not None:  # the innermost operator's frame
        found = getattr(tb.tb_frame.f_locals.get("self"), "onnx_node", None)
        node = found if isinstance(found, onnx.NodeProto) else node
        tb = tb.tb_next
    where = f" at {node.op_type} node {node.name!r}" if node is not None else ""
    return RuntimeError(
        f"onnx.reference cannot run this model{where}: {type(error).__name__}: {error}"
    )
