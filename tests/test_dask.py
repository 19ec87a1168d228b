"""The Dask faces: ``dask.run`` over arrays chunked on the batch, and VAD on a cluster
(``vad.cluster.detect``) over many files.

One local cluster of two single-threaded worker processes serves the module. ``run``
must equal one session over the whole batch; ``detect`` must equal the single-process
``detect_files``, keep going past an unreadable file, and complete with every file
exactly once when a worker dies mid-run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import dask.array as da  # noqa: E402

import onnx_recurrent  # noqa: E402
from onnx_recurrent.errors import RecurrentError  # noqa: E402
from onnx_recurrent.tools import dask as ordask  # noqa: E402
from onnx_recurrent.tools import workers  # noqa: E402
from onnx_recurrent.tools.vad import cluster  # noqa: E402

from models import node_model, random_inputs  # noqa: E402

DATA = Path(__file__).parent / "data"
HAS_SILERO = importlib.util.find_spec("silero_vad") is not None
HAS_AUDIO = all(importlib.util.find_spec(m) is not None for m in ("soundfile", "soxr"))
needs_silero = pytest.mark.skipif(not HAS_SILERO, reason="needs silero-vad")
needs_vad = pytest.mark.skipif(
    not (HAS_SILERO and HAS_AUDIO), reason="needs silero-vad, soundfile and soxr"
)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=40,  # the killed worker's errors: expected
    )
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        yield client


# --- run ----------------------------------------------------------------------------------


def free_batch(model, batch_axes: dict[str, int]):
    """The model with its inputs' batch dims named (node_model fixes every dim)."""
    for value in model.graph.input:
        if value.name in batch_axes:
            dim = value.type.tensor_type.shape.dim[batch_axes[value.name]]
            dim.dim_param = "batch"
    return model


def chunked(feeds, batch_axes, size):
    return {
        name: da.from_array(value, chunks={batch_axes[name]: size})
        if name in batch_axes
        else value
        for name, value in feeds.items()
    }


