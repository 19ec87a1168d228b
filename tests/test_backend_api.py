"""onnx's backend API over InferenceSession (:mod:`onnx_recurrent.backend`).

- ``prepare`` takes what onnxruntime's backend takes (a model, its path or bytes, a
  session, a prepared model) and InferenceSession's keywords; ``run`` maps a list onto
  the graph inputs that are not initializers, takes a dict, or one array.
- ``run_node`` runs one GRU, RNN or LSTM node as the functions compute it; other
  operators raise ``NotImplementedError``, as onnxruntime's backend does for all.
- onnx's own runner (``BackendTest``) runs the backend; the module's example runs.
"""

from __future__ import annotations

import doctest
import unittest

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_recurrent as orc
from onnx_recurrent import backend

from models import node_model, random_inputs


def _shaped(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its outputs' ranks declared (dims unknown): onnx's checker, which
    ``prepare`` runs on a ModelProto as onnxruntime's backend does, wants a shape."""
    for output in model.graph.output:
        rank = 4 if output.name == "Y" else 3
        output.type.tensor_type.shape.dim.extend([onnx.TensorShapeProto.Dimension()] * rank)
    return model


@pytest.fixture(scope="module")
def lstm():
    feeds = random_inputs("LSTM", T=6, N=2, I=3, H=4, D=1)
    return _shaped(node_model("LSTM", feeds, {})), feeds


def test_the_module_example_runs():
    result = doctest.testmod(backend, verbose=False)
    assert result.attempted >= 10 and result.failed == 0, result


def test_the_package_exports_it_lazily():
    assert orc.backend is backend and "backend" in orc.__all__
    assert backend.RecurrentBackend.prepare == backend.prepare
    assert backend.run == backend.run_model


def test_prepare_takes_what_onnxruntime_takes(lstm, tmp_path):
    model, feeds = lstm
    expected = orc.InferenceSession(model).run(None, feeds)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    session = orc.InferenceSession(model, host="reference")
    reps = [
        backend.prepare(model),
        backend.prepare(model.SerializeToString(), "CPU"),
        backend.prepare(str(path), device=None),
        backend.prepare(path, host="reference"),
        backend.prepare(session),
    ]
    assert backend.prepare(reps[0]) is reps[0] and reps[-1].session is session
    for rep in reps:
        for got, want in zip(rep.run(list(feeds.values())), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_maps_a_list_by_position_and_takes_a_dict(lstm):
    model, feeds = lstm
    rep = backend.prepare(model)
    names = [arg.name for arg in rep.session.get_inputs()]
    assert names == list(feeds)
    by_position = rep.run([feeds[n] for n in names])
    for other in (rep.run(tuple(feeds[n] for n in names)), rep.run(feeds)):
        for a, b in zip(by_position, other, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"\d inputs given; the model takes \d"):
        rep.run([*feeds.values(), feeds["X"]])
    with pytest.raises(ValueError, match=r"one input given, not in a list"):
        rep.run(feeds["X"])
    with pytest.raises(ValueError, match=r"missing input\(s\)"):
        rep.run([feeds["X"]])


def test_initializers_are_not_positional_inputs():
    # an initializer also listed as a graph input (IR < 4 style) takes no position
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 2, 4)).astype(np.float32)
    W = rng.standard_normal((1, 15, 4)).astype(np.float32)
    R = rng.standard_normal((1, 15, 5)).astype(np.float32)
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=5)
    inputs = [
        helper.make_tensor_value_info("W", TensorProto.FLOAT, W.shape),
        helper.make_tensor_value_info("X", TensorProto.FLOAT, X.shape),
        helper.make_tensor_value_info("R", TensorProto.FLOAT, R.shape),
    ]
    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 1, 2, 5]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, 2, 5]),
    ]
    graph = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    Y, Y_h = backend.run_model(model, [X, R])  # X, then R: W is an initializer
    want_Y, want_Y_h = orc.gru(X, W, R)
    np.testing.assert_allclose(Y, want_Y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Y_h, want_Y_h, rtol=1e-5, atol=1e-6)


