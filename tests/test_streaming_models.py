"""Stateful streaming of whole models: expose_states and StreamingSession.

The PyTorch models in ``tests/data`` (written by ``scripts/export_streaming_models.py``)
keep their state inside: a 2-layer GRU (torch.export exporter, zeros from ``Expand``)
and a 2-layer LSTM (TorchScript exporter, zeros from ``ConstantOfShape``). Fed chunk by
chunk through a StreamingSession they must give what one call over the whole sequence
gives, and what PyTorch gave. No torch needed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_recurrent as orc
from onnx_recurrent.runtime.streaming import StreamingSession, expose_states

from models import node_model, over_constants_model, random_inputs

DATA = Path(__file__).parent / "data"
TOLERANCE = 1e-5
#: name -> (output names, time axis of x, batch axis of x)
MODELS = {"gru": (("y", "h_n"), 1, 0), "lstm": (("y", "h_n", "c_n"), 0, 1)}
STEPS = 50


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(DATA / "streaming_expected.npz", allow_pickle=False) as f:
        return dict(f)


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(DATA / f"streaming_{name}.onnx")


def _stream(session: StreamingSession, x: np.ndarray, chunk: int, axis: int) -> list:
    """Per-step outputs concatenated along time; final states from the last chunk."""
    parts = []
    for start in range(0, x.shape[axis], chunk):
        index = range(start, min(start + chunk, x.shape[axis]))
        parts.append(session.step({"x": np.take(x, index, axis=axis)}))
    return [np.concatenate([p[0] for p in parts], axis=axis), *parts[-1][1:]]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_chunks_give_the_full_call(host, name, chunk, expected):
    outputs, time_axis, _ = MODELS[name]
    x = expected[f"{name}.x"]
    full = orc.InferenceSession(_model(name)).run(None, {"x": x})
    got = _stream(StreamingSession(_model(name), host=host), x, chunk, time_axis)
    assert len(got) == len(outputs)
    for out, g, f in zip(outputs, got, full, strict=True):
        assert g.shape == f.shape, out
        np.testing.assert_allclose(g, f, rtol=0, atol=TOLERANCE, err_msg=out)
        np.testing.assert_allclose(g, expected[f"{name}.{out}"], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("name", MODELS)
def test_expose_states_declares_inputs_and_outputs(name):
    model = _model(name)
    before = model.SerializeToString()
    exposed = expose_states(model)
    assert model.SerializeToString() == before, "the caller's model was modified"
    onnx.checker.check_model(exposed, full_check=True)
    recurrent = [n for n in exposed.graph.node if n.op_type in ("GRU", "LSTM")]
    states = ("initial_h", "initial_c") if name == "lstm" else ("initial_h",)
    finals = ("Y_h", "Y_c") if name == "lstm" else ("Y_h",)
    want_inputs = ["x"] + [f"{n.name}.{s}" for n in recurrent for s in states]
    want_outputs = list(MODELS[name][0]) + [f"{n.name}.{s}" for n in recurrent for s in finals]
    assert [i.name for i in exposed.graph.input] == want_inputs
    assert [o.name for o in exposed.graph.output] == want_outputs
    session = orc.InferenceSession(exposed)
    for arg in session.get_inputs()[1:] + session.get_outputs()[len(MODELS[name][0]) :]:
        assert arg.shape == [1, "batch", 8], arg
        assert arg.type == "tensor(float)"
    # the zeros PyTorch built for h0 are gone
    zeros = {"gru": "Expand", "lstm": "ConstantOfShape"}[name]
    assert zeros in {n.op_type for n in model.graph.node}
    assert zeros not in {n.op_type for n in exposed.graph.node}


@pytest.mark.parametrize("name", MODELS)
def test_exposed_model_streams_on_onnxruntime(name, expected):
    ort = pytest.importorskip("onnxruntime")
    outputs, time_axis, batch_axis = MODELS[name]
    exposed = expose_states(_model(name))
    sess = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    x = expected[f"{name}.x"]
    states = {
        i.name: np.zeros((1, x.shape[batch_axis], 8), np.float32)
        for i in sess.get_inputs()
        if i.name != "x"
    }
    ys = []
    for start in range(0, STEPS, 7):
        chunk = np.take(x, range(start, min(start + 7, STEPS)), axis=time_axis)
        result = sess.run(None, {"x": chunk, **states})
        states = dict(zip(states, result[len(outputs) :], strict=True))
        ys.append(result[0])
    np.testing.assert_allclose(
        np.concatenate(ys, axis=time_axis), expected[f"{name}.y"], rtol=0, atol=TOLERANCE
    )


def test_states_reset_and_restore(host, expected):
    x = expected["lstm.x"]  # [seq, batch 2, 4]
    session = StreamingSession(_model("lstm"), host=host)
    assert len(session.states) == 4
    assert all(v is None for v in session.states.values())
    first = session.step({"x": x[:10]})
    saved = session.states
    assert all(v.shape == (1, 2, 8) and v.dtype == np.float32 for v in saved.values())
    second = session.step({"x": x[10:20]})
    session.reset()
    assert all(v is None for v in session.states.values())
    again = session.step({"x": x[:10]})
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    session.states = saved
    resumed = session.step({"x": x[10:20]})
    for a, b in zip(second, resumed, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [a.name for a in session.get_inputs()] == ["x"]
    assert [a.name for a in session.get_outputs()] == ["y", "h_n", "c_n"]
    # not a dict: its items were taken for names; names of mixed types failed to sort
    with pytest.raises(TypeError, match=r"states must be a dict of state name to array, got"):
        session.states = list(saved.values())
    with pytest.raises(ValueError, match=r"unknown state name\(s\) \[1\]; the states are"):
        session.states = {1: None, **saved}


def test_a_copied_stream_goes_on_alone_from_the_same_states(host, expected):
    """``copy.copy`` of a stream (it said it could not pickle): a second stream over
    the same session, from its states; a step of one leaves the other's."""
    import copy

    x = expected["lstm.x"]
    session = StreamingSession(_model("lstm"), host=host)
    session.step({"x": x[:10]})
    twin = copy.copy(session)
    second = session.step({"x": x[10:20]})
    session.step({"x": x[20:]})
    for a, b in zip(twin.step({"x": x[10:20]}), second, strict=True):
        np.testing.assert_array_equal(a, b)
    twin.reset()
    assert all(v is not None for v in session.states.values())


