"""onnx_recurrent.convert: PyTorch and Keras weights to ONNX and back.

The Keras tests on plain arrays compare with a NumPy transcription of Keras' equations
and need neither Keras nor torch; the torch and Keras tests skip without them.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

from onnx_recurrent.convert import Layer, from_keras, from_torch, run_layers, to_keras, to_torch

TOL = 1e-5
T, N, I, H = 6, 3, 4, 5
GATES = {"gru": 3, "lstm": 4, "rnn": 1}
KERAS_CASES = [("gru", True), ("gru", False), ("lstm", None), ("rnn", None)]


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def keras_forward(kind, kernel, recurrent_kernel, bias, x, reset_after=None, h0=None, c0=None):
    """Keras' GRU / LSTM / SimpleRNN on batch-first x, in float64, from Keras' equations.

    Returns the sequence ``(N, T, H)`` and the final states.
    """
    k, rk = kernel.astype(np.float64), recurrent_kernel.astype(np.float64)
    Hn = rk.shape[0]
    b = np.zeros(k.shape[1]) if bias is None else bias.astype(np.float64)
    b_in, b_rec = (b[0], b[1]) if b.ndim == 2 else (b, np.zeros_like(b))
    h = np.zeros((x.shape[0], Hn)) if h0 is None else h0.astype(np.float64)
    c = np.zeros_like(h) if c0 is None else c0.astype(np.float64)
    ys = []
    for t in range(x.shape[1]):
        xt = x[:, t].astype(np.float64) @ k + b_in
        if kind == "rnn":
            h = np.tanh(xt + h @ rk + b_rec)
        elif kind == "lstm":  # gates i f c o
            zi, zf, zc, zo = np.split(xt + h @ rk + b_rec, 4, axis=-1)
            c = _sigmoid(zf) * c + _sigmoid(zi) * np.tanh(zc)
            h = _sigmoid(zo) * np.tanh(c)
        else:  # gates z r h
            x_z, x_r, x_h = np.split(xt, 3, axis=-1)
            if reset_after:
                r_z, r_r, r_h = np.split(h @ rk + b_rec, 3, axis=-1)
                z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
                hh = np.tanh(x_h + r * r_h)
            else:
                z = _sigmoid(x_z + h @ rk[:, :Hn])
                r = _sigmoid(x_r + h @ rk[:, Hn : 2 * Hn])
                hh = np.tanh(x_h + (r * h) @ rk[:, 2 * Hn :])
            h = z * h + (1 - z) * hh
        ys.append(h)
    return (np.stack(ys, axis=1), h, c) if kind == "lstm" else (np.stack(ys, axis=1), h)


def keras_weights(kind, reset_after, bias=True, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    G = GATES[kind]
    weights = [rng.standard_normal((I, G * H)) * 0.5, rng.standard_normal((H, G * H)) * 0.5]
    if bias:
        weights.append(rng.standard_normal((2, G * H) if reset_after else (G * H,)) * 0.5)
    return [w.astype(dtype) for w in weights]


def onnx_layer(op, D=1, dtype=np.float32, seed=0, **attributes):
    rng = np.random.default_rng(seed)
    G = GATES[op.lower()]
    W, R, B = (
        rng.standard_normal(s).astype(dtype) * 0.5
        for s in [(D, G * H, I), (D, G * H, H), (D, 2 * G * H)]
    )
    direction = {1: "forward", 2: "bidirectional"}[D]
    return Layer(op, W, R, B, {"hidden_size": H, "direction": direction, **attributes})


def _max_diff(actual, expected):
    return max(
        float(np.abs(np.asarray(a, np.float64) - np.asarray(e, np.float64)).max())
        for a, e in zip(actual, expected, strict=True)
    )


# --- Keras, on plain arrays: no torch, no Keras -------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("kind", "reset_after"), KERAS_CASES)
def test_keras_round_trip_is_exact(kind, reset_after, bias, dtype):
    weights = keras_weights(kind, reset_after, bias, dtype)
    layer = from_keras(*weights, kind=kind, reset_after=reset_after)
    assert layer.op == kind.upper() and layer.W.dtype == dtype
    assert layer.attributes["layout"] == 1 and layer.attributes["hidden_size"] == H
    assert (layer.B is None) == (not bias)
    back = to_keras(layer, kind=kind, reset_after=reset_after)
    assert len(back) == len(weights)
    for a, b in zip(back, weights, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("kind", "reset_after"), KERAS_CASES)
def test_from_keras_computes_keras_equations(kind, reset_after, bias, initial):
    weights = keras_weights(kind, reset_after, bias)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, T, I)).astype(np.float32)
    states = [rng.standard_normal((N, H)).astype(np.float32) for _ in range(1 + (kind == "lstm"))]
    expected = keras_forward(
        kind,
        *weights[:2],
        weights[2] if bias else None,
        x,
        reset_after,
        *(states if initial else []),
    )
    layer = from_keras(*weights, kind=kind, reset_after=reset_after)
    # run_layers takes PyTorch's [layers*directions, N, H] states
    got = run_layers([layer], x, *(s[None] for s in states if initial))
    assert got[0].shape == (N, T, H)
    assert _max_diff([got[0], *(s[0] for s in got[1:])], expected) < TOL
    # one ONNX node, layout=1: Y [N, T, 1, H], states [N, 1, H]
    got = layer.run(x, None, *(s[:, None] for s in states if initial))
    assert _max_diff([got[0][:, :, 0], *(s[:, 0] for s in got[1:])], expected) < TOL


@pytest.mark.parametrize(("op", "lbr"), [("GRU", 0), ("GRU", 1), ("LSTM", None), ("RNN", None)])
def test_to_keras_computes_the_onnx_layer(op, lbr):
    """Any ONNX biases, Rb included: to_keras folds what Keras keeps in one vector."""
    layer = onnx_layer(op, layout=1, **({} if lbr is None else {"linear_before_reset": lbr}))
    weights = to_keras(layer)
    x = np.random.default_rng(2).standard_normal((N, T, I)).astype(np.float32)
    expected = keras_forward(op.lower(), *weights, x, reset_after=bool(lbr))
    Y, *states = layer.run(x)
    assert _max_diff([Y[:, :, 0], *(s[:, 0] for s in states)], expected) < TOL
    again = from_keras(*weights, kind=op, reset_after=None if lbr is None else bool(lbr))
    assert _max_diff(again.run(x), layer.run(x)) < TOL


def test_run_layers_chains_and_layouts():
    rng = np.random.default_rng(3)
    first = onnx_layer("LSTM", D=2, seed=4)
    W2 = rng.standard_normal((2, 4 * H, 2 * H)).astype(np.float32)
    second = first.replace(W=W2)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    h0, c0 = (rng.standard_normal((4, N, H)).astype(np.float32) for _ in range(2))
    Y, Y_h, Y_c = run_layers([first, second], x, h0, c0)
    assert Y.shape == (T, N, 2 * H) and Y_h.shape == Y_c.shape == (4, N, H)
    # by hand: layer 0, then layer 1 on [T, N, 2H]
    Y0, h_0, c_0 = first.run(x, None, h0[:2], c0[:2])
    Y1, h_1, c_1 = second.run(Y0.transpose(0, 2, 1, 3).reshape(T, N, -1), None, h0[2:], c0[2:])
    np.testing.assert_array_equal(Y, Y1.transpose(0, 2, 1, 3).reshape(T, N, -1))
    np.testing.assert_array_equal(Y_h, np.concatenate([h_0, h_1]))
    np.testing.assert_array_equal(Y_c, np.concatenate([c_0, c_1]))
    # layout=1: batch-first X and Y, the same (PyTorch-shaped) states
    batch_first = [
        layer.replace(attributes={**layer.attributes, "layout": 1}) for layer in (first, second)
    ]
    Yb, Yb_h, Yb_c = run_layers(batch_first, x.transpose(1, 0, 2), h0, c0)
    assert _max_diff([Yb.transpose(1, 0, 2), Yb_h, Yb_c], [Y, Y_h, Y_c]) < 1e-6
    # output_sequence=False: no Y, the same states
    none, *states = run_layers([first, second], x, h0, c0, output_sequence=False)
    assert none is None and _max_diff(states, [Y_h, Y_c]) < 1e-6


def _ones(*shapes, dtype=np.float64):
    return [np.ones(shape, dtype) for shape in shapes]


@pytest.mark.parametrize(
    ("args", "keywords", "error", "match"),
    [
        (
            _ones((I, 9), (H, 9)),
            {"kind": "conv"},
            ValueError,
            r"kind must be one of 'gru', 'lstm'",
        ),
        (
            _ones((I, 15), (6, 15)),
            {"kind": "gru"},
            ValueError,
            r"recurrent_kernel must have shape \[hidden_size, 3\*hidden_size\]",
        ),
        (_ones((I, 14), (H, 15)), {"kind": "gru"}, ValueError, r"^kernel must have shape"),
        (
            _ones((I, 12), (H, 15)),
            {"kind": "gru"},
            ValueError,
            r"^kernel must have shape \[input_size, 3\*hidden_size\] .*=5.*got \[4, 12\]",
        ),
        (_ones(15, (H, 15)), {"kind": "gru"}, ValueError, r"^kernel must have shape"),
        (
            _ones((I, 20), (H, 20)),
            {"kind": "gru"},
            ValueError,
            r"recurrent_kernel must have shape .* for kind='gru', got \[5, 20\]",
        ),
        (
            _ones((I, 15), (H, 15), 15),
            {"kind": "gru"},
            ValueError,
            r"bias must have shape \[2, 15\] for kind='gru', reset_after=True",
        ),
        (
            _ones((I, 15), (H, 15), (2, 15)),
            {"kind": "gru", "reset_after": False},
            ValueError,
            r"bias must have shape \[15\] .*reset_after=False",
        ),
        (
            _ones((I, 20), (H, 20), 15),
            {"kind": "lstm"},
            ValueError,
            r"bias must have shape \[20\] for kind='lstm' \(hidden_size=5\), got \[15\]",
        ),
        (
            _ones((I, 20), (H, 20)),
            {"kind": "lstm", "reset_after": True},
            ValueError,
            r"reset_after is for kind='gru' only",
        ),
        (
            [np.ones((I, 5), np.int64), np.ones((H, 5))],
            {"kind": "rnn"},
            TypeError,
            r"kernel must have a float dtype",
        ),
        (
            [np.ones((I, 5)), np.ones((H, 5), np.float32)],
            {"kind": "rnn"},
            TypeError,
            r"one dtype, got kernel float64, recurrent_kernel float32",
        ),
        (  # "False" is true: it was taken for reset_after=True
            _ones((I, 15), (H, 15), (2, 15)),
            {"kind": "gru", "reset_after": "False"},
            TypeError,
            r"reset_after must be a bool, got str 'False'",
        ),
        (
            _ones((I, 15), (H, 15), (2, 15)),
            {"kind": "gru", "reset_after": 0.5},
            TypeError,
            r"reset_after must be a bool, got float 0.5",
        ),
    ],
)
def test_from_keras_errors(args, keywords, error, match):
    with pytest.raises(error, match=match):
        from_keras(*args, **keywords)


def test_from_keras_given_a_layer_or_its_weights_list_says_how_to_call_it():
    # Python's "missing 1 required positional argument: 'recurrent_kernel'" told nothing
    class KerasLayer:
        def get_weights(self):
            return _ones((I, 15), (H, 15), (2, 15))

    weights = KerasLayer().get_weights()
    for given, what in ((KerasLayer(), "a Keras layer"), (weights, "a list of 3")):
        with pytest.raises(TypeError, match=rf"unpacked, got {what}: from_keras\(\*keras_"):
            from_keras(given, kind="gru")
    assert from_keras(*weights, kind="gru").hidden_size == H


@pytest.mark.parametrize(
    ("layer", "keywords", "error", "match"),
    [
        (
            onnx_layer("GRU", D=2, linear_before_reset=1),
            {},
            ValueError,
            r"direction='bidirectional', expected 'forward'",
        ),
        (onnx_layer("RNN", direction="reverse"), {}, ValueError, r"direction='reverse', expected"),
        (
            onnx_layer("GRU", linear_before_reset=1),
            {"kind": "lstm"},
            ValueError,
            r"layer is a GRU, expected a LSTM",
        ),
        (
            onnx_layer("GRU", linear_before_reset=1),
            {"reset_after": False},
            ValueError,
            r"reset_after=False .* linear_before_reset=1",
        ),
        (
            onnx_layer("GRU"),
            {"reset_after": True},
            ValueError,
            r"reset_after=True .* linear_before_reset=0",
        ),
        (onnx_layer("RNN"), {"reset_after": True}, ValueError, r"reset_after is for kind='gru'"),
        (onnx_layer("RNN", clip=2.0), {}, ValueError, r"cannot be computed by Keras: clip=2.0"),
        (
            onnx_layer("LSTM", input_forget=1),
            {},
            ValueError,
            r"cannot be computed by Keras: input_forget=1",
        ),
        ({"W": 1}, {}, TypeError, r"layer must be a Layer, got dict"),
        (
            onnx_layer("GRU", linear_before_reset=1),
            {"reset_after": "no"},
            TypeError,
            r"reset_after must be a bool, got str 'no'",
        ),
        (  # the folded bias was inf, with only NumPy's overflow warning
            Layer(
                "RNN",
                np.ones((1, H, I), np.float16),
                np.ones((1, H, H), np.float16),
                np.full((1, 2 * H), 40000, np.float16),
            ),
            {},
            ValueError,
            r"Wb \+ Rb, overflows float16 \(up to 80000\)",
        ),
    ],
)
def test_to_keras_errors(layer, keywords, error, match):
    with pytest.raises(error, match=match):
        to_keras(layer, **keywords)


def test_layer_and_run_layers_errors():
    W = np.zeros((1, 3 * H, I), np.float32)
    R = np.zeros((1, 3 * H, H), np.float32)
    with pytest.raises(
        ValueError, match=r"Layer.op must be one of \['GRU', 'LSTM', 'RNN'\], got 'Gru'"
    ):
        Layer("Gru", W, R)
    with pytest.raises(ValueError, match=r"GRU has no attribute\(s\) \['input_forget'\]"):
        Layer("GRU", W, R, attributes={"input_forget": 1})
    with pytest.raises(ValueError, match=r"R must be 3-D"):
        Layer("GRU", W, R[0])
    with pytest.raises(TypeError, match=r"B must have a float dtype"):
        Layer("GRU", W, R, np.zeros((1, 6 * H), np.int32))
    gru = Layer("GRU", W, R)
    x = np.zeros((T, N, I), np.float32)
    with pytest.raises(ValueError, match=r"initial_c is for LSTM only"):
        gru.run(x, initial_c=np.zeros((1, N, H), np.float32))
    with pytest.raises(ValueError, match=r"initial_c is for LSTM only"):
        run_layers([gru], x, None, np.zeros((1, N, H), np.float32))
    with pytest.raises(ValueError, match=r"at least one layer"):
        run_layers([], x)
    with pytest.raises(ValueError, match=r"layers\[1\] is a RNN with layout=0, layers\[0\] a GRU"):
        run_layers([gru, onnx_layer("RNN")], x)
    with pytest.raises(ValueError, match=r"layers\[1\] is a GRU with layout=1"):
        run_layers([gru, Layer("GRU", W, R, attributes={"layout": 1})], x)
    upper = Layer("GRU", np.zeros((1, 3 * H, H), np.float32), R)  # takes gru's Y
    with pytest.raises(ValueError, match=r"initial_h must have shape \[2, 3, 5\] \[num_layers"):
        run_layers([gru, upper], x, np.zeros((1, N, H), np.float32))
    # PyTorch's shape named, not a layer's batch-first slice ("[3, 1, 5] ... got [4, 1, 5]")
    batch_first = Layer("GRU", W, R, attributes={"layout": 1})
    upper_first = Layer("GRU", upper.W, R, attributes={"layout": 1})
    with pytest.raises(ValueError, match=r"\[2, 6, 5\] .*X's batch_size is 6\), got \[2, 4, 5\]"):
        run_layers(
            [batch_first, upper_first], np.zeros((6, T, I), np.float32), np.zeros((2, 4, H))
        )
    # checked before any layer runs: NumPy's concatenate error after them all, or a
    # layer's own terms for X (layers[1]'s input is layers[0]'s output)
    wider = Layer(
        "GRU",
        np.zeros((1, 3 * (H + 1), H), np.float32),
        np.zeros((1, 3 * (H + 1), H + 1), np.float32),
    )
    with pytest.raises(ValueError, match=r"layers\[1\] has hidden_size=6, layers\[0\] 5"):
        run_layers([gru, wider], x)
    # layers[1] blamed, not X ("X must have the layer's dtype float64"), after layers[0] ran
    double = Layer("GRU", upper.W.astype(np.float64), R.astype(np.float64))
    with pytest.raises(TypeError, match=r"layers\[1\] is float64, layers\[0\] float32: a"):
        run_layers([gru, double], x)
    with pytest.raises(ValueError, match=r"layers\[1\] has input_size=4 .*layers\[0\] gives"):
        run_layers([gru, gru], x)
    with pytest.raises(ValueError, match=r"must have shape \[1, 3, 5\].*got \[1, 3, 2\]"):
        run_layers([gru], x, np.zeros((1, N, 2), np.float32))
    with pytest.raises(TypeError, match=r"layers\[1\] must be a Layer, got str"):
        run_layers([gru, "gru"], x)
    assert (
        repr(gru)
        == "Layer('GRU', W=[1, 15, 4], R=[1, 15, 5], B=None, dtype=float32, attributes={})"
    )


def test_missing_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(
        ImportError, match=r"from_torch needs torch.*pip install 'onnx-recurrent\[torch\]'"
    ):
        from_torch(object())
    with pytest.raises(ImportError, match=r"to_torch needs torch.*onnx-recurrent\[torch\]"):
        to_torch([], object())


# --- PyTorch ---------------------------------------------------------------------------------

MODES = ["GRU", "LSTM", "RNN_TANH", "RNN_RELU"]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def make_module(torch, mode, seed=0, **options):
    torch.manual_seed(seed)
    cls = {"GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM}.get(mode, torch.nn.RNN)
    extra = {"nonlinearity": mode[4:].lower()} if mode.startswith("RNN") else {}
    return cls(I, H, **extra, **options).eval()


def torch_inputs(torch, module, batch_first, initial, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((N, T, I) if batch_first else (T, N, I), generator=g)
    shape = (module.num_layers * (1 + module.bidirectional), N, H)
    states = [torch.randn(shape, generator=g) for _ in range(1 + (module.mode == "LSTM"))]
    return x, (states if initial else [])


def torch_run(module, x, states):
    Y, final = module(x, (tuple(states) if len(states) == 2 else states[0]) if states else None)
    return [t.detach().numpy() for t in (Y, *(final if isinstance(final, tuple) else [final]))]


@pytest.mark.parametrize("initial", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_torch_forward(torch, mode, num_layers, bidirectional, batch_first, bias, initial):
    module = make_module(
        torch,
        mode,
        num_layers=num_layers,
        bidirectional=bidirectional,
        batch_first=batch_first,
        bias=bias,
    )
    x, states = torch_inputs(torch, module, batch_first, initial)
    expected = torch_run(module, x, states)
    layers = from_torch(module)
    assert len(layers) == num_layers
    got = run_layers(layers, x.numpy(), *(s.numpy() for s in states))
    assert [a.shape for a in got] == [e.shape for e in expected]
    assert all(a.dtype == np.float32 for a in got)
    assert _max_diff(got, expected) < TOL


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", MODES)
def test_torch_packed_sequences(torch, mode, bidirectional, batch_first):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    module = make_module(
        torch, mode, num_layers=2, bidirectional=bidirectional, batch_first=batch_first
    )
    x, states = torch_inputs(torch, module, batch_first, True)
    lengths = torch.tensor([4, T, 1])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    out, final = module(packed, (tuple(states) if len(states) == 2 else states[0]))
    Y, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=T)
    expected = [Y, *(final if isinstance(final, tuple) else [final])]
    got = run_layers(
        from_torch(module),
        x.numpy(),
        *(s.numpy() for s in states),
        sequence_lens=lengths.numpy().astype(np.int32),
    )
    assert _max_diff(got, [e.detach().numpy() for e in expected]) < TOL


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", MODES)
def test_torch_round_trip_is_exact(torch, mode, bidirectional, bias):
    options = {"num_layers": 2, "bidirectional": bidirectional, "bias": bias}
    source, target = make_module(torch, mode, 0, **options), make_module(torch, mode, 1, **options)
    layers = from_torch(source)
    assert to_torch(layers, target) is target
    expected, got = source.state_dict(), target.state_dict()
    assert list(got) == list(expected)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    for a, b in zip(from_torch(target), layers, strict=True):
        for name in ("W", "R", "B"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_torch_attributes_and_shapes(torch):
    layers = from_torch(
        make_module(torch, "GRU", num_layers=2, bidirectional=True, batch_first=True)
    )
    assert [layer.attributes for layer in layers] == [
        {"hidden_size": H, "direction": "bidirectional", "layout": 1, "linear_before_reset": 1}
    ] * 2
    assert [layer.input_size for layer in layers] == [I, 2 * H]
    assert layers[1].W.shape == (2, 3 * H, 2 * H) and layers[1].B.shape == (2, 6 * H)
    (rnn,) = from_torch(make_module(torch, "RNN_RELU", bias=False))
    assert rnn.attributes == {
        "hidden_size": H,
        "direction": "forward",
        "layout": 0,
        "activations": ["Relu"],
    }
    assert rnn.B is None
    (lstm,) = from_torch(make_module(torch, "LSTM"))
    assert lstm.op == "LSTM" and lstm.W.shape == (1, 4 * H, I) and lstm.num_directions == 1


def test_torch_gate_order(torch):
    """PyTorch's GRU r z n becomes z r h; its LSTM i f g o becomes i o f c."""
    for mode, onnx_from_torch in [("GRU", [1, 0, 2]), ("LSTM", [0, 3, 1, 2])]:
        module = make_module(torch, mode)
        G = len(onnx_from_torch)
        with torch.no_grad():
            for g in range(G):
                module.weight_ih_l0[g * H : (g + 1) * H] = g
                module.bias_hh_l0[g * H : (g + 1) * H] = 10 + g
        (layer,) = from_torch(module)
        assert [layer.W[0, g * H, 0] for g in range(G)] == onnx_from_torch
        assert [layer.B[0, (G + g) * H] for g in range(G)] == [10 + g for g in onnx_from_torch]


