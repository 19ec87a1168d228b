"""Tensors computed from initializers only (Silero's weights go through ``Slice``,
``Concat`` and ``Unsqueeze``; a learned initial state may come from a recurrent node),
folded once by onnx.reference with onnx-recurrent's recurrent operators."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx

from ..held import import_whole
from .graph import (
    initializer_tensors,
    is_default_domain,
    is_random,
    overridable_initializers,
    subgraphs,
    tensor_array,
    walk,
)


def is_constant(model: onnx.ModelProto) -> Callable[[str], bool]:
    """Whether a tensor of ``model`` is computed from initializers only, as
    :func:`constant_values` takes it (a name no graph defines: False)."""
    return _constants(model)[2]


def _constants(
    model: onnx.ModelProto,
) -> tuple[dict[str, onnx.TensorProto], dict[str, onnx.NodeProto], Callable[[str], bool]]:
    """The initializers that count and the nodes, by the names they give, and the test
    of :func:`is_constant`."""
    producers: dict[str, onnx.NodeProto] = {}
    tensors = initializer_tensors(model.graph, set(overridable_initializers(model)))
    for graph, node in walk(model.graph):
        if graph is not model.graph:
            tensors.update(initializer_tensors(graph, set()))
        for out in node.output:
            if out:
                producers[out] = node

    memo: dict[str, bool] = {}

    def constant(name: str) -> bool:
        if name in memo:
            return memo[name]
        memo[name] = False  # a cycle is never constant
        node = producers.get(name)
        if name in tensors:
            result = True
        elif node is None or not is_default_domain(node.domain) or is_random(node):
            result = False
        else:
            result = not any(True for _ in subgraphs(node)) and all(
                constant(i) for i in node.input if i
            )
        memo[name] = result
        return result

    return tensors, producers, constant


def constant_values(model: onnx.ModelProto, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The values of those ``names`` that are computed from initializers only.

    A tensor is constant if it is an initializer (not an overridable one, which a
    caller may replace: :func:`overridable_initializers`; of two of one name, the
    first, as onnxruntime), or the output of a deterministic default-domain node
    without subgraphs whose inputs are all constant (a ``Dropout`` given
    ``training_mode`` is random). The ones asked for are computed together by
    onnx.reference, a recurrent node among them by onnx-recurrent
    (:func:`.reference.reference_ops`); those that are not constant, or whose
    computation fails, are left out.

    Raises
    ------
    ValueError
        An initializer asked for whose data cannot be read (:func:`tensor_array`).
    """
    tensors, producers, constant = _constants(model)
    wanted = [n for n in dict.fromkeys(names) if n and constant(n)]
    if not wanted:
        return {}
    direct = {n: tensor_array(tensors[n]) for n in wanted if n in tensors}
    computed = [n for n in wanted if n not in tensors]
    if not computed:
        return direct
    order: list[onnx.NodeProto] = []
    used: list[onnx.TensorProto] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name in tensors:
            used.append(tensors[name])
            return
        node = producers[name]
        for i in node.input:
            if i:
                visit(i)
        if not any(node is n for n in order):
            order.append(node)

    for name in computed:
        visit(name)
    graph = onnx.helper.make_graph(
        order,
        "constants",
        [],
        [onnx.helper.make_empty_tensor_value_info(n) for n in computed],
        initializer=used,
    )
    folded = onnx.helper.make_model(
        graph, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    # on first use (a second on import), whole: see held.import_whole
    ReferenceEvaluator = import_whole("onnx.reference").ReferenceEvaluator
    from .reference import reference_ops

    try:
        values = ReferenceEvaluator(folded, new_ops=reference_ops()).run(None, {})
    except Exception:  # not foldable: the weights cross per call
        return direct
    return direct | {n: np.asarray(v) for n, v in zip(computed, values, strict=True)}
