"""Prepared weights kept across calls: reused only for bit-identical weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnx_recurrent as orc
from onnx_recurrent import backends, prepared
from onnx_recurrent.cells import GRU
from onnx_recurrent.spec import make_spec

from models import random_inputs

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    op=st.sampled_from(sorted(FUNCTIONS)),
    backend=st.sampled_from(["numba", "numpy"]),
    which=st.sampled_from(["W", "R", "B", "P"]),
    index=st.integers(0, 10**6),
    value=st.sampled_from([0.25, -0.0, 0.0, np.nan, -3.0]),
    threads=st.sampled_from(["1", "2"]),
)
def test_weights_changed_in_place_are_prepared_again(
    monkeypatch, op, backend, which, index, value, threads
):
    """A call after the caller changed its weights in place (one element; NaN, signed
    zero) computes what a first call on the changed weights computes."""
    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", threads)
    feeds = random_inputs(op, T=4, N=3, I=3, H=4, seed=index % 7)
    feeds["sequence_lens"] = np.full(3, 4, np.int32)
    if which == "P" and op != "LSTM":
        which = "B"
    call = FUNCTIONS[op]
    with backends.use(backend):
        call(**feeds)  # prepared and kept
        array = feeds[which]
        array.flat[index % array.size] = value
        after = call(**feeds)
        prepared.clear()
        first = call(**feeds)
    for a, b in zip(after, first, strict=True):
        np.testing.assert_array_equal(a, b)


def test_equal_weights_reuse_the_prepared_ones():
    """Equal weights (another array, the same bits) are prepared once; changed ones
    again; nothing kept aliases the caller's arrays."""
    feeds = random_inputs("GRU", T=2, N=1, I=3, H=4, D=2)
    spec = _spec(feeds["R"], 1)
    W, R, B = feeds["W"], feeds["R"], feeds["B"]
    first = prepared.layer(spec, {}, W, R, B, None)
    assert len(first.directions()) == 2
    assert prepared.layer(spec, {}, W.copy(), R.copy(), B.copy(), None) is first
    kept = [first.W, first.R, first.B, *(w.W for w in first.directions())]
    assert not any(np.shares_memory(k, a) for k in kept for a in (W, R, B))
    assert prepared.layer(spec, {}, np.asfortranarray(W), R, B, None) is first
    R[1, 0, 0] = -R[1, 0, 0]
    assert prepared.layer(spec, {}, W, R, B, None) is not first
    other = _spec(feeds["R"], 0)
    assert prepared.layer(other, {}, W, R, B, None) is not first


def _spec(R, linear_before_reset):
    none = dict.fromkeys(["hidden_size", "activations", "activation_alpha", "activation_beta"])
    return make_spec(
        GRU, R, **none, direction="bidirectional", clip=None, layout=0,
        linear_before_reset=linear_before_reset,
    )  # fmt: skip


def test_kept_weights_are_bounded(monkeypatch):
    """At most MAX_ENTRIES prepared weights, and MAX_BYTES of what they hold, are kept."""
    monkeypatch.setattr(prepared, "MAX_ENTRIES", 3)
    for seed in range(6):
        orc.rnn(**random_inputs("RNN", H=5, seed=seed))
    assert len(prepared._entries) == 3
    prepared.clear()
    orc.rnn(**random_inputs("RNN", H=5, seed=0))
    one = prepared._kept_bytes()
    monkeypatch.setattr(prepared, "MAX_BYTES", 2 * one)
    for seed in range(1, 5):
        orc.rnn(**random_inputs("RNN", H=5, seed=seed))
    assert len(prepared._entries) == 2 and prepared._kept_bytes() == 2 * one
    # one larger than MAX_BYTES is kept alone: it was prepared again at every call (an
    # LSTM of hidden size 1400 took 14-49 ms a call, its Layer 1.1 ms)
    monkeypatch.setattr(prepared, "MAX_BYTES", one - 1)
    prepared.clear()
    feeds = random_inputs("RNN", H=5, seed=0)
    orc.rnn(**feeds)
    assert len(prepared._entries) == 1
    kept = prepared._entries[0][1]
    orc.rnn(**feeds)
    assert prepared._entries == [(prepared._entries[0][0], kept)]  # used again
    orc.rnn(**random_inputs("RNN", H=5, seed=1))  # another: the large one dropped
    assert len(prepared._entries) == 1 and prepared._entries[0][1] is not kept


def test_a_stack_of_more_than_sixteen_layers_is_kept():
    """A stack of 17 or more distinct layers called in turn (16 kept) prepared every
    layer again at every call: 0.8 ms a layer against 0.05."""
    layers = [random_inputs("GRU", H=4, seed=seed) for seed in range(40)]
    for feeds in layers:
        orc.gru(**feeds)
    kept = [layer for _, layer in prepared._entries]
    for feeds in layers:
        orc.gru(**feeds)
    assert [layer for _, layer in prepared._entries] == kept


@pytest.fixture(autouse=True)
def _fresh():
    prepared.clear()
    yield
    prepared.clear()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_memory_held_is_within_max_bytes(monkeypatch, backend):
    """What the kept layers hold (copies, arrangements, packed panels), measured by
    tracemalloc after the calls, stays within MAX_BYTES (the copies alone did; the
    whole was 2.25-2.6 times as much)."""
    import gc
    import tracemalloc

    monkeypatch.setattr(prepared, "MAX_BYTES", 16 << 20)
    rng = np.random.default_rng(0)
    H = I = 256
    X = rng.standard_normal((3, 2, I), dtype=np.float32)
    gc.collect()
    tracemalloc.start()
    try:
        with backends.use(backend):
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(12):  # 1 MiB of W and R each time: fresh weights
                W = rng.standard_normal((1, 4 * H, I), dtype=np.float32)
                R = rng.standard_normal((1, 4 * H, H), dtype=np.float32)
                orc.lstm(X, W, R)
            del W, R
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 2 <= len(prepared._entries) < 12
    assert prepared._kept_bytes() <= prepared.MAX_BYTES
    assert held <= prepared.MAX_BYTES + (1 << 20), held / 2**20
