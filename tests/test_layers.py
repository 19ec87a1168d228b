"""Prepared layers: the one path that functions, sessions and converters run through."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import onnx_recurrent as orc
from onnx_recurrent import scan
from test_properties import _check_against_oracle, _code_path, _settings

from models import random_inputs
from strategies import cases

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}


def _as_layer(op):
    """A function with the operator's signature that makes a Layer, then calls it."""

    def call(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, **a):
        layer = orc.Layer(op, W, R, B, a, P)
        states = (initial_h, initial_c) if op == "LSTM" else (initial_h,)
        return layer(X, sequence_lens, *states)

    return call


@pytest.mark.parametrize("op", ["gru", "lstm", "rnn"])
@_settings(150)
@given(data=st.data())
def test_layer_matches_oracle(op, data):
    """A Layer, made once and called, over the whole attribute space (every code path:
    the one-call path of short forward calls, blocks, threads, both backends)."""
    case = data.draw(cases(op))
    with pytest.MonkeyPatch.context() as mp, _code_path(data):
        mp.setattr(orc, op, _as_layer(op.upper()))
        _check_against_oracle(op, case)


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("T", [1, 7])
def test_layer_equals_function_and_owns_its_weights(op, T):
    feeds = random_inputs(op, T=T, N=3, I=4, H=5, seed=T)
    feeds["sequence_lens"] = None
    W, R, B = feeds["W"], feeds["R"], feeds["B"]
    layer = orc.Layer(op, W, R, B, {"hidden_size": 5}, feeds.get("P"))
    states = [feeds["initial_h"]] + ([feeds["initial_c"]] if op == "LSTM" else [])
    expected = FUNCTIONS[op](**feeds)
    for got, want in zip(layer(feeds["X"], None, *states), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    # copies, read-only: the caller's arrays changed later do not change the layer
    assert not layer.W.flags.writeable and not np.shares_memory(layer.W, W)
    W[...] = 0
    R[...] = 0
    for got, want in zip(layer(feeds["X"], None, *states), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="read-only"):
        layer.R[0, 0, 0] = 1


def test_layer_errors_name_the_input():
    feeds = random_inputs("GRU", T=3, N=2, I=4, H=5)
    layer = orc.Layer("GRU", feeds["W"], feeds["R"], feeds["B"])
    X = feeds["X"]
    with pytest.raises(TypeError, match=r"X must have the layer's dtype float32 \(W's\)"):
        layer(X.astype(np.float64))
    with pytest.raises(ValueError, match=r"X must have input_size=4 \(W's last axis\)"):
        layer(X[..., :3])
    with pytest.raises(ValueError, match=r"initial_h must have shape \[1, 2, 5\]"):
        layer(X, initial_h=np.zeros((1, 3, 5), np.float32))
    with pytest.raises(ValueError, match="initial_c is for LSTM only"):
        layer(X, initial_c=np.zeros((1, 2, 5), np.float32))
    with pytest.raises(ValueError, match=r"sequence_lens\[0\]=4"):
        layer(X, np.array([4, 1], np.int32))
    with pytest.raises(ValueError, match=r"GRU has no attribute\(s\) \['input_forget'\]"):
        orc.Layer("GRU", feeds["W"], feeds["R"], attributes={"input_forget": 1})
    with pytest.raises(ValueError, match=r"P \(peepholes\) is for LSTM only"):
        orc.Layer("GRU", feeds["W"], feeds["R"], P=np.zeros((1, 15), np.float32))
    with pytest.raises(TypeError, match=r"B must have W's dtype float32, got float64"):
        orc.Layer("GRU", feeds["W"], feeds["R"], feeds["B"].astype(np.float64))
    with pytest.raises(ValueError, match=r"Layer has no field\(s\) \['V'\]"):
        layer.replace(V=1)


def test_layer_replace_and_run_override():
    feeds = random_inputs("LSTM", T=4, N=2, I=3, H=4, D=1)
    layer = orc.Layer("LSTM", feeds["W"], feeds["R"], feeds["B"], {"clip": 0.5})
    reverse = layer.replace(attributes={"direction": "reverse"})
    assert reverse.attributes == {"direction": "reverse"} and reverse.W is not layer.W
    got = reverse(feeds["X"])
    want = orc.lstm(feeds["X"], feeds["W"], feeds["R"], feeds["B"], direction="reverse")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    Y, Y_h, Y_c = layer.run(feeds["X"], output_sequence=False)
    assert Y is None and Y_h.shape == Y_c.shape == (1, 2, 4)


def test_layer_called_from_many_threads(monkeypatch):
    """One layer, called from several threads at once (threaded calls among them):
    every result as alone."""
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    feeds = random_inputs("GRU", T=20, N=4, I=3, H=8)
    layer = orc.Layer("GRU", feeds["W"], feeds["R"], feeds["B"])
    inputs = [
        (np.random.default_rng(s).standard_normal((20, 4, 3), dtype=np.float32), lens)
        for s in range(12)
        for lens in [None, feeds["sequence_lens"]][s % 2 : s % 2 + 1]
    ]
    alone = [layer(X, lens) for X, lens in inputs]
    results = [None] * len(inputs)

    def work(i):
        results[i] = layer(*inputs[i])

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for a, b in zip(alone, results, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_converters_return_runnable_layers():
    feeds = random_inputs("RNN", T=3, N=2, I=3, H=4)
    layer = orc.convert.from_keras(feeds["W"][0].T, feeds["R"][0].T, feeds["B"][0, :4], kind="rnn")
    assert isinstance(layer, orc.Layer)
    X = np.swapaxes(feeds["X"], 0, 1).copy()  # Keras is batch-first
    Y, Y_h = layer(X)
    assert Y.shape == (2, 3, 1, 4) and Y_h.shape == (2, 1, 4)


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("states", [False, True])
def test_short_calls_equal_the_scan(op, direction, states):
    """A small call of full-length sequences (one compiled call, prepared with the
    layer: the backend's small_call) gives the general scan's results bit for bit."""
    D = 2 if direction == "bidirectional" else 1
    feeds = random_inputs(op, T=7, N=3, I=5, H=6, D=D)
    attributes = {"direction": direction}
    if op == "GRU":
        attributes["linear_before_reset"] = 1
    layer = orc.Layer(op, feeds["W"], feeds["R"], feeds["B"], attributes, P=feeds.get("P"))
    taken = []
    if layer._small is not None:
        call, backend = layer._small

        def spy(*args):
            taken.append(args)
            return call(*args)

        layer._small = (spy, backend)
    given = {k: feeds[k] for k in ("initial_h", "initial_c") if states and k in feeds}
    short = layer(feeds["X"], **given)
    assert bool(taken) == (orc.backends.select(layer.spec, np.float32).name == "numba")
    with orc.backends.use("numpy"):  # another backend asked for: the general scan
        taken.clear()
        by_numpy = layer(feeds["X"], **given)
        assert not taken
    for a, b in zip(short, by_numpy, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    full = np.full(3, 7, np.int32)
    general = _general(layer, feeds["X"], full, **given)
    for a, b in zip(short, general, strict=True):
        np.testing.assert_array_equal(a, b)
    Y_only = layer(feeds["X"], output_sequence=False, **given)
    assert Y_only[0] is None
    for a, b in zip(Y_only[1:], general[1:], strict=True):
        np.testing.assert_array_equal(a, b)


def _general(layer: orc.Layer, *args, **kwargs):
    """The layer's call through the general scan (its small path set aside)."""
    small, layer._small = layer._small, None
    try:
        return layer(*args, **kwargs)
    finally:
        layer._small = small


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_short_calls_with_lengths_equal_the_scan(op, direction, layout):
    """A small call with ``sequence_lens`` (empty, short and full rows, initial states
    given) runs as one compiled call too, and gives the general scan's bits; lengths
    the full checks refuse still reach them (same errors), and the caller's lengths
    are left as they were."""
    D = 2 if direction == "bidirectional" else 1
    feeds = random_inputs(op, T=7, N=5, I=3, H=4, D=D)
    attributes = {"direction": direction, "layout": layout}
    layer = orc.Layer(op, feeds["W"], feeds["R"], feeds["B"], attributes, P=feeds.get("P"))
    states = {k: feeds[k] for k in ("initial_h", "initial_c") if k in feeds}
    X = feeds["X"]
    if layout:
        X = np.ascontiguousarray(np.swapaxes(X, 0, 1))
        states = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in states.items()}
    taken = []
    if layer._small is not None:
        call, backend = layer._small
        layer._small = (lambda *a: taken.append(a) or call(*a), backend)
    for dtype in (np.int32, np.int64, np.uint16):
        lens = np.array([7, 0, 3, 1, 5], dtype)
        kept = lens.copy()
        got = layer(X, lens, **states)
        assert bool(taken) == (orc.backends.select(layer.spec, np.float32).name == "numba")
        np.testing.assert_array_equal(lens, kept)
        for a, b in zip(got, _general(layer, X, lens, **states), strict=True):
            np.testing.assert_array_equal(a, b)
        taken.clear()
    for bad, error in (
        (np.array([7, 0, 8, 1, 5]), "sequence_lens"),
        (np.array([7, 0, -1, 1, 5]), "sequence_lens"),
        (np.array([7, 0, 3]), "sequence_lens"),
        (np.array([7.0, 0, 3, 1, 5]), "sequence_lens"),
    ):
        with pytest.raises((ValueError, TypeError), match=error):
            layer(X, bad, **states)
        assert not taken


def test_a_layer_and_its_copies_cannot_part_ways():
    # changing layer.attributes or writing into layer.W (setflags(write=True) worked)
    # left the layer as it was and its copies and pickles with the change
    import copy
    import pickle

    rng = np.random.default_rng(0)
    W = rng.standard_normal((1, 12, 3), dtype=np.float32)
    R = rng.standard_normal((1, 12, 4), dtype=np.float32)
    layer = orc.Layer("GRU", W, R, attributes={"linear_before_reset": 1, "clip": 0.5})
    x = rng.standard_normal((5, 2, 3), dtype=np.float32)
    want = layer(x)[0]
    layer.attributes["clip"] = 0.01
    layer.attributes["activations"] = ["Relu", "Tanh"]
    assert layer.attributes == {"linear_before_reset": 1, "clip": 0.5}
    with pytest.raises(ValueError):
        layer.W.setflags(write=True)
    # layer.W = W + 1 was taken: the layer computed with its old W, its copies with the
    # new one (1.48 apart); layer.W = "nonsense" failed at the next call
    for name in ("op", "spec", "W", "R", "B", "P", "dtype", "addresses"):
        with pytest.raises(AttributeError, match=rf"Layer\.{name} is fixed"):
            setattr(layer, name, W + 1)
        with pytest.raises(AttributeError, match=rf"Layer\.{name} is fixed"):
            delattr(layer, name)
    layer.note = "a caller's own attribute"  # others are the caller's
    for other in (copy.copy(layer), copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        np.testing.assert_array_equal(other(x)[0], want)
        assert repr(other) == repr(layer)
        assert other.note == layer.note  # it went with the copy (it was dropped)
    W, R = _weights()
    peepholes = orc.Layer("LSTM", np.zeros((1, 16, 3), np.float32), R[:, :4].repeat(4, 1),
                          P=np.zeros((1, 12), np.float32))  # fmt: skip
    assert repr(peepholes).endswith(", P=[1, 12])")  # as if it had none
    assert set(orc.Layer("GRU", *_weights()).__dict__) == orc.Layer._OWN


class _Named(orc.Layer):  # a subclass with a field of its own
    def __init__(self, *args, name: str = "unnamed", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.name = name


def test_a_subclass_copies_and_pickles_with_its_own_fields():
    import copy
    import pickle

    layer = _Named("GRU", *_weights(), name="decoder")
    for other in (copy.copy(layer), copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(other) is _Named and other.name == "decoder"  # was "unnamed"


def _call_in_child(layer, x):
    return layer(x)


@pytest.mark.parametrize("prepare", [True, False])
def test_a_layer_pickles_to_another_process(prepare):
    # a prepared (or called) layer failed to pickle: "Can't pickle local object
    # 'NumbaBackend.small_call.<locals>.call'"
    import multiprocessing
    import pickle

    rng = np.random.default_rng(0)
    W = rng.standard_normal((2, 12, 3), dtype=np.float32)
    R = rng.standard_normal((2, 12, 4), dtype=np.float32)
    layer = orc.Layer("GRU", W, R, attributes={"direction": "bidirectional"}, prepare=prepare)
    x = rng.standard_normal((5, 2, 3), dtype=np.float32)
    want = layer(x)
    copy = pickle.loads(pickle.dumps(layer))
    assert copy.attributes == layer.attributes and copy._prepared
    for a, b in zip(copy(x), want, strict=True):
        np.testing.assert_array_equal(a, b)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply(_call_in_child, (layer, x))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_no_memory_for_the_packed_weights_names_the_layer(monkeypatch):
    # NumPy's "Unable to allocate 2.98 GiB for an array with shape (800160016,)"
    # named an internal array only
    from onnx_recurrent import backends

    backend = backends.select(orc.Layer("GRU", *_weights(), prepare=False).spec, np.float32)

    def no_memory(*args):
        raise MemoryError("Unable to allocate 2.98 GiB for an array with shape (800160016,)")

    monkeypatch.setattr(backend, "prepare", no_memory)
    with pytest.raises(MemoryError, match=r"prepare a GRU layer \(hidden_size=4, input_size=3"):
        orc.Layer("GRU", *_weights())


def _weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((1, 12, 3), dtype=np.float32), rng.standard_normal(
        (1, 12, 4), dtype=np.float32
    )


def test_a_bidirectional_call_counts_both_directions_when_it_decides_on_threads(monkeypatch):
    # the small path counted one direction's work: a bidirectional call of twice the
    # planned size ran on one thread (measured: 2.76 ms, against 1.91 on two threads,
    # T=200, N=8, H=64, AMD EPYC)
    from onnx_recurrent import threads

    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    feeds = random_inputs("LSTM", T=20, N=4, I=8, H=8, D=2, full=False)
    layer = orc.Layer("LSTM", feeds["W"], feeds["R"], attributes={"direction": "bidirectional"})
    one_direction = 20 * 4 * 4 * 8 * (8 + 8)
    monkeypatch.setattr(scan, "PARALLEL_MACS", one_direction + 1)  # both: above it
    monkeypatch.setattr(scan, "parallel_macs", lambda workers=None: one_direction + 1)
    parties = []
    run = threads.run
    monkeypatch.setattr(threads, "run", lambda n, *a, **k: parties.append(n) or run(n, *a, **k))
    got = layer(feeds["X"])
    assert max(parties, default=1) > 1
    for a, b in zip(got, orc.lstm(**feeds, direction="bidirectional"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_weight_or_state_given_as_a_list_takes_the_others_dtype():
    """As the functions take them (a list has no dtype of its own): ``Layer`` refused W
    as a list, blaming R ("R must have W's dtype float64"), ``gru_cell`` W or R as
    lists, ``run_layers`` the states as lists."""
    W, R = _weights()
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 2, 3), dtype=np.float32)
    h0 = rng.standard_normal((1, 2, 4), dtype=np.float32)
    layer = orc.Layer("GRU", W, R)
    want = layer(X, initial_h=h0)
    for made in (orc.Layer("GRU", W.tolist(), R), orc.Layer("GRU", W, R.tolist())):
        assert made.dtype == np.float32
        for a, b in zip(made(X, initial_h=h0), want, strict=True):
            np.testing.assert_array_equal(a, b)
    from onnx_recurrent.convert import run_layers

    np.testing.assert_array_equal(run_layers([layer], X, h0.tolist())[1], want[1])
    cell = orc.gru_cell(X[0], h0[0], W[0], R[0], hidden_size=4)
    listed = orc.gru_cell(X[0], h0[0], W[0].tolist(), R[0].tolist(), hidden_size=4)
    np.testing.assert_array_equal(listed, cell)