def test_devices_and_keywords(lstm):
    model, _ = lstm
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA") and not backend.supports_device("GPU")
    assert backend.is_compatible(model) and not backend.is_compatible(model, "CUDA")
    with pytest.raises(RuntimeError, match=r"runs on the CPU only, got device 'CUDA'"):
        backend.prepare(model, "CUDA")
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['threads'\]"):
        backend.prepare(model, threads=2)
    assert backend.prepare(model, rtol=1e-3, atol=1e-7).session  # onnx's runner's
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError):
        backend.prepare(broken)


@pytest.mark.parametrize(
    ("op", "function", "attributes"),
    [
        ("GRU", orc.gru, {"linear_before_reset": 1, "direction": "bidirectional"}),
        ("RNN", orc.rnn, {"direction": "reverse"}),
        ("LSTM", orc.lstm, {"input_forget": 1}),
    ],
)
def test_run_node_runs_one_recurrent_node(op, function, attributes):
    D = 2 if attributes.get("direction") == "bidirectional" else 1
    feeds = random_inputs(op, T=5, N=3, I=4, H=6, D=D)
    names = list(feeds)
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    node = helper.make_node(op, names, outputs, hidden_size=6, **attributes)
    got = backend.run_node(node, list(feeds.values()))
    want = function(**feeds, hidden_size=6, **attributes)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    by_name = backend.run_node(node, feeds, opset_version=14)
    for g, w in zip(by_name, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [3, 4])
def test_run_node_at_opsets_3_and_4_runs_gru_3(opset):
    # onnx's table of IR versions lacks opsets 2-4: "Unsupported opset-version."
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1, full=False)
    node = helper.make_node("GRU", list(feeds), ["Y", "Y_h"], hidden_size=5)
    got = backend.run_node(node, feeds, opset_version=opset)
    want = orc.gru(**feeds, hidden_size=5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", ["7", 7.0, True, 0])
def test_run_node_names_a_bad_opset_version(opset):
    # a string or float was nanobind's TypeError from inside onnx's checker
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1, full=False)
    node = helper.make_node("GRU", list(feeds), ["Y", "Y_h"], hidden_size=5)
    with pytest.raises(TypeError, match=r"opset_version must be a positive integer, got"):
        backend.run_node(node, feeds, opset_version=opset)


