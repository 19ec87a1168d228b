"""InferenceSession under each host: onnxruntime's shape, checked feeds, concurrent runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime
import pytest

import onnx_recurrent as orc

from models import node_model, random_inputs


@pytest.fixture(scope="module")
def model_and_feeds():
    feeds = random_inputs("LSTM", T=30, N=4, I=8, H=16, D=2)
    model = node_model("LSTM", feeds, {"direction": "bidirectional", "clip": 2.0})
    return model, feeds


def test_model_from_path_bytes_and_proto(host, tmp_path, model_and_feeds):
    model, feeds = model_and_feeds
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    results = [
        orc.InferenceSession(m, host=host).run(None, feeds)
        for m in (model, model.SerializeToString(), str(path), path)
    ]
    for r in results[1:]:
        for a, b in zip(results[0], r, strict=True):
            np.testing.assert_array_equal(a, b)


def test_inputs_and_outputs_describe_the_graph(host, model_and_feeds):
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    inputs = session.get_inputs()
    assert [i.name for i in inputs] == list(feeds)
    assert inputs[0].shape == [30, 4, 8] and inputs[0].type == "tensor(float)"
    assert inputs[4].type == "tensor(int32)"
    assert [o.name for o in session.get_outputs()] == ["Y", "Y_h", "Y_c"]


def test_output_names_select_and_order(host, model_and_feeds):
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    _Y, Y_h, Y_c = session.run(None, feeds)
    Y_c2, Y_h2 = session.run(["Y_c", "Y_h"], feeds)
    np.testing.assert_array_equal(Y_c, Y_c2)
    np.testing.assert_array_equal(Y_h, Y_h2)


def test_concurrent_runs_equal_serial_runs(host, model_and_feeds):
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    rng = np.random.default_rng(7)
    variants = [
        {**feeds, "X": rng.standard_normal(feeds["X"].shape).astype(np.float32)} for _ in range(12)
    ]
    serial = [session.run(None, f) for f in variants]
    with ThreadPoolExecutor(max_workers=6) as pool:
        parallel = list(pool.map(lambda f: session.run(None, f), variants * 2))
    for i, result in enumerate(parallel):
        for a, b in zip(serial[i % len(variants)], result, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda f: f.pop("X"), ValueError, r"missing input\(s\) \['X'\]"),
        (lambda f: f.update(x=f["X"]), ValueError, r"unknown input name\(s\) \['x'\]"),
        (lambda f: f.update(x=f.pop("X")), ValueError, r"unknown input name\(s\) \['x'\]"),
        (
            lambda f: f.update(X=f["X"].astype(np.float64)),
            TypeError,
            r"'X': expected element type tensor\(float\)",
        ),
        (lambda f: f.update(X=f["X"][0]), ValueError, r"'X': expected rank 3"),
        (lambda f: f.update(X=f["X"][:, :2]), ValueError, r"'X': expected shape \[30, 4, 8\]"),
        (
            lambda f: f.update(sequence_lens=f["sequence_lens"] + 40),
            ValueError,
            r"LSTM node .*sequence_lens must lie in \[0, seq_length=30\]",
        ),
    ],
)
def test_bad_feeds(host, model_and_feeds, change, error, match):
    model, feeds = model_and_feeds
    feeds = dict(feeds)
    change(feeds)
    with pytest.raises(error, match=match):
        orc.InferenceSession(model, host=host).run(None, feeds)


def test_onnxruntime_checks_array_feeds_and_ours_word_its_refusal(model_and_feeds):
    # under the onnxruntime host, arrays fed under the model's input names go straight
    # to onnxruntime (it checks them); the session's checks run where it refuses them
    pytest.importorskip("onnxruntime")
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host="onnxruntime")
    calls = []
    original = session._check_feeds
    session._check_feeds = lambda f: calls.append(1) or original(f)
    session.run(None, feeds)
    assert calls == []
    with pytest.raises(TypeError, match=r"'X': expected element type tensor\(float\)"):
        session.run(None, {**feeds, "X": feeds["X"].astype(np.float64)})
    assert calls == [1]
    with pytest.raises(TypeError, match=r"'X': expected element type"):
        session.run(None, {**feeds, "X": [["not a number"]]})  # not an array: ours first
    assert calls == [1, 1]


def test_an_empty_output_list_is_every_output(host, model_and_feeds):
    # as onnxruntime's run: the host's direct call to onnxruntime's C++ session refused
    # it ("At least one output should be requested")
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    for a, b in zip(session.run([], feeds), session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_lists_are_fed_as_onnxruntime_takes_them(host, model_and_feeds):
    """A nested list of numbers for a tensor, cast to its element type within their kind
    (integers to floats: onnxruntime does so; a float to an integer is refused, where
    onnxruntime truncates it); a ragged one, or None for a tensor, is a clear error."""
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    expected = session.run(None, feeds)
    as_lists = {
        **feeds,
        "X": feeds["X"].tolist(),
        "sequence_lens": feeds["sequence_lens"].tolist(),
    }
    for a, b in zip(session.run(None, as_lists), expected, strict=True):
        np.testing.assert_array_equal(a, b)
    whole = {**feeds, "X": np.round(feeds["X"])}
    rounded = {**feeds, "X": np.round(feeds["X"]).astype(int).tolist()}
    for a, b in zip(session.run(None, rounded), session.run(None, whole), strict=True):
        np.testing.assert_array_equal(a, b)
    lens = {**feeds, "sequence_lens": [float(n) + 0.5 for n in feeds["sequence_lens"]]}
    with pytest.raises(TypeError, match=r"'sequence_lens': expected element type tensor\(int32\)"):
        session.run(None, lens)
    with pytest.raises(ValueError, match=r"input 'X': not a tensor: "):
        session.run(None, {**feeds, "X": [[[1.0]], [[1.0, 2.0]]]})
    with pytest.raises(TypeError, match=r"input 'X': a tensor is required, got None"):
        session.run(None, {**feeds, "X": None})
    # integers beyond int32: refused (NumPy's cast wrapped 2**40 to 0, a row run empty)
    for beyond in (2**40, 2**32 + 3, -(2**31) - 1):
        lens = {**feeds, "sequence_lens": [*feeds["sequence_lens"].tolist()[:-1], beyond]}
        with pytest.raises(ValueError, match=rf"'sequence_lens': {beyond} is outside int32"):
            session.run(None, lens)


def test_arrays_in_the_other_byte_order_are_read_by_value(host, model_and_feeds):
    # onnxruntime 1.32 alone reads a big-endian array's bytes as little-endian ones: a
    # silent wrong answer, which the onnxruntime host gave too
    model, feeds = model_and_feeds
    session = orc.InferenceSession(model, host=host)
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in feeds.items()}
    copies = {k: v.copy() for k, v in swapped.items()}
    for a, b in zip(session.run(None, swapped), session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(a, b)
    for k, v in swapped.items():
        assert v.dtype == copies[k].dtype and np.array_equal(v, copies[k])


@pytest.mark.parametrize(
    ("op", "flag"), [("GRU", "linear_before_reset"), ("LSTM", "input_forget")]
)
def test_flags_other_than_0_or_1_are_true_as_onnxruntime_has_them(host, op, flag):
    """``linear_before_reset != 0`` (SEMANTICS.md): onnxruntime runs 2 and -1 as 1; they
    were refused (a model onnxruntime runs)."""
    feeds = random_inputs(op, full=False)
    size = {"hidden_size": feeds["R"].shape[-1]}  # onnxruntime asks for it
    model = node_model(op, feeds, {flag: 1} | size)
    one = orc.InferenceSession(model, host=host).run(None, feeds)
    for value in (2, -1):
        model = node_model(op, feeds, {flag: value} | size)
        got = orc.InferenceSession(model, host=host).run(None, feeds)
        expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
        for a, b, c in zip(got, one, expected, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("activations", "extra"),
    [(["Relu", "Tanh"], {}), (["HardSigmoid", "Affine"], {"activation_alpha": [0.4, 2.0]})],
)
def test_a_one_direction_rnn_of_two_activations_runs_as_onnxruntime_runs_it(
    host, activations, extra
):
    """The schema's default lists two for RNN; onnxruntime takes the first (refused)."""
    feeds = random_inputs("RNN", full=False)
    size = {"hidden_size": feeds["R"].shape[-1]}
    model = node_model("RNN", feeds, {"activations": activations} | extra | size)
    got = orc.InferenceSession(model, host=host).run(None, feeds)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for a, c in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


