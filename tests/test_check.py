"""``onnx-recurrent check``: lint, the comparison table, --trace and the exit status."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_recurrent as orc
from onnx_recurrent import cells
from onnx_recurrent.runtime.graph import walk
from onnx_recurrent.spec import make_spec
from onnx_recurrent.tools import cli
from onnx_recurrent.tools.check import cell_step, check, installed_peers, lint, probes
from onnx_recurrent.tools.check.peers import PEERS

from models import node_model, random_inputs

DATA = Path(__file__).parent / "data"


def _main(*argv: str) -> int:
    """``onnx-recurrent check ARGV...`` in this process; its exit status."""
    return cli.main(["check", *argv])


def _save(tmp_path, model, feeds=None) -> list[str]:
    """Save the model (and feeds as .npy); the argv that names them."""
    onnx.save(model, tmp_path / "m.onnx")
    argv = [str(tmp_path / "m.onnx")]
    for name, value in (feeds or {}).items():
        np.save(tmp_path / f"{name}.npy", value)
        argv += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    return argv


def _row(out: str, output: str, peer: str) -> str:
    rows = [
        line
        for line in out.splitlines()
        if line.split()[:2] == [output, peer] and ("ok" in line or "DIFF" in line)
    ]
    assert len(rows) == 1, out
    return rows[0]


def _clip_rnn(onset: int = 3):
    """An RNN with clip=1 whose gate input exceeds the clip from step ``onset`` on."""
    feeds = random_inputs("RNN", T=6, N=2, full=False, seed=5)
    feeds["R"] *= 0.2  # |R h| <= 0.3
    feeds["X"][:onset] *= 0.1  # |W x| <= 0.2
    feeds["X"][onset:] *= 4
    return node_model("RNN", feeds, {"hidden_size": 3, "clip": 1.0}), feeds


def test_rnn_clip_onnx_reference_is_wrong(tmp_path, capsys):
    model, feeds = _clip_rnn()
    assert _main(*_save(tmp_path, model, feeds)) == 1
    out = capsys.readouterr().out
    assert "RNN-22 'RNN_0': onnx.reference: ignores clip=1" in out
    row = _row(out, "Y", "onnx.reference")
    assert row.endswith("DIFFERS") and float(row.split()[2]) > 0.1
    if "onnxruntime" in installed_peers():
        assert _row(out, "Y", "onnxruntime").endswith("ok")
    assert "result: onnx.reference beyond the tolerance" in out


def test_rnn_sequence_lens_onnx_reference_as_probed(tmp_path, capsys):
    """onnx.reference's sequence_lens is being fixed upstream: its probe decides whether
    the lint names it, and the comparison and the trace agree with the probe."""
    feeds = random_inputs("RNN", T=6, N=3, seed=2)
    feeds["sequence_lens"] = np.array([6, 2, 4], np.int32)
    del feeds["initial_h"]
    model = node_model("RNN", feeds, {"hidden_size": 3})
    argv = _save(tmp_path, model, {"sequence_lens": feeds["sequence_lens"]})
    probed = probes.probe("onnx.reference", probes.Form("RNN"), probes.SEQUENCE_LENS)
    assert _main(*argv, "--trace", "--peer", "onnx.reference") == int(probed.wrong)
    out = capsys.readouterr().out
    named = "onnx.reference: ignores sequence_lens (runs every sequence to the end) (probed: "
    assert (named in out) == probed.wrong
    row = _row(out, "Y", "onnx.reference")
    assert row.endswith("DIFFERS" if probed.wrong else "ok")
    if probed.wrong:
        assert "Y first differs at step t=2 (direction 0 forward, batch 1)" in out
        assert "t=2 is past sequence_lens[1]=2" in out


def test_clean_float32_gru_agrees_with_onnxruntime(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    feeds = random_inputs("GRU", T=7, N=2, D=2, seed=1)
    del feeds["sequence_lens"]
    attrs = {"direction": "bidirectional", "linear_before_reset": 1, "hidden_size": 3}
    model = node_model("GRU", feeds, attrs)
    assert _main(*_save(tmp_path, model), "--peer", "onnxruntime") == 0
    out = capsys.readouterr().out
    assert "lint: nothing known to go wrong" in out
    for output in ("Y", "Y_h"):
        assert _row(out, output, "onnxruntime").endswith("ok")
    assert "result: every peer that ran agrees" in out


def test_pytorch_exported_models_agree_with_every_peer(capsys):
    for name in ("gru", "lstm"):
        assert _main(str(DATA / f"streaming_{name}.onnx"), "--dim", "seq=20") == 0
        out = capsys.readouterr().out
        assert "input x: [20, 1, 4] float32" in out or "input x: [1, 20, 4] float32" in out
        assert "warning" not in out


@pytest.mark.parametrize(
    ("producer", "lbr", "warned"),
    [("pytorch", 0, True), ("pytorch", 1, False), ("tf2onnx", 0, False)],
)
def test_pytorch_gru_with_linear_before_reset_0_is_warned(tmp_path, capsys, producer, lbr, warned):
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, {"linear_before_reset": lbr, "hidden_size": 3})
    model.producer_name = producer
    findings = [str(f) for f in lint(model)]
    assert any("warning: linear_before_reset=0" in f for f in findings) == warned
    assert _main(*_save(tmp_path, model), "--peer", "onnx.reference") == 0
    out = capsys.readouterr().out
    assert ("a known exporter mistake" in out) == warned


def test_trace_names_the_step_and_the_gate(tmp_path, capsys):
    model, feeds = _clip_rnn(onset=3)
    argv = _save(tmp_path, model, feeds)
    assert _main(*argv, "--trace", "--peer", "onnx.reference") == 1
    out = capsys.readouterr().out
    trace = out.split("\ntrace:\n")[1]
    assert "RNN 'RNN_0' vs onnx.reference: Y first differs at step t=3 (direction 0" in trace
    assert "gate differing most: i" in trace
    assert "with gate i computed without clip" in trace


def test_trace_gru_activations_and_lstm_clip(tmp_path, capsys):
    feeds = random_inputs("GRU", T=5, N=2, full=False, seed=1)
    attrs = {"hidden_size": 3, "activations": ["HardSigmoid", "Softsign"]}
    argv = _save(tmp_path, node_model("GRU", feeds, attrs))
    assert _main(*argv, "--trace", "--peer", "onnx.reference") == 1
    out = capsys.readouterr().out
    assert "onnx.reference: ignores activations ['HardSigmoid', 'Softsign']" in out
    assert "Y first differs at step t=0" in out
    assert "every gate computed with the default activations ['Sigmoid', 'Tanh']" in out

    feeds = random_inputs("LSTM", T=5, N=2, full=False, seed=1)
    argv = _save(tmp_path, node_model("LSTM", feeds, {"hidden_size": 3, "clip": 0.5}))
    assert _main(*argv, "--trace", "--peer", "onnx.reference") == 1
    out = capsys.readouterr().out
    assert "every gate computed without clip" in out
    assert "gate differing most: " in out


def test_onnxruntime_affine_default_is_linted_and_traced(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    feeds = random_inputs("RNN", T=4, N=2, full=False, seed=3)
    attrs = {"hidden_size": 3, "activations": ["Affine"], "activation_beta": [0.25]}
    argv = _save(tmp_path, node_model("RNN", feeds, attrs))
    assert _main(*argv, "--trace", "--peer", "onnxruntime") == 1
    out = capsys.readouterr().out
    assert "onnxruntime: uses 0 for Affine's alpha when not given (the ONNX default is 1)" in out
    assert "with gate i computed with 0 for the unset alpha/beta" in out


def test_an_int_input_must_be_given(tmp_path, capsys):
    feeds = random_inputs("GRU", T=4, N=2, seed=0)
    del feeds["initial_h"]
    argv = _save(tmp_path, node_model("GRU", feeds, {"hidden_size": 3}))
    assert _main(*argv) == 2
    err = capsys.readouterr().err
    assert "'sequence_lens' is tensor(int32)" in err
    assert "-i sequence_lens=FILE.npy" in err
    np.save(tmp_path / "lens.npy", feeds["sequence_lens"])
    # given, the model runs; onnxruntime honours sequence_lens: it agrees with ours
    lens = f"sequence_lens={tmp_path / 'lens.npy'}"
    assert _main(*argv, "-i", lens, "--peer", "onnxruntime") == 0
    out = capsys.readouterr().out
    assert "input sequence_lens: [2] int32, given" in out
    if "onnxruntime" in installed_peers():
        assert _row(out, "Y", "onnxruntime").endswith("ok")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/nonexistent.onnx"], "no such file"),
        (["{model}", "-i", "X"], "-i expects NAME=VALUE"),
        (["{model}", "-i", "X=/nonexistent.npy"], "cannot read"),
        (["{model}", "-i", "nope={npy}"], "the model has no input 'nope'"),
        (["{model}", "--dim", "seq=x"], "--dim seq=x: the model has no dim 'seq' (none"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    feeds = random_inputs("RNN", full=False)
    onnx.save(node_model("RNN", feeds, {}), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", feeds["X"])
    argv = [a.format(model=tmp_path / "m.onnx", npy=tmp_path / "x.npy") for a in argv]
    assert _main(*argv) == 2
    assert message in capsys.readouterr().err


def test_a_peer_that_cannot_run_the_model_is_reported(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    feeds = random_inputs("LSTM", full=False)
    feeds["X"] = np.ascontiguousarray(feeds["X"].swapaxes(0, 1))
    argv = _save(tmp_path, node_model("LSTM", feeds, {"layout": 1, "hidden_size": 3}))
    # the only peer did not run: nothing verified, so not status 0 (it was, with "every
    # peer that ran agrees")
    assert _main(*argv, "--peer", "onnxruntime") == 3
    out = capsys.readouterr().out
    assert "result: nothing compared: no peer ran the model" in out
    assert "every peer that ran agrees" not in out
    refused = probes.probe("onnxruntime", probes.Form("LSTM"), probes.LAYOUT)
    assert refused.refused is not None  # what the lint says comes from its probe
    assert f"onnxruntime: does not support layout=1 (refused: {refused.refused})" in out
    assert "(all)   onnxruntime  error: " in out and "layout == 1" in out
    assert "(onnxruntime could not run it)" in out


def test_outputs_that_are_not_number_tensors_are_compared():
    """Strings, sequences and maps (a classifier's ZipMap) were cast to float64: a
    TypeError for a map, strings of numbers read as numbers. Now a sequence's or map's
    numbers are compared within the tolerance, its structure and text exactly."""
    from onnx_recurrent.tools.check.trace import compare

    x = np.array([1.0, 2.0], np.float32)
    text = np.array(["1.5", "b"], dtype=object)
    assert compare("s", "p", text, np.array(["1.5", "b"]), 0, 0).max_abs == 0.0
    differs = compare("s", "p", text, np.array(["1.50", "b"], dtype=object), 0, 0)
    assert differs.exceeds and differs.error == "not the same structure or text"
    near = compare("q", "p", [x, x], [x, x + 1e-7], 1e-6, 0)
    assert not near.exceeds and 0 < near.max_abs < 1e-6
    assert compare("q", "p", [x, x], [x], 1e-6, 0).exceeds
    maps = [{0: 0.25, 1: 0.75}]
    assert compare("z", "p", maps, [{0: 0.25, 1: 0.75 + 1e-9}], 1e-6, 0).exceeds is False
    assert compare("z", "p", maps, [{0: 0.25, 2: 0.75}], 1e-6, 0).exceeds
    far = compare("z", "p", maps, [{0: 0.25, 1: 0.5}], 1e-6, 0)
    assert far.exceeds and far.max_abs == pytest.approx(0.25)
    assert compare("y", "p", x, x[:1], 0, 0).error == "shape [1], ours [2]"


def test_a_model_with_map_and_string_outputs_is_checked(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    nodes = [
        helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING),
        helper.make_node("ZipMap", ["x"], ["z"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]),
    ]
    maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, []))
    )
    outputs = [helper.make_tensor_value_info("s", TensorProto.STRING, [1, 2])]
    outputs.append(helper.make_value_info("z", maps))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph(nodes, "g", [x], outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    argv = _save(tmp_path, helper.make_model(graph, opset_imports=opsets))
    assert _main(*argv, "--peer", "onnxruntime") == 0
    out = capsys.readouterr().out
    assert "  s       onnxruntime  " in out and "  z       onnxruntime  " in out
    assert "every peer that ran agrees within the tolerance" in out


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_onnxruntime_is_not_run_where_it_would_end_the_process(tmp_path, op):
    """onnxruntime 1.32 ends its process (SIGABRT) on a GRU or LSTM node given a batch
    of 0: check ran it in its own process, and died. A subprocess here, so that the old
    behaviour fails the test instead of ending pytest."""
    pytest.importorskip("onnxruntime")
    feeds = random_inputs(op, full=False)
    feeds["X"] = feeds["X"][:, :0]
    done = _check_child(_save(tmp_path, node_model(op, feeds, {}), feeds), "onnxruntime")
    assert "error: RuntimeError: not run: the input 'X' is empty" in done.stdout
    assert "(onnxruntime could not run it)" in done.stdout


def test_openvino_is_not_run_on_string_tensors(tmp_path):
    """OpenVINO 2026.4 frees a string output wrongly ("free(): invalid pointer",
    SIGABRT): check died with it, with no result. A subprocess, as above."""
    pytest.importorskip("openvino")
    nodes = [helper.make_node("Identity", ["s"], ["o"])]
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    o = helper.make_tensor_value_info("o", TensorProto.STRING, [2])
    model = helper.make_model(helper.make_graph(nodes, "g", [s], [o]))
    done = _check_child(_save(tmp_path, model, {"s": np.array(["a", "b"])}), "openvino")
    assert "error: RuntimeError: not run: the model has string tensors" in done.stdout


def _check_child(argv: list[str], peer: str):
    """``onnx-recurrent check ARGV --peer PEER`` in a child process, which compared
    nothing (status 3): its result."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "onnx_recurrent", "check", *argv, "--peer", peer],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, (done.returncode, done.stderr)  # nothing compared
    return done


def test_a_warning_is_said_once(tmp_path, capsys):
    # check makes a session for the model twice: the host's fall back was said twice
    import ml_dtypes

    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, dtype=ml_dtypes.bfloat16)
    feeds = {k: feeds[k] for k in ("X", "W", "R", "B")}
    argv = _save(tmp_path, node_model("GRU", feeds, {}, constants=("W", "R", "B")))
    _main(*argv, "--peer", "onnx.reference")
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "warning: the reference host runs" in line]
    assert len(said) == 1, err