def test_states_are_checked_when_set_and_a_bad_one_does_not_stick(host, expected):
    # a state of another type, rank or size, or a masked one, was taken as it was and
    # failed every later step (or, masked, ran with its mask ignored); a list failed
    # although run() converts lists
    x = expected["lstm.x"]
    session = StreamingSession(_model("lstm"), host=host)
    session.step({"x": x[:10]})
    saved = session.states
    name = next(iter(saved))
    good = saved[name]
    bad = {
        "float64": (TypeError, r"state '.+': expected element type float32, got float64"),
        "rank": (ValueError, r"state '.+': expected shape \[1, 'batch', 8\], got \[2, 8\]"),
        "hidden": (ValueError, r"state '.+': expected shape \[1, 'batch', 8\], got \[1, 2, 7\]"),
        "masked": (TypeError, r"input '.+': a masked array, whose mask would be ignored"),
    }
    values = {
        "float64": good.astype(np.float64),
        "rank": good[0],
        "hidden": good[..., :7],
        "masked": np.ma.masked_array(good, mask=True),
    }
    for case, (error, match) in bad.items():
        with pytest.raises(error, match=match):
            session.states = {**saved, name: values[case]}
    assert all(np.array_equal(session.states[k], saved[k]) for k in saved)  # none was set
    want = session.step({"x": x[10:20]})
    session.states = saved
    session.states = {**saved, name: good.tolist()}  # a list, as a feed: converted
    got = session.step({"x": x[10:20]})
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_batch_size_comes_from_the_first_feed(host):
    session = StreamingSession(_model("gru"), host=host)
    session.step({"x": np.ones((3, 2, 4), np.float32)})
    assert {v.shape for v in session.states.values()} == {(1, 3, 8)}
    with pytest.raises(ValueError, match="the batch changed from 3 to 2"):
        session.step({"x": np.ones((2, 2, 4), np.float32)})
    session.reset()
    session.step({"x": np.ones((2, 2, 4), np.float32)})  # a new stream may change it


