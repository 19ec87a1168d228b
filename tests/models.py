"""Small ONNX models for the tests: one recurrent node, inputs fed by name."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

INPUT_NAMES = {
    "GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
    "RNN": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
    "LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
}
OUTPUT_NAMES = {"GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h"), "LSTM": ("Y", "Y_h", "Y_c")}
GATES = {"GRU": 3, "RNN": 1, "LSTM": 4}


def node_model(
    op: str,
    feeds: dict[str, np.ndarray],
    attributes: dict,
    *,
    opset: int = 22,
    outputs: tuple[str, ...] | None = None,
) -> onnx.ModelProto:
    """A model with one ``op`` node taking the named feeds (absent ones as '')."""
    names = INPUT_NAMES[op]
    last = max(names.index(n) for n in feeds)
    node_inputs = [n if n in feeds else "" for n in names[: last + 1]]
    outputs = OUTPUT_NAMES[op] if outputs is None else outputs
    graph_inputs = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), list(feeds[n].shape)
        )
        for n in node_inputs
        if n
    ]
    elem = helper.np_dtype_to_tensor_dtype(feeds["X"].dtype)
    graph_outputs = [helper.make_tensor_value_info(n, elem, None) for n in outputs if n]
    node = helper.make_node(op, node_inputs, list(outputs), **attributes)
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


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
