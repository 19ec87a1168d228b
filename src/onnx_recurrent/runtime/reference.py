"""``onnx.reference`` operators backed by onnx-recurrent, one class per operator version.

``ReferenceEvaluator`` looks new operators up by class name, so the classes it is
given are named exactly ``GRU``, ``RNN`` and ``LSTM``; each picks the versioned class
for the model's opset (``GRU.versions``) when a node is loaded. Version differences are
handled here and nowhere else: ``output_sequence`` (1, 3: Y is produced whenever the
node names it), GRU-1's ``'foward'`` default, ``layout`` (14+) and bfloat16 (22+).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from .. import ops
from ..cells import check_arity
from ..errors import RecurrentError, RecurrentTypeError
from ..spec import as_array
from .graph import check_element_type, check_required_outputs, node_attributes, node_version


class RecurrentOp(OpRun):
    """Base of the adapters: calls the public function with the node's attributes."""

    op_domain = ""
    function: ClassVar[Callable[..., tuple]]
    since_version: ClassVar[int]
    versions: ClassVar[dict[int, type[RecurrentOp]]]

    def __new__(cls, onnx_node: onnx.NodeProto, run_params: dict[str, Any], schema: Any = None):
        if "since_version" not in cls.__dict__:  # the operator's class: pick the version
            opset = run_params.get("opsets", {}).get("", max(cls.versions))
            try:  # the sessions' choice, and their refusals (an opset newer than onnx's)
                cls = cls.versions[node_version(cls.__name__, opset)]
            except RecurrentError as e:
                raise RecurrentError(f"{onnx_node.op_type} node {onnx_node.name!r}: {e}") from None
        return super().__new__(cls)

    def run(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        # OpRun.run rewraps a TypeError into a generic one: surface ours, naming the node.
        try:
            return super().run(*args, **kwargs)
        except (RecurrentError, TypeError) as e:
            cause = e if isinstance(e, RecurrentError) else e.__cause__
            if not isinstance(cause, RecurrentError | RecurrentTypeError):
                raise
            node = self.onnx_node
            raise type(cause)(f"{node.op_type} node {node.name!r}: {cause}") from None

    def _check_and_fix_outputs(self, res: tuple[Any, ...]) -> tuple[Any, ...]:
        # Outputs the node names '' are None, so the evaluator's optional-input
        # placeholder results[''] stays None for the nodes that follow. OpRun.run's
        # private hook, no public one: guarded by tests/test_foreign_names.py.
        return res

    def _run(self, X, W, R, *optional, **attributes):
        name = self.onnx_node.op_type
        check_arity(name, len(self.onnx_node.input), len(self.onnx_node.output))
        # the sessions' reading: only what the node sets, of its schema's types
        kwargs = node_attributes(name, self.since_version, self.onnx_node)
        check_required_outputs(name, self.since_version, self.onnx_node)
        if len(optional) > 1 and optional[1] is not None:
            lengths = as_array("sequence_lens", optional[1]).dtype
            if lengths.newbyteorder("=") != np.int32:  # either byte order: read by value
                raise RecurrentTypeError(
                    f"sequence_lens must be tensor(int32), as the operator's schema says, "
                    f"got {lengths}"
                )
        X = as_array("X", X)  # a tensor that needs grad: named, not torch's bare error
        check_element_type(name, self.since_version, X.dtype)
        outputs = self.onnx_node.output
        want_Y = len(outputs) > 0 and outputs[0] != ""
        results = type(self).function(X, W, R, *optional, output_sequence=want_Y, **kwargs)
        return tuple(
            r if i < len(outputs) and outputs[i] else None for i, r in enumerate(results)
        )[: max(len(outputs), 1)]


def _family(name: str, function: Callable[..., tuple], versions: tuple[int, ...]) -> type:
    body = {"function": staticmethod(function), "versions": {}, "__module__": __name__}
    base = type(name, (RecurrentOp,), body)  # of this module (type() took abc's name)
    for v in versions:
        schema = onnx.defs.get_schema(name, v)
        body = {"since_version": v, "op_schema": schema, "__module__": __name__}
        cls = type(f"{name}_{v}", (base,), body)
        base.versions[v] = cls
    return base


GRU = _family("GRU", ops.gru, (1, 3, 7, 14, 22))
RNN = _family("RNN", ops.rnn, (1, 7, 14, 22))
LSTM = _family("LSTM", ops.lstm, (1, 7, 14, 22))


def reference_ops() -> list[type[OpRun]]:
    """The recurrent operators as ``onnx.reference`` operator classes.

    Pass them as ``onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())``:
    onnx.reference then runs the other operators and onnx-recurrent the recurrent
    ones. The classes are named ``GRU``, ``RNN`` and ``LSTM`` (the evaluator matches
    by name); each dispatches on the model's opset to its versioned class, GRU 1, 3,
    7, 14, 22, RNN and LSTM 1, 7, 14, 22 (``GRU.versions[7]`` is ``GRU_7``). A node's
    attributes, its ``sequence_lens`` and the opset are checked as
    :class:`~onnx_recurrent.InferenceSession` checks them (a node it refuses raises
    the same error here).

    onnx.reference evaluates a model-local function's body without ``new_ops``: a
    recurrent node inside one runs as onnx.reference's own operator, which ignores
    ``clip``, GRU activations and ``sequence_lens``. Inline such functions first
    (``onnx.inliner.inline_local_functions(model)``), or use ``InferenceSession``,
    which does.

    Returns
    -------
    list of type
        Subclasses of ``onnx.reference.op_run.OpRun``, domain ``""``.
    """
    return [GRU, RNN, LSTM]
