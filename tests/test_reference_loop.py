"""``Loop`` corrected for onnx.reference (runtime/loop.py), and ``check`` on a Loop model.

onnx.reference (1.23.2) runs ``Loop(M, "")`` for zero iterations and stacks scan outputs
with ``np.vstack``; the corrected ``Loop`` runs M iterations, stacks on a new axis, as
onnxruntime, OpenVINO and ONNX shape inference do.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnx_recurrent as orc
from onnx_recurrent.runtime.loop import Loop, reference_fixes
from onnx_recurrent.tools.check import check, installed_peers, lint

T, N, I, H = 2, 2, 3, 4


def loop_model(M=3, cond=None, body_cond=None, scan=True, seed=0):
    """``Loop(M, cond, h0)`` whose body runs a GRU-14 over the outer ``X`` from the
    carried ``h``; scan output: each iteration's ``Y_h``. ``M`` / ``cond`` None are
    omitted (``""``); ``body_cond`` None passes the body's cond input through, a bool
    makes it that constant. Returns the model, the feeds and the weights."""
    rng = np.random.default_rng(seed)
    weights = {
        "W": rng.normal(0, 0.5, (1, 3 * H, I)).astype(np.float32),
        "R": rng.normal(0, 0.5, (1, 3 * H, H)).astype(np.float32),
        "B": rng.normal(0, 0.5, (1, 6 * H)).astype(np.float32),
    }
    feeds = {
        "X": rng.normal(size=(T, N, I)).astype(np.float32),
        "h0": rng.normal(size=(1, N, H)).astype(np.float32),
    }
    gru = helper.make_node("GRU", ["X", "W", "R", "B", "", "h_in"], ["", "h_out"], hidden_size=H)
    nodes = [gru]
    if body_cond is None:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        value = helper.make_tensor("c", TensorProto.BOOL, [], [body_cond])
        nodes.append(helper.make_node("Constant", [], ["cond_out"], value=value))
    h = [1, N, H]
    outputs = [
        helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("h_out", TensorProto.FLOAT, h),
    ]
    if scan:
        nodes.append(helper.make_node("Identity", ["h_out"], ["h_scan"]))
        outputs.append(helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, h))
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, h),
        ],
        outputs,
    )
    initializers = [onnx.numpy_helper.from_array(v, k) for k, v in weights.items()]
    if M is not None:
        initializers.append(onnx.numpy_helper.from_array(np.array(M, np.int64), "M"))
    if cond is not None:
        initializers.append(onnx.numpy_helper.from_array(np.array(cond), "cond"))
    loop = helper.make_node(
        "Loop",
        ["M" if M is not None else "", "cond" if cond is not None else "", "h0"],
        ["h_final", "h_all"] if scan else ["h_final"],
        name="loop",
        body=body,
    )
    graph_outputs = [helper.make_tensor_value_info("h_final", TensorProto.FLOAT, h)]
    if scan:
        graph_outputs.append(helper.make_tensor_value_info("h_all", TensorProto.FLOAT, ["n", *h]))
    graph = helper.make_graph(
        [loop],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, N, I]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, h),
        ],
        graph_outputs,
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    return model, feeds, weights


def expected(feeds, weights, iterations):
    """The loop in NumPy: ``[h_final, h_all]`` after ``iterations`` GRU runs."""
    h, states = feeds["h0"], []
    for _ in range(iterations):
        _, h = orc.gru(feeds["X"], **weights, initial_h=h, hidden_size=H)
        states.append(h)
    all_h = np.stack(states) if states else np.empty((0, 1, N, H), np.float32)
    return [h, all_h]


def fixed(model):
    return ReferenceEvaluator(model, new_ops=[*orc.reference_ops(), *reference_fixes()])


def onnxruntime_run(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_outputs(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_reference_fixes_is_the_loop():
    assert reference_fixes() == [Loop]
    assert Loop.__name__ == "Loop"  # ReferenceEvaluator matches new_ops by class name


def test_cond_omitted_runs_m_iterations():
    model, feeds, weights = loop_model(M=3)
    want = expected(feeds, weights, 3)
    assert_outputs(onnxruntime_run(model, feeds), want)
    assert_outputs(fixed(model).run(None, feeds), want)
    assert_outputs(ReferenceEvaluator(model, new_ops=reference_fixes()).run(None, feeds), want)


def test_onnx_reference_runs_cond_omitted_for_zero_iterations():
    """The upstream mistake corrected here (onnx 1.23.2): no iteration at all, so the
    GRU never runs and ``h_final`` is ``h0``; with a scan output it raises."""
    model, feeds, weights = loop_model(M=3, scan=False)
    (got,) = ReferenceEvaluator(model, new_ops=orc.reference_ops()).run(None, feeds)
    (want,) = expected(feeds, weights, 3)[:1]
    if np.allclose(got, want, rtol=1e-5, atol=1e-5):
        pytest.skip(f"onnx {onnx.__version__} runs Loop(M, '') as the spec says")
    np.testing.assert_array_equal(got, feeds["h0"])
    assert not np.allclose(got, want, atol=1e-3)
    model, feeds, _ = loop_model(M=3)
    with pytest.raises(ValueError, match="at least one array"):
        ReferenceEvaluator(model).run(None, feeds)


@pytest.mark.parametrize("M", [3, None])
def test_cond_given_stops_where_the_body_cond_is_false(M):
    """As before the correction: one iteration, then the body's false cond ends it."""
    model, feeds, weights = loop_model(M=M, cond=True, body_cond=False)
    want = expected(feeds, weights, 1)
    assert_outputs(onnxruntime_run(model, feeds), want)
    got = fixed(model).run(None, feeds)
    assert_outputs(got, want)
    # the loop-carried value is onnx.reference's; its scan output was [1, N, H] (vstack)
    before = ReferenceEvaluator(model, new_ops=orc.reference_ops()).run(None, feeds)
    np.testing.assert_allclose(before[0], got[0], rtol=1e-6, atol=1e-6)
    if before[1].shape != got[1].shape:
        assert before[1].shape == (1, N, H)


