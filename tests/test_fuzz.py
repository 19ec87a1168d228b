"""Fuzzed models (issue 14): every mutant gives outputs or a clear error, under each host.

``test_mutants_give_outputs_or_clear_errors`` runs a fixed-seed set of mutants
(:mod:`fuzz`) in worker processes, so that a crash of the interpreter or a hang fails
the test with its seed instead of killing pytest; ``scripts/fuzz_models.py`` runs
thousands. The other tests pin each defect the fuzzer found, on a small hand-built
model.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_recurrent as orc
from onnx_recurrent.errors import RecurrentError, RecurrentTypeError

from fuzz import DEFECTS, fuzz, mutant, outcome_label, run_mutant
from models import node_model, random_inputs

#: mutants in the fixed-seed run (seeds 0 .. COUNT-1)
COUNT = 300
#: the exception types a mutant may raise, by ``module.qualname`` (builtins bare)
ALLOWED_ERRORS = {
    "onnx_recurrent.errors.RecurrentError",
    "onnx_recurrent.errors.RecurrentTypeError",
    "ValueError",
    "TypeError",
    "RuntimeError",  # onnxruntime refusing a model; onnx.reference's own errors
    "NotImplementedError",  # onnx.reference: an operator it does not know
    "onnx.reference.op_run.RuntimeTypeError",
    "onnx.onnx_cpp2py_export.checker.ValidationError",
    "onnxruntime.capi.onnxruntime_pybind11_state.Fail",
    "onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument",
    "onnxruntime.capi.onnxruntime_pybind11_state.InvalidGraph",
    "onnxruntime.capi.onnxruntime_pybind11_state.RuntimeException",
    "onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented",
}


def _hosts() -> list[str]:
    packages = ("onnxruntime", "onnxruntime_extensions")
    if all(importlib.util.find_spec(p) for p in packages):
        return ["reference", "onnxruntime"]
    return ["reference"]


def test_mutants_are_reproducible():
    a, b = mutant(17), mutant(17)
    assert a.mutations == b.mutations and a.name == b.name
    as_bytes = [m if isinstance(m, bytes) else m.SerializeToString() for m in (a.model, b.model)]
    assert as_bytes[0] == as_bytes[1]
    assert a.feeds.keys() == b.feeds.keys()
    for name in a.feeds:
        np.testing.assert_array_equal(a.feeds[name], b.feeds[name])


def test_a_mutant_after_a_name_that_is_not_utf8():
    # a mutation that renamed a tensor with bytes that are not UTF-8, then one that
    # picked among the names, stopped the fuzzer (seed 810075: "'<' not supported
    # between instances of 'bytes' and 'str'")
    m = mutant(810075)
    assert m.mutations[0].startswith("submessage bytes:")
    assert m.mutations[1].startswith("outputs: LSTM '' output 0 -> ")


def test_a_direction_in_another_case_is_expected_as_the_library_reads_it():
    # seed 993704 flipped 'bidirectional' to 'biDirectional', which spec.py reads without
    # regard to case (Y of two directions); the fuzzer expected one direction and called
    # the right shape a defect
    m = mutant(993704)
    assert m.mutations[0].startswith("bytes:")
    outcome, _ = run_mutant(m, "reference")
    assert outcome["kind"] == "outputs" and outcome["shapes"][0] == [5, 2, 3, 3]


@pytest.mark.skipif(sys.platform == "win32", reason="the workers are read with select()")
def test_mutants_give_outputs_or_clear_errors():
    hosts = _hosts()
    results = fuzz(range(COUNT), hosts, jobs=2, timeout=60)
    assert len(results) == COUNT
    defects = []
    kinds: dict[str, int] = {}
    for r in results:
        for host, outcome in r["hosts"].items():
            kinds[outcome_label(outcome)] = kinds.get(outcome_label(outcome), 0) + 1
            ok = outcome["kind"] == "outputs" or (
                outcome["kind"] == "error" and outcome["type"] in ALLOWED_ERRORS
            )
            if not ok:
                assert outcome["kind"] in (*DEFECTS, "error")
                defects.append(
                    f"seed {r['seed']} ({host}, {r.get('model')}: {r.get('mutations')}): "
                    f"{outcome_label(outcome)}: {outcome.get('message', '')[:300]} "
                    f"[{outcome.get('where', '')[-300:]}]"
                )
    assert not defects, "\n".join(defects)
    # the run reaches both outcomes, under every host
    assert kinds.get("outputs", 0) > COUNT // 10, kinds
    assert sum(v for k, v in kinds.items() if k.startswith("error")) > COUNT // 10, kinds


# -- the defects the fuzzer found -------------------------------------------------------


def _gru(**attributes) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    feeds = random_inputs("GRU", full=False)
    return node_model("GRU", feeds, attributes), feeds


def _with_initializers(model: onnx.ModelProto, feeds: dict, names) -> onnx.ModelProto:
    """``model`` with the feeds ``names`` as initializers, not inputs."""
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(feeds.pop(n), n) for n in names)
    return model


def test_a_recurrent_node_without_X_is_an_error(host):
    # was: AttributeError under the reference host; under onnxruntime the custom node
    # got no X and the callback's IndexError aborted the process (seed 2874)
    model, _ = _gru()
    model.graph.node[0].input[0] = ""
    with pytest.raises(RecurrentError, match=r"GRU node '': input 0 \(X\) is required"):
        orc.InferenceSession(model, host=host)
    model.graph.node[0].input[0] = "X"
    del model.graph.node[0].input[1:]
    with pytest.raises(RecurrentError, match=r"input 1 \(W\) is required, got absent"):
        orc.InferenceSession(model, host=host)


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime_extensions") is None,
    reason="the onnxruntime host needs onnxruntime-extensions",
)
def test_the_onnxruntime_host_survives_a_node_without_X():
    # in a child process: were the fix undone, the callback would abort it, not pytest
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, "tests")
        import onnx_recurrent as orc
        from models import node_model, random_inputs
        feeds = random_inputs("GRU", full=False)
        model = node_model("GRU", feeds, {})
        model.graph.node[0].input[0] = ""
        try:
            orc.InferenceSession(model, host="onnxruntime").run(None, feeds)
        except ValueError as e:
            print("ValueError:", e)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "input 0 (X) is required" in done.stdout


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.dims.__setitem__(1, 10), r"tensor 'W' \(FLOAT, dims \[1, 10, 4\]\) cannot"),
        (lambda t: setattr(t, "raw_data", t.raw_data[:-3]), r"tensor 'W' .* cannot be read"),
        (lambda t: setattr(t, "data_type", 1000), r"tensor 'W' has an unknown element type"),
        (lambda t: setattr(t, "data_type", 0), r"tensor 'W' \(UNDEFINED, .*\) cannot be read"),
    ],
    ids=["dims", "truncated", "unknown-type", "undefined-type"],
)
def test_a_weight_whose_data_cannot_be_read_is_named(host, change, message):
    # was: numpy's "cannot reshape array of size 36 into shape (1,10,4)", a KeyError
    # for an unknown element type, onnx's TypeError for UNDEFINED (seeds 66, 2822, 1199)
    model, feeds = _gru()
    model = _with_initializers(model, feeds, ["W"])
    change(model.graph.initializer[0])
    with pytest.raises(RecurrentError, match=message):
        orc.InferenceSession(model, host=host)


def test_an_unreadable_initializer_that_no_recurrent_node_uses_is_named():
    # the reference host read it inside onnx.reference: "cannot reshape array of size
    # 1 into shape (7,)", naming no tensor
    model, _ = _gru()
    extra = numpy_helper.from_array(np.zeros(3, np.float32), "unused")
    extra.dims[0] = 7
    model.graph.initializer.append(extra)
    with pytest.raises(RecurrentError, match=r"initializer 'unused' \(FLOAT, dims \[7\]\)"):
        orc.InferenceSession(model, host="reference")


def test_external_data_is_read_beside_the_model(host, tmp_path):
    # was: onnx's ValidationError "should be stored in w.bin, but it is not regular
    # file" (read from the working directory, not the model's)
    model, feeds = _gru()
    model = _with_initializers(model, feeds, ["W", "R"])
    expected = orc.InferenceSession(model, host=host).run(None, feeds)
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(
        model,
        folder / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    got = orc.InferenceSession(str(folder / "m.onnx"), host=host).run(None, feeds)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    # from bytes, the file cannot be found: the error says what to give instead
    data = (folder / "m.onnx").read_bytes()
    with pytest.raises(RecurrentError, match=r"tensor 'W' keeps its data in an external file"):
        orc.InferenceSession(data, host=host)
    (folder / "w.bin").unlink()
    with pytest.raises(RecurrentError, match=r"m\.onnx': its external data cannot be read"):
        orc.InferenceSession(folder / "m.onnx", host=host)


def test_declared_element_types_no_array_has_are_errors(host):
    # was: KeyError 0 when run checked the feeds; protobuf's "Enum DataType has no
    # name defined for value 1000" (seeds 1109, 51, 93)
    model, _ = _gru()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    with pytest.raises(
        RecurrentTypeError, match=r"input 'X' has element type tensor\(undefined\)"
    ):
        orc.InferenceSession(model, host=host)
    model, _ = _gru()
    model.graph.output[1].type.tensor_type.elem_type = 1000
    with pytest.raises(RecurrentTypeError, match=r"tensor 'Y_h' .* unknown element type 1000"):
        orc.InferenceSession(model, host=host)


def test_a_sequence_input_feeding_a_recurrent_node_is_an_error(host):
    # sequence inputs are fed since issue 23; one that a GRU takes as X is an invalid
    # model (onnxruntime: "Type Error"), was "the element type of X cannot be told"
    # under the onnxruntime host and an AttributeError under the reference host
    model, _ = _gru()
    sequence = helper.make_tensor_sequence_value_info("X", TensorProto.FLOAT, None)
    model.graph.input[0].CopyFrom(sequence)
    with pytest.raises(
        RecurrentTypeError,
        match=r"GRU node '.*': its X is the graph input 'X', a seq\(tensor\(float\)\), not a",
    ):
        orc.InferenceSession(model, host=host)


def test_names_that_are_not_utf8_are_an_error(host):
    # protobuf hands such a string back as bytes; was a UnicodeDecodeError from onnx's
    # make_node under the onnxruntime host (seed 2427)
    model, _ = _gru()
    data = model.SerializeToString().replace(b"Y_h", b"Y\x8bh")
    with pytest.raises(RecurrentError, match=r"model: .* b'Y\\x8bh' is not UTF-8 text"):
        orc.InferenceSession(data, host=host)


def test_a_string_attribute_that_is_not_utf8_is_named(host):
    # was: UnicodeDecodeError (seed 1089)
    model, _ = _gru(direction="forward")
    model.graph.node[0].attribute[0].s = b"\xff"
    with pytest.raises(RecurrentError, match=r"attribute 'direction' is not UTF-8 text"):
        orc.InferenceSession(model, host=host)


def test_an_unnamed_graph_output_is_an_error(host):
    # was: None among the outputs under the reference host (seed 29)
    model, _ = _gru()
    model.graph.output[1].name = ""
    with pytest.raises(RecurrentError, match="graph output 1 has no name"):
        orc.InferenceSession(model, host=host)


def test_onnx_reference_failures_name_the_node():
    # a Constant without its value: onnx.reference raised AttributeError (seed 1444)
    model, _ = _gru()
    model.graph.node.insert(0, helper.make_node("Constant", [], ["c"], name="empty"))
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    with pytest.raises(RuntimeError, match=r"at Constant node 'empty': AttributeError"):
        orc.InferenceSession(model, host="reference")


def test_onnx_reference_value_and_type_errors_name_the_node():
    # a Transpose with a repeated axis (seed 801741), an Unsqueeze given float axes
    # (seed 800377): NumPy's ValueError, onnx.reference's TypeError, named no node
    model, feeds = _gru()
    model.graph.node.append(
        helper.make_node("Transpose", ["X"], ["t"], name="bad", perm=[1, 1, 2])
    )
    model.graph.output.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, None))
    session = orc.InferenceSession(model, host="reference")
    with pytest.raises(ValueError, match=r"at Transpose node 'bad': ValueError: repeated axis"):
        session.run(None, feeds)
    model, feeds = _gru()
    axes = numpy_helper.from_array(np.array([0.0], np.float32), "axes")
    model.graph.initializer.append(axes)
    model.graph.node.append(helper.make_node("Unsqueeze", ["X", "axes"], ["u"], name="odd"))
    model.graph.output.append(helper.make_tensor_value_info("u", TensorProto.FLOAT, None))
    with pytest.raises(TypeError, match=r"at Unsqueeze node 'odd': TypeError"):
        orc.InferenceSession(model, host="reference").run(None, feeds)
    # a Transpose of a rank its perm does not have: onnx.reference's RuntimeError
    # named the operator, not the node (seed 801742)
    model, feeds = _gru()
    model.graph.node.append(helper.make_node("Transpose", ["X"], ["t"], name="short", perm=[1, 0]))
    model.graph.output.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, None))
    with pytest.raises(
        RuntimeError, match=r"at Transpose node 'short': RuntimeError: Inconsistent"
    ):
        orc.InferenceSession(model, host="reference").run(None, feeds)


def test_a_node_whose_bias_is_computed_at_run_time(host):
    # W and R initializers, B computed from a graph input: under onnxruntime the
    # constant W and R were dropped ("R must be 3-D ..., got shape ()", seed 201344)
    feeds = random_inputs("GRU")
    expected = orc.InferenceSession(node_model("GRU", feeds, {}), host=host).run(None, feeds)
    model = _with_initializers(node_model("GRU", dict(feeds), {}), dict(feeds), ["W", "R"])
    node = model.graph.node[0]
    node.input[3] = "B_computed"
    model.graph.node.insert(0, helper.make_node("Identity", ["B"], ["B_computed"]))
    session = orc.InferenceSession(model, host=host)
    assert sorted(session.recurrent_nodes[0].dynamic) == ["B", "R", "W"]
    got = session.run(None, {k: v for k, v in feeds.items() if k not in ("W", "R")})
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_more_inputs_or_outputs_than_the_operator_has_are_errors(host):
    # a 7th input of a GRU was ignored under onnxruntime, taken as initial_c (an
    # error) under the reference host (seed 200689)
    model, _ = _gru()
    model.graph.node[0].input.extend(["", "", "", "X"])
    with pytest.raises(RecurrentError, match=r"GRU node '': 7 inputs, GRU has at most 6"):
        orc.InferenceSession(model, host=host)
    model, _ = _gru()
    model.graph.node[0].output.append("Y_c")
    with pytest.raises(RecurrentError, match=r"3 outputs, GRU has at most 2 \(Y, Y_h\)"):
        orc.InferenceSession(model, host=host)


def test_float16_weights_of_another_type_are_an_error(host):
    # a float16 node computes on float32 between Cast nodes under onnxruntime: an int32
    # R was cast and ran, where the reference host said R is int32 (seed 204704)
    feeds = random_inputs("GRU", dtype=np.float16, full=False)
    feeds["R"] = feeds["R"].astype(np.int32)
    model = node_model("GRU", feeds, {})
    with pytest.raises(RecurrentTypeError, match=r"GRU node '': R must have .*got int32"):
        orc.InferenceSession(model, host=host).run(None, feeds)


def test_the_ai_onnx_domain_is_the_default_one(host):
    # onnxruntime reads "ai.onnx" as the default domain; onnx.reference knew only ''
    # ("Domain 'ai.onnx' (node type: 'GRU') is not specified", seed 681)
    model, feeds = _gru()
    expected = orc.InferenceSession(model, host=host).run(None, feeds)
    model.graph.node[0].domain = "ai.onnx"
    got = orc.InferenceSession(model, host=host).run(None, feeds)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
