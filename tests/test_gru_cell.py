"""gru_cell: one step of gru, and OpenVINO's own GRUCell-3."""

from __future__ import annotations

import numpy as np
import pytest

import onnx_recurrent as orc
from onnx_recurrent.tools.check.peers import signal_stack_kept

ACTIVATION_PAIRS = [("sigmoid", "tanh"), ("tanh", "relu"), ("relu", "sigmoid")]


def _inputs(N=3, I=5, H=4, lbr=False, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    u = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    return u(N, I), u(N, H), u(3 * H, I), u(3 * H, H), u((4 if lbr else 3) * H)


@pytest.mark.parametrize("lbr", [False, True])
@pytest.mark.parametrize("clip", [None, 0.5])
@pytest.mark.parametrize("activations", ACTIVATION_PAIRS)
def test_equals_one_step_of_gru(lbr, clip, activations):
    X, h, W, R, B = _inputs(lbr=lbr)
    H = 4
    Ho = orc.gru_cell(
        X, h, W, R, B, hidden_size=H, activations=activations, clip=clip, linear_before_reset=lbr
    )
    if lbr:  # [Wbz+Rbz, Wbr+Rbr, Wbh, Rbh] -> ONNX [Wb, Rb]
        onnx_B = np.concatenate([B[: 3 * H], np.zeros(2 * H, B.dtype), B[3 * H :]])
    else:
        onnx_B = np.concatenate([B, np.zeros_like(B)])
    _, Y_h = orc.gru(
        X[None],
        W[None],
        R[None],
        onnx_B[None],
        None,
        h[None],
        activations=list(activations),
        clip=clip,
        linear_before_reset=int(lbr),
    )
    np.testing.assert_array_equal(Ho, Y_h[0])


def _openvino_gru_cell(X, h, W, R, B, *, hidden_size, activations, clip, lbr):
    ov = pytest.importorskip("openvino", reason="openvino is not installed")
    from openvino import opset3

    params = [opset3.parameter(list(a.shape), np.float32) for a in (X, h, W, R, B)]
    node = opset3.gru_cell(
        *params,
        hidden_size=hidden_size,
        activations=list(activations),
        clip=clip or 0.0,
        linear_before_reset=lbr,
    )
    model = ov.Model([node], params)
    # the thread's signal stack kept (OpenVINO's, unmapped when its Core goes, killed
    # the process at the next Ctrl-C: peers.signal_stack_kept)
    core = ov.Core()
    with signal_stack_kept():
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return next(iter(compiled([X, h, W, R, B]).values()))


@pytest.mark.parametrize("lbr", [False, True])
@pytest.mark.parametrize("clip", [None, 0.7])
@pytest.mark.parametrize("activations", ACTIVATION_PAIRS)
@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_openvino(lbr, clip, activations, seed):
    X, h, W, R, B = _inputs(N=2, I=6, H=8, lbr=lbr, seed=seed)
    kwargs = dict(hidden_size=8, activations=activations, clip=clip)
    expected = _openvino_gru_cell(X, h, W, R, B, lbr=lbr, **kwargs)
    got = orc.gru_cell(X, h, W, R, B, linear_before_reset=lbr, **kwargs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_dtypes_and_missing_bias():
    import ml_dtypes

    for dtype in (np.float16, np.float64, ml_dtypes.bfloat16):
        X, h, W, R, _ = _inputs(dtype=dtype)
        Ho = orc.gru_cell(X, h, W, R, hidden_size=4)
        assert Ho.dtype == dtype and Ho.shape == (3, 4)
        expected = orc.gru_cell(*(a.astype(np.float64) for a in (X, h, W, R)), hidden_size=4)
        np.testing.assert_allclose(Ho.astype(np.float64), expected, atol=2e-2)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"B": np.zeros(16, np.float32)}, r"B must have shape \[12\] \(linear_before_reset=False"),
        (
            {"B": np.zeros(13, np.float32), "linear_before_reset": True},
            r"B must have shape \[16\]",
        ),
        # GRUCell-3: with linear_before_reset, B is [4*hidden_size]; a [3*hidden_size]
        # one (Wbh and Rbh summed) cannot be split as the reset gate needs
        (
            {"B": np.zeros(12, np.float32), "linear_before_reset": True},
            r"B must have shape \[16\] \(linear_before_reset=True",
        ),
        ({"X": np.zeros((3, 5, 1), np.float32)}, r"X must be 2-D"),
        ({"W": np.zeros((12, 4), np.float32)}, r"W must have shape \[12, 5\]"),
        ({"R": np.zeros((12, 3), np.float32)}, r"R must have shape \[12, 4\]"),
        (
            {"initial_hidden_state": np.zeros((2, 4), np.float32)},
            r"initial_hidden_state must have shape \[3, 4\]",
        ),
        ({"hidden_size": 5}, r"must have shape"),
        ({"activations": ("sigmoid", "swish")}, r"unknown activation 'swish'"),
        ({"clip": -1.0}, r"clip must be a positive number, or 0 for none"),
        # named as the ONNX operators name it (activation_alpha)
        ({"activations_alpha": [1.0]}, r"activations_alpha has 1 values but activations"),
    ],
)
def test_bad_input(change, match):
    X, h, W, R, B = _inputs()
    args = {"X": X, "initial_hidden_state": h, "W": W, "R": R, "B": B, "hidden_size": 4, **change}
    with pytest.raises(ValueError, match=match):
        orc.gru_cell(**args)