def test_run_lstm_batch_on_axis_1_equals_one_session(client):
    feeds = random_inputs("LSTM", T=6, N=7, seed=3)
    axes = {"X": 1, "sequence_lens": 0, "initial_h": 1, "initial_c": 1}
    model = free_batch(node_model("LSTM", feeds, {"hidden_size": 3}), axes)
    options = None
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime

        options = onnxruntime.SessionOptions()  # carried to the workers, though no pickle
        options.intra_op_num_threads = 1
    outputs = ordask.run(model, chunked(feeds, axes, 3), axes, sess_options=options)
    assert [y.chunks[a] for y, a in zip(outputs, (2, 1, 1), strict=True)] == [(3, 3, 1)] * 3
    got = client.compute(outputs, sync=True)
    want = onnx_recurrent.InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_run_bfloat16_outputs_are_declared_bfloat16(client):
    """The Dask arrays of a bfloat16 model were declared ``|V2`` (void): ``Y_h * 2``
    then raised TypeError, ``Y.mean()`` UFuncTypeError."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    feeds = random_inputs("GRU", T=4, N=6, dtype=ml_dtypes.bfloat16, seed=5, full=False)
    axes = {"X": 1}
    model = free_batch(node_model("GRU", feeds, {"hidden_size": 3}), axes)
    Y, Y_h = ordask.run(model, chunked(feeds, axes, 2), axes, host="reference")
    assert Y.dtype == Y_h.dtype == np.dtype(ml_dtypes.bfloat16)
    want = onnx_recurrent.InferenceSession(model, host="reference").run(None, feeds)
    got = client.compute([Y_h * 2, Y.astype(np.float32).mean()], sync=True)
    np.testing.assert_array_equal(got[0], want[1] * 2)
    np.testing.assert_allclose(got[1], want[0].astype(np.float32).mean(), rtol=1e-6)


def test_run_gru_layout_1_equals_one_session(client):
    feeds = random_inputs("GRU", T=4, N=5, D=2, seed=4)
    feeds["X"] = feeds["X"].transpose(1, 0, 2).copy()
    feeds["initial_h"] = feeds["initial_h"].transpose(1, 0, 2).copy()
    attributes = {"hidden_size": 3, "layout": 1, "direction": "bidirectional"}
    axes = {"X": 0, "sequence_lens": 0, "initial_h": 0}
    model = free_batch(node_model("GRU", feeds, attributes), axes)
    outputs = ordask.run(model, chunked(feeds, axes, 2), axes, host="reference")
    got = client.compute(outputs, sync=True)
    want = onnx_recurrent.InferenceSession(model, host="reference").run(None, feeds)
    assert [y.chunks[0] for y in outputs] == [(2, 2, 1)] * 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@needs_silero
def test_run_silero_streams_equals_one_session(client):
    from onnx_recurrent.tools.vad import silero_model_path

    path = silero_model_path()
    rng = np.random.default_rng(0)
    feeds = {
        "input": rng.uniform(-0.5, 0.5, (5, 576)).astype(np.float32),
        "state": rng.uniform(-0.5, 0.5, (2, 5, 128)).astype(np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }
    axes = {"input": 0, "state": 1}
    output, state = ordask.run(path, chunked(feeds, axes, 2), axes)
    assert (output.chunks[0], state.chunks[1]) == ((2, 2, 1), (2, 2, 1))  # found by probing
    got = client.compute([output, state], sync=True)
    want = onnx_recurrent.InferenceSession(path).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # given explicitly, and wrong
    ordask.run(path, chunked(feeds, axes, 2), axes, output_batch_axes={"stateN": 1})
    with pytest.raises(RecurrentError, match="'stateN': axis 0 does not follow the batch"):
        ordask.run(path, chunked(feeds, axes, 2), axes, output_batch_axes={"stateN": 0})


def test_run_rejects_chunks_that_differ():
    feeds = random_inputs("GRU", N=6)
    axes = {"X": 1, "sequence_lens": 0, "initial_h": 1}
    model = free_batch(node_model("GRU", feeds, {"hidden_size": 3}), axes)
    dask_feeds = chunked(feeds, axes, 3)
    dask_feeds["initial_h"] = da.from_array(feeds["initial_h"], chunks={1: 2})
    with pytest.raises(ValueError, match=r"'X' \(axis 1\): \(3, 3\).*'initial_h' \(axis 1\)"):
        ordask.run(model, dask_feeds, axes)


def test_run_rejects_bad_feeds():
    feeds = random_inputs("GRU", N=6, full=False)
    model = node_model("GRU", feeds, {"hidden_size": 3})
    with pytest.raises(ValueError, match="fixes axis 1 to 6"):
        ordask.run(model, chunked(feeds, {"X": 1}, 3), {"X": 1})
    free_batch(model, {"X": 1})
    with pytest.raises(ValueError, match="'X' has batch axis 1 but is a ndarray"):
        ordask.run(model, feeds, {"X": 1})
    with pytest.raises(ValueError, match="'W' is a Dask array without a batch axis"):
        ordask.run(
            model, {**chunked(feeds, {"X": 1}, 3), "W": da.from_array(feeds["W"])}, {"X": 1}
        )
    with pytest.raises(ValueError, match=r"^missing input\(s\) \['R'\]"):  # no "unknown []"
        ordask.run(model, {"X": da.from_array(feeds["X"]), "W": feeds["W"]}, {"X": 1})
    with pytest.raises(ValueError, match="out of range"):
        ordask.run(model, chunked(feeds, {"X": 1}, 3), {"X": 3})
    dask_feeds = chunked(feeds, {"X": 1}, 3)
    # were: ignored (sess_options), a bare TypeError from a list's index, dask's own
    # "Arrays chunk sizes are unknown" from deep inside
    with pytest.raises(TypeError, match=r"sess_options must be an onnxruntime\.SessionOptions"):
        ordask.run(model, dask_feeds, {"X": 1}, sess_options=5)
    with pytest.raises(TypeError, match=r"batch_axes must be a dict .* got list"):
        ordask.run(model, dask_feeds, ["X"])
    with pytest.raises(TypeError, match=r"output_batch_axes must be a dict .* got list"):
        ordask.run(model, dask_feeds, {"X": 1}, output_batch_axes=[2])
    unknown = dask_feeds["X"][:, dask_feeds["X"][0, :, 0] > -100]  # chunks of nan size
    with pytest.raises(ValueError, match=r"'X' has chunks of unknown size .*compute_chunk_sizes"):
        ordask.run(model, {**dask_feeds, "X": unknown}, {"X": 1})


def _slice_to_longest_model():
    """Y = X[:, :max(L)]: an output whose axis 1 depends on the data (the longest
    length in the batch), so on which batch elements a block holds."""
    from onnx import TensorProto, helper

    def const(name, value):
        tensor = helper.make_tensor(name, TensorProto.INT64, [1], [value])
        return helper.make_node("Constant", [], [name], value=tensor)

    nodes = [
        const("zero", 0),
        const("one", 1),
        helper.make_node("ReduceMax", ["L"], ["m"], keepdims=1),
        helper.make_node("Slice", ["X", "zero", "m", "one"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "T", 3]),
            helper.make_tensor_value_info("L", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", "M", 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gram_model():
    """o = X @ X^T, shape [N, N]: both axes follow the batch."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["X"], ["Xt"]),
            helper.make_node("MatMul", ["X", "Xt"], ["o"]),
        ],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["N", "N"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_session_options_reach_the_workers_as_the_onnxruntime_host_copies_them():
    # the workers' own list of 15 attributes and 3 entries dropped what the host copies
    # (session.set_denormal_as_zero, use_per_session_threads...): one list for both now
    import pickle

    ort = pytest.importorskip("onnxruntime")
    from onnx_recurrent.runtime.hosts.session_options import readable_settings

    so = ort.SessionOptions()
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    so.add_session_config_entry("session.inter_op.spin_duration_us", "0")
    so.use_per_session_threads = False
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    record = pickle.loads(pickle.dumps(workers.options_record(so)))
    carried = workers.session_options(record)
    assert readable_settings(carried) == readable_settings(so)
    assert carried.get_session_config_entry("session.set_denormal_as_zero") == "1"
    assert carried.get_session_config_entry("session.inter_op.spin_duration_us") == "0"
    assert carried.use_per_session_threads is False
    assert workers.options_record(None) is None
    with pytest.raises(TypeError, match=r"sess_options must be an onnxruntime\.SessionOptions"):
        workers.options_record({"intra_op_num_threads": 1})
    with_provider = ort.SessionOptions()
    with_provider.add_provider("CPUExecutionProvider", {})
    with pytest.raises(RecurrentError, match=r"hold execution providers"):
        workers.options_record(with_provider)


def test_run_refuses_outputs_whose_dims_depend_on_the_data_or_the_batch():
    """The shapes were learnt from the first batch element alone: an output trimmed to
    the longest length in its block was declared (4, 2, 3), and ``y.sum()`` gave 6.95
    for 9.75, silently; an output [N, N] declared (6, 1) computed to (6, 2)."""
    import dask

    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 10, 3)).astype(np.float32)
    L = np.array([2, 3, 9, 10])
    feeds = {"X": da.from_array(X, chunks=(2, 10, 3)), "L": da.from_array(L, chunks=2)}
    with dask.config.set(scheduler="synchronous"):
        (y,) = ordask.run(_slice_to_longest_model(), feeds, {"X": 0, "L": 0})
        shapes = r"shape \[2, 10, 3\] for a block of 2, where the first .* gave \[1, 2, 3\]"
        with pytest.raises(RecurrentError, match=r"output 'Y' has a dim that depends on the da"):
            y.sum().compute()
        with pytest.raises(RecurrentError, match=shapes):
            y.compute()
        # a second axis that follows the batch: found by the probe, at the call
        x = da.from_array(rng.standard_normal((6, 3)).astype(np.float32), chunks=(2, 3))
        for given in ({"o": 0}, None):
            with pytest.raises(
                RecurrentError,
                match=r"output 'o' has a dim that depends on the batch: axis 1 besides its "
                r"batch axis 0 \(shape \[1, 1\] at batch 1, \[2, 2\] at batch 2\)",
            ):
                ordask.run(_gram_model(), {"X": x}, {"X": 0}, output_batch_axes=given)