def test_torch_dtypes(torch):
    module = make_module(torch, "LSTM", num_layers=2, bidirectional=True).double()
    x, states = torch_inputs(torch, module, False, True)
    x, states = x.double(), [s.double() for s in states]
    layers = from_torch(module)
    assert layers[0].W.dtype == np.float64
    assert (
        _max_diff(
            run_layers(layers, x.numpy(), *(s.numpy() for s in states)),
            torch_run(module, x, states),
        )
        < 1e-12
    )
    ml_dtypes = pytest.importorskip("ml_dtypes")
    source = make_module(torch, "GRU").bfloat16()
    (layer,) = from_torch(source)
    assert layer.W.dtype == ml_dtypes.bfloat16
    target = to_torch([layer], make_module(torch, "GRU", seed=1).bfloat16())
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_torch_errors(torch):
    with pytest.raises(
        TypeError,
        match=r"expected a torch.nn.GRU, LSTM or RNN, got torch.nn.modules.linear.Linear",
    ):
        from_torch(torch.nn.Linear(2, 3))
    with pytest.raises(TypeError, match=r"got builtins.str"):
        to_torch([], "GRU")
    with pytest.raises(ValueError, match=r"proj_size=2 is not supported"):
        from_torch(torch.nn.LSTM(I, H, proj_size=2))
    with pytest.raises(ValueError, match=r"on the 'meta' device \(no values\)"):
        from_torch(torch.nn.GRU(I, H, device="meta"))  # torch's NotImplementedError before
    gru = make_module(torch, "GRU", num_layers=2)
    layers = from_torch(gru)
    before = {k: v.clone() for k, v in gru.state_dict().items()}

    def second(**changes):  # made inside pytest.raises: a Layer checks itself
        return lambda: [layers[0], layers[1].replace(**changes)]

    lbr = {"linear_before_reset": 1}
    cases = [
        (layers[:1], r"expected 2 layers \(num_layers\), got 1"),
        ([layers[0], *from_torch(make_module(torch, "LSTM"))], r"layers\[1\] is a LSTM, expected"),
        (
            from_torch(make_module(torch, "GRU", num_layers=2, bidirectional=True)),
            r"layers\[0\] has direction='bidirectional', expected 'forward'",
        ),
        (
            second(W=layers[1].W[:, :, :2]),
            r"layers\[1\].W must have shape \[1, 15, 5\] .*got \[1, 15, 2\]",
        ),
        (second(B=layers[1].B[:, :3]), r"B must have shape \[1, 30\]"),
        (second(attributes={**lbr, "hidden_size": 7}), r"hidden_size=7 disagrees with R"),
        (second(attributes={}), r"layers\[1\] has linear_before_reset=0"),
        (
            second(attributes={**lbr, "clip": 3.0}),
            r"layers\[1\] cannot be computed by torch.nn.GRU: clip=3.0",
        ),
        (
            second(attributes={**lbr, "activations": ["Sigmoid", "Relu"]}),
            r"activations=\['Sigmoid', 'Relu'\] \(needs \['sigmoid', 'tanh'\]\)",
        ),
        ([layers[0], ["not a layer"]], r"layers\[1\] must be a Layer"),
    ]
    for bad, match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            to_torch(bad() if callable(bad) else bad, gru)
    for name, value in gru.state_dict().items():  # nothing written by a failed call
        assert torch.equal(value, before[name]), name
    relu = from_torch(make_module(torch, "RNN_RELU"))
    with pytest.raises(
        ValueError, match=r"torch.nn.RNN: activations=\['Relu'\] \(needs \['tanh'\]\)"
    ):
        to_torch(relu, make_module(torch, "RNN_TANH"))
    with pytest.raises(
        ValueError, match=r"layers\[0\] has a non-zero B; the module has bias=False"
    ):
        to_torch(relu, make_module(torch, "RNN_RELU", bias=False))
    zero_bias = [relu[0].replace(B=np.zeros_like(relu[0].B))]
    to_torch(zero_bias, make_module(torch, "RNN_RELU", bias=False))  # zeros are fine