@pytest.mark.parametrize(("M", "cond"), [(0, None), (0, True), (3, False)])
def test_zero_iterations(M, cond):
    """The initial values, and an empty scan output of the body's declared shape."""
    model, feeds, weights = loop_model(M=M, cond=cond)
    want = expected(feeds, weights, 0)
    assert_outputs(onnxruntime_run(model, feeds), want)
    assert_outputs(fixed(model).run(None, feeds), want)


def test_m_given_cond_omitted_ignores_the_body_cond():
    """The spec: ``for (i = 0; i < M; ++i) { cond = ...; // ignored }``. onnxruntime 1.32
    and OpenVINO 2026.4 stop after one iteration; lint warns."""
    model, feeds, weights = loop_model(M=3, body_cond=False)
    want = expected(feeds, weights, 3)
    assert_outputs(fixed(model).run(None, feeds), want)
    (finding,) = lint(model)
    assert finding.peer is None and str(finding).startswith("Loop 'loop': warning: M given")
    assert lint(loop_model(M=3)[0]) == []  # a passed-through cond stays true
    assert lint(loop_model(M=3, body_cond=True)[0]) == []
    assert lint(loop_model(M=3, cond=True, body_cond=False)[0]) == []


def test_m_and_cond_omitted_end_on_the_body_cond():
    """Read literally, the spec never ends; as onnxruntime, the body's cond ends it."""
    model, feeds, weights = loop_model(M=None, body_cond=False)
    want = expected(feeds, weights, 1)
    assert_outputs(onnxruntime_run(model, feeds), want)
    assert_outputs(fixed(model).run(None, feeds), want)