def test_bad_feeds(host):
    session = StreamingSession(_model("gru"), host=host)
    state = next(iter(session.states))
    x = np.ones((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="states are fed by the session"):
        session.step({"x": x, state: np.zeros((1, 1, 8), np.float32)})
    with pytest.raises(
        ValueError, match=r"^missing input\(s\) \['x'\]; the model's inputs are \['x'\]"
    ):
        session.step({})
    with pytest.raises(ValueError, match=r"^unknown input name\(s\) \['y'\]; the model's inputs"):
        session.step({"x": x, "y": x})
    # a plain TypeError where InferenceSession.run raised RecurrentTypeError
    with pytest.raises(orc.RecurrentTypeError, match=r"^feeds must be a dict of input name"):
        session.step([x])
    with pytest.raises(TypeError, match="float"):
        session.step({"x": x.astype(np.float64)})
    with pytest.raises(ValueError, match="unknown state"):
        session.states = {"nope": None}


def test_no_recurrent_node_is_an_error():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ValueError, match="no GRU, RNN or LSTM node"):
        expose_states(helper.make_model(graph))
    with pytest.raises(ValueError, match="no GRU, RNN or LSTM node"):
        StreamingSession(helper.make_model(graph))
    with pytest.raises(TypeError, match="ModelProto"):
        expose_states(b"not a model")


def test_a_node_in_a_loop_body_is_not_exposed():
    feeds = random_inputs("RNN", full=False)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("RNN", ["X", "W", "R"], ["Y"], hidden_size=3),
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
    loop = helper.make_node("Loop", ["n", ""], ["Ys"], body=body)
    graph = helper.make_graph(
        [loop],
        "g",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            *(
                helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
                for k, v in feeds.items()
            ),
        ],
        [helper.make_tensor_value_info("Ys", TensorProto.FLOAT, None)],
    )
    with pytest.raises(ValueError, match="only inside Loop node"):
        expose_states(helper.make_model(graph))


def _chunks(x: np.ndarray, size: int, axis: int):
    return [
        np.take(x, range(s, min(s + size, x.shape[axis])), axis=axis)
        for s in range(0, x.shape[axis], size)
    ]


@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_unnamed_outputs_and_batch_first_layout(host, op):
    """A node with only Y, no initial state and layout=1: the states get names and shapes."""
    feeds = random_inputs(op, T=12, N=2, full=False, seed=3)
    feeds["X"] = np.ascontiguousarray(feeds["X"].swapaxes(0, 1))  # [N, T, I]
    model = node_model(op, feeds, {"layout": 1, "hidden_size": 3}, outputs=("Y",))
    model.graph.node[0].name = "rec"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    exposed = expose_states(model)
    names = ["initial_h", "initial_c"] if op == "LSTM" else ["initial_h"]
    inputs = {i.name: i for i in orc.InferenceSession(exposed).get_inputs()}
    for n in names:
        assert inputs[f"rec.{n}"].shape == ["batch", 1, 3]
    assert [o.name for o in exposed.graph.output][1:] == [
        f"rec.{n}" for n in (["Y_h", "Y_c"] if op == "LSTM" else ["Y_h"])
    ]
    session = StreamingSession(model, host=host)
    ys = [session.step({**feeds, "X": c})[0] for c in _chunks(feeds["X"], 5, axis=1)]
    full = orc.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_allclose(np.concatenate(ys, axis=1), full, rtol=1e-6, atol=1e-6)


