"""``Loop`` for onnx.reference as the ONNX specification has it.

onnx.reference's ``Loop`` (measured with onnx 1.23.2) gets three things wrong:

- An omitted ``cond`` input (``""``) arrives as None and ``while cond and ...`` runs
  zero iterations: ``Loop(M, "")`` returns its initial values, so a GRU in the body
  never runs (the spec, onnxruntime and OpenVINO: M iterations).
- Scan outputs are joined with ``np.vstack``: per-iteration values of rank 2 or more
  are concatenated on their own first axis instead of stacked on a new one (3
  iterations of a ``[1, N, H]`` value give ``[3, N, H]``; ONNX shape inference,
  onnxruntime and OpenVINO ``[3, 1, N, H]``), and zero iterations raise.
- An outer-scope value overrides a body input of the same name.

Here, after the spec's table of modes: ``(M, "")`` runs M iterations and ignores the
body's ``cond`` output (onnxruntime 1.32 and OpenVINO 2026.4 stop where it turns
false); ``("", "")`` runs until the body's ``cond`` is false, as onnxruntime and
OpenVINO do (the spec's literal reading, ignoring it, never ends); with ``cond``
given, as onnx.reference: while ``cond`` and, where given, fewer than M iterations.
A scan output of zero iterations is empty, ``[0, *shape]`` as the body declares it
(unknown dimensions 0).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.helper import tensor_dtype_to_np_dtype
from onnx.reference.op_run import OpRun
from onnx.reference.ops import op_loop


class Loop(op_loop.Loop):
    """onnx.reference's ``Loop`` with the iteration rule and scan outputs of the spec."""

    def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):
        body = self.body
        names = body.input_names
        inputs = dict(context or {})  # the outer scope, shadowed by the body's inputs
        inputs.update(zip(names[2:], args, strict=False))
        trips = None if M is None else int(np.asarray(M).reshape(-1)[0])
        use_cond = cond is not None or M is None  # ("", ""): the body's cond ends it
        go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        cond_value = np.array(go)
        scans: list[list[np.ndarray]] = [[] for _ in range(self.K)]
        it = 0
        while (go or not use_cond) and (trips is None or it < trips):
            if len(names) > 0:
                inputs[names[0]] = np.array(it, dtype=np.int64)
            if len(names) > 1:
                inputs[names[1]] = cond_value
            # onnx.reference's runner of the body (private; tests/test_foreign_names.py)
            outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
            cond_value = outputs[0]
            if cond_value is None:
                raise RuntimeError(f"Loop body output {body.output_names[0]!r} is None.")
            go = bool(np.asarray(cond_value).reshape(-1)[0])
            inputs.update(zip(names[2:], outputs[1 : 1 + self.N], strict=False))
            for k in range(self.K):
                scans[k].append(np.asarray(outputs[1 + self.N + k]))
            it += 1
        results = [inputs[n] for n in names[2:]]
        graph = next(a.g for a in self.onnx_node.attribute if a.name == "body")
        for k, values in enumerate(scans):
            results.append(np.stack(values) if values else _empty(graph.output[1 + self.N + k]))
        while len(results) < len(self.onnx_node.output):
            results.append(np.empty(shape=()))
        return tuple(results)  # OpRun.run checks them


def _empty(value_info: onnx.ValueInfoProto) -> np.ndarray:
    """A scan output of zero iterations: ``[0, *declared shape]``, unknown dims 0."""
    t = value_info.type.tensor_type
    dtype = tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else np.float32
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
    return np.empty((0, *dims), dtype=dtype)


def reference_fixes() -> list[type[OpRun]]:
    """onnx.reference operators corrected to the spec: ``[Loop]``.

    Pass them with ``ReferenceEvaluator(model, new_ops=[..., *reference_fixes()])``;
    the evaluator matches operators by class name.
    """
    return [Loop]