def test_a_body_input_shadows_an_outer_value():
    """The body's carried input ``a`` is the Loop's ``b`` (0), not the outer ``a``
    (100); onnx.reference 1.23.2 gives 102."""
    tensor = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["a", "one"], ["a_out"]),
        ],
        "body",
        [
            tensor("i", TensorProto.INT64, []),
            tensor("cond_in", TensorProto.BOOL, []),
            tensor("a", TensorProto.FLOAT, [1]),
        ],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("a_out", TensorProto.FLOAT, [1])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "b"], ["r"], body=body)],
        "g",
        [tensor("a", TensorProto.FLOAT, [1]), tensor("b", TensorProto.FLOAT, [1])],
        [tensor("r", TensorProto.FLOAT, [1])],
        [
            helper.make_tensor("M", TensorProto.INT64, [], [2]),
            helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    feeds = {"a": np.array([100.0], np.float32), "b": np.array([0.0], np.float32)}
    want = [np.array([2.0], np.float32)]
    assert_outputs(onnxruntime_run(model, feeds), want)
    assert_outputs(ReferenceEvaluator(model, new_ops=reference_fixes()).run(None, feeds), want)


@pytest.mark.parametrize("host", ["reference", "onnxruntime"])
def test_session_runs_the_loop(host):
    """Both hosts run ``Loop(M, "")`` M times; the reference host ignores a body cond
    that turns false, as the spec says (onnxruntime stops there)."""
    model, feeds, weights = loop_model(M=3)
    want = expected(feeds, weights, 3)
    assert_outputs(orc.InferenceSession(model, host=host).run(None, feeds), want)
    if host == "reference":
        model, feeds, weights = loop_model(M=3, body_cond=False)
        got = orc.InferenceSession(model, host=host).run(None, feeds)
        assert_outputs(got, expected(feeds, weights, 3))


def test_check_flags_no_peer_on_the_loop_model():
    """check's onnx.reference peer runs the corrected Loop; onnx-recurrent's session
    (the reference of every comparison) runs the Loop right, so no peer differs."""
    model, feeds, _ = loop_model(M=3)
    report = check(model, feeds)
    assert {c.peer for c in report.comparisons} == set(installed_peers())
    assert [c for c in report.comparisons if c.exceeds or c.error] == []
    assert report.findings == []


def test_check_on_a_loop_whose_body_cond_turns_false():
    """``Loop(M, "")`` whose body cond turns false: the spec (check's onnx.reference)
    runs M iterations, onnxruntime and OpenVINO one. onnx-recurrent's session sides with
    its host, so the other side is flagged; the lint warning says which is which."""
    model, feeds, _ = loop_model(M=3, body_cond=False)
    report = check(model, feeds)
    differing = {c.peer for c in report.comparisons if c.exceeds}
    if orc.InferenceSession(model).host == "onnxruntime":
        assert differing == {"onnx.reference"} & set(installed_peers())
    else:
        assert differing == {"onnxruntime", "openvino"} & set(installed_peers())
    assert [str(f) for f in report.findings] == [str(f) for f in lint(model)] != []


def test_reference_ops_say_what_is_wrong_with_a_nodes_inputs_and_outputs():
    # were onnx's "Issues with types [...]" and "Unable to find output name 'Z'" with
    # the model dumped
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    import onnx_recurrent as orc

    from models import random_inputs

    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    weights = [numpy_helper.from_array(feeds[k], k) for k in ("W", "R")]
    for inputs, outputs, match in (
        (["X", "W", "R", "", "", "", "X"], ["Y"], r"7 inputs, GRU has at most 6"),
        (["X", "W", "R"], ["Y", "Yh", "Z"], r"3 outputs, GRU has at most 2 \(Y, Y_h\)"),
    ):
        node = helper.make_node("GRU", inputs, outputs, hidden_size=5)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 2, 3])],
            [helper.make_tensor_value_info(outputs[-1], TensorProto.FLOAT, None)],
            weights,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
        evaluator = ReferenceEvaluator(model, new_ops=orc.reference_ops())
        with pytest.raises(ValueError, match=rf"GRU node '': {match}"):
            evaluator.run(None, {"X": feeds["X"]})
    # big-endian sequence_lens read by value (refused: "got >i4"); X that needs grad
    # named (torch's bare RuntimeError)
    node = helper.make_node("GRU", ["X", "W", "R", "", "L"], ["", "Y_h"], hidden_size=5)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 2, 3]),
            helper.make_tensor_value_info("L", TensorProto.INT32, [2]),
        ],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    evaluator = ReferenceEvaluator(model, new_ops=orc.reference_ops())
    lens = np.array([4, 2], np.int32)
    want = orc.gru(feeds["X"], feeds["W"], feeds["R"], sequence_lens=lens)[1]
    (got,) = evaluator.run(None, {"X": feeds["X"], "L": lens.astype(">i4")})
    np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"GRU node '': X cannot be read as an array"):
        evaluator.run(None, {"X": torch.from_numpy(feeds["X"]).requires_grad_(), "L": lens})


@pytest.mark.parametrize("host", ["reference", "onnxruntime"])
def test_zero_iterations_give_the_scan_output_its_inferred_shape(host):
    """A body whose recurrent output leaves as a scan output declared without a shape:
    zero iterations gave ``(0, 0, 0, 0, 0)`` (onnxruntime host: the custom node's
    outputs have no inferred shape) or ``(0,)`` (reference host) where onnxruntime,
    which infers the body for itself, gives ``(0, T, 1, N, H)``."""
    rng = np.random.default_rng(0)
    W = rng.normal(0, 0.5, (1, 3 * H, I)).astype(np.float32)
    R = rng.normal(0, 0.5, (1, 3 * H, H)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("GRU", ["X", "W", "R"], ["Y", ""], hidden_size=H),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", ""], ["Ys"], body=body)],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, N, I]),
            helper.make_tensor_value_info("M", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("Ys", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(R, "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    before = model.SerializeToString()
    session = orc.InferenceSession(model, host=host)
    X = rng.normal(size=(T, N, I)).astype(np.float32)
    for M in (0, 2):
        feeds = {"X": X, "M": np.array(M, np.int64)}
        (got,) = session.run(None, feeds)
        (want,) = onnxruntime_run(model, feeds)
        assert got.shape == want.shape == (M, T, 1, N, H)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert model.SerializeToString() == before