def test_bfloat16_outputs_are_compared_as_numbers():
    """ml_dtypes' bfloat16 is NumPy kind 'V': its outputs were compared as text, so
    any difference (bfloat16 rounding: 0.017) was "not the same structure or text",
    whatever --atol and --rtol."""
    import ml_dtypes

    from onnx_recurrent.tools.check.trace import compare

    ours = np.array([0.5, 1.25], ml_dtypes.bfloat16)
    theirs = np.array([0.5, 1.3125], ml_dtypes.bfloat16)  # 8 of its steps off
    near = compare("Y", "p", ours, theirs, 0.1, 0)
    assert not near.exceeds and near.error is None and near.max_abs == pytest.approx(0.0625)
    assert compare("Y", "p", ours, theirs, 0.001, 0).exceeds


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_output_differs_beyond_two_of_its_epsilons_at_least(dtype):
    """A bfloat16 GRU rounded once from float32 against onnx.reference's, computed in
    bfloat16 step by step, is one or two steps off: DIFFERS at the default tolerance
    (atol 1e-4), status 1, for a model computed right."""
    import ml_dtypes

    from onnx_recurrent.tools.check.trace import compare

    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    eps = float(ml_dtypes.finfo(dt).eps)
    ours = np.array([0.0, 0.25, 1.0], dt)
    two = np.array([2 * eps * 0.5, 0.25, 1.0 + 2 * eps], dt)
    assert compare("Y", "p", ours, two, 1e-4, 1e-3).widened
    assert not compare("Y", "p", ours, two, 1e-4, 1e-3).exceeds
    five = np.array([0.0, 0.25, 1.0 + 5 * eps], dt)
    assert compare("Y", "p", ours, five, 1e-4, 1e-3).exceeds
    wide = ours.astype(np.float32), two.astype(np.float32)  # float32: as given
    assert compare("Y", "p", *wide, 1e-4, 1e-3).exceeds