def test_to_torch_refuses_what_it_could_not_write_or_would_drop(torch):
    # each was accepted, and the module then computed something else, silently
    from torch.nn.utils import prune

    src = make_module(torch, "GRU")
    layers = from_torch(src)
    for wrap, match in (
        (
            lambda m: torch.nn.utils.parametrizations.weight_norm(m, name="weight_hh_l0"),
            r"module.weight_hh_l0 is not a parameter of the module but computed from",
        ),
        (
            lambda m: prune.l1_unstructured(m, "weight_ih_l0", amount=0.3),
            r"module.weight_ih_l0 is not a parameter",
        ),
    ):
        dst = make_module(torch, "GRU")
        wrap(dst)
        before = {k: v.clone() for k, v in dst.state_dict().items()}
        with pytest.raises(ValueError, match=match):
            to_torch(layers, dst)
        for name, value in dst.state_dict().items():
            assert torch.equal(value, before[name]), name
    with pytest.raises(ValueError, match=r"module.weight_ih_l0 is on the 'meta' device"):
        to_torch(layers, torch.nn.GRU(I, H, device="meta"))
    lstm = from_torch(make_module(torch, "LSTM"))[0]
    peepholes = lstm.replace(P=np.full((1, 3 * H), 0.5, np.float32))
    with pytest.raises(ValueError, match=r"torch.nn.LSTM: peepholes \(a non-zero P\)"):
        to_torch([peepholes], make_module(torch, "LSTM"))
    with pytest.raises(ValueError, match=r"Keras: peepholes \(a non-zero P\)"):
        to_keras(peepholes)
    to_torch([lstm.replace(P=np.zeros((1, 3 * H), np.float32))], make_module(torch, "LSTM"))


