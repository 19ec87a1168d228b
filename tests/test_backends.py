"""Every backend (and both numba loops) equals the NumPy backend over a grid of attributes."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onnx_recurrent as orc
from onnx_recurrent import backends
from onnx_recurrent.activations import TABLE

from models import random_inputs

numba_backend = pytest.importorskip("onnx_recurrent.backends.numba_backend")
packed = pytest.importorskip("onnx_recurrent.backends.packed")
from onnx_recurrent.backends import layout  # noqa: E402

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}
ACTIVATION_SETS = [
    None,
    ["HardSigmoid", "Elu", "Softplus"],
    ["Affine", "ScaledTanh", "LeakyRelu"],
    ["ThresholdedRelu", "Softsign", "Relu"],
]
CASES = list(
    itertools.product(
        FUNCTIONS,
        ["forward", "reverse", "bidirectional"],
        range(len(ACTIVATION_SETS)),
        [None, 0.7],
        [False, True],  # linear_before_reset (GRU) / input_forget (LSTM)
    )
)


def _call(op, direction, acts, clip, flag, feeds):
    n = {"GRU": 2, "RNN": 1, "LSTM": 3}[op]
    kwargs = {"direction": direction, "clip": clip}
    if ACTIVATION_SETS[acts] is not None:
        names = ACTIVATION_SETS[acts][:n] * (2 if direction == "bidirectional" else 1)
        kinds = [TABLE[name.lower()] for name in names]
        kwargs |= {
            "activations": names,
            "activation_alpha": [
                0.3 + 0.2 * i for i, k in enumerate(kinds) if k.alpha is not None
            ],
            "activation_beta": [0.2 + 0.1 * i for i, k in enumerate(kinds) if k.beta is not None],
        }
    if op == "GRU":
        kwargs["linear_before_reset"] = int(flag)
    if op == "LSTM":
        kwargs["input_forget"] = int(flag)
    return FUNCTIONS[op](**feeds, **kwargs)


@pytest.mark.parametrize("project_below", [0, 100], ids=["fused", "projected"])
@pytest.mark.parametrize("lens", [[7, 3, 0, 7, 1], [7, 3, 0, 7, 1, 6, 2, 7, 5, 4, 7]])
@pytest.mark.parametrize(("op", "direction", "acts", "clip", "flag"), CASES)
def test_numba_equals_numpy(monkeypatch, project_below, lens, op, direction, acts, clip, flag):
    """The numba backend's step loop against the NumPy one: every activation, clip,
    flag and direction; rows finishing at every step (product tiles of 8, 4, 2, 1);
    gate inputs from one product per step or with the block's input projection ahead."""
    monkeypatch.setattr(numba_backend, "PROJECT_BELOW", project_below)
    D = 2 if direction == "bidirectional" else 1
    feeds = random_inputs(op, T=7, N=len(lens), I=4, H=6, D=D, seed=len(op) + acts)
    feeds["sequence_lens"] = np.array(lens, np.int32)
    with backends.use("numpy"):
        expected = _call(op, direction, acts, clip, flag, feeds)
        exact = _call(op, direction, acts, clip, flag, _as(feeds, np.float64))
    with backends.use("numba"):
        got = _call(op, direction, acts, clip, flag, feeds)
    for g, e, x in zip(got, expected, exact, strict=True):
        # Affine gates without clip grow to 1e16 in 7 steps: there, float32 rounding
        # (summation order) shows; allow 4x the NumPy loop's own distance from float64
        spread = 4 * np.abs(e - x).max()
        np.testing.assert_allclose(g, x, rtol=1e-4, atol=2e-6 + spread)


def _as(feeds, dtype):
    return {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in feeds.items()}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(
    ("op", "attributes", "dtype"),
    [(op, {}, np.float32) for op in FUNCTIONS]
    + [("GRU", {"linear_before_reset": 1}, dt) for dt in (np.float32, np.float64, np.float16)],
)
def test_input_size_zero(op, attributes, dtype, backend):
    """``input_size`` 0 (``X W^T`` is zero): the same as one input of zeros, on every
    backend (the NumPy one reshaped an empty block with ``-1`` and failed). GRU with
    ``linear_before_reset`` failed most calls as "no memory": its empty panels of ``W``
    were not aligned (:func:`layout.empty_panels`), and the kernel refused them."""
    feeds = random_inputs(op, T=6, N=5, I=1, H=7, D=2, seed=3, dtype=dtype)
    feeds["X"] = np.zeros_like(feeds["X"])
    empty = {**feeds, "X": feeds["X"][..., :0], "W": feeds["W"][..., :0]}
    with backends.use(backend):
        expected = FUNCTIONS[op](**feeds, direction="bidirectional", **attributes)
        got = FUNCTIONS[op](**empty, direction="bidirectional", **attributes)
    tolerance = {"rtol": 1e-6, "atol": 1e-7} if dtype != np.float16 else {"atol": 2e-3}
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, **tolerance)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_empty_panels_are_aligned(dtype):
    """Panels with no rows or none at all start on a cache line too, as the kernels check:
    an empty slice of the raw buffer pointed at its start."""
    from onnx_recurrent.backends import layout

    for count, K in [(3, 0), (0, 5), (0, 0), (2, 4)]:
        for _ in range(4):  # a few allocations, at a few offsets
            panels = layout.empty_panels(count, K, dtype)
            assert panels.shape == (count, K, layout.panel_width(dtype))
            assert panels.ctypes.data % layout.ALIGN == 0, (count, K)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op", FUNCTIONS)