def test_unknown_output_and_bad_model(host):
    model = node_model("RNN", random_inputs("RNN", full=False), {})
    with pytest.raises(ValueError, match=r"unknown output name\(s\) \['Z'\]"):
        orc.InferenceSession(model, host=host).run(["Z"], random_inputs("RNN", full=False))
    with pytest.raises(FileNotFoundError, match="no such file"):
        orc.InferenceSession("/nonexistent/model.onnx", host=host)
    with pytest.raises(TypeError, match=r"model must be a path, bytes or onnx\.ModelProto"):
        orc.InferenceSession(42, host=host)


@pytest.mark.parametrize(
    ("attributes", "match"),
    [
        (
            {"clip": "3"},
            r"attribute 'clip' must be of type FLOAT \(the GRU-22 schema\), got STRING",
        ),
        ({"clip": 3}, r"attribute 'clip' must be of type FLOAT \(the GRU-22 schema\), got INT"),
        ({"hidden_size": 3.0}, r"attribute 'hidden_size' must be of type INT .*got FLOAT"),
        ({"linear_before_reset": 0.5}, r"attribute 'linear_before_reset' must be of type INT"),
        ({"direction": 1}, r"attribute 'direction' must be of type STRING .*got INT"),
        ({"activations": "Sigmoid"}, r"attribute 'activations' must be of type STRINGS"),
    ],
)
def test_node_attributes_of_the_schema_types(host, attributes, match):
    """A node's attributes must have their schema's types, as the onnx checker has them."""
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, attributes)
    with pytest.raises(ValueError, match=r"GRU node '': " + match):
        orc.InferenceSession(model, host=host).run(None, feeds)