def test_initial_state_from_a_graph_input_is_kept():
    feeds = random_inputs("GRU", full=False)
    feeds["h0"] = np.zeros((1, 3, 3), np.float32)
    node = helper.make_node("GRU", ["X", "W", "R", "", "", "h0"], ["Y"], name="g")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    exposed = expose_states(helper.make_model(graph))
    assert [i.name for i in exposed.graph.input] == ["X", "W", "R", "h0"]


def _if_model():
    """``If(cond)``: a GRU in the then branch, an RNN in the else branch, x from outside."""
    rng = np.random.default_rng(7)
    W1 = rng.uniform(-0.5, 0.5, (1, 9, 4)).astype(np.float32)
    R1 = rng.uniform(-0.5, 0.5, (1, 9, 3)).astype(np.float32)
    W2 = rng.uniform(-0.5, 0.5, (1, 3, 4)).astype(np.float32)
    R2 = rng.uniform(-0.5, 0.5, (1, 3, 3)).astype(np.float32)

    def branch(op, W, R, name):
        return helper.make_graph(
            [helper.make_node(op, ["x", W, R], [f"{name}_y"], name=name, hidden_size=3)],
            name,
            [],
            [
                helper.make_tensor_value_info(
                    f"{name}_y", TensorProto.FLOAT, ["seq", 1, "batch", 3]
                )
            ],
        )

    node = helper.make_node(
        "If",
        ["cond"],
        ["y"],
        name="if",
        then_branch=branch("GRU", "W1", "R1", "gru"),
        else_branch=branch("RNN", "W2", "R2", "rnn"),
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 1, "batch", 3])],
        initializer=[
            numpy_helper.from_array(a, n)
            for a, n in ((W1, "W1"), (R1, "R1"), (W2, "W2"), (R2, "R2"))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return model, (W1, R1, W2, R2)


def test_nodes_inside_if_branches(host):
    model, (W1, R1, W2, R2) = _if_model()
    exposed = expose_states(model)
    onnx.checker.check_model(exposed, full_check=True)
    assert [i.name for i in exposed.graph.input] == ["cond", "x", "gru.initial_h", "rnn.initial_h"]
    assert [o.name for o in exposed.graph.output] == ["y", "gru.Y_h", "rnn.Y_h"]

    x = np.random.default_rng(8).standard_normal((9, 2, 4)).astype(np.float32)
    session = StreamingSession(model, host=host)
    # then, else, then: each node's state carries over the chunks of its own branch
    order = [(True, x[:3]), (False, x[3:6]), (True, x[6:])]
    got = [session.step({"cond": np.array(c), "x": chunk})[0] for c, chunk in order]
    _, h = orc.gru(x[:3], W1, R1)
    np.testing.assert_allclose(got[0], orc.gru(x[:3], W1, R1)[0], atol=1e-6)
    np.testing.assert_allclose(got[1], orc.rnn(x[3:6], W2, R2)[0], atol=1e-6)
    np.testing.assert_allclose(got[2], orc.gru(x[6:], W1, R1, initial_h=h)[0], atol=1e-6)
    states = session.states
    assert states["gru.initial_h"].shape == (1, 2, 3)
    np.testing.assert_allclose(states["rnn.initial_h"], orc.rnn(x[3:6], W2, R2)[1], atol=1e-6)


def test_a_bidirectional_model_is_warned_about():
    example = Path(orc.__file__).parent / "data" / "example_gru.onnx"
    with pytest.warns(UserWarning, match="also run backwards in time"):
        session = StreamingSession(example)
    assert len(session.states) == 2  # both layers, both directions in each state
    logits, h_n = session.step({"x": np.ones((1, 3, 16), np.float32)})
    assert logits.shape == (1, 3, 4) and h_n.shape == (4, 1, 32)
    assert {v.shape for v in session.states.values()} == {(2, 1, 32)}


@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_an_empty_chunk_or_a_row_of_length_0_keeps_its_state(host, op):
    """A chunk of no steps (seq_length 0), or a row whose sequence_lens is 0 in a chunk,
    goes on from the state it came with. The operator gives zeros there (no step ran),
    and the stream carried those on: the next chunks started over, silently."""
    feeds = random_inputs(op, T=9, N=3, full=False, seed=11)
    feeds["B"] = random_inputs(op, full=True, seed=11)["B"]
    X = feeds.pop("X")
    model = node_model(op, {"X": X, **feeds, "sequence_lens": np.zeros(3, np.int32)}, {})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    session = StreamingSession(model, host=host)
    chunks = [(0, 4, [4, 4, 4]), (4, 4, [0, 0, 0]), (4, 9, [5, 0, 3]), (9, 9, [0, 0, 0])]
    for t0, t1, lens in chunks:
        *_, final = session.step({"X": X[t0:t1], **feeds, "sequence_lens": np.int32(lens)})
    function = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}[op]
    for b, steps in enumerate([9, 4, 7]):  # each row's valid steps, one after another
        alone = function(X[:steps, b : b + 1], feeds["W"], feeds["R"], feeds["B"])
        np.testing.assert_allclose(final[:, b], alone[-1][:, 0], rtol=1e-6, atol=1e-6)


