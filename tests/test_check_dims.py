"""``onnx-recurrent check`` on models with symbolic dims: the dims the weights fix are
inferred, the others guessed, and a run that fails on a guess names the ``--dim`` to pass.

The models stand for the two real ones of issue 24: a beat tracker whose batch-first
input reaches an LSTM through a Transpose (its features must be the LSTM's
input_size) and a VAD whose states fix the batch.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_recurrent.runtime.session import InferenceSession
from onnx_recurrent.tools import cli, vad
from onnx_recurrent.tools.check import solve_dims

F, H = 26, 8  # the beat tracker's 266 features, smaller
GATES = {"GRU": 3, "LSTM": 4}
PEER = ("--peer", "onnx.reference")  # one peer is enough here, and quick


def _weights(op: str, D: int, I: int, seed: int = 0) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    G = GATES[op]
    return [
        numpy_helper.from_array((0.3 * rng.standard_normal((D, G * H, I))).astype("f4"), "W"),
        numpy_helper.from_array((0.3 * rng.standard_normal((D, G * H, H))).astype("f4"), "R"),
    ]


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def beat_tracker(op: str = "LSTM", normalize: bool = False) -> onnx.ModelProto:
    """x [batch, time, feat] (batch-first) -> (x - mean) -> Transpose -> bidirectional
    ``op`` whose W has input_size F."""
    nodes, source, extra = [], "x", []
    if normalize:
        mean = np.linspace(-1, 1, F, dtype="f4")
        extra.append(numpy_helper.from_array(mean, "mean"))
        nodes.append(helper.make_node("Sub", ["x", "mean"], ["centred"], name="sub"))
        source = "centred"
    nodes += [
        helper.make_node("Transpose", [source], ["xt"], perm=[1, 0, 2], name="tr"),
        helper.make_node(
            op, ["xt", "W", "R"], ["Y"], hidden_size=H, direction="bidirectional", name="rnn"
        ),
    ]
    return _model(nodes, [("x", ["batch", "time", "feat"])], ["Y"], _weights(op, 2, F) + extra)


def vad_fixed_state() -> onnx.ModelProto:
    """x [N, T, F] batch-first, a GRU (layout 1) whose state input h is [1, 1, H]: the
    state fixes N = 1."""
    node = helper.make_node("GRU", ["x", "W", "R", "", "", "h"], ["Y", "hn"], name="gru")
    node.attribute.extend([helper.make_attribute("hidden_size", H)])
    node.attribute.extend([helper.make_attribute("layout", 1)])
    inputs = [("x", ["N", "T", F]), ("h", [1, 1, H])]
    return _model([node], inputs, ["hn"], _weights("GRU", 1, F))


def vad_symbolic_state() -> onnx.ModelProto:
    """x [T, N, F] and h [one, batch2, H]: 'one' is num_directions (1), 'batch2' is x's N."""
    node = helper.make_node("GRU", ["x", "W", "R", "", "", "h"], ["Y", "hn"], name="gru")
    node.attribute.extend([helper.make_attribute("hidden_size", H)])
    inputs = [("x", ["T", "N", F]), ("h", ["one", "batch2", H])]
    return _model([node], inputs, ["hn"], _weights("GRU", 1, F))


def vad_stacked_state() -> onnx.ModelProto:
    """Silero's form: state [2, batch, H] -> Gather -> Unsqueeze -> the LSTM's initial_h
    and initial_c, while x's batch is named N."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="tr")]
    for k, part in enumerate(("h", "c")):
        index = numpy_helper.from_array(np.array(k, np.int64), f"i{k}")
        nodes.append(helper.make_node("Constant", [], [f"i{k}"], value=index))
        nodes.append(helper.make_node("Gather", ["state", f"i{k}"], [f"{part}2"], axis=0))
        nodes.append(helper.make_node("Unsqueeze", [f"{part}2", "axes"], [f"{part}3"]))
    nodes.append(
        helper.make_node("LSTM", ["xt", "W", "R", "", "", "h3", "c3"], ["Y", "hn"], hidden_size=H)
    )
    inputs = [("x", ["N", "T", F]), ("state", [2, "batch", H])]
    return _model(nodes, inputs, ["hn"], [*_weights("LSTM", 1, F), axes])


def flattened() -> onnx.ModelProto:
    """x [n] -> Reshape [1, 1, -1] -> GRU: no shape inference ties n to input_size; an
    input 'extra' [m] that has nothing to do with the GRU."""
    shape = numpy_helper.from_array(np.array([1, 1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["xr"], name="flat"),
        helper.make_node("GRU", ["xr", "W", "R"], ["Y"], hidden_size=H, name="gru"),
        helper.make_node("Identity", ["extra"], ["extra_out"]),
    ]
    inputs = [("x", ["n"]), ("extra", ["m"])]
    return _model(nodes, inputs, ["Y", "extra_out"], [*_weights("GRU", 1, F), shape])


def _check(capsys, tmp_path, model: onnx.ModelProto, *argv: str) -> tuple[int, str, str]:
    """``onnx-recurrent check`` on ``model`` in this process: status, stdout, stderr."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    status = cli.main(["check", str(path), *PEER, *argv])
    out, err = capsys.readouterr()
    return status, out, err


