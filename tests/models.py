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