@pytest.mark.parametrize("opset", [99, onnx.defs.onnx_opset_version() + 1])
def test_an_opset_newer_than_known_is_an_error(host, opset):
    feeds = random_inputs("LSTM", full=False)
    model = node_model("LSTM", feeds, {}, opset=opset)
    with pytest.raises(
        ValueError,
        match=rf"imports opset {opset}, newer than any the installed onnx .* knows .*"
        r"onnx-recurrent implements \(LSTM 1, 7, 14, 22\)",
    ):
        orc.InferenceSession(model, host=host)
    # the newest opset onnx knows still selects LSTM-22
    latest = onnx.defs.onnx_opset_version()
    session = orc.InferenceSession(node_model("LSTM", feeds, {}, opset=latest), host=host)
    assert len(session.run(None, feeds)) == 3


def test_a_timers_exception_while_the_model_is_read_is_not_blamed_on_the_model(monkeypatch):
    # a timer's handler raising TimeoutError as the model was parsed or a tensor read
    # came out as "model given as bytes is not an ONNX model (timer)" or "tensor 'R'
    # ... cannot be read: timer" (probe S: 15 of 600 timed sessions): the timeout
    # itself now
    from onnx import numpy_helper

    feeds = random_inputs("GRU", T=2, N=1, I=3, H=4)
    model = node_model("GRU", feeds, {"hidden_size": 4}, constants=("W", "R"))

    def timer(*args, **kwargs):
        raise TimeoutError("timer")

    with monkeypatch.context() as m:
        m.setattr(onnx, "load_from_string", timer)
        with pytest.raises(TimeoutError, match=r"^timer$"):
            orc.InferenceSession(model.SerializeToString(), host="reference")
    with monkeypatch.context() as m:
        m.setattr(numpy_helper, "to_array", timer)
        with pytest.raises(TimeoutError, match=r"^timer$"):
            orc.InferenceSession(model, host="reference")
