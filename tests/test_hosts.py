"""InferenceSession under both hosts: same results, same errors, faults contained."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import onnx
import pytest

import onnx_recurrent as orc
from children import interrupted

from models import node_model, random_inputs
from oracle import gru_ref, lstm_ref, rnn_ref

pytest.importorskip("onnxruntime_extensions")
HOSTS = ["onnxruntime", "reference"]
REFS = {"GRU": gru_ref, "LSTM": lstm_ref, "RNN": rnn_ref}


def oracle(op, feeds, attributes):
    """The float64 oracle on the feeds (layout 0 feeds turned batch-first if asked)."""
    return REFS[op](
        **{k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()},
        **attributes,
    )


def batch_first(feeds):
    """Layout-1 feeds from layout-0 ones: X, initial_h, initial_c with axes 0 and 1 swapped."""
    swap = {"X", "initial_h", "initial_c"}
    return {
        k: np.ascontiguousarray(v.swapaxes(0, 1)) if k in swap else v for k, v in feeds.items()
    }


def _feeds_for(session, feeds):
    return {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}


def _constant_weights_model(op, feeds, attributes):
    """The node model with W, R, B (and P) as initializers, as exported models have."""
    model = node_model(op, feeds, attributes)
    graph = model.graph
    weights = {"W", "R", "B", "P"}
    for name in [i.name for i in graph.input if i.name in weights and i.name in feeds]:
        graph.initializer.append(onnx.numpy_helper.from_array(feeds[name], name))
    keep = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(keep)
    return model


@pytest.mark.parametrize(
    ("op", "attributes", "dtype"),
    [
        ("GRU", {"layout": 1, "linear_before_reset": 1}, np.float32),
        ("LSTM", {"input_forget": 1, "direction": "bidirectional"}, np.float64),
        ("RNN", {"activations": ["Affine"]}, np.float32),
        ("LSTM", {"clip": 1.5}, np.float16),
    ],
)
@pytest.mark.parametrize("host", HOSTS)
def test_models_onnxruntime_gets_wrong_equal_the_oracle(op, attributes, dtype, host):
    D = 2 if attributes.get("direction") == "bidirectional" else 1
    feeds = random_inputs(op, T=5, N=3, I=4, H=6, D=D, dtype=dtype)
    if attributes.get("layout"):
        feeds = batch_first(feeds)
    model = _constant_weights_model(op, feeds, attributes)
    session = orc.InferenceSession(model, host=host)
    assert session.host == host
    got = session.run(None, _feeds_for(session, feeds))
    want = oracle(op, feeds, attributes)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    for g, w in zip(got, want, strict=False):
        np.testing.assert_allclose(g.astype(np.float64), w, atol=tol, rtol=tol)


def test_hosts_agree_on_silero_and_errors():
    vad = pytest.importorskip("onnx_recurrent.tools.vad")
    path = vad.silero_model_path()
    rng = np.random.default_rng(0)
    feeds = {
        "input": (rng.standard_normal((4, 576)) * 0.1).astype(np.float32),
        "state": np.zeros((2, 4, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for host in HOSTS:
        got = orc.InferenceSession(path, host=host).run(None, feeds)
        assert np.max(np.abs(got[0] - want[0])) < 1e-4, host


@pytest.mark.parametrize("host", HOSTS)
def test_same_error_under_both_hosts(host):
    feeds = random_inputs("LSTM", T=6, N=2, I=3, H=4, D=1)
    model = _constant_weights_model("LSTM", feeds, {})
    session = orc.InferenceSession(model, host=host)
    bad = _feeds_for(session, feeds)
    bad["sequence_lens"] = np.array([9, 1], np.int32)
    with pytest.raises(
        ValueError, match=r"LSTM node .*sequence_lens must lie in \[0, seq_length=6\]"
    ):
        session.run(None, bad)
    with pytest.raises(TypeError, match="list of names"):
        session.run("Y", bad)
    # the session lives on and computes right
    good = session.run(None, _feeds_for(session, feeds))
    np.testing.assert_allclose(good[1], oracle("LSTM", feeds, {})[1], atol=1e-5)


def test_arrays_fed_by_every_input_name_run_onnxruntimes_cxx_session():
    # onnxruntime's Python run costs 20-39 µs after a pause: the host runs its C++
    # session where the feeds are arrays fed by exactly the graph's input names; other
    # feeds take the public run, and the errors are worded as before
    feeds = random_inputs("GRU", T=5, N=2, I=3, H=4, D=1)
    model = _constant_weights_model("GRU", feeds, {})
    session = orc.InferenceSession(model, host="onnxruntime")
    host = session._host
    good = _feeds_for(session, feeds)
    assert host._run_arrays is not None
    direct, public = [], []
    host._run_arrays = lambda *a, run=host._run_arrays: direct.append(1) or run(*a)
    host._session.run = lambda *a, run=host._session.run: public.append(1) or run(*a)
    expected = oracle("GRU", feeds, {})
    np.testing.assert_allclose(session.run(None, good)[1], expected[1], atol=1e-5)
    assert (len(direct), len(public)) == (1, 0)
    not_a_dict = types.MappingProxyType(good)  # checked by the session, the public run
    np.testing.assert_allclose(session.run(None, not_a_dict)[1], expected[1], atol=1e-5)
    assert (len(direct), len(public)) == (1, 1)
    name = next(iter(good))  # one input under another name: missing, and one unknown
    renamed = {("other" if k == name else k): v for k, v in good.items()}
    with pytest.raises(ValueError, match=r"unknown input name\(s\) \['other'\]"):
        session.run(None, renamed)
    assert len(direct) == 1  # refused by the session first: the C++ session does not
    # check that every input is fed
    wrong = {**good, name: good[name].astype(np.float64)}
    with pytest.raises(TypeError, match=rf"input '{name}'"):
        session.run(None, wrong)
    assert len(direct) == 2  # the wrong type reached onnxruntime, which refused it


def test_drop_in_surface():
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    model = _constant_weights_model("GRU", feeds, {})
    model.producer_name = "tests"
    session = orc.InferenceSession(model, None, ["CPUExecutionProvider"], host="onnxruntime")
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_modelmeta().producer_name == "tests"
    assert [i.name for i in session.get_inputs()] == [
        i.name for i in model.graph.input if i.name in feeds
    ]
    with pytest.raises(ValueError, match="host must be one of"):
        orc.InferenceSession(model, host="tvm")


def _run_child(code: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        **kwargs,
    )


def test_auto_falls_back_without_extensions_with_one_warning():
    child = _run_child(
        """
        import sys, warnings
        sys.modules["onnxruntime_extensions"] = None  # as if not installed
        import onnx_recurrent as orc
        from models import node_model, random_inputs
        feeds = random_inputs("GRU", T=3, N=2, I=3, H=4, D=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            session = orc.InferenceSession(node_model("GRU", feeds, {}))
        print(session.host, len(caught), caught[0].message)
        """
    )
    assert child.returncode == 0, child.stderr
    host, count, message = child.stdout.split(" ", 2)
    assert (host, count) == ("reference", "1")
    assert (
        "onnxruntime_extensions is not installed: pip install 'onnx-recurrent[onnxruntime]'"
        in message
    )


def test_the_onnxruntime_host_without_onnxruntime_names_the_extra():
    # the one optional face whose error gave no pip command
    child = _run_child(
        """
        import sys
        sys.modules["onnxruntime"] = None  # as if not installed
        import onnx_recurrent as orc
        from models import node_model, random_inputs
        feeds = random_inputs("GRU", T=3, N=2, I=3, H=4, D=1)
        try:
            orc.InferenceSession(node_model("GRU", feeds, {}), host="onnxruntime")
        except RuntimeError as e:
            print(e)
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == (
        "host='onnxruntime' cannot run this model: onnxruntime is not installed: "
        "pip install 'onnx-recurrent[onnxruntime]'"
    )


def test_error_inside_the_callback_does_not_kill_the_process():
    child = _run_child(
        """
        import numpy as np, onnx_recurrent as orc
        from models import node_model, random_inputs
        feeds = random_inputs("GRU", T=5, N=2, I=3, H=4, D=1)
        session = orc.InferenceSession(node_model("GRU", feeds, {}), host="onnxruntime")
        feeds["sequence_lens"] = np.array([7, 1], np.int32)
        try:
            session.run(None, feeds)
        except ValueError as e:
            print("ValueError", e)
        feeds["sequence_lens"] = np.array([5, 1], np.int32)
        print("next", session.run(None, feeds)[1].shape)
        """
    )
    assert child.returncode == 0, child.stderr
    assert "ValueError GRU node" in child.stdout
    assert "next (1, 2, 4)" in child.stdout


def test_ctrl_c_during_a_long_node_raises_and_the_process_lives():
    returncode, out, err = interrupted(
        """
        import sys, time, numpy as np, onnx_recurrent as orc
        from models import node_model, random_inputs
        # ~10 s on a 2-core Xeon, 4 s on a Zen 5; Y is not asked for (memory)
        feeds = random_inputs("LSTM", T=200000, N=16, I=8, H=256, D=1, full=False)
        small = {k: (v[:2000] if k == "X" else v) for k, v in feeds.items()}
        model = node_model("LSTM", feeds, {}, outputs=("", "Y_h"))
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
        session = orc.InferenceSession(model, host="onnxruntime")
        want = session.run(None, small)  # the same code path, compiled
        print("ready", flush=True)
        start = time.perf_counter()
        try:
            session.run(None, feeds)
            print("finished after", time.perf_counter() - start)
        except KeyboardInterrupt:
            print("interrupted after", time.perf_counter() - start, flush=True)
        again = session.run(None, small)
        print("same", all(np.array_equal(a, b) for a, b in zip(want, again)))
        """
    )
    # a SIGINT after the run (during the interpreter's exit) would kill it: -2
    assert returncode == 0, err
    assert "interrupted" in out and "same True" in out, (out, err)
    # within a block of steps after the SIGINT (at 0.5 s), not at the end of the call
    assert float(out.split("interrupted after")[1].split()[0]) < 1.5, out


def _if_model(branches, inputs, initializers=()):
    """A model whose output is an ``If`` on ``c`` between two one-node branches: each
    ``(node, branch_initializers)`` giving its ``Yh`` output as the branch's."""
    from onnx import TensorProto, helper

    graphs = [
        helper.make_graph(
            [node],
            f"branch{k}",
            [],
            [helper.make_tensor_value_info(node.output[1], TensorProto.FLOAT, None)],
            list(own),
        )
        for k, (node, own) in enumerate(branches)
    ]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["out"], then_branch=graphs[0], else_branch=graphs[1])
    graph = helper.make_graph([node], "g", [*inputs, cond], [out], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def _gru_branches():
    """Seeded GRU feeds, a second W, and two If branches each holding a GRU node over
    its own initializer named 'W' (the feeds' W, then the second)."""
    from onnx import helper, numpy_helper

    gru = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    other_w = (gru["W"] * -2).astype(np.float32)
    branches = [
        (
            helper.make_node("GRU", ["X", "W", "R"], ["Y", "Yh"], hidden_size=5),
            [numpy_helper.from_array(w_, "W")],
        )
        for w_ in (gru["W"], other_w)
    ]
    return gru, other_w, branches


@pytest.mark.parametrize("host", HOSTS)
def test_sibling_branches_with_the_same_names_compute_their_own_nodes(host):
    # ONNX lets an If's two branches use the same names: two unnamed LSTMs with the
    # same inputs and outputs, one reverse, ran as one (the first bound); two GRUs
    # with their own initializer 'W' ran with one W (silent wrong answers, 0.3 and 1.3)
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("LSTM", T=4, N=2, I=3, H=5, D=1)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 2, 3])
    weights = [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")]
    branches = [
        (helper.make_node("LSTM", ["X", "W", "R"], ["Y", "Yh"], hidden_size=5, **extra), ())
        for extra in ({}, {"direction": "reverse"})
    ]
    model = _if_model(branches, [x], weights)
    before = model.SerializeToString()
    session = orc.InferenceSession(model, host=host)
    w = {k: feeds[k] for k in ("X", "W", "R")}
    for c, direction in ((True, "forward"), (False, "reverse")):
        got = session.run(None, {"X": feeds["X"], "c": np.array(c)})[0]
        want = lstm_ref(**w, hidden_size=5, direction=direction)[1]
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=direction)
    assert model.SerializeToString() == before  # the caller's proto is not changed

    gru, other_w, branches = _gru_branches()
    model = _if_model(branches, [x], [numpy_helper.from_array(gru["R"], "R")])
    session = orc.InferenceSession(model, host=host)
    for c, w_ in ((True, gru["W"]), (False, other_w)):
        got = session.run(None, {"X": gru["X"], "c": np.array(c)})[0]
        want = gru_ref(gru["X"], w_, gru["R"], hidden_size=5)[1]
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(c))


