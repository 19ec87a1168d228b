"""The reference host: onnx.reference runs the graph, the bound layers the recurrent nodes.

Slow on the non-recurrent nodes, but needs neither onnxruntime nor
onnxruntime-extensions. ``Loop`` is onnx-recurrent's (:mod:`..loop`): onnx.reference
runs a ``Loop`` whose ``cond`` input is omitted for zero iterations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from ..bound import BoundNode, node_key
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

    def __init__(self, model: onnx.ModelProto, bound: Mapping[tuple[str, ...], BoundNode]):
        self._evaluator = ReferenceEvaluator(
            model, new_ops=[*_bound_ops(bound), *reference_fixes()]
        )

    def providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def run(
        self, output_names: Sequence[str], feeds: dict[str, np.ndarray], run_options: Any
    ) -> list[np.ndarray]:
        return list(self._evaluator.run(list(output_names), feeds))