def test_from_torch_names_a_missing_or_misshapen_parameter(torch):
    # a deleted parameter was AttributeError, a bias of 19 values numpy's "array split
    # does not result in an equal division"
    m = make_module(torch, "GRU")
    del m.weight_hh_l0
    with pytest.raises(ValueError, match=r"module.weight_hh_l0 is missing, expected a tensor"):
        from_torch(m)
    m = make_module(torch, "GRU", bias=False)
    m.bias = True  # the attribute says bias, the module has none
    with pytest.raises(ValueError, match=r"module.bias_ih_l0 is missing"):
        from_torch(m)
    m = make_module(torch, "GRU")
    m.bias_hh_l0 = torch.nn.Parameter(torch.zeros(3 * H + 1))
    with pytest.raises(
        ValueError, match=rf"module.bias_hh_l0 has shape \[{3 * H + 1}\], expected"
    ):
        from_torch(m)
    m = make_module(torch, "LSTM", num_layers=2)
    m.weight_ih_l1 = torch.nn.Parameter(torch.zeros(4 * H, H + 1))
    with pytest.raises(ValueError, match=rf"weight_ih_l1 has shape \[{4 * H}, {H + 1}\], "):
        from_torch(m)


def test_from_torch_reads_a_negative_view(torch):
    # numpy() refuses a tensor with its negative bit set (a lazy negation)
    m = make_module(torch, "GRU")
    m.weight_ih_l0 = torch.nn.Parameter(torch._neg_view(torch.randn(3 * H, I)))
    x, _ = torch_inputs(torch, m, False, False)
    with torch.no_grad():
        expected = torch_run(m, x, [])
    assert _max_diff(run_layers(from_torch(m), x.numpy()), expected) < TOL