def test_a_float_output_through_a_16_bit_recurrent_node_is_judged_at_its_epsilons():
    """A float16 GRU between two Casts (float32 graph inputs and outputs): its outputs
    hold float16 roundings, and every peer was DIFFERS at float32's tolerance (exit
    1), while the trace found no recurrent node differing."""
    from onnx import TensorProto, helper, numpy_helper

    from onnx_recurrent.tools.check import check
    from onnx_recurrent.tools.check.trace import low_precision_upstream

    feeds = random_inputs("GRU", T=30, N=2, I=5, H=7, dtype=np.float16, full=False, seed=3)
    nodes = [
        helper.make_node("Cast", ["x"], ["X"], to=TensorProto.FLOAT16),
        helper.make_node("GRU", ["X", "W", "R"], ["Y16", "Y_h16"], hidden_size=7),
        helper.make_node("Cast", ["Y16"], ["Y"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [30, 2, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "same")],
        [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    upstream = low_precision_upstream(model)
    assert upstream == {"Y": float(np.finfo(np.float16).eps), "same": 0.0}
    report = check(model, {"x": feeds["X"].astype(np.float32)}, peers=["onnx.reference"])
    judged = {c.output: c for c in report.comparisons}
    assert judged["Y"].widened and not judged["Y"].exceeds, judged
    assert not judged["same"].widened


def test_openvino_layout_1_gives_wrong_shapes(tmp_path, capsys):
    pytest.importorskip("openvino")
    feeds = random_inputs("GRU", T=5, N=3, full=False)
    feeds["X"] = np.ascontiguousarray(feeds["X"].swapaxes(0, 1))
    argv = _save(tmp_path, node_model("GRU", feeds, {"layout": 1, "hidden_size": 3}))
    assert _main(*argv, "--peer", "openvino") == 1
    out = capsys.readouterr().out
    assert "openvino: ignores layout=1" in out
    assert "openvino  DIFFERS: shape [3, 1, 5, 3], ours [3, 5, 1, 3]" in out


def _symbolic_constant(model: onnx.ModelProto, feeds) -> onnx.ModelProto:
    """The same node with W, R and B as initializers and X's dims symbolic."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    fed = [i for i in g.input if i.name not in ("W", "R", "B")]
    for i in fed:
        if i.name == "X":
            i.type.tensor_type.shape.dim[0].dim_param = "T"
            i.type.tensor_type.shape.dim[1].dim_param = "N"
    del g.input[:]
    g.input.extend(fed)
    g.initializer.extend(onnx.numpy_helper.from_array(feeds[n], n) for n in ("W", "R", "B"))
    return model


def _scenario(name):
    """A one-node model and its feeds, for what a peer may get wrong."""
    bidi = {"direction": "bidirectional", "hidden_size": 3}
    if name == "rnn clip":
        return _clip_rnn()
    if name == "lstm peepholes and initial states":
        feeds = random_inputs("LSTM", T=5, N=3, seed=4)
        del feeds["sequence_lens"]
        return node_model("LSTM", feeds, {"hidden_size": 3}), feeds
    if name.startswith("lstm sequence_lens"):
        feeds = random_inputs("LSTM", T=5, N=3, seed=4)
        feeds["sequence_lens"] = np.array([5, 1, 3], np.int32)
        for optional in ("initial_h", "initial_c", "P"):
            del feeds[optional]
        model = node_model("LSTM", feeds, {"hidden_size": 3})
        if name.endswith("symbolic"):
            model = _symbolic_constant(model, feeds)
            feeds = {k: v for k, v in feeds.items() if k not in ("W", "R", "B")}
        return model, feeds
    op, attrs, kw = {
        "gru layout=1": ("GRU", {"layout": 1, "hidden_size": 3}, {}),
        "lstm double": ("LSTM", {"hidden_size": 3}, {"dtype": np.float64}),
        "rnn affine unset alpha": ("RNN", {"hidden_size": 3, "activations": ["Affine"]}, {}),
        "gru activations": (
            "GRU",
            {"hidden_size": 3, "activations": ["HardSigmoid", "Softsign"]},
            {},
        ),
        "lstm input_forget": ("LSTM", {"hidden_size": 3, "input_forget": 1}, {}),
        "rnn per-direction activations": (
            "RNN",
            {**bidi, "activations": ["Tanh", "Relu"]},
            {"D": 2},
        ),
        "gru no hidden_size": ("GRU", {}, {}),
        "gru-3": ("GRU", {"hidden_size": 3}, {"opset": 3}),
        "gru plain": ("GRU", {**bidi, "linear_before_reset": 1}, {"D": 2}),
    }[name]
    opset = kw.pop("opset", 22)
    feeds = random_inputs(op, T=5, N=3, full=False, seed=3, **kw)
    if attrs.get("layout") == 1:
        feeds["X"] = np.ascontiguousarray(feeds["X"].swapaxes(0, 1))
    return node_model(op, feeds, attrs, opset=opset), feeds


SCENARIOS = [
    "rnn clip",
    "lstm sequence_lens",
    "lstm sequence_lens symbolic",
    "lstm peepholes and initial states",
    "gru layout=1",
    "lstm double",
    "rnn affine unset alpha",
    "gru activations",
    "lstm input_forget",
    "rnn per-direction activations",
    "gru no hidden_size",
    "gru-3",
    "gru plain",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_lint_names_a_peer_exactly_where_it_differs_on_the_model(name):
    """Whatever the installed peers' versions: a peer is named by the lint (from its
    probes) if and only if it differs from ours on the model itself, or fails on it;
    each finding gives its evidence."""
    model, feeds = _scenario(name)
    report = check(model, feeds)
    named = {f.peer for f in report.findings if f.peer is not None}
    wrong = {c.peer for c in report.comparisons if c.exceeds or c.error is not None}
    assert named == wrong, [str(f) for f in report.findings]
    for f in report.findings:
        assert f.message.endswith(")") and ("(probed" in f.message or "(refused: " in f.message)


def test_lint_openvino_sequence_lens_depends_on_the_form():
    """OpenVINO ignores sequence_lens when X's dims are symbolic and the weights
    constant (measured with 2026.4), honours it with fixed dims: the lint applies the
    probe of the model's own form, and says which."""
    pytest.importorskip("openvino")
    fixed, _ = _scenario("lstm sequence_lens")
    symbolic, _ = _scenario("lstm sequence_lens symbolic")
    form = probes.Form("LSTM")
    static = probes.probe("openvino", form, probes.SEQUENCE_LENS)
    dynamic = probes.probe(
        "openvino", probes.Form("LSTM", static=False, constant=True), probes.SEQUENCE_LENS
    )
    about = "openvino: ignores sequence_lens"
    assert any(about in str(f) for f in lint(fixed, ["openvino"])) == static.wrong
    got = [str(f) for f in lint(symbolic, ["openvino"])]
    assert any(about in f for f in got) == dynamic.wrong
    if dynamic.wrong:
        assert any("probed with X's dims symbolic and the weights constant: " in f for f in got)


def test_lint_messages_of_the_installed_peers():
    """What the probes of this machine's peers show, worded (each peer when installed)."""

    def findings(op, attrs, *, opset=22, dtype=np.float32, D=1, **kw):
        feeds = random_inputs(op, full=False, dtype=dtype, D=D, **kw)
        return [str(f) for f in lint(node_model(op, feeds, attrs, opset=opset))]

    peers = set(installed_peers())
    bidi = {"direction": "bidirectional", "hidden_size": 3}
    got = findings("RNN", {**bidi, "activations": ["ScaledTanh", "ScaledTanh"]}, D=2)
    if "onnxruntime" in peers:  # once, not per direction; the evidence measured
        (alpha,) = [f for f in got if "onnxruntime: uses 0 for ScaledTanh's alpha" in f]
        assert alpha.endswith(")") and "(the ONNX default is 1) (probed: max |diff| " in alpha
    got = findings("GRU", {"hidden_size": 3}, opset=3)
    if "onnxruntime" in peers:
        assert any(
            f.startswith("GRU-3 'GRU_0': onnxruntime: cannot run GRU-3 in float (refused: ")
            for f in got
        )
    got = findings("LSTM", {"hidden_size": 3, "input_forget": 1}, dtype=np.float64)
    if "onnxruntime" in peers:
        assert any("onnxruntime: cannot run LSTM-22 in double (refused: " in f for f in got)
    if "onnx.reference" in peers:
        assert any("onnx.reference: ignores input_forget=1 (probed: " in f for f in got)
    got = findings("GRU", {"activations": ["Sigmoid", "Elu"]})
    if "openvino" in peers:
        assert any(
            "openvino: fails without the hidden_size attribute (refused: " in f for f in got
        )
    assert findings("GRU", {"hidden_size": 3}) == []


@pytest.fixture
def fake_peer(monkeypatch):
    """``make(alter)``: a peer that runs onnx-recurrent on the model as ``alter`` leaves
    it (``alter`` may raise: a refusal); its probes are forgotten afterwards."""
    made = []

    def make(alter):
        name = f"fake-{len(made)}"

        def run(model, feeds, names):
            altered = onnx.ModelProto.FromString(model.SerializeToString())
            alter(altered)
            session = orc.InferenceSession(altered, host="reference")
            return session.run(list(names), dict(feeds))

        monkeypatch.setitem(PEERS, name, ("onnx", run))
        made.append(name)
        return name

    probes.probe.cache_clear()
    yield make
    probes.probe.cache_clear()


def _recurrent(model):
    return [n for _, n in walk(model.graph) if n.op_type in ("GRU", "RNN", "LSTM")]


def _drop_attribute(name):
    def alter(model):
        for node in _recurrent(model):
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(kept)

    return alter


def test_lint_names_a_peer_only_where_its_probe_shows_it(fake_peer):
    """The mechanism, on peers made to order: one as right as ours, one that ignores
    clip, one that ignores sequence_lens when X's dims are symbolic only, one that
    refuses layout=1."""

    def lens_if_symbolic(model):
        x = next(i for i in model.graph.input if i.name == "X")
        if any(d.dim_param for d in x.type.tensor_type.shape.dim):
            for node in _recurrent(model):
                if len(node.input) > 4:
                    node.input[4] = ""

    def no_layout_1(model):
        for node in _recurrent(model):
            if any(a.name == "layout" and a.i == 1 for a in node.attribute):
                raise RuntimeError("no layout=1 here")

    right = fake_peer(lambda model: None)
    no_clip = fake_peer(_drop_attribute("clip"))
    lens = fake_peer(lens_if_symbolic)
    layout = fake_peer(no_layout_1)
    peers = [right, no_clip, lens, layout]

    clipped, _ = _clip_rnn()
    assert [str(f) for f in lint(clipped, peers)] == [
        "RNN-22 'RNN_0': fake-1: ignores clip=1 (probed: max |diff| 0.54)"
    ]
    fixed, _ = _scenario("lstm sequence_lens")
    assert lint(fixed, peers) == []
    symbolic, _ = _scenario("lstm sequence_lens symbolic")
    (finding,) = lint(symbolic, peers)
    assert (finding.peer, finding.feature) == (lens, "sequence_lens")
    assert finding.message.startswith(
        "ignores sequence_lens (runs every sequence to the end) "
        "(probed with X's dims symbolic and the weights constant: max |diff| "
    )
    batch_first, _ = _scenario("gru layout=1")
    assert [str(f) for f in lint(batch_first, peers)] == [
        "GRU-22 'GRU_0': fake-3: does not support layout=1 "
        "(refused: RuntimeError: no layout=1 here)"
    ]
    assert lint(clipped, []) == []  # no peer, nothing probed


def test_lint_walks_subgraphs(fake_peer):
    feeds = random_inputs("RNN", full=False)
    rnn = helper.make_node("RNN", ["X", "W", "R"], ["Y"], name="inner", hidden_size=3, clip=2.0)
    branch = helper.make_graph(
        [rnn], "b", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    )
    node = helper.make_node(
        "If", ["c"], ["out"], name="cond", then_branch=branch, else_branch=branch
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
        + [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph)
    right = fake_peer(lambda model: None)
    no_clip = fake_peer(_drop_attribute("clip"))
    got = [str(f) for f in lint(model, [right, no_clip])]
    assert got == ["RNN-22 'inner' in cond: fake-1: ignores clip=2 (probed: max |diff| 0.54)"]


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("GRU", {"linear_before_reset": 0, "clip": 1.5}),
        ("GRU", {"linear_before_reset": 1, "activations": ["HardSigmoid", "Elu"]}),
        ("RNN", {"activations": ["Affine"], "activation_alpha": [0.7], "activation_beta": [0.2]}),
        ("LSTM", {"clip": 0.8}),
        ("LSTM", {"input_forget": 1, "activations": ["Sigmoid", "Softsign", "Relu"]}),
    ],
)
def test_cell_step_is_the_operator(op, attrs):
    """cell_step, looped over time, gives what the library computes."""
    feeds = random_inputs(op, T=5, N=2, seed=9)
    del feeds["sequence_lens"]
    expected = getattr(orc, op.lower())(**feeds, **attrs)
    spec = make_spec(
        {"GRU": cells.GRU, "RNN": cells.RNN, "LSTM": cells.LSTM}[op],
        feeds["R"],
        hidden_size=None,
        direction="forward",
        layout=0,
        activations=attrs.get("activations"),
        activation_alpha=attrs.get("activation_alpha"),
        activation_beta=attrs.get("activation_beta"),
        clip=attrs.get("clip"),
        linear_before_reset=attrs.get("linear_before_reset", 0),
        input_forget=attrs.get("input_forget", 0),
    )
    P = feeds.get("P")
    for b in range(2):
        h = feeds["initial_h"][0, b]
        c = feeds["initial_c"][0, b] if op == "LSTM" else None
        for t in range(5):
            gates, h, c = cell_step(
                spec,
                0,
                feeds["X"][t, b],
                h,
                c,
                feeds["W"][0],
                feeds["R"][0],
                feeds["B"][0],
                None if P is None else P[0],
            )
            np.testing.assert_allclose(h, expected[0][t, 0, b], rtol=1e-5, atol=1e-6)
        assert set(gates) == {"GRU": {*"zrh"}, "RNN": {"i"}, "LSTM": {*"iofc", "h(C)"}}[op]
        if op == "LSTM":
            np.testing.assert_allclose(c, expected[2][0, b], rtol=1e-5, atol=1e-6)


def test_check_as_a_function(fake_peer):
    """On a peer that ignores clip: the first step past the clip (t=3), and there the
    batch entry that differs most, computed here from the two results."""
    model, feeds = _clip_rnn()
    no_clip = fake_peer(_drop_attribute("clip"))
    report = check(model, feeds, peers=[no_clip], trace_nodes=True)
    assert report.exceeds
    assert [c.output for c in report.comparisons] == ["Y", "Y_h"]
    ours = orc.rnn(**feeds, hidden_size=3, clip=1.0)[0]
    theirs = orc.rnn(**feeds, hidden_size=3)[0]
    diff = np.abs(ours - theirs)  # [T, 1, N, H]
    assert diff[:3].max() <= 1e-4 < diff[3].max()  # step 3 is the first to differ
    batch = int(np.argmax(diff[3, 0].max(axis=-1)))
    (div,) = report.divergences
    assert (div.step, div.direction, div.batch, div.gate) == (3, 0, batch, "i")
    assert f"Y first differs at step t=3 (direction 0 forward, batch {batch})" in div.message
    with pytest.raises(ValueError, match="unknown peer"):
        check(model, feeds, peers=["tensorflow"])


def test_check_rejects_negative_tolerances():
    """The function checks them too (the command line's --atol/--rtol never pass one)."""
    feeds = random_inputs("RNN", full=False)
    with pytest.raises(ValueError, match="atol and rtol must be >= 0, got -1"):
        check(node_model("RNN", feeds, {}), feeds, peers=[], atol=-1)


def test_an_inf_against_a_finite_value_differs():
    """|inf - 0.5| > atol + rtol * |inf| is inf > inf, False: an inf against a finite
    value was "ok". Non-finite values must be the same; the same inf differs by 0 (it
    showed inf - inf = nan as inf)."""
    from onnx_recurrent.tools.check.trace import _excess, compare

    inf, nan = np.inf, np.nan
    for ours, theirs in [(inf, 0.5), (0.5, inf), (inf, -inf), (-inf, 1e300), (nan, 1.0)]:
        found = compare("Y", "p", np.array([1.0, ours]), np.array([1.0, theirs]), 1e-4, 1e-3)
        assert found.exceeds and found.max_abs == inf and found.max_rel == inf, (ours, theirs)
        assert _excess(np.array([ours]), np.array([theirs]), 1e-4, 1e-3).all()
    same = np.array([inf, -inf, nan, 2.0], np.float32)
    found = compare("Y", "p", same, same.copy(), 0, 0)
    assert not found.exceeds and (found.max_abs, found.max_rel) == (0.0, 0.0)
    assert not _excess(same, same.copy(), 0, 0).any()


def test_check_of_an_inf_output_against_a_finite_peer_is_status_1(tmp_path, capsys):
    """A GRU whose ScaledTanh has alpha inf: ours is inf where onnx.reference, which
    ignores the activations, is finite; check said "ok" and status 0."""
    I = H = 2
    feeds = {"X": np.ones((1, 1, I), np.float32), "W": np.full((1, 3 * H, I), 0.5, np.float32)}
    feeds["R"] = np.zeros((1, 3 * H, H), np.float32)
    attrs = {"hidden_size": H, "activations": ["Sigmoid", "ScaledTanh"]}
    attrs |= {"activation_alpha": [np.inf], "activation_beta": [1.0]}
    model = node_model("GRU", feeds, attrs, constants=("W", "R"), opset=14)
    argv = _save(tmp_path, model, {"X": feeds["X"]})
    assert _main(*argv, "--peer", "onnx.reference") == 1
    out = capsys.readouterr().out
    assert _row(out, "Y_h", "onnx.reference").split()[2:] == ["inf", "inf", "DIFFERS"]
    assert "result: onnx.reference beyond the tolerance" in out


def test_a_peer_given_twice_is_refused(tmp_path, capsys):
    """--peer X --peer X ran X twice and reported each row twice (as bench --ops
    gru,gru is refused)."""
    feeds = random_inputs("RNN", full=False)
    argv = _save(tmp_path, node_model("RNN", feeds, {}, constants=("W", "R")))
    assert _main(*argv, "--peer", "onnx.reference", "--peer", "onnx.reference") == 2
    err = capsys.readouterr().err
    assert "onnx-recurrent check: error: --peer 'onnx.reference' given twice" in err, err
    with pytest.raises(ValueError, match=r"peer 'onnx\.reference' given twice"):
        check(tmp_path / "m.onnx", feeds, peers=["onnx.reference", "onnx.reference"])


def test_check_feeds_an_overridable_initializer(tmp_path, capsys):
    """-i of an initializer that the graph also lists as an input (the peers take its
    feed too): "the model has no input 'W'" before."""
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, {"hidden_size": 3}, constants=("R",))
    model.graph.initializer.append(onnx.numpy_helper.from_array(feeds["W"], "W"))
    argv = _save(tmp_path, model, {"X": feeds["X"], "W": np.zeros_like(feeds["W"])})
    assert _main(*argv, "--peer", "onnx.reference") == 0
    out = capsys.readouterr().out
    assert "input W: [1, 9, 4] float32, given" in out
    assert _row(out, "Y", "onnx.reference").split()[2:] == ["0", "0", "ok"]