def _blocking_preload(tmp_path: Path) -> str:
    """A worker preload that makes onnx_recurrent unimportable there (a worker whose
    environment lacks the package)."""
    path = tmp_path / "block_onnx_recurrent.py"
    path.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'onnx_recurrent':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _Block())\n"
        "for name in [m for m in sys.modules if m.split('.')[0] == 'onnx_recurrent']:\n"
        "    del sys.modules[name]\n"
    )
    return str(path)


def _within(seconds: float, call):
    """``call()``'s error, or None; fails where it is still running after ``seconds``
    (a daemon thread: a hang cannot hold the test run up)."""
    import threading

    caught = []

    def target():
        try:
            call()
        except BaseException as e:
            caught.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return caught[0] if caught else None


def test_workers_without_the_package_are_an_error_not_a_hang(tmp_path):
    """Workers that cannot import onnx_recurrent never ran a task of ours: ``run`` (its
    probe) and ``vad.cluster.detect`` (its groups) waited forever."""
    import dask

    feeds = random_inputs("GRU", N=4, full=False)
    model = free_batch(node_model("GRU", feeds, {"hidden_size": 3}), {"X": 1})
    dask_feeds = chunked(feeds, {"X": 1}, 2)
    local = distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,  # the preload must not reach this process
        dashboard_address=":0",  # any free port: the module's cluster holds 8787
        preload=[_blocking_preload(tmp_path)],
        silence_logs=50,
    )
    with local, distributed.Client(local, set_as_default=False) as client:
        client.wait_for_workers(1)
        worker = next(iter(client.scheduler_info()["workers"]))
        lacks = rf"1 of the client's 1 workers lack onnx_recurrent.*{worker}: not importable"
        with dask.config.set(scheduler=client):
            error = _within(60, lambda: ordask.run(model, dask_feeds, {"X": 1}))
        assert isinstance(error, RecurrentError) and re.search(lacks, str(error)), error
        files = [str(DATA / "speech_16k.wav")]
        error = _within(60, lambda: list(cluster.detect(client, files)))
        assert isinstance(error, RecurrentError) and re.search(lacks, str(error)), error