def test_to_torch_checks_every_parameter_before_writing_any(torch):
    layers = from_torch(make_module(torch, "GRU", num_layers=2, bidirectional=True))

    def refused(module, match):
        before = {k: v.clone() for k, v in module.state_dict().items()}
        with pytest.raises(ValueError, match=match):
            to_torch(layers, module)
        for name, value in module.state_dict().items():  # nothing written
            assert torch.equal(value, before[name]), name

    # torch's "The size of tensor a (7) must match ...", after weight_ih_l0 was written
    m = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    m.weight_hh_l1 = torch.nn.Parameter(torch.zeros(3 * H, H + 2))
    refused(m, rf"module.weight_hh_l1 has shape \[{3 * H}, {H + 2}\], expected \[{3 * H}, {H}\]")
    # one tensor under two names: the reverse direction overwrote the forward one
    m = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    m.weight_hh_l0_reverse = m.weight_hh_l0
    refused(m, r"module.weight_hh_l0_reverse is the same tensor as module.weight_hh_l0")
    m = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    del m.weight_ih_l1
    m.register_buffer("weight_ih_l1", torch.zeros(3 * H, 2 * H))
    refused(m, r"module.weight_ih_l1 is a Tensor, not a Parameter")
    # an expanded parameter: torch's "more than one element of the written-to tensor
    # refers to a single memory location", after three parameters were written
    m = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    m.bias_hh_l0 = torch.nn.Parameter(torch.zeros(1).expand(3 * H))
    refused(m, r"module.bias_hh_l0 holds elements that share memory \(strides \[0\]")
    # two views of one tensor that overlap: the second write overwrote part of the
    # first, silently (the module then computed 0.47 away from the layers)
    m = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    base = torch.zeros(4 * H)
    m.bias_ih_l0, m.bias_hh_l0 = torch.nn.Parameter(base[: 3 * H]), torch.nn.Parameter(base[H:])
    refused(m, r"module.bias_hh_l0 overlaps module.bias_ih_l0 in memory")