def _solve(model: onnx.ModelProto, dims=None, feeds=None):
    inputs = InferenceSession(model, host="reference").get_inputs()
    return solve_dims(model, inputs, dims or {}, feeds or {})


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("normalize", [False, True])
def test_beat_tracker_features_are_the_input_size(capsys, tmp_path, op, normalize):
    model = beat_tracker(op, normalize)
    dims = _solve(model)
    assert dims.values == {"batch": 1, "time": 8, "feat": F}
    assert dims.guessed == ["batch", "time"]
    why = (
        "broadcast against 'mean' in Sub node 'sub'"
        if normalize
        else f"input_size of {op} node 'rnn' (W's axis 2)"
    )
    assert dims.inferred == {"feat": why}
    status, out, err = _check(capsys, tmp_path, model)
    assert status == 0, err
    assert f"input x: [1, 8, {F}] float32, random (seed 0)" in out
    assert f"dim feat={F}: {why}" in out
    assert "dims guessed: batch=1, time=8 (--dim NAME=VALUE sets them)" in out


def test_vad_state_of_fixed_shape_fixes_the_batch(capsys, tmp_path):
    model = vad_fixed_state()
    dims = _solve(model)
    assert dims.values == {"N": 1, "T": 8}
    assert dims.inferred == {"N": "batch_size of GRU node 'gru' (initial_h's axis 0)"}
    status, out, err = _check(capsys, tmp_path, model)
    assert status == 0, err
    assert f"input x: [1, 8, {F}] float32" in out and f"input h: [1, 1, {H}] float32" in out


def test_vad_symbolic_state_takes_num_directions_and_the_batch(capsys, tmp_path):
    model = vad_symbolic_state()
    dims = _solve(model)
    assert dims.values == {"T": 8, "N": 1, "one": 1, "batch2": 1}
    assert dims.inferred == {"one": "num_directions of GRU node 'gru' (W's axis 0)"}
    assert dims.guessed == ["T", "N", "batch2"]  # N and batch2: one guess, a batch's
    status, out, err = _check(capsys, tmp_path, model)
    assert status == 0, err
    assert f"input h: [1, 1, {H}] float32" in out


def test_vad_state_sliced_per_layer_shares_the_batch(capsys, tmp_path):
    model = vad_stacked_state()
    assert _solve(model).values == {"N": 1, "T": 8, "batch": 1}
    status, out, err = _check(capsys, tmp_path, model)
    assert status == 0, err
    assert f"input x: [1, 8, {F}] float32" in out and f"input state: [2, 1, {H}]" in out


def test_a_given_input_sizes_the_dims_it_shares(capsys, tmp_path):
    """x given (-i) as [T=5, N=3, F]: the drawn h takes N=3 from it."""
    model = vad_symbolic_state()
    x = np.zeros((5, 3, F), np.float32)
    assert _solve(model, feeds={"x": x}).values == {"one": 1, "batch2": 3}
    np.save(tmp_path / "x.npy", x)
    status, out, err = _check(capsys, tmp_path, model, "-i", f"x={tmp_path / 'x.npy'}")
    assert status == 0, err
    assert f"input h: [1, 3, {H}] float32, random" in out


def test_a_dim_the_model_does_not_fix_is_named_when_the_run_fails(capsys, tmp_path):
    model = flattened()
    dims = _solve(model)
    assert dims.values == {"n": 8, "m": 8} and dims.guessed == ["n", "m"]
    status, _, err = _check(capsys, tmp_path, model)
    assert status == 2
    (line,) = err.splitlines()
    assert line.startswith(
        "onnx-recurrent check: error: the run failed on random inputs whose dims were guessed: "
        "pass --dim n=VALUE (input 'x' axis 0, drawn as 8); the error: "
        f"GRU node 'gru': X must have input_size={F}"
    ), line
    assert "--dim m=" not in line  # 'extra' does not reach the GRU
    status, _, err = _check(capsys, tmp_path, model, "--dim", f"n={F}")
    assert status == 0, err