# --- what the fifth probe found (twenty-sixth session): reports that were not true -------


def test_openvino_is_not_run_on_an_empty_batch(tmp_path):
    """OpenVINO 2026.4 ends its process (SIGFPE) on an RNN given a batch of 0: check
    died with it (reachable since a dim declared 0 is no longer drawn as 8)."""
    pytest.importorskip("openvino")
    feeds = random_inputs("RNN", full=False)
    feeds["X"] = feeds["X"][:, :0]
    done = _check_child(_save(tmp_path, node_model("RNN", feeds, {}), feeds), "openvino")
    assert "error: RuntimeError: not run: the input 'X' is empty" in done.stdout


def test_a_dim_declared_0_is_fixed_not_drawn(tmp_path, capsys):
    """X declared [5, 0, 3]: the 0 was taken as free, drawn as 8 ("pass --dim X:1=VALUE",
    and --dim X:1=0 is refused); onnxruntime and the session hold it fixed."""
    feeds = random_inputs("GRU", full=False)
    feeds["X"] = feeds["X"][:, :0]
    model = node_model("GRU", feeds, {"hidden_size": feeds["R"].shape[-1]})
    (path,) = _save(tmp_path, model)
    assert cli.main(["run", path]) == 0
    assert "output Y_h: shape [1, 0," in capsys.readouterr().out
    assert _main(path, "--peer", "onnx.reference") == 0