def test_run_node_inputs_left_empty_and_outputs_info():
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    X, W, R = feeds["X"], feeds["W"], feeds["R"]
    node = helper.make_node("GRU", ["X", "W", "R", "", "", "h0"], ["", "Y_h"], hidden_size=5)
    h0 = np.full((1, 2, 5), 0.5, np.float32)
    (Y_h,) = backend.run_node(
        node, [X, W, R, None, None, h0], outputs_info=[(np.float32, ()), (np.float32, (1, 2, 5))]
    )
    np.testing.assert_allclose(Y_h, orc.gru(X, W, R, initial_h=h0)[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"input 3 of the node is left empty"):
        backend.run_node(node, [X, W, R, np.zeros((1, 30), np.float32)])
    with pytest.raises(ValueError, match=r"GRU node '': no value given for its input R"):
        backend.run_node(node, [X, W])
    with pytest.raises(ValueError, match=r"outputs_info gives 1 outputs; the node has 2"):
        backend.run_node(node, [X, W, R, None, None, h0], outputs_info=[(np.float32, (1, 2, 5))])


def test_run_node_and_prepare_refuse_what_they_cannot_honour():
    # each was a deep or misleading error (onnx's checker: "topologically sorted";
    # AttributeError; "'NoneType' object is not iterable"), or ignored silently (a
    # value for '', host= with a session, a declared double for a float node)
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    X, W, R = feeds["X"], feeds["W"], feeds["R"]
    node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=5)
    for inputs in ([X, W, R], {"X": X, "W": W, "R": R}):
        with pytest.raises(ValueError, match=r"no value given for its input B \('B'\); or name"):
            backend.run_node(node, inputs)
    with pytest.raises(TypeError, match=r"node must be an onnx.NodeProto, got str"):
        backend.run_node("GRU", [X, W, R])
    with pytest.raises(TypeError, match=r"inputs must be a list .* got NoneType"):
        backend.run_node(node, None)
    empty = helper.make_node("GRU", ["X", "W", "R", ""], ["Y", "Y_h"], hidden_size=5)
    with pytest.raises(ValueError, match=r"inputs\[''\] is given a value"):
        backend.run_node(empty, {"X": X, "W": W, "R": R, "": feeds["B"]})
    with pytest.raises(TypeError, match=r"outputs_info\[0\] declares float64; .* float32"):
        backend.run_node(empty, [X, W, R], outputs_info=[(np.float64, None)] * 2)
    with pytest.raises(TypeError, match=r"outputs_info\[1\] must be \(dtype, shape\)"):
        backend.run_node(empty, [X, W, R], outputs_info=[(np.float32, None), np.float32])
    _, Y_h = backend.run_node(empty, [X, W, R], outputs_info=[(np.float32, None)] * 2)
    np.testing.assert_allclose(Y_h, orc.gru(X, W, R)[1], rtol=1e-5, atol=1e-6)
    model = node_model("GRU", {"X": X, "W": W, "R": R}, {"hidden_size": 5})
    session = orc.InferenceSession(model, host="onnxruntime")
    for made in (session, backend.prepare(session)):
        with pytest.raises(TypeError, match=r"prepare\(\) got \['host'\] .* made already"):
            backend.prepare(made, host="reference")


def test_run_node_reads_arrays_as_the_session_does():
    """A masked array was computed with its mask ignored, a big-endian array gave
    onnx's ValueError naming no input, a tensor that needs grad torch's bare error:
    refused naming the input, or read by value, as ``run`` reads them."""
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    X, W, R = feeds["X"], feeds["W"], feeds["R"]
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=5)
    want = backend.run_node(node, [X, W, R])
    masked = np.ma.masked_array(X, mask=np.zeros(X.shape, bool))
    with pytest.raises(TypeError, match=r"X is a masked array, whose mask would be ignored"):
        backend.run_node(node, [masked, W, R])
    for got, w in zip(backend.run_node(node, [X.astype(">f4"), W, R]), want, strict=True):
        np.testing.assert_array_equal(got, w)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"R cannot be read as an array \(Tensor\)"):
        backend.run_node(node, {"X": X, "W": W, "R": torch.from_numpy(R).requires_grad_()})


def test_run_node_of_other_operators_is_not_implemented():
    node = helper.make_node("Relu", ["x"], ["y"])
    with pytest.raises(NotImplementedError, match=r"GRU, RNN and LSTM nodes only, not 'Relu'"):
        backend.run_node(node, [np.zeros(3, np.float32)])


def test_onnx_runner_runs_the_recurrent_cases():
    """onnx's ``BackendTest`` over this backend: its own loading and comparison."""
    from onnx.backend.test import BackendTest

    runner = BackendTest(backend.RecurrentBackend, __name__)
    runner.include(r"^test_(gru|lstm|rnn|simple_rnn)_[a-z_]*_cpu$")
    tests = [
        test
        for case in runner.test_cases.values()
        for test in unittest.defaultTestLoader.loadTestsFromTestCase(case)
    ]
    result = unittest.TestResult()
    unittest.TestSuite(tests).run(result)
    assert not result.failures and not result.errors, result.failures + result.errors
    skipped = {id(test) for test, _ in result.skipped}
    ran = sorted(t.id().rpartition(".")[2] for t in tests if id(t) not in skipped)
    assert len(ran) >= 18 and all(name.endswith("_cpu") for name in ran), ran
    assert "test_gru_batchwise_cpu" in ran  # one onnxruntime refuses