def _learned_state_model(T: int, I: int, batch, seed: int = 0):
    """A GRU (H=5, one row) whose initial_h is a constant, and its feeds; X's batch dim
    ``batch`` (1 or a name)."""
    feeds = random_inputs("GRU", T=T, N=1, I=I, H=5, D=1, seed=seed)
    feeds = {k: feeds[k] for k in ("X", "W", "R", "B", "initial_h")}
    model = node_model(
        "GRU",
        feeds,
        {"hidden_size": 5},
        constants=("W", "R", "B", "initial_h"),
        shapes={"X": ["T", batch, I]},
    )
    return feeds, model


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_a_learned_initial_state_starts_the_stream(host):
    # a constant, non-zero initial_h (a learned state) was replaced by zeros: the stream
    # differed from one call by 0.45, silently
    feeds, model = _learned_state_model(T=6, I=4, batch=1, seed=2)
    whole = orc.InferenceSession(model, host=host).run(None, {"X": feeds["X"]})
    session = StreamingSession(model, host=host)
    np.testing.assert_array_equal(session.states[session.state_info[0].input], feeds["initial_h"])
    for _ in range(2):  # and again after reset()
        steps = [session.step({"X": feeds["X"][t : t + 2]})[0] for t in range(0, 6, 2)]
        np.testing.assert_allclose(np.concatenate(steps), whole[0], atol=1e-6)
        session.reset()