def test_to_torch_writes_parameters_that_interleave_in_one_tensor(torch):
    """Column blocks of one matrix share a span of memory but no element: written."""
    module = make_module(torch, "GRU")
    layers = from_torch(module)
    m = make_module(torch, "GRU")
    both = torch.zeros(3 * H, I + H)
    m.weight_ih_l0 = torch.nn.Parameter(both[:, :I])
    m.weight_hh_l0 = torch.nn.Parameter(both[:, I:])
    to_torch(layers, m)
    for name, value in module.state_dict().items():
        assert torch.equal(m.state_dict()[name], value), name


def test_to_torch_refuses_what_the_module_dtype_cannot_hold(torch):
    # float16 took 1e5 as inf, silently
    big = Layer(
        "GRU",
        np.full((1, 3 * H, I), 1e5, np.float32),
        np.zeros((1, 3 * H, H), np.float32),
        None,
        {"linear_before_reset": 1},
    )
    m = make_module(torch, "GRU").half()
    before = m.weight_ih_l0.clone()
    with pytest.raises(
        ValueError, match=rf"weight_ih_l0: {3 * H * I} values overflow the module.s dtype float16"
    ):
        to_torch([big], m)
    assert torch.equal(m.weight_ih_l0, before)
    to_torch([big], make_module(torch, "GRU"))  # float32 holds it
    # a B that rounds to zero in float32 is still not zero (the check cast it first)
    zeros = np.zeros((1, 3 * H, I)), np.zeros((1, 3 * H, H))
    tiny = Layer("GRU", *zeros, np.full((1, 6 * H), 1e-60), {"linear_before_reset": 1})
    with pytest.raises(ValueError, match=r"layers\[0\] has a non-zero B; the module has bias="):
        to_torch([tiny], make_module(torch, "GRU", bias=False).double())