def test_a_dim_tied_to_two_sizes_is_named_with_both(capsys, tmp_path):
    """'feat' is the GRU's input_size (F) and broadcasts against a [5] constant."""
    five = numpy_helper.from_array(np.ones(5, "f4"), "five")
    nodes = [
        helper.make_node("GRU", ["x", "W", "R"], ["Y"], hidden_size=H, name="gru"),
        helper.make_node("Add", ["bias", "five"], ["z"], name="add"),
    ]
    inputs = [("x", ["T", "N", "feat"]), ("bias", ["feat"])]
    model = _model(nodes, inputs, ["Y", "z"], [*_weights("GRU", 1, F), five])
    dims = _solve(model)
    assert dims.guessed == ["T", "N", "feat"]
    assert set(dims.conflicts["feat"]) == {F, 5}
    status, _, err = _check(capsys, tmp_path, model)
    assert status == 2
    assert (
        f"--dim feat=VALUE (input 'x' axis 2, input 'bias' axis 0, drawn as 8; the model "
        f"ties it to {F}: input_size of GRU node 'gru' (W's axis 2); "
        "5: broadcast against 'five' in Add node 'add')"
    ) in err


@pytest.mark.parametrize(
    "make, dims",
    [
        (beat_tracker, ["batch=2", "time=5", f"feat={F}"]),
        (vad_fixed_state, ["N=1", "T=3"]),
        (vad_symbolic_state, ["one=1", "N=2", "batch2=2", "T=4"]),
        (vad_stacked_state, ["N=2", "batch=2", "T=4"]),
    ],
)
def test_given_dims_check_clean(capsys, tmp_path, make, dims):
    argv = [a for d in dims for a in ("--dim", d)]
    status, out, err = _check(capsys, tmp_path, make(), *argv)
    assert status == 0, err
    assert not [line for line in out.splitlines() if line.startswith(("dim ", "dims "))]


def test_unnamed_dims_are_named_input_axis(capsys, tmp_path):
    """A dim with neither a size nor a name: --dim x:1=5 sizes it; the error for an
    unknown name lists it; an inferred one is printed under that name."""
    model = beat_tracker()
    for d in model.graph.input[0].type.tensor_type.shape.dim:
        d.Clear()
    assert _solve(model).values == {"x:0": 8, "x:1": 8, "x:2": F}
    status, out, err = _check(capsys, tmp_path, model, "--dim", "x:0=2", "--dim", "x:1=5")
    assert status == 0, err
    assert f"input x: [2, 5, {F}] float32" in out and f"dim x:2={F}: input_size" in out
    status, _, err = _check(capsys, tmp_path, model, "--dim", "time=5")
    assert status == 2
    assert "the model has no dim 'time' (none named; unnamed, as INPUT:AXIS: x:0, x:1, x:2)" in err


def test_fixed_dims_need_no_inference(capsys, tmp_path):
    """A model without free dims: nothing to solve, nothing printed about dims."""
    model = beat_tracker()
    for d, size in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 4, F), strict=True):
        d.dim_value = size
    dims = _solve(model)
    assert dims.values == {} and dims.lines() == []


def _silero_op15():
    try:
        path = vad.silero_model_path().with_name("silero_vad_16k_op15.onnx")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"needs the Silero VAD model: {e}")
    if not path.exists():
        pytest.skip(f"no {path.name} in the silero-vad package")
    return path


def test_silero_vad_names_its_sequence_dim(capsys, tmp_path):
    """Silero's STFT pads by 64 samples (reflect): 8 samples are too few, and no weight
    tells the chunk size: the message names --dim sequence; with it, check is clean."""
    path = _silero_op15()
    np.save(tmp_path / "sr.npy", np.array(16000, np.int64))
    argv = ["check", str(path), *PEER, "-i", f"sr={tmp_path / 'sr.npy'}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "pass --dim batch=VALUE (input 'input' axis 0, input 'state' axis 1, drawn as 1)" in err
    assert " or --dim sequence=VALUE (input 'input' axis 1, drawn as 8); the error:" in err
    assert cli.main([*argv, "--dim", "sequence=512"]) == 0
    assert "input state: [2, 1, 128] float32" in capsys.readouterr().out