@pytest.mark.parametrize("host", HOSTS)
def test_every_mend_of_the_hosted_model_at_once_leaves_the_callers_proto(host):
    # repeated initializers, names repeated across branches and shapeless branch
    # outputs are mended in one copy of the model, never in the caller's
    from onnx import TensorProto, helper, numpy_helper

    from onnx_recurrent.runtime import graph

    gru, other_w, branches = _gru_branches()
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 2, 3])
    R = [numpy_helper.from_array(r, "R") for r in (gru["R"], -gru["R"])]  # the first counts
    model = _if_model(branches, [x], R)
    before = model.SerializeToString()
    mended = graph.hosted(model)
    assert model.SerializeToString() == before
    assert [t.name for t in mended.graph.initializer] == ["R"]
    branch_w = [t.name for b in graph.all_graphs(mended.graph)[1:] for t in b.initializer]
    assert len(set(branch_w)) == 2, branch_w
    shapes = [
        b.output[0].type.tensor_type.HasField("shape") for b in graph.all_graphs(mended.graph)[1:]
    ]
    assert shapes == [True, True]
    session = orc.InferenceSession(model, host=host)
    for c, w_ in ((True, gru["W"]), (False, other_w)):
        got = session.run(None, {"X": gru["X"], "c": np.array(c)})[0]
        want = gru_ref(gru["X"], w_, gru["R"], hidden_size=5)[1]
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(c))
    assert model.SerializeToString() == before