def _stacked_gru():
    """GRU ``first`` with clip (onnx.reference ignores it) feeding a plain GRU ``second``."""
    rng = np.random.default_rng(3)
    T, N, I, H = 4, 2, 3, 4

    def w(*shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32))

    tensors = []
    for name, shape in (("W1", (1, 3 * H, I)), ("R1", (1, 3 * H, H)), ("W2", (1, 3 * H, H)),
                        ("R2", (1, 3 * H, H))):  # fmt: skip
        t = w(*shape)
        t.name = name
        tensors.append(t)
    nodes = [
        helper.make_node("GRU", ["X", "W1", "R1"], ["Y1"], hidden_size=H, clip=0.3, name="first"),
        helper.make_node("Squeeze", ["Y1", "one"], ["X2"]),
        helper.make_node("GRU", ["X2", "W2", "R2"], ["Y2"], hidden_size=H, name="second"),
    ]
    tensors.append(onnx.numpy_helper.from_array(np.array([1]), "one"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [T, N, I])],
        [helper.make_tensor_value_info("Y2", TensorProto.FLOAT, None)],
        tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, {"X": rng.standard_normal((T, N, I)).astype(np.float32) * 3}


def test_trace_does_not_blame_a_node_whose_input_already_differs(tmp_path, capsys):
    """The trace recomputed ``second`` from our X and blamed onnx.reference there ("no
    known peer behaviour explains the step"), which computes ``second`` right from
    its own X: the difference is ``first``'s."""
    model, feeds = _stacked_gru()
    assert _main(*_save(tmp_path, model, feeds), "--trace", "--peer", "onnx.reference") == 1
    trace = capsys.readouterr().out.split("\ntrace:\n")[1]
    assert "GRU 'first' vs onnx.reference: Y first differs" in trace
    assert "computed without clip" in trace
    assert "GRU 'second' vs onnx.reference: its input X ('X2') already differs" in trace
    assert "no known peer behaviour" not in trace