def test_a_learned_state_broadcast_over_the_batch_is_warned_about():
    # Expand(learned [1, 1, H], to X's batch): not a constant the session can take
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    learned = numpy_helper.from_array(np.full((1, 1, 5), 0.5, np.float32), "learned")
    nodes = [
        helper.make_node("Shape", ["X"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["batch"], axis=0),
        helper.make_node("Concat", ["first", "batch", "hidden"], ["size"], axis=0),
        helper.make_node("Expand", ["learned", "size"], ["h0"]),
        helper.make_node("GRU", ["X", "W", "R", "", "", "h0"], ["Y"], hidden_size=5),
    ]
    consts = {"one": [1], "first": [1], "hidden": [5]}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [learned]
        + [numpy_helper.from_array(feeds[k], k) for k in ("W", "R")]
        + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.warns(UserWarning, match=r"computes the initial value of state\(s\) \['GRU_4"):
        StreamingSession(model)
    zeros = onnx.ModelProto()
    zeros.CopyFrom(model)
    no_start = numpy_helper.from_array(np.zeros((1, 1, 5), np.float32), "learned")
    zeros.graph.initializer[0].CopyFrom(no_start)

    with warnings.catch_warnings():  # zeros broadcast: what the session starts from
        warnings.simplefilter("error")
        StreamingSession(zeros)


def test_states_set_are_copied():
    # the setter kept the caller's array: changed after, it changed the stream (99 off)
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    model = node_model("GRU", feeds, {"hidden_size": 5}, constants=("W", "R", "B"))
    x = {"X": feeds["X"], "sequence_lens": feeds["sequence_lens"]}
    x = {k: v for k, v in x.items() if k in {i.name for i in StreamingSession(model).get_inputs()}}
    runs = []
    for change in (False, True):
        session = StreamingSession(model)
        name = session.state_info[0].input
        h = np.full((1, 2, 5), 0.1, np.float32)
        session.states = {name: h}
        if change:
            h[...] = 99
        runs.append(session.step(x))
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_state_set_of_another_batch_is_named_as_set():
    # was "the batch changed from 5 to 2": no batch had changed, the set state was wrong
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    feeds = {k: feeds[k] for k in ("X", "W", "R", "B")}
    model = node_model(
        "GRU", feeds, {"hidden_size": 5}, constants=("W", "R", "B"), shapes={"X": ["T", "N", 3]}
    )
    session = StreamingSession(model)
    x = {i.name: feeds[i.name] for i in session.get_inputs()}
    name = session.state_info[0].input
    session.states = {name: np.zeros((1, 5, 5), np.float32)}
    with pytest.raises(ValueError, match=rf"state '{name}' set with session.states has batch s"):
        session.step(x)
    session.states = {name: np.zeros((1, 2, 5), np.float32)}
    session.step(x)
    with pytest.raises(ValueError, match=r"the batch changed from 2 to 1"):
        session.step({"X": x["X"][:, :1]})


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_a_state_of_batch_0_is_not_taken_for_zeros(host):
    # the session's own empty state means "zeros": a caller's [1, 0, 5] for a batch of
    # 2 was taken so, silently (onnxruntime and InferenceSession refuse it)
    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, D=1)
    feeds = {k: feeds[k] for k in ("X", "W", "R", "B")}
    model = node_model(
        "GRU", feeds, {"hidden_size": 5}, constants=("W", "R", "B"), shapes={"X": ["T", "N", 3]}
    )
    session = StreamingSession(model, host=host)
    x = {i.name: feeds[i.name] for i in session.get_inputs()}
    name = session.state_info[0].input
    session.step(x)
    before = session.states
    session.states = {name: np.zeros((1, 0, 5), np.float32)}
    with pytest.raises(ValueError, match=rf"state set with session.states '{name}': expected t"):
        session.step(x)
    session.states = before
    session.step(x)
    session.reset()
    assert session.step({"X": x["X"][:, :0]})[0].shape == (4, 1, 0, 5)  # a batch of 0: fine
    session.states = {name: np.zeros((1, 0, 5), np.float32)}
    session.step({"X": x["X"][:, :0]})


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_a_learned_state_of_another_batch_says_so(host):
    # was "the batch changed from 1 to 3 ...: call reset()" at the first chunk
    feeds, model = _learned_state_model(T=4, I=3, batch="N")
    session = StreamingSession(model, host=host)
    x = np.repeat(feeds["X"], 3, axis=1)
    with pytest.raises(ValueError, match=r"the model's constant initial state '.*' has batch s"):
        session.step({"X": x})
    name = session.state_info[0].input
    session.states = {name: np.repeat(feeds["initial_h"], 3, axis=1)}
    session.step({"X": x})


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_a_node_inside_a_local_function_is_streamed(host):
    # it was not exposed: it restarted from zeros each chunk, silently (0.07 off)
    rng = np.random.default_rng(0)
    I, H = 3, 4

    def weights(name, cols):
        return numpy_helper.from_array(
            (rng.standard_normal((1, 3 * H, cols)) * 0.5).astype(np.float32), name
        )

    block = helper.make_function(
        "local",
        "Block",
        ["x", "W", "R"],
        ["y"],
        [
            helper.make_node("GRU", ["x", "W", "R"], ["Y", "Yh"], hidden_size=H),
            helper.make_node("Squeeze", ["Y", "axis"], ["y"]),
        ],
        opset_imports=[helper.make_opsetid("", 14)],
    )
    nodes = [
        helper.make_node("Block", ["x", "W1", "R1"], ["h1"], domain="local", name="block1"),
        helper.make_node("GRU", ["h1", "W2", "R2"], ["Y", "Yh"], hidden_size=H, name="top"),
    ]
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", I])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [weights("W1", I), weights("R1", H), weights("W2", H), weights("R2", H), axis],
    )
    opsets = [helper.make_opsetid("", 14), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[block])
    x = rng.standard_normal((8, 2, I)).astype(np.float32)
    whole = orc.InferenceSession(model, host=host).run(None, {"x": x})[0]
    stream = StreamingSession(model, host=host)
    assert len(stream.state_info) == 2
    got = np.concatenate([stream.step({"x": x[a:b]})[0] for a, b in ((0, 3), (3, 8))])
    np.testing.assert_allclose(got, whole, atol=1e-6)