def test_a_local_function_without_onnx_inliner_is_a_clear_error(monkeypatch):
    import sys

    from onnx import helper

    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    function = helper.make_function(
        "local",
        "F",
        ["x", "w", "r"],
        ["y"],
        [helper.make_node("GRU", ["x", "w", "r"], ["", "y"], hidden_size=5)],
        opset_imports=[helper.make_opsetid("", 22)],
    )
    model = node_model("GRU", feeds, {"hidden_size": 5})
    model.functions.append(function)
    monkeypatch.setitem(sys.modules, "onnx.inliner", None)  # as in an onnx without it
    with pytest.raises(ValueError, match=r"local functions, which need onnx.inliner"):
        orc.InferenceSession(model)


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_recurrent_node_in_a_local_function_is_computed_as_ours(host, dtype):
    # a model-local function's LSTM ran as onnx.reference's own under the reference
    # host (clip, activations and lengths ignored: 0.76 off) and as onnxruntime's under
    # its host (no double: refused)
    from onnx import helper, numpy_helper

    feeds = random_inputs("LSTM", T=5, N=3, I=4, H=6, D=1, dtype=dtype)
    lens = np.array([5, 2, 0], np.int32)
    attributes = {
        "hidden_size": 6,
        "clip": 0.5,
        "activations": ["HardSigmoid", "Tanh", "Tanh"],
        "activation_alpha": [0.2],
        "activation_beta": [0.5],
    }
    function = helper.make_function(
        "local",
        "MyLSTM",
        ["x", "w", "r", "l"],
        ["yh"],
        [helper.make_node("LSTM", ["x", "w", "r", "", "l"], ["y", "yh"], **attributes)],
        opset_imports=[helper.make_opsetid("", 22)],
    )
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("MyLSTM", ["X", "W", "R", "L"], ["out"], domain="local")],
        "g",
        [helper.make_tensor_value_info("X", elem, [5, 3, 4])],
        [helper.make_tensor_value_info("out", elem, [1, 3, 6])],
        [
            numpy_helper.from_array(feeds["W"], "W"),
            numpy_helper.from_array(feeds["R"], "R"),
            numpy_helper.from_array(lens, "L"),
        ],
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid("local", 1)],
    )
    session = orc.InferenceSession(model, host=host)
    assert session.host == host and len(session.recurrent_nodes) == 1
    got = session.run(None, {"X": feeds["X"]})[0]
    want = lstm_ref(
        *(feeds[k].astype(np.float64) for k in ("X", "W", "R")), sequence_lens=lens, **attributes
    )[1]
    np.testing.assert_allclose(got, want, atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("host", HOSTS)
def test_a_local_functions_attribute_defaults_reach_its_recurrent_node(host):
    # onnx's inliner drops a function's attribute defaults (attribute_proto): a GRU whose
    # direction and linear_before_reset refer to them ran forward, without linear
    # before reset (0.37 off), silently
    from onnx import AttributeProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=5, N=2, I=4, H=6, D=1)
    node = helper.make_node("GRU", ["x", "w", "r"], ["", "yh"], hidden_size=6)
    for name, ref, kind in (
        ("direction", "dir", AttributeProto.STRING),
        ("linear_before_reset", "lbr", AttributeProto.INT),
    ):
        node.attribute.append(AttributeProto(name=name, ref_attr_name=ref, type=kind))
    function = helper.make_function(
        "local", "F", ["x", "w", "r"], ["yh"], [node], [helper.make_opsetid("", 14)]
    )
    function.attribute_proto.extend(
        [helper.make_attribute("dir", "reverse"), helper.make_attribute("lbr", 1)]
    )

    def model(**given):
        call = helper.make_node("F", ["X", "W", "R"], ["Yh"], domain="local", **given)
        graph = helper.make_graph(
            [call],
            "g",
            [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [5, 2, 4])],
            [helper.make_tensor_value_info("Yh", onnx.TensorProto.FLOAT, None)],
            [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")],
        )
        opsets = [helper.make_opsetid("", 14), helper.make_opsetid("local", 1)]
        return helper.make_model(graph, opset_imports=opsets, functions=[function])

    X = {"X": feeds["X"]}
    weights = {k: feeds[k].astype(np.float64) for k in ("X", "W", "R")}
    for given, attributes in (
        ({}, {"direction": "reverse", "linear_before_reset": 1}),
        ({"dir": "forward"}, {"direction": "forward", "linear_before_reset": 1}),
    ):
        proto = model(**given)
        before = proto.SerializeToString()
        got = orc.InferenceSession(proto, host=host).run(None, X)[0]
        want = gru_ref(**weights, hidden_size=6, **attributes)[1]
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert proto.SerializeToString() == before