def test_trace_takes_the_tables_tolerance_for_16_bit_floats(tmp_path, capsys):
    """Two float16 GRUs: the table called ``plain``'s outputs ok, while the trace
    reported it differing (rounding) with nothing to explain it."""
    feeds = random_inputs("GRU", T=6, N=2, full=False, seed=2, dtype=np.float16)
    H = feeds["R"].shape[-1]
    model = node_model("GRU", feeds, {"hidden_size": H, "clip": 0.3})
    plain = onnx.helper.make_node("GRU", ["X", "W", "R"], ["Yp"], hidden_size=H, name="plain")
    model.graph.node.append(plain)
    model.graph.output.append(helper.make_tensor_value_info("Yp", TensorProto.FLOAT16, None))
    assert _main(*_save(tmp_path, model, feeds), "--trace", "--peer", "onnx.reference") == 1
    out = capsys.readouterr().out
    assert "ok" in _row(out, "Yp", "onnx.reference")
    assert "'plain'" not in out.split("\ntrace:\n")[1]


def test_lint_and_trace_see_openvino_ignore_a_constant_p_beside_a_fed_w(tmp_path, capsys):
    """The lint's probe fed P with W (refused there) where the model keeps P constant
    (ignored): "does not support peepholes (refused)", though OpenVINO ran the model;
    and the trace had no such hypothesis."""
    pytest.importorskip("openvino")
    feeds = random_inputs("LSTM", T=5, N=2, full=False, seed=4)
    feeds["P"] = np.random.default_rng(4).standard_normal((1, 3 * 3)).astype(np.float32) * 2
    model = node_model("LSTM", feeds, {"hidden_size": 3}, constants=["R", "B", "P"])
    fed = {k: v for k, v in feeds.items() if k in ("X", "W")}
    assert _main(*_save(tmp_path, model, fed), "--trace", "--peer", "openvino") == 1
    out = capsys.readouterr().out
    assert "openvino: ignores the peepholes (P) (probed with P constant" in out
    assert "the peer's step equals ours with the peepholes (P) ignored" in out