def test_a_closed_client_is_named():
    """``vad.detect(..., client=closed)`` failed with ``AttributeError: 'NoneType'
    object has no attribute 'ncores'`` from inside distributed."""
    import dask

    from onnx_recurrent import vad

    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as local:
        client = distributed.Client(local, set_as_default=False)
        client.close()
        for call in (
            lambda: cluster.detect(client, ["a.wav"]),
            lambda: vad.detect(["a.wav"], client=client),
        ):
            with pytest.raises(RecurrentError, match="the client is closed"):
                call()
        # run: a closed client set as the scheduler is refused alike
        feeds = random_inputs("GRU", N=2, full=False)
        model = free_batch(node_model("GRU", feeds, {"hidden_size": 3}), {"X": 1})
        with dask.config.set(scheduler=client):
            with pytest.raises(RecurrentError, match="the client is closed"):
                ordask.run(model, chunked(feeds, {"X": 1}, 1), {"X": 1})


# --- detect -------------------------------------------------------------------------------


def recordings() -> list[str]:
    files = [DATA / "speech_16k.wav", *sorted((DATA / "vad").glob("*"))]
    return [str(f) for f in files if f.suffix in (".wav", ".flac", ".ogg")]


@pytest.fixture(scope="module")
def expected():
    """Each recording's segments from the single-process detect_files."""
    from onnx_recurrent.tools.vad import detect_files

    return dict(detect_files(recordings(), host="onnxruntime"))


