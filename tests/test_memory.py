"""Working memory grows with a block of time steps, not with seq_length."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import onnx_recurrent as orc
from onnx_recurrent import scan

MiB = 1 << 20


@pytest.mark.parametrize(("op", "ragged"), [("GRU", False), ("LSTM", True)])
def test_long_sequence_peak_memory_and_blocking(monkeypatch, op, ragged):
    T, N, I, H = 20000, 8, 128, 128
    G = {"GRU": 3, "LSTM": 4}[op]
    fn = {"GRU": orc.gru, "LSTM": orc.lstm}[op]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((T, N, I), dtype=np.float32)
    W = rng.standard_normal((1, G * H, I), dtype=np.float32) * 0.1
    R = rng.standard_normal((1, G * H, H), dtype=np.float32) * 0.1
    lens = rng.integers(T // 2, T + 1, N).astype(np.int32) if ragged else np.full(N, T, np.int32)
    fn(X[:2], W, R, sequence_lens=np.minimum(lens, 2))  # compiled kernels are not working memory
    tracemalloc.start()
    try:
        outputs = fn(X, W, R, sequence_lens=lens)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    extra = peak - sum(o.nbytes for o in outputs)
    assert extra < 64 * MiB, f"peak working memory {extra / MiB:.1f} MiB"

    monkeypatch.setattr(scan, "BLOCK_BYTES", 1 << 40)  # one block: the unblocked computation
    unblocked = fn(X, W, R, sequence_lens=lens)
    for a, b in zip(outputs, unblocked, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