def test_x_of_a_type_inference_cannot_tell_takes_the_weights_type():
    # X from com.microsoft's Gelu has no inferred type: the onnxruntime host refused
    # the model ("the element type of X cannot be told") where W is a graph input
    from onnx import helper

    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Gelu", ["X0"], ["X"], domain="com.microsoft"),
            helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=6),
        ],
        "g",
        [
            helper.make_tensor_value_info("X0", f32, [5, 3, 4]),
            helper.make_tensor_value_info("W", f32, [1, 18, 4]),
            helper.make_tensor_value_info("R", f32, [1, 18, 6]),
        ],
        [helper.make_tensor_value_info("Y_h", f32, None)],
    )
    opsets = [helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    session = orc.InferenceSession(model, host="onnxruntime")
    got = session.run(None, {"X0": feeds["X"], "W": feeds["W"], "R": feeds["R"]})[0]
    x = feeds["X"].astype(np.float64)
    gelu = 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2)))
    want = gru_ref(gelu, *(feeds[k].astype(np.float64) for k in ("W", "R")), hidden_size=6)[1]
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("host", HOSTS)
def test_a_graph_input_that_is_a_graph_output_is_a_copy(host):
    # the reference host handed back the caller's own X: writing the output wrote the feed
    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    model = _constant_weights_model("GRU", {k: feeds[k] for k in ("X", "W", "R")}, {})
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, None)
    )
    X = feeds["X"].copy()
    out = orc.InferenceSession(model, host=host).run(["Y_h", "X"], {"X": X})
    np.testing.assert_array_equal(out[1], feeds["X"])
    out[1][...] = 0
    np.testing.assert_array_equal(X, feeds["X"])