@needs_vad
def test_detect_equals_detect_files_in_input_order(client, expected):
    files = [os.path.relpath(recordings()[0]), *recordings() * 3]  # relative: as given
    got = list(cluster.detect(client, files, group_size=2, host="onnxruntime"))
    assert [path for path, _ in got] == files
    assert [segments for _, segments in got] == [expected[os.path.abspath(f)] for f in files]
    # one session per worker, kept from one run to the next
    list(cluster.detect(client, files[:4], group_size=1, host="onnxruntime"))
    counts = client.run(lambda: sum(k[0] == "vad" for k in workers.SESSIONS))
    assert set(counts.values()) == {1}


@needs_vad
def test_vad_detect_passes_group_size_and_retries_to_the_cluster(client, expected):
    # they were taken for segment options ("unknown speech segment option")
    from onnx_recurrent import vad

    files = recordings()
    got = list(vad.detect(files, client=client, group_size=1, retries=0, host="onnxruntime"))
    assert got == [(f, expected[f]) for f in files]
    with pytest.raises(ValueError, match=r"group_size and retries cut the files .*give a client"):
        vad.detect(files, group_size=1, retries=0)


def test_detect_unreadable_file_among_good_ones(client, expected, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not really")
    files = recordings()
    files = [files[0], str(broken), *files[1:], str(tmp_path / "missing.flac")]
    got = list(cluster.detect(client, files, group_size=2, host="onnxruntime"))
    assert [path for path, _ in got] == files
    for path, found in got:
        if path in expected:
            assert found == expected[path]
        else:
            assert isinstance(found, (OSError, ValueError)), found
            assert Path(path).name in str(found)


def _install_killer(victim: str, marker: str) -> None:
    """On a worker: the first group holding ``victim`` kills its worker process."""
    from onnx_recurrent.tools.vad import files as vad

    original = vad.detect_files

    def detect_files(paths, **kwargs):
        if victim in paths and not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)
        return original(paths, **kwargs)

    detect_files.original = original
    vad.detect_files = detect_files


def _remove_killer() -> None:
    from onnx_recurrent.tools.vad import files as vad

    vad.detect_files = getattr(vad.detect_files, "original", vad.detect_files)


