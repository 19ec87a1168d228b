"""Property-based tests: the library against the float64 oracle on random configurations."""

import contextlib
import importlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnx_recurrent as orc

from strategies import OPS, assert_close, cases

OP_PARAMS = [
    pytest.param(op, marks=pytest.mark.skipif(not hasattr(orc, op), reason=f"no orc.{op} yet"))
    for op in OPS
]


def _settings(n):
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


#: internal size thresholds of the library, (module, name, value that forces the path)
KNOBS = [
    ("onnx_recurrent.scan", "BLOCK_BYTES", 1),  # input projection in blocks of 16 steps
    ("onnx_recurrent.scan", "PARALLEL_MACS", 0),  # units (direction x rows) on threads
    ("onnx_recurrent.scan", "MIN_SHARE", 2),  # two threads may share the hidden units
]


@contextlib.contextmanager
def _code_path(data, force=()):
    """Draw a backend ("auto" or "numpy") and which of the library's size thresholds
    (:data:`KNOBS`, where they exist) to shrink, so that small configurations run every
    code path; the knobs named in ``force`` are always shrunk."""
    with contextlib.ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        for module_name, name, value in KNOBS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, name) and (
                name in force or data.draw(st.booleans(), label=f"{name}={value}")
            ):
                mp.setattr(module, name, value)
        threads = data.draw(st.sampled_from([None, "1", "2", "3"]), "threads")
        if threads is not None:
            mp.setenv("ONNX_RECURRENT_NUM_THREADS", threads)
        use = getattr(getattr(orc, "backends", None), "use", None)
        if use is not None:
            stack.enter_context(use(data.draw(st.sampled_from(["auto", "numpy"]), "backend")))
        yield


def _check_against_oracle(op, case, bound=1e3):
    expected = case.reference(bound)
    outputs = case.call(getattr(orc, op))
    assert len(outputs) == len(expected)
    # rounding errors accumulate over the steps (tolerances are for 6 steps), and more so
    # in ill-conditioned draws
    factor = max(1.0, case.seq_length / 6)
    for got, ref, sensitivity in zip(outputs, expected, case.sensitivity(expected), strict=True):
        assert isinstance(got, np.ndarray) and got.dtype == case.dtype
        assert_close(got, ref, case.dtype, factor, sensitivity)


@pytest.mark.parametrize("op", OP_PARAMS)
@_settings(400)
@given(data=st.data())
def test_matches_oracle(op, data):
    case = data.draw(cases(op))
    with _code_path(data):
        _check_against_oracle(op, case)


@pytest.mark.parametrize("op", OP_PARAMS)
@_settings(40)
@given(data=st.data())
def test_matches_oracle_long_sequences(op, data):
    """Long sequences and odd sizes, over several time blocks of the library.

    Outputs that grew large come from unstable recurrences, where float32 rounding is
    amplified over the steps: those draws are rejected.
    """
    case = data.draw(cases(op, max_sizes=(40, 9, 7, 17)))
    with _code_path(data, force=["BLOCK_BYTES"]):
        _check_against_oracle(op, case, bound=50)


def _awkward(a, how):
    """Same values as ``a`` in an unusual memory layout (or read-only)."""
    if how == "readonly":
        b = a.copy()
        b.flags.writeable = False
    elif how == "fortran":
        b = np.asfortranarray(a)
    elif how == "strided":
        big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        big[..., ::2] = a
        b = big[..., ::2]
    else:  # negative strides
        b = np.flip(np.flip(a).copy())
    return b


@pytest.mark.parametrize("op", OP_PARAMS)
@_settings(50)
@given(data=st.data())
def test_inputs_untouched_and_memory_layout_irrelevant(op, data):
    """Inputs are not written to nor aliased by the outputs; read-only, Fortran-ordered,
    strided or reversed inputs give the same results."""
    case = data.draw(cases(op))
    fn = getattr(orc, op)
    inputs = {k: v for k, v in case.inputs.items() if v is not None}
    copies = {k: v.copy() for k, v in inputs.items()}
    expected = case.call(fn)
    hows = st.sampled_from(["readonly", "fortran", "strided", "reversed"])
    awkward = {k: _awkward(v, data.draw(hows, label=k)) for k, v in inputs.items()}
    got = case.call(fn, awkward)
    for k, v in inputs.items():
        np.testing.assert_array_equal(v, copies[k], err_msg=f"{k} was modified")
        np.testing.assert_array_equal(awkward[k], copies[k], err_msg=f"{k} was modified")
    for g, e in zip(got, expected, strict=True):  # same up to summation order
        assert_close(g, e, case.dtype)
        assert not any(np.shares_memory(g, v) for v in awkward.values())


def _corrupt(case, how):
    """Make ``case`` invalid in one way (see docs/semantics.md)."""
    inputs, attrs = case.inputs, case.attrs
    n_dir = 2 if attrs["direction"] == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    T, N = inputs["X"].shape[layout], inputs["X"].shape[1 - layout]
    if how == "seq_len_too_long":
        inputs["sequence_lens"] = np.full(N, T + 1, np.int32)
    elif how == "seq_len_negative":
        inputs["sequence_lens"] = np.full(N, -1, np.int32)
    elif how == "activations_length":
        # (a one-direction RNN takes two: the schema's default, the first used)
        one_rnn = case.op == "rnn" and n_dir == 1
        attrs["activations"] = ["Tanh"] * (OPS[case.op][1] * n_dir + 1 + one_rnn)
    elif how == "activation_name":
        attrs["activations"] = ["Tanhh"] * (OPS[case.op][1] * n_dir)
    elif how in ("clip_zero", "clip_negative", "clip_nan"):
        attrs["clip"] = {"clip_zero": 0.0, "clip_negative": -1.0, "clip_nan": math.nan}[how]
    elif how == "direction":
        attrs["direction"] = "sideways"
    elif how == "layout":
        attrs["layout"] = 2
    elif how == "hidden_size":
        attrs["hidden_size"] = inputs["R"].shape[-1] + 1
    elif how == "W_shape":
        inputs["W"] = inputs["W"][:, 1:]
    elif how == "R_shape":
        inputs["R"] = inputs["R"][..., 1:]
    elif how == "B_shape":
        inputs["B"] = np.zeros((n_dir, 1), inputs["X"].dtype)
    elif how == "initial_h_shape":
        inputs["initial_h"] = np.zeros((n_dir + 1, N, 1), inputs["X"].dtype)
    elif how == "X_rank":
        inputs["X"] = inputs["X"][0]
    elif how == "X_int":
        inputs["X"] = inputs["X"].astype(np.int32)
    return case


INVALID = [
    "seq_len_too_long", "seq_len_negative", "activations_length", "activation_name",
    "clip_zero", "clip_negative", "clip_nan", "direction", "layout", "hidden_size",
    "W_shape", "R_shape", "B_shape", "initial_h_shape", "X_rank", "X_int",
]  # fmt: skip


@pytest.mark.parametrize("op", OP_PARAMS)
@pytest.mark.parametrize("how", INVALID)
@_settings(3)
@given(data=st.data())
def test_invalid_input_raises(op, how, data):
    case = _corrupt(data.draw(cases(op)), how)
    with pytest.raises((ValueError, TypeError)):
        case.call(getattr(orc, op))