def test_to_torch_writes_a_module_made_in_inference_mode(torch):
    # torch's "Inplace update to inference tensor outside InferenceMode is not allowed"
    source = make_module(torch, "LSTM", num_layers=2)
    with torch.inference_mode():
        m = make_module(torch, "LSTM", seed=1, num_layers=2)
    to_torch(from_torch(source), m)
    for name, value in source.state_dict().items():
        assert torch.equal(m.state_dict()[name], value), name


def test_from_torch_reads_weights_a_pre_hook_computes(torch):
    # torch's older weight_norm, spectral_norm and pruning set the weight in a forward
    # pre-hook: after load_state_dict, before a forward, from_torch read stale weights
    # (0.56, 0.28, 0.41 off)
    import warnings

    from torch.nn.utils import prune

    x = np.random.default_rng(3).standard_normal((5, 2, I)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm's deprecation
        wraps = (
            lambda m: torch.nn.utils.weight_norm(m, name="weight_hh_l0"),
            lambda m: torch.nn.utils.spectral_norm(m, name="weight_hh_l0"),
            lambda m: prune.l1_unstructured(m, "weight_ih_l0", amount=0.5),
        )
        for op, wrap in zip(("GRU", "GRU", "LSTM"), wraps, strict=True):
            trained = wrap(make_module(torch, op))
            with torch.no_grad():
                for p in trained.parameters():
                    p.mul_(1.5)
            restored = wrap(make_module(torch, op))
            restored.load_state_dict(trained.state_dict())
            before = {k: v.clone() for k, v in restored.state_dict().items()}
            layers = from_torch(restored)
            for name, value in restored.state_dict().items():
                assert torch.equal(value, before[name]), name
            with torch.no_grad():
                expected = restored(torch.from_numpy(x))[0].numpy()
            np.testing.assert_allclose(run_layers(layers, x)[0], expected, atol=1e-5)


def test_from_torch_leaves_a_module_in_training_mode_as_it_was(torch):
    # a parametrization's spectral_norm runs a power iteration on each read in training
    # mode: from_torch changed the module's _u and _v buffers (by 0.007); it reads the
    # weights as eval mode computes them, and the module keeps its mode
    module = make_module(torch, "LSTM")
    torch.nn.utils.parametrizations.spectral_norm(module, "weight_hh_l0")
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    layers = from_torch(module)
    for name, value in module.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(m.training for m in module.modules())
    module.eval()
    x = np.random.default_rng(3).standard_normal((5, 2, I)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(run_layers(layers, x)[0], expected, atol=1e-5)


def test_from_torch_refuses_a_subclass_with_its_own_forward(torch):
    # its forward may compute anything from the weights (one scaling x by 2 converted
    # silently, 0.45 off); a subclass that keeps torch's forward converts
    class Scaled(torch.nn.GRU):
        def forward(self, x, h=None):
            return super().forward(x * 2, h)

    class Named(torch.nn.GRU):
        pass

    torch.manual_seed(0)
    with pytest.raises(TypeError, match=r"Scaled has its own forward.*torch.nn.GRU's forward"):
        from_torch(Scaled(I, H))
    assert len(from_torch(Named(I, H))) == 1


def test_from_torch_refuses_a_module_whose_hooks_or_forward_change_what_it_computes(torch):
    # forward hooks, forward pre-hooks and a forward set on the module were ignored:
    # the layers computed what the weights alone give (0.35-0.98 off module(x)); the
    # weights' reparametrizations (weight_norm's pre-hook) still convert
    torch.manual_seed(0)
    cases = {
        r"1 forward hook\(s\)": lambda m: m.register_forward_hook(
            lambda mod, args, out: (out[0] * 2, out[1])
        ),
        r"1 forward pre-hook\(s\)": lambda m: m.register_forward_pre_hook(
            lambda mod, args: (args[0] * 2, *args[1:])
        ),
        "a forward set on it": lambda m: setattr(m, "forward", lambda x, h=None: None),
    }
    for what, change in cases.items():
        module = torch.nn.GRU(I, H)
        change(module)
        with pytest.raises(TypeError, match=rf"GRU has {what}: its weights alone"):
            from_torch(module)
    module = torch.nn.GRU(I, H)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(module, name="weight_hh_l0")
    assert len(from_torch(module)) == 1


def test_from_torch_names_a_parameter_of_another_dtype(torch):
    # "R must have W's dtype float32, got float16": no layer, no parameter named
    module = torch.nn.GRU(I, H, num_layers=2)
    module.weight_hh_l1.data = module.weight_hh_l1.data.half()
    with pytest.raises(TypeError, match=r"module.weight_hh_l1 is torch.float16, module.weig"):
        from_torch(module)


def test_run_layers_of_an_empty_batch_or_sequence_and_of_one_layer(torch):
    # N=0 or T=0: "cannot reshape array of size 0 into shape (5,0,newaxis)"; one
    # Layer for the list: "'Layer' object is not iterable"
    module = make_module(torch, "GRU", num_layers=2, bidirectional=True)
    layers = from_torch(module)
    for shape in ((5, 0, I), (0, 3, I)):
        Y, Y_h = run_layers(layers, np.zeros(shape, np.float32))
        assert Y.shape == (*shape[:2], 2 * H) and Y_h.shape == (4, shape[1], H)
    x = np.random.default_rng(0).standard_normal((5, 2, I)).astype(np.float32)
    for a, b in zip(run_layers(layers[0], x), run_layers(layers[:1], x), strict=True):
        np.testing.assert_array_equal(a, b)
    to_torch(layers[0], make_module(torch, "GRU", bidirectional=True))
    with pytest.raises(TypeError, match=r"^run_layers: layers must be a list of Layer, got int"):
        run_layers(3, x)


def test_converters_read_what_the_layer_computes(torch):
    relu = from_torch(make_module(torch, "RNN_RELU"))[0]
    W, R, B = relu.W, relu.R, relu.B
    names = ["Relu"]
    layer = Layer("RNN", W, R, B, {"activations": names})
    names[0] = "Tanh"  # the caller's list changed after: not the layer's
    assert layer.attributes["activations"] == ["Relu"]
    with pytest.raises(ValueError, match=r"activations=\['Relu'\] \(needs \['tanh'\]\)"):
        to_torch([layer], make_module(torch, "RNN_TANH"))
    # attributes the layer reads as these were refused (compared as given)
    for attributes in (
        {"direction": "Forward", "activations": ["Relu"]},
        {"direction": b"forward", "activations": [b"Relu"]},
        {"hidden_size": None, "activations": ["Relu"]},
        {"activations": ["Relu"], "activation_alpha": np.array([], np.float32)},
    ):
        module = to_torch([Layer("RNN", W, R, B, attributes)], make_module(torch, "RNN_RELU"))
        assert torch.equal(module.weight_hh_l0, torch.tensor(R[0])), attributes
    weights = to_keras(Layer("RNN", W, R, B, {"direction": "FORWARD"}))
    np.testing.assert_array_equal(weights[1], R[0].T)


# --- Keras itself (torch backend) --------------------------------------------------------


# Keras 3 with torch tensors warns about NumPy 2's __array__(copy=...) protocol
keras_warnings = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    return pytest.importorskip("keras")


def keras_layer(keras, kind, reset_after, bias):
    cls = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM, "rnn": keras.layers.SimpleRNN}[kind]
    extra = {} if reset_after is None else {"reset_after": reset_after}
    layer = cls(H, return_sequences=True, return_state=True, use_bias=bias, **extra)
    layer.build((N, T, I))
    return layer


def keras_run(keras, layer, x, states):
    return [keras.ops.convert_to_numpy(a) for a in layer(x, initial_state=states or None)]


@keras_warnings
@pytest.mark.parametrize("initial", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize(("kind", "reset_after"), KERAS_CASES)
def test_keras_layers(keras, kind, reset_after, bias, initial):
    source = keras_layer(keras, kind, reset_after, bias)
    source.set_weights(keras_weights(kind, reset_after, bias))  # Keras' biases start at 0
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, T, I)).astype(np.float32)
    states = (
        [rng.standard_normal((N, H)).astype(np.float32) for _ in range(1 + (kind == "lstm"))]
        if initial
        else []
    )
    expected = keras_run(keras, source, x, states)
    layer = from_keras(*source.get_weights(), kind=kind, reset_after=reset_after)
    got = run_layers([layer], x, *(s[None] for s in states))
    assert _max_diff([got[0], *(s[0] for s in got[1:])], expected) < TOL
    target = keras_layer(keras, kind, reset_after, bias)
    target.set_weights(to_keras(layer))
    np.testing.assert_array_equal(keras_run(keras, target, x, states)[0], expected[0])


@keras_warnings
@pytest.mark.parametrize("mode", ["GRU", "LSTM", "RNN_TANH"])
def test_torch_to_keras(torch, keras, mode):
    module = make_module(torch, mode, batch_first=True)
    x, _ = torch_inputs(torch, module, True, False)
    kind = {"GRU": "gru", "LSTM": "lstm", "RNN_TANH": "rnn"}[mode]
    target = keras_layer(keras, kind, True if kind == "gru" else None, True)
    (layer,) = from_torch(module)
    target.set_weights(to_keras(layer))
    expected = torch_run(module, x, [])
    got = keras_run(keras, target, x.numpy(), [])
    assert _max_diff([got[0], *(s[None] for s in got[1:])], expected) < TOL
    # and back: Keras -> ONNX -> torch
    back = to_torch(
        [from_keras(*target.get_weights(), kind=kind)],
        make_module(torch, mode, seed=1, batch_first=True),
    )
    assert _max_diff(torch_run(back, x, []), expected) < 1e-6