def test_trace_gives_a_layout_1_nodes_shapes_as_the_runtimes_made_them(tmp_path, capsys):
    pytest.importorskip("openvino")
    feeds = random_inputs("LSTM", T=5, N=2, full=False, seed=1)
    feeds["X"] = np.ascontiguousarray(feeds["X"].transpose(1, 0, 2))  # [N, T, I]
    model = node_model("LSTM", feeds, {"hidden_size": 3, "layout": 1})
    assert _main(*_save(tmp_path, model, feeds), "--trace", "--peer", "openvino") == 1
    out = capsys.readouterr().out
    assert "Y has shape [2, 1, 5, 3], ours [2, 5, 1, 3]" in out.split("\ntrace:\n")[1], out


def test_integer_outputs_must_be_equal():
    """ids 30000 apart by 30 were "ok" within atol + rtol * |id|."""
    from onnx_recurrent.tools.check.trace import compare

    ids = np.array([30000, 7], np.int64)
    assert compare("o", "p", ids, ids + np.array([30, 0]), 1e-4, 1e-3).exceeds
    assert not compare("o", "p", ids, ids.copy(), 1e-4, 1e-3).exceeds
    near = ids + np.array([1e-3, 0])
    assert not compare("o", "p", ids.astype(float), near, 1e-4, 1e-3).exceeds