def test_a_step_while_another_threads_step_runs_is_refused(host):
    """Steps of one stream from two threads mixed their states silently (the final
    state matched no order of the chunks); the second is refused, the first runs on."""
    import threading

    session = StreamingSession(_model("gru"), host=host)
    x = np.ones((3, 2, 4), np.float32)
    inside, release = threading.Event(), threading.Event()
    run = session._session.run

    def held(*args, **kwargs):
        inside.set()
        release.wait(30)
        return run(*args, **kwargs)

    session._session.run = held
    first: list = []
    other = threading.Thread(target=lambda: first.append(session.step({"x": x})))
    other.start()
    try:
        assert inside.wait(30)
        with pytest.raises(RuntimeError, match=r"another thread's step of this stream runs"):
            session.step({"x": x})
    finally:
        release.set()
        other.join(30)
    session._session.run = run
    alone = StreamingSession(_model("gru"), host=host)
    for got, want in zip(first[0], alone.step({"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)
    session.step({"x": x})  # free again


def test_a_node_over_constants_only_is_not_carried(host):
    """A GRU over a constant X (a context encoder) added to the streamed GRU's output:
    its state was carried too, so it ran on from its own last state (0.25 off from the
    second chunk). It gives the same on every chunk: left as it is."""
    N, I, H = 2, 4, 3
    nodes = [
        helper.make_node("GRU", ["X1", "W1", "R1"], ["", "context"], name="g0", hidden_size=H),
        helper.make_node("GRU", ["X", "W", "R"], ["Y", ""], name="g1", hidden_size=H),
        helper.make_node("Add", ["Y", "context"], ["out"]),
    ]
    model, rng = over_constants_model(nodes, "out", N, I, H)
    X = rng.standard_normal((12, N, I)).astype(np.float32)
    whole = orc.InferenceSession(model, host=host).run(None, {"X": X})[0]
    session = StreamingSession(model, host=host)
    assert [s.node for s in session.state_info] == ["g1"]
    steps = [session.step({"X": X[t : t + 4]})[0] for t in range(0, 12, 4)]
    np.testing.assert_allclose(np.concatenate(steps), whole, rtol=1e-5, atol=1e-6)
    del model.graph.node[1:]
    model.graph.output[0].name = "context"
    with pytest.raises(orc.RecurrentError, match=r"GRU node 'g0': X computed from initializers"):
        expose_states(model)