@needs_vad
def test_detect_survives_a_worker_killed_mid_run(client, expected, tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    files = recordings() * 3
    victim = files[5]  # in the third group of two
    marker = tmp_path / "killed"
    before = set(client.scheduler_info(n_workers=-1)["workers"])
    client.run(_install_killer, victim, str(marker))
    try:
        got = list(cluster.detect(client, files, group_size=2, host="onnxruntime"))
    finally:
        client.run(_remove_killer)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert marker.exists()  # a worker did die
    assert [path for path, _ in got] == files  # every file, once, in order
    assert [segments for _, segments in got] == [expected[f] for f in files]
    client.wait_for_workers(2)
    assert set(client.scheduler_info(n_workers=-1)["workers"]) != before  # one restarted


@needs_vad
def test_detect_whole_group_failure_is_each_files_error(client):
    files = recordings()[:3]
    got = list(cluster.detect(client, files, model_path="/no/such/model.onnx", retries=0))
    assert [path for path, _ in got] == files
    assert all(isinstance(found, FileNotFoundError) for _, found in got)


def test_detect_checks_its_options_at_the_call(client):
    with pytest.raises(TypeError, match="unknown speech segment option"):
        cluster.detect(client, ["a.wav"], treshold=0.4)
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        cluster.detect(client, ["a.wav"], group_size=0)
    with pytest.raises(ValueError, match="host must be one of"):  # was each file's error
        cluster.detect(client, ["a.wav"], host="bogus")
    with pytest.raises(TypeError, match=r"paths\[1\] must be a path .* got int"):
        cluster.detect(client, ["a.wav", 5])


def test_the_old_path_of_detect_is_the_vad_one():
    """``onnx_recurrent.dask.detect`` (before VAD on a cluster moved to the vad package)
    is ``vad.cluster.detect`` itself; ``dask`` lists ``run`` only."""
    import onnx_recurrent.dask

    assert onnx_recurrent.dask.detect is cluster.detect
    assert ordask.__all__ == ["run"]


# --- run: what the fourth probe found (twenty-sixth session) ------------------------------


def _gru_graph(x_shape, outputs, extra_nodes=(), extra_inputs=(), initializers=(), H=4, I=3):
    """A GRU ``g`` on X (``x_shape``), its weights initializers, and more nodes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    W = rng.standard_normal((1, 3 * H, I)).astype(np.float32)
    R = rng.standard_normal((1, 3 * H, H)).astype(np.float32)
    nodes = [helper.make_node("GRU", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=H, name="g")]
    graph = helper.make_graph(
        [*nodes, *extra_nodes],
        "m",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape), *extra_inputs],
        outputs,
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R"), *initializers],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


@pytest.mark.parametrize("fixed", [1, 2])
def test_run_a_model_that_fixes_its_batch_in_blocks_of_that_batch(fixed):
    """A model exported at batch 1 (no dynamic axes) could not run at all: the probe ran
    it at batch 1 and 2, so one of them was refused, whatever the chunks."""
    import dask
    from onnx import TensorProto, helper

    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", 1, fixed, 4]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, fixed, 4]),
    ]
    model = _gru_graph(["T", fixed, 3], outputs)
    X = np.random.default_rng(0).standard_normal((7, 4, 3)).astype(np.float32)
    session = onnx_recurrent.InferenceSession(model)
    want = [session.run(None, {"X": X[:, b : b + fixed]}) for b in range(0, 4, fixed)]
    with dask.config.set(scheduler="synchronous"):
        Y, Y_h = ordask.run(model, {"X": da.from_array(X, chunks=(-1, fixed, -1))}, {"X": 1})
        np.testing.assert_array_equal(Y.compute(), np.concatenate([w[0] for w in want], 2))
        np.testing.assert_array_equal(Y_h.compute(), np.concatenate([w[1] for w in want], 1))
        given = {"Y": 2, "Y_h": 1}
        (Y, _) = ordask.run(model, {"X": da.from_array(X, chunks=(-1, fixed, -1))}, {"X": 1},
                            output_batch_axes=given)  # fmt: skip
        np.testing.assert_array_equal(Y.compute(), np.concatenate([w[0] for w in want], 2))
        with pytest.raises(ValueError, match=rf"'Y': axis 3 is 4 .*not the batch of {fixed}"):
            ordask.run(model, {"X": da.from_array(X, chunks=(-1, fixed, -1))}, {"X": 1},
                       output_batch_axes={"Y": 3})  # fmt: skip
        with pytest.raises(ValueError, match=rf"fixes axis 1 to {fixed} .*rechunk it"):
            ordask.run(model, {"X": da.from_array(X, chunks=(-1, 3, -1))}, {"X": 1})


def test_run_a_fixed_batch_whose_output_axis_inference_cannot_tell_asks_for_it():
    import dask
    from onnx import TensorProto, helper

    # a Reshape to a shape fed at run time: shape inference knows nothing of "out"
    model = _gru_graph(
        ["T", 2, 3],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [helper.make_node("Reshape", ["Y_h", "s"], ["out"])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
    )
    X = np.zeros((5, 4, 3), np.float32)
    feeds = {"X": da.from_array(X, chunks=(-1, 2, -1)), "s": np.array([2, 4])}
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(ValueError, match=r"'out' .*batch axis cannot be found.*axes \[0\]"):
            ordask.run(model, feeds, {"X": 1})
        (out,) = ordask.run(model, feeds, {"X": 1}, output_batch_axes={"out": 0})
        assert out.compute().shape == (4, 4)


def test_run_names_an_output_that_is_no_tensor():
    """It was an AttributeError from the probe: ``'list' object has no attribute 'shape'``."""
    import dask
    from onnx import TensorProto, helper

    model = _gru_graph(
        ["T", "N", 3],
        [
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None),
            helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None),
        ],
        [helper.make_node("SequenceConstruct", ["Y_h", "Y_h"], ["seq"])],
    )
    X = np.zeros((5, 4, 3), np.float32)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(ValueError, match=r"output 'seq' is a seq\(tensor\(float\)\) .*tensor"):
            ordask.run(model, {"X": da.from_array(X, chunks=(-1, 2, -1))}, {"X": 1})


def test_run_takes_an_overridable_initializer_and_a_static_list():
    """A feed for an initializer that is also a graph input was an unknown input (the
    session and onnxruntime take it); a static input given as a list became float64."""
    import dask
    from onnx import TensorProto, helper, numpy_helper

    shift = np.zeros((1, 1, 4), np.float32)
    model = _gru_graph(
        ["T", "N", 3],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "N", 4])],
        [
            helper.make_node("Add", ["Y_h", "shift"], ["s"]),
            helper.make_node("Add", ["s", "bias"], ["out"]),
        ],
        [
            helper.make_tensor_value_info("shift", TensorProto.FLOAT, [1, 1, 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]),
        ],
        [numpy_helper.from_array(shift, "shift")],
    )
    X = np.random.default_rng(1).standard_normal((5, 4, 3)).astype(np.float32)
    bias = [0.5, 0.25, 0.0, -1.0]
    session = onnx_recurrent.InferenceSession(model)
    with dask.config.set(scheduler="synchronous"):
        for fed in ({}, {"shift": shift + 1}):
            feeds = {"X": da.from_array(X, chunks=(-1, 2, -1)), "bias": bias, **fed}
            (out,) = ordask.run(model, feeds, {"X": 1})
            want = session.run(None, {"X": X, "bias": np.array(bias, np.float32), **fed})
            np.testing.assert_array_equal(out.compute(), want[0])
        with pytest.raises(
            ValueError, match=r"unknown input\(s\) \['W2'\].*override: \['shift'\]"
        ):
            ordask.run(model, {"X": da.from_array(X), "bias": bias, "W2": 1}, {"X": 1})
        # a masked array given whole: refused as by the session (its mask was dropped)
        masked = np.ma.masked_array(np.array(bias, np.float32), mask=[0, 1, 0, 0])
        with pytest.raises(TypeError, match=r"input 'bias': a masked array"):
            ordask.run(model, {"X": da.from_array(X), "bias": masked}, {"X": 1})


def test_run_says_which_rows_a_failing_block_holds():
    """The session's error named ``sequence_lens[0]``, the index in its block (row 4)."""
    import dask

    feeds = random_inputs("GRU", T=7, N=10, seed=4)
    axes = {"X": 1, "sequence_lens": 0, "initial_h": 1}
    feeds["sequence_lens"][4] = 99
    model = free_batch(node_model("GRU", feeds, {"hidden_size": 3}), axes)
    with dask.config.set(scheduler="synchronous"):
        Y, _ = ordask.run(model, chunked(feeds, axes, 2), axes)
        with pytest.raises(
            ValueError, match=r"block of batch rows 4\.\.5 .*sequence_lens\[0\]=99"
        ):
            Y.compute()