def test_openvino_models_dropped_in_any_order_leave_ctrl_c_working():
    # each OpenVINO Core's CPU plugin gives the compiling thread an alternate signal
    # stack and unmaps it when the Core goes: two dropped in the order made left the
    # main thread's unmapped, and the next Ctrl-C (Python's handler runs on that stack)
    # killed the process with SIGSEGV, faulthandler silent (the test suite's own
    # process, once: after a SIGALRM test). The thread's stack is kept now; and a
    # forked child compiles (a Core kept for the process hung the child's compile).
    import subprocess
    import sys

    pytest.importorskip("openvino")
    code = (
        "import gc, os, signal, sys\n"
        "from onnx import TensorProto, helper\n"
        "from onnx_recurrent.tools.check.peers import openvino_model\n"
        "def model(op):\n"
        "    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [2, 3])\n"
        "    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [2, 3])\n"
        "    graph = helper.make_graph([helper.make_node(op, ['x'], ['y'])], 'g', [x], [y])\n"
        "    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])\n"
        "first, second = openvino_model(model('Relu')), openvino_model(model('Abs'))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    openvino_model(model('Neg'))\n"
        "    os._exit(7)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "del first; gc.collect()\n"
        "del second; gc.collect()\n"
        "try:\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('KeyboardInterrupt')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["child", "7", "KeyboardInterrupt"], done.stdout
