"""Small ONNX models for the tests: one recurrent node, inputs fed by name."""

from __future__ import annotations

import numpy as np

from onnx_recurrent.cells import CELLS
from onnx_recurrent.runtime.graph import node_model  # noqa: F401  (one node, the feeds)

GATES = {name: cell.n_gates for name, cell in CELLS.items()}


def random_inputs(
    op: str,
    *,
    T: int = 5,
    N: int = 3,
    I: int = 4,
    H: int = 3,
    D: int = 1,
    dtype=np.float32,
    seed: int = 0,
    full: bool = True,
) -> dict[str, np.ndarray]:
    """Seeded inputs of one configuration (layout 0); ``full`` adds every optional one."""
    rng = np.random.default_rng(seed)
    G = GATES[op]

    def r(*shape, scale=0.5):
        return (rng.uniform(-1, 1, shape) * scale).astype(dtype)

    feeds = {"X": r(T, N, I, scale=1.0), "W": r(D, G * H, I), "R": r(D, G * H, H)}
    if full:
        feeds["B"] = r(D, 2 * G * H)
        feeds["sequence_lens"] = rng.integers(0, T + 1, N).astype(np.int32)
        feeds["initial_h"] = r(D, N, H, scale=1.0)
        if op == "LSTM":
            feeds["initial_c"] = r(D, N, H, scale=1.0)
            feeds["P"] = r(D, 3 * H)
    return feeds


def over_constants_model(nodes, output: str, N: int = 2, I: int = 4, H: int = 3):
    """A model of ``nodes`` with the constants ``X1 [4, N, 2]``, ``W1``, ``R1`` (a GRU
    of hidden size H over X1, computed from initializers only) and ``W``, ``R`` (a GRU
    over the input ``X [T, N, I]``); one output ``output``. Returns the model and a
    seeded generator for the feeds."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    constants = {
        "X1": (rng.standard_normal((4, N, 2)) * 3).astype(np.float32),
        "W1": (rng.standard_normal((1, 3 * H, 2)) * 1.5).astype(np.float32),
        "R1": (rng.standard_normal((1, 3 * H, H)) * 0.5).astype(np.float32),
        "W": rng.uniform(-0.5, 0.5, (1, 3 * H, I)).astype(np.float32),
        "R": rng.uniform(-0.5, 0.5, (1, 3 * H, H)).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", N, I])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, rng