@pytest.mark.parametrize("direct", [False, True])
def test_a_recurrent_node_in_a_scan_body_with_undeclared_output_shapes(direct):
    # onnxruntime wants the shape of a Scan body's outputs: its own LSTM infers it, our
    # custom node gave none ("Subgraph must have the shape set for all outputs but Yo
    # did not"), where plain onnxruntime runs the model; also where the node's Y is
    # itself the body output declared without a shape (direct)
    from onnx import TensorProto, helper, numpy_helper

    T, N, I, H = 6, 2, 4, 5
    feeds = random_inputs("LSTM", T=T, N=1, I=I, H=H, D=1)
    Y = "Yo" if direct else "Y"
    body = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["xs", "axis"], ["xu"]),
            helper.make_node("LSTM", ["xu", "W", "R"], [Y, "Yh", "Yc"], hidden_size=H),
            helper.make_node("Add", ["acc_in", "Yh"], ["acc_out"]),
            *([] if direct else [helper.make_node("Identity", ["Y"], ["Yo"])]),
        ],
        "body",
        [
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 1, H]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, [T, I]),
        ],
        [
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 1, H]),
            helper.make_tensor_value_info("Yo", TensorProto.FLOAT, None),  # no shape
        ],
        [numpy_helper.from_array(np.array([1], np.int64), "axis")],
    )
    scan = helper.make_node("Scan", ["acc0", "X"], ["acc", "Ys"], body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [scan],
        "g",
        [
            helper.make_tensor_value_info("acc0", TensorProto.FLOAT, [1, 1, H]),
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [N, T, I]),
        ],
        [
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 1, H]),
            helper.make_tensor_value_info("Ys", TensorProto.FLOAT, [N, T, 1, 1, H]),
        ],
        [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    x = np.random.default_rng(3).standard_normal((N, T, I)).astype(np.float32)
    run = {"acc0": np.zeros((1, 1, H), np.float32), "X": x}
    got = orc.InferenceSession(model, host="onnxruntime").run(None, run)
    want = [lstm_ref(x[n][:, None], feeds["W"], feeds["R"], hidden_size=H) for n in range(N)]
    np.testing.assert_allclose(got[1], np.stack([w[0] for w in want]), atol=1e-5)
    np.testing.assert_allclose(got[0], sum(w[1] for w in want), atol=1e-5)


@pytest.mark.parametrize("name", ["my_gru", ""])
def test_onnxruntimes_refusal_names_the_models_node_not_ours(name):
    # was: "operator (OnnxRecurrentFloat) in node (onnx_recurrent::0)"
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    graph = helper.make_graph(
        [helper.make_node("GRU", ["X", "W", "R", "", "L"], ["Y", "Yh"], hidden_size=6, name=name)],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, 3, 4]),
            helper.make_tensor_value_info("L", TensorProto.INT64, [3]),  # the spec: int32
        ],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(RuntimeError, match="onnxruntime refuses the model") as caught:
        orc.InferenceSession(model, host="onnxruntime")
    message = str(caught.value)
    assert f"operator (GRU) in node ({name})" in message, message
    assert "OnnxRecurrent" not in message and "onnx_recurrent::" not in message, message


