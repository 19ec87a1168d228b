"""Streaming: chunks with the final state carried give what one call gives."""

from __future__ import annotations

import numpy as np
import pytest

import onnx_recurrent as orc

from models import random_inputs

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}


def _stream(fn, feeds, chunk, layout):
    """Run ``fn`` chunk by chunk, each chunk's final states the next one's initial ones."""
    time_axis = layout
    X = feeds["X"]
    states = {k: feeds[k] for k in ("initial_h", "initial_c") if k in feeds}
    Ys = []
    for start in range(0, X.shape[time_axis], chunk):
        part = np.take(X, range(start, min(start + chunk, X.shape[time_axis])), axis=time_axis)
        Y, *finals = fn(part, feeds["W"], feeds["R"], feeds["B"], layout=layout, **states)
        states = dict(zip(states, finals, strict=True))
        Ys.append(Y)
    return np.concatenate(Ys, axis=time_axis), *states.values()


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_chunks_equal_one_call(op, layout, chunk):
    feeds = random_inputs(op, T=50, N=3, I=4, H=5, seed=chunk)
    del feeds["sequence_lens"]
    feeds.pop("P", None)
    if layout:
        feeds = {
            k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) if k.startswith(("X", "initial")) else v
            for k, v in feeds.items()
        }
    expected = FUNCTIONS[op](**feeds, layout=layout)
    got = _stream(FUNCTIONS[op], feeds, chunk, layout)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