def test_numba_dtypes(op, dtype):
    feeds = random_inputs(op, dtype=dtype, D=2)
    with backends.use("numpy"):
        expected = FUNCTIONS[op](**feeds, direction="bidirectional")
    with backends.use("numba"):
        got = FUNCTIONS[op](**feeds, direction="bidirectional")
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype
        tol = 1e-12 if dtype == np.float64 else 1e-2
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), atol=tol)


@settings(max_examples=120, deadline=None)
@given(
    m=st.integers(0, 20),
    K=st.integers(1, 40),
    N=st.integers(1, 100),
    lda_extra=st.integers(0, 3),
    split=st.floats(0, 1),
    skip=st.integers(0, 5),
    start=st.sampled_from(["zeros", "bias", "add"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    rows=st.sampled_from([1, 2, 4, 6, 8, 12]),
    span=st.sampled_from([1, 2, 4]),
    depth=st.sampled_from([0, 1, 5, 16]),
)
def test_packed_products(m, K, N, lda_extra, split, skip, start, dtype, rows, span, depth):
    """``packed.mm`` computes ``start + [A, A2] B[k0:k0+K]`` for any sizes (partial
    tiles and panels), any split of those ``K`` rows between ``A`` and ``A2`` (0 and
    ``K`` included), ``B`` of any strides and rows of ``A`` spaced; ``start``: zeros, a
    bias, or ``C`` itself. It writes zeros (or the bias) in the padding columns of its
    last panel and nothing past row ``m``; each row's result is the same, bit for bit,
    whatever tile computes it: any rows, span and depth (blocks of ``B``'s rows,
    across ``A`` and ``A2``) the planner may choose, and the short tiles at the end."""
    rng = np.random.default_rng(m * 10_000 + K * 100 + N)
    K1 = round(split * K)
    k0 = skip
    A = rng.standard_normal((m, K1 + lda_extra)).astype(dtype)
    A2 = rng.standard_normal((m, K - K1 + 2 * lda_extra)).astype(dtype)
    B = rng.standard_normal((N, k0 + K + skip)).astype(dtype).T
    Bp = layout.panels(B, dtype)
    assert Bp.ctypes.data % layout.ALIGN == 0
    v = rng.standard_normal(N).astype(dtype) if start == "bias" else np.zeros(N, dtype)
    vp = np.zeros(-(-N // layout.panel_width(dtype)) * layout.panel_width(dtype), dtype)
    vp[:N] = v  # zero-padded to whole panels
    width = layout.columns(N, dtype)
    C = np.full((m + 1, width), np.nan, dtype)
    C[:m, : Bp.shape[0] * Bp.shape[2]] = 0.0
    if start == "add":
        C[:m, :N] = rng.standard_normal((m, N))
    C0 = C.copy()
    lda, lda2 = K1 + lda_extra, K - K1 + 2 * lda_extra
    P = Bp.shape[0]
    bias = vp.ctypes.data if start == "bias" else 0
    args = (Bp, 0, P, k0, C.ctypes.data, width, bias, start == "add", rows, span, depth)
    packed.mm(A.ctypes.data, lda, K1, A2.ctypes.data, lda2, K - K1, m, *args)
    full = np.concatenate([A[:, :K1], A2[:, : K - K1]], axis=1)
    expected = full @ B[k0 : k0 + K] + v + C0[:m, :N]
    np.testing.assert_allclose(C[:m, :N], expected, rtol=1e-5, atol=1e-5)
    assert (C[:m, N : Bp.shape[0] * Bp.shape[2]] == 0).all()
    assert np.isnan(C[m]).all() and np.isnan(C[:, Bp.shape[0] * Bp.shape[2] :]).all()
    for i in range(m if m > 1 else 0):  # the same rows one at a time
        row = C0[i : i + 1].copy()
        a, a2 = A[i : i + 1].ctypes.data, A2[i : i + 1].ctypes.data
        one = (1, 1 + (i % 4), 0)  # one row, spanning 1-4 panels, all of K at once
        at = row.ctypes.data
        packed.mm(a, lda, K1, a2, lda2, K - K1, 1, Bp, 0, P, k0, at, width, *args[6:8], *one)
        assert (row[0, :N] == C[i, :N]).all()
    if P > 1 and start != "add":  # panels 1.. alone: their columns, from their own bias
        part = C0[:m].copy()
        at = bias + Bp.shape[2] * np.dtype(dtype).itemsize if bias else 0
        packed.mm(A.ctypes.data, lda, K1, A2.ctypes.data, lda2, K - K1, m, Bp, 1, P, k0,
                  part.ctypes.data, width, at, start == "add", rows, span, depth)  # fmt: skip
        L = Bp.shape[2]
        assert (part[:, : N - L] == C[:m, L:N]).all()


@pytest.mark.parametrize("shape", [(50, 1, 64, 64), (5, 4, 256, 256)], ids=["S", "M"])
def test_no_blas_thread_left_spinning(shape):
    """A call leaves no thread busy: OpenBLAS's own threads, woken by a product, would
    spin for ~0.1 s after the call and take a core from the caller."""
    import time

    T, N, I, H = shape
    feeds = random_inputs("GRU", T=T, N=N, I=I, H=H, full=False)
    orc.gru(**feeds)
    time.sleep(0.3)
    orc.gru(**feeds)
    start = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - start < 0.05


def test_backend_choice():
    feeds = random_inputs("RNN")
    with pytest.raises(ValueError, match="backend must be one of"):
        with backends.use("cuda"):
            pass
    with backends.use("numpy"):
        a = orc.rnn(**feeds)
    b = orc.rnn(**feeds)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-6)


NO_JIT = """
import warnings
import numpy as np
import onnx_recurrent as orc
from onnx_recurrent import backends
from onnx_recurrent.runtime.graph import node_model

rng = np.random.default_rng(0)
feeds = {"X": rng.standard_normal((5, 2, 3), dtype=np.float32)}
feeds["W"] = rng.standard_normal((1, 12, 3), dtype=np.float32)
feeds["R"] = rng.standard_normal((1, 12, 4), dtype=np.float32)
with backends.use("numpy"):
    want = orc.gru(**feeds)[1]
assert np.array_equal(orc.gru(**feeds)[1], want)
assert np.array_equal(orc.Layer("GRU", feeds["W"], feeds["R"])(feeds["X"])[1], want)
model = node_model("GRU", feeds, {"hidden_size": 4}, constants=("W", "R"))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    session = orc.InferenceSession(model)
print(session.host, [str(w.message) for w in caught])
np.testing.assert_allclose(session.run(["Y_h"], {"X": feeds["X"]})[0], want, atol=1e-6)
try:
    with backends.use("numba"):
        orc.gru(**feeds)
except ValueError as e:
    print(e)
"""


def test_numba_compiler_turned_off_runs_on_numpy(tmp_path):
    """NUMBA_DISABLE_JIT=1 (a debugging setting): every call failed with an
    AttributeError deep in the kernels' preparation. The functions and layers run on
    the numpy backend, a session falls back to the reference host (with its warning)
    where the native nodes are not in the cache, and asking for numba says why."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", XDG_CACHE_HOME=str(tmp_path))
    env.pop("ONNX_RECURRENT_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-c", NO_JIT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    host, asked = done.stdout.splitlines()[-2:]
    assert host.startswith("reference [") and "NUMBA_DISABLE_JIT" in host
    assert asked.startswith("backend 'numba' was asked for, but numba cannot be imported")
    assert "NUMBA_DISABLE_JIT" in asked


@pytest.mark.parametrize("threads", ["2", "3"])
@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_threads_split_directions_and_rows(monkeypatch, threads, op, layout):
    from onnx_recurrent import scan

    feeds = random_inputs(op, T=6, N=7, I=3, H=4, D=2, seed=int(threads))
    feeds["sequence_lens"] = np.array([6, 0, 2, 6, 5, 1, 3], np.int32)
    if layout:
        for k in ("X", "initial_h", "initial_c"):
            if k in feeds:
                feeds[k] = np.ascontiguousarray(np.swapaxes(feeds[k], 0, 1))
    serial = FUNCTIONS[op](**feeds, direction="bidirectional", layout=layout)
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", threads)
    units, _, parties = scan._units(*_spec_and_inputs(op, feeds, layout), int(threads))
    assert (len(units), parties) == {"2": (2, 1), "3": (4, 1)}[threads]
    parallel = FUNCTIONS[op](**feeds, direction="bidirectional", layout=layout)
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("threads", [2, 3])
def test_ragged_rows_dealt_evenly_between_threads(monkeypatch, threads):
    """Too few ragged rows for buckets: they go to the threads by length there and back;
    with lengths 12, 11, ..., 1 every slice gets the same total length (round-robin gave
    the first slice the longer row of each pair: 3 and 4 steps more here)."""
    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    feeds = random_inputs("GRU", T=12, N=12, I=2, H=4, D=1, seed=0)
    lengths = np.random.default_rng(0).permutation(np.arange(1, 13))
    feeds["sequence_lens"] = lengths.astype(np.int32)
    spec, x = _spec_and_inputs("GRU", feeds, 0, "forward")
    units, _, shares = scan._units(spec, x, threads)
    totals = [int(x.sequence_lens[rows].sum()) for _, rows in units]
    assert shares == 1 and len(units) == threads
    assert sorted(np.concatenate([rows for _, rows in units]).tolist()) == list(range(12))
    assert max(totals) == min(totals), totals


@pytest.mark.parametrize(("direction", "threads"), [("forward", 2), ("bidirectional", 4)])
def test_ragged_rows_in_buckets_of_like_lengths(monkeypatch, direction, threads):
    """Enough ragged rows, more threads than directions: buckets of rows of like
    lengths, the longest first (both directions of a bucket before the next), from a
    queue, the longer half by BUCKET_ROWS, the rest by half as many; the outputs are
    bit for bit those of one thread. As many threads as directions: a unit per
    direction, as before."""
    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    D = 2 if direction == "bidirectional" else 1
    feeds = random_inputs("LSTM", T=40, N=37, I=3, H=5, D=D, seed=4, full=False)
    lengths = np.random.default_rng(4).integers(0, 41, 37)  # a 0 and a 40 among them
    lengths[:2] = 0, 40
    feeds["sequence_lens"] = lengths.astype(np.int32)
    spec, x = _spec_and_inputs("LSTM", feeds, 0, direction)
    if D == 2:
        assert [(d, len(rows)) for d, rows in scan._units(spec, x, 2)[0]] == [(0, 37), (1, 37)]
    units, _, shares = scan._units(spec, x, threads)
    # two buckets of 8 (the longer half), then 21 rows in buckets of 4 (the last of 1)
    sizes = [b - a for a, b in (scan.bucket_bounds(i, 37) for i in range(scan.buckets(37)))]
    assert sizes == [8, 8, 4, 4, 4, 4, 4, 1]
    assert shares == 1 and len(units) == len(sizes) * D
    order = np.argsort(-x.sequence_lens, kind="stable")
    for i, (d, rows) in enumerate(units):
        a, b = scan.bucket_bounds(i // D, 37)
        assert d == i % D
        assert rows.tolist() == order[a:b].tolist()  # longest first
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "1")
    alone = FUNCTIONS["LSTM"](**feeds, direction=direction)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", str(threads))
    together = FUNCTIONS["LSTM"](**feeds, direction=direction)
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("H", [2, 5, 16])
def test_two_threads_share_hidden_units(monkeypatch, direction, op, flag, H):
    """One direction on two threads: each computes half of the hidden units of every row,
    with a barrier per step; odd sizes, several blocks (odd ones too), every output."""
    from onnx_recurrent import scan

    feeds = random_inputs(op, T=9, N=7, I=3, H=H, D=1, seed=H)
    feeds["sequence_lens"] = np.full(7, 9, np.int32)  # full length: shared (ragged: rows)
    if op == "LSTM":
        feeds["P"] = np.random.default_rng(3).uniform(-0.5, 0.5, (1, 3 * H)).astype(np.float32)
    kwargs = {"direction": direction}
    if op == "GRU":
        kwargs["linear_before_reset"] = int(flag)
    if op == "LSTM":
        kwargs["input_forget"] = int(flag)
    serial = FUNCTIONS[op](**feeds, **kwargs)
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 1)
    monkeypatch.setattr(scan, "BLOCK_BYTES", 1)  # blocks of 16 steps: odd ones too
    monkeypatch.setattr(scan, "MIN_BLOCK", 4)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    spec, x = _spec_and_inputs(op, feeds, 0, direction)
    assert scan._units(spec, x, 2)[2] == 2
    shared = FUNCTIONS[op](**feeds, **kwargs)
    for a, b in zip(serial, shared, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("H", [300, 520, 600])
def test_shared_hidden_units_give_one_threads_bits(monkeypatch, dtype, H):
    """A float64 LSTM's two shares of 300 units ended inside the cell loop's vector
    width: its last units took the scalar tail, rounded otherwise than one thread's
    vector body (1-3 ulp, 51000 of 84000 elements at H=600). Shares now start on
    multiples of plans.SHARE_ALIGN units."""
    from onnx_recurrent import scan
    from onnx_recurrent.backends import plans

    assert plans.share_bounds(600, 2) == [0, 304, 600]
    assert plans.share_bounds(4, 2) == [0, 2, 4]  # never an empty share (garbage rows)
    rng = np.random.default_rng(H)
    X = rng.standard_normal((4, 7, 32)).astype(dtype)
    W = (rng.standard_normal((1, 4 * H, 32)) / 6).astype(dtype)
    R = (rng.standard_normal((1, 4 * H, H)) / np.sqrt(H)).astype(dtype)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "1")
    alone = orc.lstm(X, W, R)
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    spec, x = _spec_and_inputs("LSTM", {"X": X, "R": R, "sequence_lens": None}, 0, "forward")
    assert scan._units(spec, x, 2)[2] == 2  # the two threads share the hidden units
    shared = orc.lstm(X, W, R)
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize(("op", "flag"), [("GRU", 0), ("GRU", 1), ("LSTM", 0), ("LSTM", 1),
                                          ("RNN", 0)])  # fmt: skip
def test_ragged_rows_share_hidden_units_in_compiled_units(monkeypatch, direction, op, flag):
    """One ragged direction on two threads that share its hidden units: each thread a
    compiled unit of every row (gathers, zeros past the lengths, copies into Y and the
    final states shared out by rows); rows that end in an earlier block of steps than
    the longest (their state then stays in whichever of the two alternating buffers
    held it), lengths 0 and T, initial states: bit for bit one thread's outputs."""
    from onnx_recurrent import scan
    from onnx_recurrent.backends import node

    H, N, I = 16, 7, 3
    G = {"GRU": 3, "LSTM": 4, "RNN": 1}[op]
    T = node.block_steps.py_func(G, N, I, H, 4) * 5 // 2  # three blocks
    feeds = random_inputs(op, T=T, N=N, I=I, H=H, D=1, seed=7)
    lengths = np.random.default_rng(7).integers(0, T + 1, N)
    lengths[:2] = 0, T
    feeds["sequence_lens"] = lengths.astype(np.int32)
    kwargs = {"direction": direction}
    if op == "GRU":
        kwargs["linear_before_reset"] = flag
    if op == "LSTM":
        kwargs["input_forget"] = flag
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "1")
    alone = FUNCTIONS[op](**feeds, **kwargs)
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    spec, x = _spec_and_inputs(op, feeds, 0, direction)
    assert scan._units(spec, x, 2)[2] == 2
    parties = []
    run_unit = numba_backend.NumbaBackend.run_unit

    def party(self, *args, **kwargs):
        parties.append(kwargs.get("shared", args[9] if len(args) > 9 else None).first)
        return run_unit(self, *args, **kwargs)

    monkeypatch.setattr(numba_backend.NumbaBackend, "run_unit", party)
    shared = FUNCTIONS[op](**feeds, **kwargs)
    assert sorted(parties) == [0, 1]
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_array_equal(a, b)


def test_each_party_claims_its_own_share_first():
    """Party ``i`` claims share ``i`` of a phase first (its core keeps that share's
    weights), then any left; a phase's claims are over once every share is claimed,
    and a late party's claim in a phase that is over fails."""
    from onnx_recurrent.backends.sync import Sync, claim

    meeting = Sync.make(3)
    sync = meeting.sync
    assert [claim(sync, 0, 3, 2), claim(sync, 0, 3, 1)] == [2, 1]
    assert [claim(sync, 0, 3, 2), claim(sync, 0, 3, 0)] == [0, -1]  # 0 taken by party 2
    assert [claim(sync, 1, 3, 1), claim(sync, 1, 3, 1), claim(sync, 1, 3, 1)] == [1, 2, 0]
    assert claim(sync, 0, 3, 0) == -1  # phase 0 is over for a late party
    meeting.abort()
    assert claim(sync, 2, 3, 0) == -1


def _spec_and_inputs(op, feeds, layout, direction="bidirectional"):
    from onnx_recurrent import cells
    from onnx_recurrent.spec import check_call, check_X, make_spec

    cell = {"GRU": cells.GRU, "RNN": cells.RNN, "LSTM": cells.LSTM}[op]
    spec = make_spec(
        cell,
        feeds["R"],
        hidden_size=None,
        direction=direction,
        activations=None,
        activation_alpha=None,
        activation_beta=None,
        clip=None,
        layout=layout,
    )
    states = [(k, feeds.get(k)) for k in cell.state_names]
    return spec, check_call(spec, check_X(spec, feeds["X"]), feeds["sequence_lens"], states)


def test_shared_hidden_units_from_many_threads(monkeypatch):
    """Calls that each take two threads (the caller and a pool thread, meeting after
    every step), made from six threads at once: no deadlock, every result as alone."""
    from concurrent.futures import ThreadPoolExecutor

    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    calls = [
        (op, random_inputs(op, T=30, N=5, I=4, H=8, seed=s, full=False))
        for s, op in enumerate(["GRU", "LSTM", "RNN"] * 4)
    ]
    alone = [FUNCTIONS[op](**feeds) for op, feeds in calls]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda call: FUNCTIONS[call[0]](**call[1]), calls))
    for a, b in zip(alone, together, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_threads_kept_on_separate_cpus_when_asked(monkeypatch, direction):
    """With placement (``scan.PIN_UNITS``, ``PIN_SHARES``) the caller stays on its CPU
    during a threaded call and
    pool threads keep off it; every CPU mask is restored after the call, and where
    affinity cannot be set, the call runs as before."""
    import threading

    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setattr(scan, "PIN_UNITS", True)
    monkeypatch.setattr(scan, "PIN_SHARES", True)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    feeds = random_inputs("GRU", T=12, N=6, I=4, H=8, D=2 if direction != "forward" else 1)
    feeds["sequence_lens"] = np.full(6, 12, np.int32)
    seen = {}
    spec = _spec_and_inputs("GRU", feeds, 0, direction)[0]
    backend = type(backends.select(spec, np.dtype(np.float32)))

    def recording(run):  # a unit's steps: block by block, or one compiled call
        def record(self, *args, **kwargs):
            seen.setdefault(threading.get_ident(), os.sched_getaffinity(0))
            return run(self, *args, **kwargs)

        return record

    before = os.sched_getaffinity(0)
    serial = orc.gru(**feeds, direction=direction)
    for name in ("run_block", "run_unit"):
        if hasattr(backend, name):
            monkeypatch.setattr(backend, name, recording(getattr(backend, name)))
    result = orc.gru(**feeds, direction=direction)
    assert os.sched_getaffinity(0) == before
    if len(before) > 1:
        caller = seen[threading.get_ident()]
        assert len(caller) == 1
        for thread, mask in seen.items():  # helpers that took part
            assert thread == threading.get_ident() or not caller & mask
    for a, b in zip(serial, result, strict=True):
        np.testing.assert_array_equal(a, b)

    def refused(*args):
        raise OSError("not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refused)
    for a, b in zip(serial, orc.gru(**feeds, direction=direction), strict=True):
        np.testing.assert_array_equal(a, b)


ONE_PASS_CELLS = ["RNN", "GRU", "GRU lbr", "LSTM", "LSTM input_forget"]


def _cell_rows(cell, one_pass, pre, pre_h, hh, old, new, c, n, j0, j1, clip):
    """A share's rows (``n`` rows, units ``j0 .. j1``) of ``cell`` with the default
    activations as ``_share`` computes them: in one pass, or a row at a time through
    the passes per gate that any activation takes; ``new`` and ``c`` updated, the GRU's
    scratch returned."""
    nb, dt = numba_backend, old.dtype
    fast, H = dt == np.float32, j1 - j0
    codes = {"RNN": [1, 0, 0], "GRU": [2, 1, 0]}.get(cell.split()[0], [2, 1, 1])
    a = (np.array(codes, np.int64), np.zeros(3, dt), np.zeros(3, dt))
    g, gz, rh = np.zeros(4 * H, dt), np.zeros((n, 3 * H), dt), np.zeros_like(old)
    input_forget = cell == "LSTM input_forget"
    if one_pass:
        if cell == "RNN":
            nb._rnn_rows(pre, new, n, j0, j1, clip)
        elif cell == "GRU":
            nb._gru_zr_rows(pre, old, gz, rh, n, j0, j1, clip)
            nb._gru_h_rows(pre_h, old, new, gz, n, j0, j1, clip)
        elif cell == "GRU lbr":
            nb._gru_lbr_rows(pre, pre_h, hh, old, new, n, j0, j1, clip)
        else:
            nb._lstm_rows(pre, new, c, input_forget, n, j0, j1, clip)
        return gz[:, :H]
    for b in range(n):
        hp, hb = old[b, j0:j1], new[b, j0:j1]
        if cell == "RNN":
            nb._rnn_row(pre[b], hb, a, clip, fast)
        elif cell == "GRU":
            nb._gru_zr_row(pre[b], hp, gz[b], rh[b, j0:j1], a, clip, fast)
        elif cell == "GRU lbr":
            nb._gru_lbr_row(pre[b], pre_h[b], hh[b], hp, hb, g, a, clip, fast)
        else:
            P = np.zeros((3, 0), dt)
            nb._lstm_row(pre[b], hb, c[b, j0:j1], P, input_forget, g, a, clip, fast)
    if cell == "GRU":
        for b in range(n):
            nb._gru_h_row(pre_h[b], old[b, j0:j1], new[b, j0:j1], gz[b], a, clip, fast)
    return gz[:, :H]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clip", [np.inf, 0.7])
@pytest.mark.parametrize("cell", ONE_PASS_CELLS)
def test_one_pass_rows_equal_the_passes(cell, clip, dtype):
    """The default activations' rows in one pass (``_rnn_rows`` ... ``_lstm_rows``)
    against the passes per gate and activation that every other activation takes:
    within 4 ulps (the compiler forms fused multiply-adds its own way in each), with
    the same infinities and NaN; and bit for bit the same whether ``Ht`` is written
    over ``Ht-1`` (one share) or beside it (a vectorized loop over one view)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(len(cell))
    n, H, j0, j1 = 11, 40, 8, 29  # a share of 21 units, odd: vector loops' remainders
    width = {"RNN": 1, "GRU": 2, "GRU lbr": 2}.get(cell, 4) * (j1 - j0)
    pre = (3 * rng.standard_normal((n, width))).astype(dt)
    pre[0, :4] = [np.inf, -np.inf, np.nan, 1e30]
    pre_h, hh = ((3 * rng.standard_normal((n, j1 - j0))).astype(dt) for _ in range(2))
    pre_h[1, :2] = [np.nan, -np.inf]
    old = rng.standard_normal((n, H)).astype(dt)
    c = rng.standard_normal((n, H)).astype(dt)
    clip = dt.type(clip)
    results = {}
    for one_pass, in_place in [(False, False), (True, False), (True, True)]:
        new = old.copy() if in_place else np.full_like(old, 7.0)
        old_in = new if in_place else old.copy()
        cs = c.copy()
        z = _cell_rows(cell, one_pass, pre, pre_h, hh, old_in, new, cs, n, j0, j1, clip)
        results[one_pass, in_place] = (new[:, j0:j1].copy(), cs, z.copy())
    eps = np.finfo(dt).eps
    for got, want in zip(results[True, False], results[False, False], strict=True):
        np.testing.assert_allclose(got, want, rtol=4 * eps, atol=4 * eps)
        assert np.array_equal(np.isnan(got), np.isnan(want))
    for got, want in zip(results[True, True], results[True, False], strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.isfinite(results[True, False][0][2:]).all()


@pytest.mark.parametrize(
    ("kind", "codes", "peepholes", "expected"),
    [
        (0, [1, 0, 0], False, True),  # RNN: Tanh
        (0, [2, 0, 0], False, False),  # RNN: Sigmoid
        (1, [2, 1, 0], False, True),  # GRU: Sigmoid, Tanh
        (1, [2, 2, 0], False, False),
        (1, [7, 1, 0], False, False),  # HardSigmoid
        (2, [2, 1, 1], False, True),  # LSTM: Sigmoid, Tanh, Tanh
        (2, [2, 1, 1], True, False),  # ... with peepholes
        (2, [2, 1, 6], False, False),  # ScaledTanh
    ],
)
def test_one_pass_rows_only_for_the_default_activations(kind, codes, peepholes, expected):
    """Which cells take the one-pass rows: the operator's default activations, no
    peepholes; every other choice the passes per gate."""
    from onnx_recurrent.activations import ActivationCode

    assert ActivationCode.TANH == 1 and ActivationCode.SIGMOID == 2
    assert ActivationCode.SCALED_TANH == 6 and ActivationCode.HARD_SIGMOID == 7
    got = numba_backend._standard(np.array(codes, np.int64), kind, peepholes)
    assert got is expected


def test_float64_tanh_within_two_ulps():
    """The vectorizable float64 tanh of the numba kernels against libm's, over both of
    its branches, the cap at 22, tiny values, infinities and NaN."""
    import numba

    from onnx_recurrent.backends.numba_backend import _tanh64

    @numba.njit
    def apply(x, out):
        for i in range(x.shape[0]):
            out[i] = _tanh64(x[i])

    rng = np.random.default_rng(0)
    special = [0.0, 0.625, np.nextafter(0.625, 0), 21.9, 22.0, 40.0, 1e-300, 5e-324, np.inf]
    x = np.concatenate([rng.uniform(-1, 1, 10**5), rng.uniform(-25, 25, 10**5), special])
    x = np.concatenate([x, -x, [np.nan]])
    got = np.empty_like(x)
    apply(x, got)
    want = np.tanh(x)
    finite = np.isfinite(want)
    ulps = np.abs(got - want)[finite] / np.spacing(np.abs(want[finite]).clip(1e-300))
    assert ulps.max() <= 2
    np.testing.assert_array_equal(got[~finite], want[~finite])  # NaN; tanh(inf) is finite


def test_float64_sigmoid_within_four_ulps():
    """The float64 sigmoid of the numba kernels (one exp, one division) against
    ``1 / (1 + exp(-x))``: within 4 ulps wherever the result is a normal number (the
    earlier ``0.5 + 0.5 tanh(x / 2)`` lost all relative accuracy below about -37), 0
    below -708 and at -inf, 1 at +inf, NaN for NaN; a float64 gate uses it."""
    import numba

    from onnx_recurrent.activations import ActivationCode
    from onnx_recurrent.backends.numba_backend import _apply, _sigmoid64

    @numba.njit
    def apply(x, out):
        for i in range(x.shape[0]):
            out[i] = _sigmoid64(x[i])

    rng = np.random.default_rng(0)
    special = [0.0, 1e-300, 5e-324, 20.0, 37.0, 40.0, 700.0, 708.0, 708.5, 800.0, np.inf]
    x = np.concatenate([rng.uniform(-2, 2, 10**5), rng.uniform(-750, 750, 10**5), special])
    x = np.concatenate([x, -x, [np.nan]])
    got = np.empty_like(x)
    apply(x, got)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x))
    normal = np.isfinite(x) & (x >= -708)
    ulps = np.abs(got - want)[normal] / np.spacing(want[normal])
    assert ulps.max() <= 4
    assert (got[x < -708] == 0).all() and got[x == np.inf] == 1 and np.isnan(got[-1])
    assert 1e-18 < got[x == -40.0][0] < 1e-17  # 4.2e-18, not 0
    gate = x[:1000].copy()  # the vectorized loop (its contractions may differ by an ulp)
    _apply(ActivationCode.SIGMOID, gate, 0.0, 0.0, False)
    assert (np.abs(gate - want[:1000]) / np.spacing(want[:1000])).max() <= 4


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize("threads", ["1", "2"])
def test_initial_states_in_any_memory_order(monkeypatch, op, threads):
    """Fortran-ordered or strided initial states give the C-ordered result (the step
    loop reads the state's rows by address: a Fortran copy of initial_h was read as if
    C-ordered, 0.28 off, before this test)."""
    from onnx_recurrent import scan

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", threads)
    feeds = random_inputs(op, T=6, N=9, I=5, H=20, seed=4)
    feeds["sequence_lens"] = np.full(9, 6, np.int32)
    expected = FUNCTIONS[op](**feeds)
    for order in (np.asfortranarray, lambda a: np.repeat(a, 2, axis=-1)[..., ::2]):
        awkward = {k: order(v) if k.startswith("initial") else v for k, v in feeds.items()}
        for g, e in zip(FUNCTIONS[op](**awkward), expected, strict=True):
            np.testing.assert_array_equal(g, e)


def test_blas_on_one_thread_while_our_threads_split_the_work(monkeypatch):
    """NumPy backend, units on threads: BLAS is limited to one thread meanwhile (two
    levels of threads on the same cores only get in each other's way)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from onnx_recurrent import scan
    from onnx_recurrent.backends.numpy_backend import NumpyBackend

    blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    if not blas or max(p["num_threads"] for p in blas) < 2:
        pytest.skip("BLAS runs on one thread here anyway")
    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "2")
    seen = []
    run_block = NumpyBackend.run_block

    def recording(self, *args, **kwargs):
        info = threadpoolctl.threadpool_info()
        seen.append(max(p["num_threads"] for p in info if p["user_api"] == "blas"))
        return run_block(self, *args, **kwargs)

    monkeypatch.setattr(NumpyBackend, "run_block", recording)
    feeds = random_inputs("GRU", T=4, N=4, I=3, H=4, D=2)
    with backends.use("numpy"):
        orc.gru(**feeds, direction="bidirectional")
    assert seen and max(seen) == 1


@pytest.mark.parametrize("lengths", ["full", "ragged"])
@pytest.mark.parametrize("helpers", ["never", "late"])
@pytest.mark.parametrize("op", FUNCTIONS)
def test_a_descheduled_helper_leaves_its_share_to_the_caller(monkeypatch, helpers, op, lengths):
    """Threads that share the hidden units claim the shares step by step (ragged: in
    compiled units, which also share out the rows' initial states, zeros, copies into
    Y and final states): a helper that never runs (descheduled for the whole call) or
    that starts only when the caller is done costs nothing, and the result is the
    one-thread result. A barrier that waits for every party hangs here (run in a
    thread with a timeout)."""
    import threading

    from onnx_recurrent import scan, threads

    monkeypatch.setattr(scan, "PARALLEL_MACS", 0)
    monkeypatch.setattr(scan, "MIN_SHARE", 2)
    feeds = random_inputs(op, T=9, N=3, I=4, H=8, seed=2)
    feeds["sequence_lens"] = np.array([9, 9, 9] if lengths == "full" else [4, 9, 0], np.int32)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "1")
    alone = FUNCTIONS[op](**feeds)
    monkeypatch.setenv("ONNX_RECURRENT_NUM_THREADS", "3")
    parties = []

    def starved(n, work, abort, **kwargs):
        parties.append(n)
        work(0)  # the caller alone: its helpers are descheduled ...
        if helpers == "late":  # ... or start when it is done, and find nothing to do
            for i in range(1, n):
                work(i)

    monkeypatch.setattr(threads, "run", starved)
    result = []
    worker = threading.Thread(target=lambda: result.append(FUNCTIONS[op](**feeds)))
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the caller waited for a helper that never ran"
    assert parties == [3]
    for a, b in zip(alone, result[0], strict=True):
        np.testing.assert_array_equal(a, b)


def test_compiled_code_reads_a_plan_from_its_record_alone():
    # a plan is one record of addresses and sizes (backends/plans.py), read by compiled
    # code into views without an owner: the arrays it views are the Plan object's own,
    # which keeps them alive
    import gc

    numba = pytest.importorskip("numba")
    nb = pytest.importorskip("onnx_recurrent.backends.numba_backend")
    from onnx_recurrent.backends import plans

    feeds = random_inputs("LSTM", T=3, N=2, I=4, H=5, D=1)
    layer = orc.Layer("LSTM", feeds["W"], feeds["R"], feeds["B"], P=feeds["P"],
                      attributes={"clip": 2.5})  # fmt: skip
    w = layer.directions()[0]
    plan = plans.get(layer.spec, w, layer.spec.activations[0], np.dtype(np.float32), 1)

    @numba.njit
    def viewed(address, like):  # (data address, size) of each of the record's arrays
        p = nb.load_plan(address, like)
        mats = [(a.ctypes.data, a.size) for a in (p.panels, p.panels_h, p.panels_r)]
        vecs = [(v.ctypes.data, v.size) for v in (p.bias, p.bias_h, p.bias_r, p.alphas, p.betas)]
        ints = [(i.ctypes.data, i.size) for i in (p.starts, p.starts_h, p.starts_r, p.bounds)]
        ints += [(p.codes.ctypes.data, p.codes.size)]
        last = [(p.peepholes.ctypes.data, p.peepholes.size)]
        return mats + vecs + ints + last, p.kind, p.clip, p.width

    names = ("panels", "panels_h", "panels_r", "bias", "bias_h", "bias_r", "alphas", "betas")
    names += ("starts", "starts_h", "starts_r", "bounds", "codes", "peepholes")
    arrays, kind, clip, width = viewed(plan.address, np.zeros(0, np.float32))
    assert arrays == [(plan.arrays[n].ctypes.data, plan.arrays[n].size) for n in names]
    assert (kind, clip) == (2, np.float32(2.5)) and width == plan.record[plans.WIDTH] > 0
    want = layer(feeds["X"])
    del w, plan
    gc.collect()
    for a, b in zip(layer(feeds["X"]), want, strict=True):
        np.testing.assert_array_equal(a, b)