@pytest.mark.parametrize("dead", ["FooBar", "Relu2", "nowhere"])
def test_a_dead_invalid_node_is_refused_as_onnxruntime_refuses_it(dead):
    # the onnxruntime host pruned nodes that nothing uses before onnxruntime saw them:
    # a model onnxruntime refuses (an unregistered op, a node with inputs its schema
    # has not, an input from nowhere) ran; a node the rewrite leaves dead (the one
    # transposing W, bound into the native node) is still pruned
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    bad = {
        "FooBar": helper.make_node("FooBar", ["Yh"], ["unused"]),
        "Relu2": helper.make_node("Relu", ["Yh", "Yh"], ["unused"]),
        "nowhere": helper.make_node("Relu", ["nowhere"], ["unused"]),
    }[dead]
    nodes = [
        helper.make_node("Transpose", ["Wt"], ["W"], perm=[0, 2, 1]),
        helper.make_node("GRU", ["X", "W", "R"], ["", "Yh"], hidden_size=6),
        bad,
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, 3, 4])],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.ascontiguousarray(feeds["W"].transpose(0, 2, 1)), "Wt"),
            numpy_helper.from_array(feeds["R"], "R"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(type(theirs.value), match="onnxruntime refuses the model"):
        orc.InferenceSession(model, host="onnxruntime")
    del model.graph.node[2]  # valid: the Transpose, dead once W is bound, is pruned
    session = orc.InferenceSession(model, host="onnxruntime")
    (Yh,) = session.run(None, {"X": feeds["X"]})
    np.testing.assert_allclose(Yh, orc.gru(feeds["X"], feeds["W"], feeds["R"])[1], atol=1e-6)
    # what the rewrite does: the GRU no longer reads W; the Transpose dies with it, and
    # Wt; a node dead in the model as given stays
    from onnx_recurrent.runtime import graph as graphs

    dead = graphs.dead_nodes(graph)
    assert dead == {("unused",)}
    graph.node[1].input[1] = "W_bound"
    graphs.prune(graph, dead)
    assert [n.op_type for n in graph.node] == ["GRU", bad.op_type]
    assert [t.name for t in graph.initializer] == ["R"]


@pytest.mark.parametrize("bad", ["int32 shape", "declared double"])
def test_an_invalid_node_computing_a_weight_is_refused_as_onnxruntime_refuses_it(bad):
    """The rewrite folds W and drops the node that computed it, so onnxruntime never saw
    it: a model it refuses ran (a Reshape to an int32 shape, a Cast whose output is
    declared of another type); the same node also read elsewhere was refused."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    W = feeds["W"]
    if bad == "int32 shape":
        node = helper.make_node("Reshape", ["W0", "shape"], ["W"])
        tensors = [W.reshape(18, 4), np.array(W.shape, np.int32)]
        declared = []
    else:
        node = helper.make_node("Cast", ["W0"], ["W"], to=TensorProto.FLOAT)
        tensors = [W.astype(np.float64)]
        declared = [helper.make_tensor_value_info("W", TensorProto.DOUBLE, None)]
    graph = helper.make_graph(
        [node, helper.make_node("GRU", ["X", "W", "R"], ["", "Yh"], hidden_size=6)],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, 3, 4])],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(t, n) for t, n in zip(tensors, ["W0", "shape"], strict=False)]
        + [numpy_helper.from_array(feeds["R"], "R")],
        value_info=declared,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(type(theirs.value), match="onnxruntime refuses the model"):
        orc.InferenceSession(model, host="onnxruntime")
    if bad == "int32 shape":  # valid with an int64 shape: folded, dropped, run
        model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(W.shape), "shape"))
    else:
        del model.graph.value_info[:]
    session = orc.InferenceSession(model, host="onnxruntime")
    (Yh,) = session.run(None, {"X": feeds["X"]})
    np.testing.assert_allclose(Yh, orc.gru(feeds["X"], W, feeds["R"])[1], atol=1e-6)


def test_sequence_lens_computed_as_int64_is_refused_by_the_reference_host():
    # onnxruntime refuses the model (tensor(int32) only); the reference host ran it, so
    # host="auto" fell back and gave outputs
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=6, N=3, I=4, H=5, D=1)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["mask", "axis"], ["counted"], keepdims=0),
            helper.make_node("Cast", ["counted"], ["lens"], to=TensorProto.INT64),
            helper.make_node("GRU", ["X", "W", "R", "", "lens"], ["Y", "Yh"], hidden_size=5),
        ],
        "g",
        [vi("X", TensorProto.FLOAT, ["T", "N", 4]), vi("mask", TensorProto.FLOAT, ["T", "N"])],
        [vi("Yh", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(feeds[k], k) for k in ("W", "R")]
        + [numpy_helper.from_array(np.array([0], np.int64), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    run = {"X": feeds["X"], "mask": (np.arange(6)[:, None] < [6, 3, 1]).astype(np.float32)}
    session = orc.InferenceSession(model, host="reference")
    with pytest.raises(TypeError, match=r"GRU node '': sequence_lens must be tensor\(int32\)"):
        session.run(None, run)


@pytest.mark.parametrize(
    ("imports", "version"),
    [([("ai.onnx", 22), ("", 7)], 7), ([("", 22), ("", 7)], 7), ([("", 7), ("", 22)], 22)],
)
def test_a_model_importing_the_default_domain_twice_is_run_at_its_last_version(imports, version):
    """onnx's checker and onnxruntime take the last of several imports of the default
    domain: the onnxruntime host took the first (it ran a GRU with ``layout`` as
    GRU-22 where the reference host refused it as GRU-7), the reference host the
    ``''`` one."""
    from onnx import helper

    H, I = 5, 2
    rng = np.random.default_rng(0)
    W = rng.standard_normal((1, 3 * H, I)).astype(np.float32)
    R = rng.standard_normal((1, 3 * H, H)).astype(np.float32)
    X = rng.standard_normal((3, 4, I)).astype(np.float32)
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=H, layout=1)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [3, 4, I])],
        [
            helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [3, 4, 1, H]),
            helper.make_tensor_value_info("Y_h", onnx.TensorProto.FLOAT, [3, 1, H]),
        ],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(R, "R")],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in imports]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    if version == 22:
        onnx.checker.check_model(model, full_check=True)
        expected = orc.gru(X, W, R, layout=1)
        for host in ("onnxruntime", "reference"):
            got = orc.InferenceSession(model.SerializeToString(), host=host).run(None, {"X": X})
            np.testing.assert_allclose(got[0], expected[0], atol=1e-6)
    else:
        with pytest.raises(onnx.checker.ValidationError, match="layout"):
            onnx.checker.check_model(model, full_check=True)
        for host in ("onnxruntime", "reference"):
            with pytest.raises(ValueError, match=r"unknown attribute\(s\) \['layout'\]; GRU-7"):
                orc.InferenceSession(model.SerializeToString(), host=host).run(None, {"X": X})


OUT_OF_MEMORY_CHILD = """
import resource, sys
import numpy as np
import onnx_recurrent as orc
from models import node_model, random_inputs

feeds = random_inputs("LSTM", T=3, N=1, I=1, H=64, full=False)
model = node_model(
    "LSTM", feeds, {"hidden_size": 64}, constants=["W", "R"], shapes={"X": ["T", 1, 1]}
)
session = orc.InferenceSession(model, host=sys.argv[1])
small = session.run(None, {"X": feeds["X"]})
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
X = np.ones((20_000_000, 1, 1), np.float32)  # Y: 4.8 GiB, past the limit below
resource.setrlimit(resource.RLIMIT_AS, (vm + X.nbytes + (600 << 20),) * 2)
try:
    session.run(None, {"X": X})
except MemoryError as e:
    print("MemoryError", "LSTM" in str(e))
except Exception as e:
    print(type(e).__name__, e)
print(np.array_equal(session.run(None, {"X": feeds["X"]})[1], small[1]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.parametrize("host", HOSTS)
def test_a_recurrent_node_out_of_memory_is_a_memory_error_under_either_host(host):
    # under the onnxruntime host, onnxruntime's allocation of the node's outputs (or
    # the node's own scratch) failing came back as onnxruntime's Fail
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY_CHILD, host],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    assert lines[0].startswith("MemoryError"), run.stdout
    assert lines[1] == "True"  # the session still usable