@pytest.mark.parametrize(
    ("change", "match"),
    [  # were numpy's "expected a sequence of integers", a state of the right shape blamed,
        # a string split into letters, the state called initial_h
        ({"hidden_size": 4.0}, r"hidden_size must be an integer, got 4.0"),
        ({"hidden_size": "4"}, r"hidden_size must be an integer, got '4'"),
        ({"activations": "tanh"}, r"activations must be a list of two names .* string 'tanh'"),
        # were "iteration over a 0-d array"
        ({"activations_alpha": np.array(0.5)}, r"activations_alpha must be a list of floats"),
        ({"activations": np.array("Tanh")}, r"activations must be a list of strings"),
        (
            {"initial_hidden_state": np.zeros((3, 4), np.float64)},
            r"initial_hidden_state must have X's dtype float32, got float64",
        ),
        # were taken as no clipping (clip == 0 asked first), or numpy's "truth value of
        # an array ... is ambiguous"
        ({"clip": False}, r"clip must be a float, got False"),
        ({"clip": 0j}, r"clip must be a float, got 0j"),
        ({"clip": np.array([1.0, 2.0])}, r"clip must be a float, got array"),
        # were a shape error ("got []"), and initial_hidden_state blamed for a list X
        ({"R": "abc"}, r"R must have a float dtype .* got <U3"),
        ({"X": [["a", "b", "c", "d", "e"]] * 3}, r"X as a list must hold numbers, got <U1"),
    ],
)
def test_bad_types_name_the_argument(change, match):
    X, h, W, R, B = _inputs()
    args = {"X": X, "initial_hidden_state": h, "W": W, "R": R, "B": B, "hidden_size": 4, **change}
    with pytest.raises(TypeError, match=match):
        orc.gru_cell(**args)


def test_x_given_as_a_list_takes_ws_dtype():
    X, h, W, R, B = _inputs()
    np.testing.assert_array_equal(
        orc.gru_cell(X.tolist(), h, W, R, B, hidden_size=4),
        orc.gru_cell(X, h, W, R, B, hidden_size=4),
    )


def test_activations_none_are_the_defaults():
    # gru, rnn and lstm take None for the defaults; gru_cell failed iterating it
    X, h, W, R, B = _inputs()
    np.testing.assert_array_equal(
        orc.gru_cell(X, h, W, R, B, hidden_size=4, activations=None),
        orc.gru_cell(X, h, W, R, B, hidden_size=4),
    )


def test_bias_dtype_and_flag_are_checked():
    X = np.zeros((2, 3), np.float32)
    h = np.zeros((2, 4), np.float32)
    W, R = np.zeros((12, 3), np.float32), np.zeros((12, 4), np.float32)
    with pytest.raises(TypeError, match=r"B must have X's dtype float32, got float64"):
        orc.gru_cell(X, h, W, R, np.zeros(12), hidden_size=4)
    with pytest.raises(TypeError, match=r"B must have a float dtype .* got int32"):
        orc.gru_cell(X, h, W, R, np.zeros(12, np.int32), hidden_size=4)
    with pytest.raises(
        ValueError, match=r"linear_before_reset must be an integer \(nonzero: true\), got 'no'"
    ):
        orc.gru_cell(X, h, W, R, hidden_size=4, linear_before_reset="no")
    with pytest.raises(TypeError, match=r"clip must be a float, got '3'"):
        orc.gru_cell(X, h, W, R, hidden_size=4, clip="3")
