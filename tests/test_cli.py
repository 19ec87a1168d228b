"""The command line, run as a user would."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx_recurrent

from models import node_model, random_inputs

CLI = [shutil.which("onnx-recurrent") or ""]
SPEECH = str(Path(__file__).parent / "data" / "speech_16k.wav")
if not CLI[0]:
    CLI = [sys.executable, "-m", "onnx_recurrent"]


def _cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_run_bundled_example():
    done = _cli("run")
    assert done.returncode == 0, done.stderr
    assert "output logits: shape [2, 20, 4] float32" in done.stdout
    assert "output h_n: shape [4, 2, 32] float32" in done.stdout
    diff = float(done.stdout.split("from PyTorch's output:")[1].split()[0])
    assert diff < 1e-5


def test_version_is_the_distributions():
    # --version was refused, naming the missing command
    import importlib.metadata

    done = _cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"onnx-recurrent {onnx_recurrent.__version__}"
    assert onnx_recurrent.__version__ == importlib.metadata.version("onnx-recurrent")
    closed = subprocess.run([*CLI, "--help"], stdout=subprocess.DEVNULL, capture_output=False,
                            stderr=subprocess.PIPE, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))  # fmt: skip
    assert closed.returncode == 2 and "standard output: Bad file descriptor" in closed.stderr


def test_python_dash_m_matches_the_script(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "onnx_recurrent", "run", "-o", str(tmp_path / "o.npz")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "o.npz") as saved:
        assert set(saved) == {"logits", "h_n"}


def test_run_model_with_given_and_random_inputs(tmp_path):
    feeds = random_inputs("GRU", full=False)
    model = tmp_path / "gru.onnx"
    onnx.save(node_model("GRU", feeds, {"linear_before_reset": 1}), model)
    for name in ("X", "W"):
        np.save(tmp_path / f"{name}.npy", feeds[name])
    out = tmp_path / "out.npz"
    args = [
        "run",
        str(model),
        "-i",
        f"X={tmp_path / 'X.npy'}",
        "-i",
        f"W={tmp_path / 'W.npy'}",
        "-o",
        str(out),
    ]
    done = _cli(*args)
    assert done.returncode == 0, done.stderr
    assert "input R: shape [1, 9, 3] float32, random (seed 0)" in done.stdout
    assert "input X: shape [5, 3, 4] float32, given" in done.stdout
    with np.load(out) as saved:
        assert saved["Y"].shape == (5, 1, 3, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "/nonexistent.onnx"], "model: no such file '/nonexistent.onnx'"),
        (["run", "{tmp}"], "is a directory, not an .onnx file"),
        (["run", "{empty}"], "empty.onnx' is empty (0 bytes), not an ONNX model"),
        (["run", "{corrupt}"], "corrupt.onnx' is not an ONNX model ("),
        (["run", "{model}", "-i", "X"], "-i expects NAME=VALUE, got 'X'"),
        (["run", "{model}", "-i", "X=/nonexistent.npy"], "-i X=/nonexistent.npy: cannot read"),
        (["run", "{model}", "-i", "X={model}"], "-i X={model}: not a .npy file"),
        (["run", "{model}", "-i", "X={tmp}"], "-i X={tmp}: cannot read it (Is a directory)"),
        (["run", "{model}", "-i", "X={objects}"], "not a readable .npy file (Object arrays"),
        (["run", "{model}", "-i", "={npy}"], "-i expects NAME=VALUE"),
        (["run", "-i", "X={npy}"], "-i needs a model path (the bundled example runs on its"),
        (["run", "{model}", "--seed", "x"], "argument --seed: expected a seed, 0 or more"),
        (["run", "{model}", "--host", "nope"], "argument --host: invalid choice: 'nope'"),
        (["run", "{model}", "-o", "{tmp}/no/o.npz"], "-o {tmp}/no/o.npz: no such directory"),
        (["run", "{unknown_op}", "--host", "reference"], "model: onnx.checker refuses it"),
        (["run", "{model}", "-i", "Z={npy}"], "the model has no input 'Z' (['X', 'W', 'R'])"),
        (["run", "{model}", "-i", "X={npy}", "-i", "X=b.npy"], "-i X: given twice ('{npy}', "),
        (["run", "{model}", "--dim", "T=2", "--dim", "T=3"], "--dim T: given twice ('2', '3')"),
        (["run", "{model}", "--dim", "T=abc"], "--dim T=abc: the value must be a positive"),
        (["run", "{model}", "--dim", "T=0"], "--dim T=0: the value must be a positive"),
        (["run", "{model}", "--dim", "nosuch=3"], "the model has no dim 'nosuch' (N, T)"),
        (["run", "{model}", "--dim", "T"], "--dim expects NAME=VALUE"),
        (["check", "{corrupt}"], "is not an ONNX model"),
        (["check", "{model}", "--dim", "nosuch=3"], "the model has no dim 'nosuch' (N, T)"),
        (["check", "{empty}"], "is empty (0 bytes)"),
        (["check", "{tmp}"], "is a directory, not an .onnx file"),
        (["check", "{model}", "-i", "X={model}"], "-i X={model}: not a .npy file"),
        (["check", "{model}", "--dim", "T=-2"], "--dim T=-2: the value must be a positive"),
        # an ONNX dim is an int64: NumPy's or onnx's own words before
        (["check", "{model}", "--dim", "T=9223372036854775808"], "integer up to 922337203"),
        (["check", "{model}", "--atol", "-1"], "--atol: expected a tolerance, 0 or more"),
        (["check", "{model}", "--peer", "nope"], "argument --peer: invalid choice: 'nope'"),
        (["bench", "--repeat", "0", "--list"], "--repeat: expected a number of rounds, 1 or"),
        (["bench", "--budget", "0", "--list"], "--budget: expected a duration in seconds, more"),
        (["bench", "--threads", "x", "--list"], "--threads: expected a number of threads"),
        (["bench", "--warmup", "-1", "--list"], "--warmup: expected a number of calls, 0 or"),
        (["bench", "--ops", "foo", "--list"], "unknown op 'foo'; choose from gru, lstm, rnn"),
        (["bench", "--json", "{tmp}/no/b.json", "--list"], "--json {tmp}/no/b.json: no such"),
        (["bench", "--models", "--json", "{tmp}/no/b.json", "--list"], "no such directory"),
        (["bench", "--plot", "{tmp}/r.xyz", "--list"], "--plot {tmp}/r.xyz: matplotlib cannot"),
        ([], "onnx-recurrent: error: the following arguments are required: command"),
        (["nosuch"], "onnx-recurrent: error: argument command: invalid choice: 'nosuch'"),
    ],
)
def test_errors_exit_2_with_one_line(tmp_path, args, message):
    """Every bad file or argument: status 2, one line on stderr naming it, no traceback."""
    feeds = random_inputs("RNN", full=False)
    model_proto = node_model("RNN", feeds, {})
    for i, name in ((0, "T"), (1, "N")):
        model_proto.graph.input[0].type.tensor_type.shape.dim[i].dim_param = name
    model = tmp_path / "m.onnx"
    onnx.save(model_proto, model)
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "corrupt.onnx").write_bytes(bytes(range(256)) * 2)
    np.save(tmp_path / "x.npy", feeds["X"])
    np.save(tmp_path / "objects.npy", np.array([{}], dtype=object), allow_pickle=True)
    paths = {"tmp": tmp_path, "model": model, "npy": tmp_path / "x.npy"}
    paths |= {"empty": tmp_path / "empty.onnx", "corrupt": tmp_path / "corrupt.onnx"}
    paths |= {"objects": tmp_path / "objects.npy", "unknown_op": tmp_path / "unknown.onnx"}
    onnx.save(_relu_model(op="NoSuchOp"), paths["unknown_op"])
    done = _cli(*[a.format(**paths) for a in args])
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if "compiling the kernels" not in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    command = f" {args[0]}" if args and args[0] in ("run", "check", "bench") else ""
    assert lines[0].startswith(f"onnx-recurrent{command}: error: "), lines[0]
    assert message.format(**paths) in lines[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
def test_an_unreadable_model_or_input_is_one_line(tmp_path):
    """A file that exists but cannot be read (/proc/self/mem: read fails, even as root)."""
    for args, message in [
        (["run", "/proc/self/mem"], "onnx-recurrent run: error: /proc/self/mem: Input/output"),
        (["check", "/proc/self/mem"], "onnx-recurrent check: error: /proc/self/mem: Input/"),
    ]:
        done = _cli(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(message), done.stderr
    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), path)
    done = _cli("run", str(path), "-i", "x=/proc/self/mem")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "-i x=/proc/self/mem: cannot read it (Input/output error)" in done.stderr


def _relu_model(op: str = "Relu") -> onnx.ModelProto:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _outputs_model() -> onnx.ModelProto:
    """x [2] -> outputs named as numpy.savez's own keywords and as a path, a string
    tensor and a sequence of two tensors."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Identity", ["x"], ["file"]),
        helper.make_node("Neg", ["x"], ["allow_pickle"]),
        helper.make_node("Abs", ["x"], ["a/b"]),
        helper.make_node("Cast", ["x"], ["text"], to=TensorProto.STRING),
        helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
    ]
    outputs = [helper.make_tensor_value_info(n, f, [2]) for n in ("file", "allow_pickle", "a/b")]
    outputs.append(helper.make_tensor_value_info("text", TensorProto.STRING, [2]))
    sequence = helper.make_sequence_type_proto(helper.make_tensor_type_proto(f, [2]))
    outputs.append(helper.make_value_info("seq", sequence))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("host", ["onnxruntime", "reference"])
def test_run_saves_every_output_under_its_name(tmp_path, host):
    """-o: outputs named ``file`` or ``allow_pickle`` (numpy.savez's keywords: a
    TypeError, or dropped), strings (readable without unpickling) and a sequence's
    tensors (``NAME/i``); ``.npz`` appended as numpy does, and said."""
    onnx.save(_outputs_model(), tmp_path / "m.onnx")
    x = np.array([1.5, -2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    done = _cli("run", str(tmp_path / "m.onnx"), "-i", f"x={tmp_path / 'x.npy'}", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"saved: {out}.npz" in done.stdout
    assert "output seq: sequence of 2 tensors ([2] float32, [2] float32)" in done.stdout
    assert "output text: shape [2] " in done.stdout and "'1.5'" in done.stdout
    with np.load(f"{out}.npz") as saved:  # allow_pickle=False
        assert sorted(saved) == ["a/b", "allow_pickle", "file", "seq/0", "seq/1", "text"]
        np.testing.assert_array_equal(saved["file"], x)
        np.testing.assert_array_equal(saved["allow_pickle"], -x)
        np.testing.assert_array_equal(saved["a/b"], np.abs(x))
        np.testing.assert_array_equal(saved["seq/1"], x)
        assert saved["text"].dtype.kind == "U" and saved["text"].astype(np.float32).tolist() == [
            1.5,
            -2.0,
        ]


def test_the_printed_values_of_every_element_type():
    import ml_dtypes

    from onnx_recurrent.tools.cli import _preview

    assert _preview(np.array([0.5, 1 / 3], ml_dtypes.bfloat16)) == "[0.5, 0.333984]"
    assert _preview(np.arange(7, dtype=np.int64)) == "[0, 1, 2, 3, 4 ...]"
    assert _preview(np.array([True, False])) == "[True, False]"
    assert _preview(np.array(["a", "b"], dtype=object)) == "['a', 'b']"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_run_writes_a_pipe_or_a_device_as_named(tmp_path):
    """-o a FIFO or /dev/null: written there (a zip seeks back: made in memory first),
    not to a new ``pipe.npz`` / ``/dev/null.npz`` beside it."""
    import io
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.update(data=fifo.read_bytes()), daemon=True)
    reader.start()
    done = _cli("run", "-o", str(fifo))  # the bundled example
    reader.join(5)
    if reader.is_alive():  # nothing opened the pipe: let the reader go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert done.returncode == 0, done.stderr
    assert f"saved: {fifo}\n" in done.stdout and sorted(os.listdir(tmp_path)) == ["pipe"]
    with np.load(io.BytesIO(got["data"])) as saved:
        assert set(saved) == {"logits", "h_n"}
    beside = os.devnull + ".npz"
    before = os.path.exists(beside)
    done = _cli("run", "-o", os.devnull)
    assert done.returncode == 0, done.stderr
    assert f"saved: {os.devnull}\n" in done.stdout and os.path.exists(beside) == before


@pytest.mark.parametrize(
    "fault", [KeyboardInterrupt(), OSError(28, "No space left on device")], ids=repr
)
def test_a_save_that_fails_leaves_the_old_file(tmp_path, monkeypatch, capsys, fault):
    """Ctrl-C or a full disk while the outputs are written: the file -o names is what
    it was (not truncated, not half written), and no temporary file is left."""
    import zipfile

    from onnx_recurrent.tools import cli

    onnx.save(_relu_model(), tmp_path / "m.onnx")
    out = tmp_path / "out.npz"
    out.write_bytes(b"results of an earlier run")
    opened = zipfile.ZipFile.open

    def failing(self, name, mode="r", **kwargs):
        if mode == "w":
            raise fault
        return opened(self, name, mode, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", failing)
    args = ["run", str(tmp_path / "m.onnx"), "-o", str(out)]
    if isinstance(fault, KeyboardInterrupt):
        assert cli.main(args) == 130
        assert capsys.readouterr().err == "onnx-recurrent run: interrupted\n"
    else:
        assert cli.main(args) == 2
        assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"results of an earlier run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.npz"]


def test_a_map_output_is_refused_before_the_run(tmp_path):
    """-o with an output no .npz can hold (ZipMap's sequence of maps): status 2 before
    the model runs; the run alone prints the maps."""
    from onnx import TensorProto, helper

    zipmap = helper.make_node(
        "ZipMap", ["x"], ["z"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]
    )
    maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, []))
    )
    graph = helper.make_graph(
        [zipmap],
        "g",
        [helper.make_tensor_value_info("x", 1, [1, 2])],
        [helper.make_value_info("z", maps)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), tmp_path / "m.onnx")
    done = _cli("run", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.npz"))
    assert done.returncode == 2
    assert "-o " in done.stderr and "output 'z' is a seq(map(int64,tensor(float)))" in done.stderr
    assert "input x" not in done.stdout and not (tmp_path / "o.npz").exists()
    done = _cli("run", str(tmp_path / "m.onnx"))
    assert done.returncode == 0, done.stderr
    assert "output z: sequence of 1 maps [{0: " in done.stdout


def test_run_output_naming_an_input_is_refused(tmp_path):
    """-o naming the model or a -i file (as given, through a link): status 2, one
    line, the file untouched. Before, the model became the .npz (status 0) and the
    next run failed on it."""
    model = tmp_path / "model.onnx"
    shutil.copy(Path(onnx_recurrent.__file__).parent / "data" / "example_gru.onnx", model)
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 5, 16), np.float32))
    (tmp_path / "alias.onnx").symlink_to(model)
    saved = {p: p.read_bytes() for p in (model, x)}
    for output, given in ((model, ()), (tmp_path / "alias.onnx", ()), (x, ("-i", f"x={x}"))):
        done = _cli("run", str(model), *given, "-o", str(output))
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"-o {output} is the input file" in lines[0], done.stderr
        assert all(p.read_bytes() == content for p, content in saved.items())


def test_an_input_read_from_a_pipe(tmp_path):
    # -i x=/dev/stdin: "cannot read it (File or stream is not seekable.)"
    import io

    model = str(Path(onnx_recurrent.__file__).parent / "data" / "example_gru.onnx")
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 5, 16), np.float32))
    data = buffer.getvalue()
    for given, status, says in (
        (data, 0, "input x: shape [2, 5, 16] float32, given"),
        (data[:100], 2, "-i x=/dev/stdin: not a readable .npy file: its header is bad"),
        (data[:-4], 2, "-i x=/dev/stdin: not a readable .npy file: its header claims shape"),
    ):
        done = subprocess.run(
            [*CLI, "run", model, "-i", "x=/dev/stdin"], input=given, capture_output=True
        )
        assert done.returncode == status, done.stderr
        assert says in (done.stdout + done.stderr).decode()


def test_an_output_spelled_as_a_directory_names_no_file(tmp_path, monkeypatch):
    """``-o x/``, ``x/.`` and ``missing/../x``: the system writes no file there, while
    the path resolved by spelling (``os.path.realpath``) is ``x``: the input ``x``
    was replaced (status 0), and ``-o new/`` wrote a file ``new``."""
    from onnx_recurrent.errors import RecurrentError
    from onnx_recurrent.runtime.files import saving
    from onnx_recurrent.tools.arguments import writable

    model = tmp_path / "model.onnx"
    shutil.copy(Path(onnx_recurrent.__file__).parent / "data" / "example_gru.onnx", model)
    saved = model.read_bytes()
    monkeypatch.chdir(tmp_path)
    for output, says in (
        ("model.onnx/", "names a directory, not a file"),
        ("model.onnx/.", "names a directory, not a file"),
        ("missing/../model.onnx", "no such directory 'missing/..'"),
        ("new/", "names a directory, not a file"),
    ):
        done = _cli("run", "model.onnx", "-o", output)  # (x/ becomes x/.npz, as for savez)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        # the path as given ("-o model.onnx/.npz" named one nobody wrote)
        assert len(lines) == 1 and lines[0].startswith(f"onnx-recurrent run: error: -o {output}:")
        assert model.read_bytes() == saved
        with pytest.raises(RecurrentError, match=says):
            writable(output, "-o")
        with pytest.raises(OSError, match=says), saving(output) as f:
            f.write(b"lost")
        assert model.read_bytes() == saved and not (tmp_path / "new").exists()


def test_an_output_file_is_replaced_with_its_mode_through_its_link(tmp_path, monkeypatch):
    """What -o, --json and --plot write through (:func:`saving`): an existing file keeps
    its mode, a new one gets the umask's, a link stays a link to the new content,
    ``/dev/null`` is written in place (``/dev`` need not be writable); a file that may
    not be written is refused first."""
    from onnx_recurrent.errors import RecurrentError
    from onnx_recurrent.runtime.files import saving
    from onnx_recurrent.tools.arguments import writable

    kept = tmp_path / "kept"
    kept.write_bytes(b"old")
    kept.chmod(0o640)
    with saving(str(kept)) as f:
        f.write(b"new")
    assert kept.read_bytes() == b"new" and kept.stat().st_mode & 0o777 == 0o640
    umask = os.umask(0o027)
    try:
        with saving(str(tmp_path / "fresh")) as f:
            f.write(b"x")
    finally:
        os.umask(umask)
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o640
    link = tmp_path / "link"
    link.symlink_to(kept)
    with saving(str(link)) as f:
        f.write(b"through the link")
    assert link.is_symlink() and kept.read_bytes() == b"through the link"
    if os.path.exists(os.devnull):
        with saving(os.devnull) as f:
            f.write(b"nothing")
        assert not os.path.isfile(os.devnull)
        monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) == os.devnull)
        writable(os.devnull, "-o")  # a device: its directory need not be writable
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != str(kept))
    with pytest.raises(RecurrentError, match=r"-o .*kept: the file is not writable"):
        writable(str(kept), "-o")


def test_a_failed_rename_names_the_file_meant_not_the_temporary_one(tmp_path):
    """A directory where the file goes: the error named ``.tmp-x3pgho9e``, gone since."""
    from onnx_recurrent.backends import cache_dirs

    (tmp_path / "out.png").mkdir()
    with pytest.raises(IsADirectoryError) as caught, cache_dirs.replacing(tmp_path / "out.png"):
        pass
    assert caught.value.filename == str(tmp_path / "out.png")
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


def test_a_cache_file_interrupted_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The caches' write_atomic and the tools' saving share :func:`replacing`: a
    KeyboardInterrupt while writing removes the temporary file and propagates."""
    from onnx_recurrent.backends import cache_dirs

    target = tmp_path / "plan.json"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), cache_dirs.replacing(target) as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    assert target.read_bytes() == b"old"
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("no")))
    assert cache_dirs.write_atomic(target, b"new") is False
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_a_file_closed_by_its_text_wrapper_is_still_written(tmp_path):
    # a TextIOWrapper over the file (vad's rows) closes it first: the unnamed file's
    # descriptor went with it ("flush of closed file", every vad -o)
    import io

    from onnx_recurrent.backends import cache_dirs

    target = tmp_path / "rows.csv"
    with cache_dirs.replacing(target, 0o640) as f, io.TextIOWrapper(f, encoding="utf-8") as text:
        text.write("file,start\n")
    assert target.read_text() == "file,start\n" and [p.name for p in tmp_path.iterdir()] == [
        "rows.csv"
    ]
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGKILL", "SIGUSR1", "SIGALRM"])
def test_a_file_being_written_when_the_process_is_ended_leaves_no_temporary_file(tmp_path, name):
    """``kill``, ``timeout`` or a closed terminal while an output is written: the
    process still ends by that signal, the old file is as it was, and the temporary
    file beside it is gone (it was left, hidden, before). SIGKILL, and the signals
    whose default ends the process without a handler of ours, left it until the file
    was written without a name (Linux's O_TMPFILE)."""
    from children import interrupted

    signum = getattr(signal, name)
    if name not in ("SIGTERM", "SIGHUP") and not hasattr(os, "O_TMPFILE"):
        pytest.skip("needs unnamed files (O_TMPFILE)")
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")
    status, out, err = interrupted(
        f"""
        import time
        from onnx_recurrent.backends.cache_dirs import replacing
        with replacing({str(target)!r}) as f:
            f.write(b"half")
            f.flush()
            print("ready", flush=True)
            time.sleep(60)
        """,
        delay=0.2,
        timeout=60,
        signum=signum,
    )
    assert status == -signum, (status, out, err)
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]
    assert target.read_bytes() == b"old"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_standard_output_that_cannot_be_written_is_named():
    """``> /dev/full`` (a full disk): the error was the bare "No space left on
    device", naming nothing."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*CLI, "run"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=600
        )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "compiling" not in line]
    assert lines == ["onnx-recurrent run: error: standard output: No space left on device"], (
        done.stderr
    )


@pytest.mark.parametrize("command", [["run"], ["vad", SPEECH]])
def test_a_closed_standard_output_is_an_error_not_a_silent_loss(command):
    """``>&-``: Python sets ``sys.stdout`` to None, and the output was dropped with
    status 0 (``cat`` says "Bad file descriptor", status 1). It is now the error a
    standard output that cannot be written gives; ``--help`` still runs (-OO too)."""
    done = subprocess.run(
        [*CLI, *command], stderr=subprocess.PIPE, text=True, timeout=600, preexec_fn=_close_1
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "compiling" not in line]
    prog = " ".join(["onnx-recurrent", command[0]])
    assert lines == [f"{prog}: error: standard output: Bad file descriptor"], done.stderr
    for flags in ([], ["-OO"]):
        done = subprocess.run(
            [sys.executable, *flags, "-m", "onnx_recurrent", command[0], "--help"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def _close_1() -> None:
    os.close(1)


def test_an_empty_or_corrupt_model_is_a_value_error_naming_it(tmp_path):
    """InferenceSession, not only the command line: a clear ValueError naming the model."""
    import onnx_recurrent as orc

    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "bad.onnx").write_bytes(b"\xff" * 64)
    cases = [
        (str(tmp_path / "empty.onnx"), r"model '.*empty\.onnx' is empty \(0 bytes\)"),
        (tmp_path / "bad.onnx", r"model '.*bad\.onnx' is not an ONNX model \("),
        (b"", r"model given as bytes is empty \(0 bytes\)"),
        (b"\xff" * 64, r"model given as bytes is not an ONNX model \("),
        (str(tmp_path), r"model '.*' is a directory, not an \.onnx file"),
    ]
    for model, match in cases:
        with pytest.raises(ValueError, match=match):
            orc.InferenceSession(model)
    # a device was read until memory ran out (/dev/zero: 21 GB, killed); a file past
    # protobuf's limit read whole (a 20 GB sparse file) before protobuf refused it
    if os.path.exists("/dev/zero"):
        with pytest.raises(ValueError, match=r"model '/dev/zero' is not a file \(a device\)"):
            orc.InferenceSession("/dev/zero")
    with open(tmp_path / "sparse.onnx", "wb") as f:
        f.truncate((2 << 30) + 1)  # no blocks: a hole
    with pytest.raises(ValueError, match=r"holds more than 2147483647 bytes"):
        orc.InferenceSession(str(tmp_path / "sparse.onnx"))


def test_a_model_without_recurrent_nodes_runs_and_says_so(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    empty = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "user")}  # nothing compiled yet
    for host in ("onnxruntime", "reference"):
        done = subprocess.run(
            [*CLI, "run", str(path), "--host", host], capture_output=True, text=True, env=empty
        )
        assert done.returncode == 0, done.stderr
        assert "has no GRU, RNN or LSTM node: onnx-recurrent computes nothing" in done.stdout
        assert "output y: shape [1, 4] float32" in done.stdout
        assert "compiling" not in done.stderr  # said 1-3 minutes, and compiled nothing


def test_a_command_loads_only_its_own_modules():
    """``run`` does not import the benchmark harness nor check; ``--help`` lists all."""
    code = "import sys; from onnx_recurrent.tools import cli; cli.main(['run', '--help'])"
    done = subprocess.run(
        [sys.executable, "-c", code + "\n", "-"], capture_output=True, text=True, timeout=60
    )
    assert "usage: onnx-recurrent run" in done.stdout
    probe = (
        "import sys\nfrom onnx_recurrent.tools import cli\n"
        "cli.build_parser('run')\n"
        "print(sorted(m for m in sys.modules if m.startswith('onnx_recurrent.tools.')"
        " and m.split('.')[2] in ('bench', 'check', 'vad', 'dask')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    help_text = _cli("--help").stdout
    assert all(name in help_text for name in ("run", "check", "bench"))


def test_the_listed_help_is_what_each_subcommand_registers():
    """``COMMANDS`` repeats each subcommand's one-line help (so as not to import it)."""
    from onnx_recurrent.tools import cli

    assert cli.build_parser().format_help() == cli.build_parser("run").format_help()


def test_first_use_says_the_kernels_compile_once(tmp_path):
    import os

    # both caches empty: numba's kernels and the native nodes' machine code
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "user"),
    }

    def run():
        return subprocess.run([*CLI, "run"], capture_output=True, text=True, timeout=300, env=env)

    first, second = run(), run()
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    line = [s for s in first.stderr.splitlines() if "compiling the kernels" in s]
    assert len(line) == 1 and "once; cached in" in line[0] and str(tmp_path) in line[0]
    assert "compiling" not in second.stderr


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_first_use_is_said_of_the_kernels_the_model_needs(dtype, monkeypatch, capsys):
    """A float64 or float16 model's run said "compiling ... on first use" on every run
    while no float32 native node was cached (all the note asked about). Each type has
    its own native code."""
    from onnx_recurrent.backends import jit_cache, native_code
    from onnx_recurrent.tools import arguments

    model = node_model("GRU", random_inputs("GRU", dtype=dtype, full=False), {"hidden_size": 3})
    elements = arguments.recurrent_elements(model)
    assert elements == {onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}
    held = {f"compute-{np.dtype(dtype).name}"}  # float32's never compiled
    monkeypatch.setattr(native_code, "cached", lambda kind: (kind in held, "/c"))
    monkeypatch.setattr(jit_cache, "cache_state", lambda: (False, "/c"))
    arguments.note_first_use(layers=False, elements=elements)
    assert capsys.readouterr().err == ""
    arguments.note_first_use(layers=False)  # a float32 model: its code is not cached
    assert "compiling the kernels" in capsys.readouterr().err


def test_run_feeds_a_name_with_equals_and_draws_shared_dims_from_given(tmp_path):
    # '-i x=a b=FILE' was split at the first '=' ("the model has no input 'x'"), and a
    # dim named in a given input (L: [N]) was drawn anew for X ([8, 8, 4]: refused)
    from onnx import TensorProto, helper, numpy_helper

    feeds = random_inputs("GRU", T=5, N=3, I=4, H=6, D=1)
    graph = helper.make_graph(
        [helper.make_node("GRU", ["x=a b", "W", "R", "", "L"], ["Y", "Yh"], hidden_size=6)],
        "g",
        [
            helper.make_tensor_value_info("x=a b", TensorProto.FLOAT, ["T", "N", 4]),
            helper.make_tensor_value_info("L", TensorProto.INT32, ["N"]),
        ],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(feeds[n], n) for n in ("W", "R")],
    )
    model = tmp_path / "gru.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]), model)
    np.save(tmp_path / "X.npy", feeds["X"])
    np.save(tmp_path / "L.npy", np.array([5, 2, 1], np.int32))
    done = _cli("run", str(model), "-i", f"L={tmp_path / 'L.npy'}")
    assert done.returncode == 0, done.stderr
    assert "input x=a b: shape [8, 3, 4] float32, random (seed 0)" in done.stdout
    given = ["-i", f"x=a b={tmp_path / 'X.npy'}", "-i", f"L={tmp_path / 'L.npy'}"]
    done = _cli("run", str(model), *given)
    assert done.returncode == 0, done.stderr
    assert "input x=a b: shape [5, 3, 4] float32, given" in done.stdout


@pytest.mark.parametrize("where", ["onnx", "argparse", "numpy"])
def test_ctrl_c_while_the_command_loads_is_one_line(where):
    # a Ctrl-C while onnx imported (0.4 s with ml_dtypes 0.7) or the parser was built
    # printed Python's traceback: the console script imported tools/cli before main ran
    code = f"""
import builtins, sys
real = builtins.__import__

def importing(name, *args, **kwargs):
    if name == {where!r}:
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)

builtins.__import__ = importing
import importlib.metadata
(script,) = importlib.metadata.entry_points(group="console_scripts", name="onnx-recurrent")
sys.exit(script.load()(["vad", "x.wav"]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (130, "onnx-recurrent vad: interrupted\n")


def test_the_console_script_names_every_command_as_the_parser_does():
    # tools.main names the command in its one line without importing cli (Ctrl-C while
    # it loads): its list must be cli's
    from onnx_recurrent import tools
    from onnx_recurrent.tools import cli

    assert tools._COMMANDS == tuple(cli.COMMANDS)


def test_bfloat16_inputs_and_outputs_go_through_files(tmp_path):
    # numpy.save writes ml_dtypes' bfloat16 as raw bytes, |V2: -o saved outputs so, and
    # -i refused such a file ("got |V2"): no bfloat16 input could be given as a file
    import ml_dtypes

    feeds = random_inputs("GRU", T=4, N=2, I=3, H=5, dtype=ml_dtypes.bfloat16)
    feeds = {k: feeds[k] for k in ("X", "W", "R", "B")}
    model = tmp_path / "bf16.onnx"
    onnx.save(node_model("GRU", feeds, {}, constants=("W", "R", "B")), model)
    np.save(tmp_path / "X.npy", feeds["X"])
    assert np.load(tmp_path / "X.npy").dtype == np.dtype("V2")
    out = tmp_path / "out.npz"
    done = _cli("run", str(model), "-i", f"X={tmp_path / 'X.npy'}", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "input X: shape [4, 2, 3] bfloat16, given" in done.stdout
    weights = {k: v for k, v in feeds.items() if k != "X"}
    want = onnx_recurrent.gru(feeds["X"], **weights)
    with np.load(out) as saved:
        for name, value in zip(("Y", "Y_h"), want, strict=True):
            np.testing.assert_array_equal(saved[name].view(ml_dtypes.bfloat16), value)


def test_a_dim_that_a_given_input_contradicts_is_refused(tmp_path):
    # --dim batch=3 with an x of batch 2: ignored (status 0), or taken by the inputs
    # drawn at random and refused by the model later
    model = str(Path(onnx_recurrent.__file__).parent / "data" / "example_gru.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 5, 16), np.float32))
    done = _cli("run", model, "--dim", "batch=3", "-i", f"x={tmp_path / 'x.npy'}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "onnx-recurrent run: error: --dim batch=3 disagrees with -i x: its array has 2 "
        "on axis 0 (shape [2, 5, 16])"
    )
    done = _cli("run", model, "--dim", "batch=2", "-i", f"x={tmp_path / 'x.npy'}")
    assert done.returncode == 0, done.stderr


def test_a_ctrl_c_swallowed_in_a_finalizer_still_stops_the_command(monkeypatch, capsys):
    # a Ctrl-C landing in distributed's Future.__del__ was printed as "Exception ignored"
    # and lost: vad --workers went on to the end, status 0
    from onnx_recurrent.tools import arguments, cli

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt

    def command(args):
        Finalized()  # collected at once: its KeyboardInterrupt cannot be raised
        return 0

    monkeypatch.setattr(cli, "cmd_run", command)
    assert cli.main(["run"]) == 130
    assert capsys.readouterr().err == "onnx-recurrent run: interrupted\n"
    before = sys.unraisablehook
    with arguments.lost_interrupts():
        Finalized()
        with pytest.raises(KeyboardInterrupt):
            arguments.raise_lost_interrupt()
        arguments.raise_lost_interrupt()  # raised once
    assert sys.unraisablehook is before


def test_ctrl_c_is_one_line_and_status_130_with_the_old_output_kept(tmp_path):
    # was: Python's traceback of KeyboardInterrupt
    import signal
    import time

    feeds = random_inputs("LSTM", T=8, N=16, I=8, H=256, D=1, full=False)
    model = node_model("LSTM", feeds, {}, outputs=("", "Y_h"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    path = tmp_path / "lstm.onnx"
    onnx.save(model, path)
    for name in ("W", "R"):
        np.save(tmp_path / f"{name}.npy", feeds[name])
    out = tmp_path / "out.npz"
    out.write_bytes(b"an earlier run's file")
    child = subprocess.Popen(
        [*CLI, "run", str(path), "--dim", "T=200000", "-o", str(out)]
        + [f"-i{n}={tmp_path / n}.npy" for n in ("W", "R")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in child.stdout:  # the inputs are printed just before the run
        if line.startswith("input X"):
            break
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert err.strip().endswith("onnx-recurrent run: interrupted") and "Traceback" not in err
    assert out.read_bytes() == b"an earlier run's file"


@pytest.mark.parametrize(
    ("args", "message"),
    [  # were: a ValueError from numpy after the work, a dropped peer or a hang, a
        # whole bench, cases timed twice, nothing written, one file overwritten
        (["run", "--seed", "-1"], "argument --seed: expected a seed, 0 or more, got '-1'"),
        (["bench", "--list", "--seed", "-1"], "argument --seed: expected a seed"),
        (["bench", "--list", "--threads", "2147483648"], "at most 4096, got '2147483648'"),
        (["bench", "--list", "--background-load", "100000"], "at most 256, got '100000'"),
        (["bench", "--list", "--budget", "inf"], "expected a duration in seconds, more than 0"),
        (["bench", "--list", "--ops", "gru,GRU"], "op 'GRU' given twice"),
        (["bench", "--list", "--shapes", "step,step"], "shape 'step' given twice"),
        (["run", "-o", ""], "argument -o/--output: expected a file name, got ''"),
        (["bench", "--list", "--json", ""], "argument --json: expected a file name"),
        (["vad", "-o", "", "a.wav"], "argument -o/--output: expected a file name"),
        # '-' wrote files named '-.npz' and '-' where standard output was meant
        (["run", "-o", "-"], "argument -o/--output: expected a file name, got '-'"),
        (["bench", "--list", "--json", "-"], "argument --json: expected a file name, got '-'"),
        (["vad", "--plot", "-", "a.wav"], "argument --plot: expected a file name, got '-'"),
    ],
)
def test_bad_numbers_names_and_file_names_exit_2_before_the_work(args, message):
    done = _cli(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_json_and_plot_on_one_file_or_a_full_device_are_named(tmp_path):
    same = str(tmp_path / "same.png")
    done = _cli("bench", "--list", "--json", same, "--plot", same)
    assert done.returncode == 2 and f"--json and --plot name one file, {same}" in done.stderr
    if os.path.exists("/dev/full"):  # was "error: No space left on device": which file?
        done = _cli("run", "-o", "/dev/full")
        assert done.returncode == 2
        assert "error: /dev/full: No space left on device" in done.stderr, done.stderr


def test_dims_too_large_for_the_memory_name_the_input(tmp_path):
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, {"hidden_size": 3})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    onnx.save(model, tmp_path / "gru.onnx")
    done = _cli("run", str(tmp_path / "gru.onnx"), "--dim", "T=1000000000000")
    assert done.returncode == 2
    assert "input 'X': drawing shape [1000000000000, 3, 4] needs" in done.stderr, done.stderr
    # more elements than NumPy can index: its ValueError ("array is too big") before
    done = _cli("run", str(tmp_path / "gru.onnx"), "--dim", "T=9223372036854775807")
    assert done.returncode == 2
    assert "input 'X': drawing shape [9223372036854775807, 3, 4] needs" in done.stderr


def test_closed_stderr_keeps_the_rows_on_stdout_clean(tmp_path):
    """stderr closed (``2>&-``, as some daemons start tools): Python's print sent the
    error lines to stdout; vad's progress bar asked None whether it was a terminal."""
    feeds = random_inputs("GRU", full=False)
    model = node_model("GRU", feeds, {"hidden_size": 3})
    onnx.save(model, tmp_path / "gru.onnx")
    done = subprocess.run(
        [*CLI, "run", str(tmp_path / "gru.onnx"), "--dim", "nosuch=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=120,
        pass_fds=(),
        close_fds=True,
        preexec_fn=lambda: os.close(2),
    )
    assert done.returncode == 2
    assert "error" not in done.stdout, done.stdout


def test_a_failing_node_is_one_line_without_onnxruntimes_log(tmp_path):
    """onnxruntime logged the failing custom node on stderr (in colour, under its
    internal names) before the command's own line."""
    pytest.importorskip("onnxruntime_extensions")
    feeds = random_inputs("GRU", full=False)
    feeds["sequence_lens"] = np.array([9, 1, 1], np.int32)  # past T = 5
    model = node_model("GRU", feeds, {"hidden_size": 3})
    onnx.save(model, tmp_path / "gru.onnx")
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    done = _cli("run", str(tmp_path / "gru.onnx"), "--host", "onnxruntime", *args)
    assert done.returncode == 2
    lines = [s for s in done.stderr.splitlines() if "compiling the kernels" not in s]
    assert len(lines) == 1 and "sequence_lens" in lines[0], done.stderr
    assert "onnxruntime" not in lines[0].split("error:")[0]


def test_ctrl_c_while_onnxruntime_is_imported_is_one_line(monkeypatch, capsys):
    # the command's first step, importing onnxruntime to quiet its log, was outside
    # the handling: a traceback (or "ImportError: initialization failed")
    from onnx_recurrent.tools import cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_quiet_onnxruntime", interrupted)
    assert cli.main(["run", "--seed", "1"]) == 130
    assert capsys.readouterr().err == "onnx-recurrent run: interrupted\n"


def _main(*argv: str) -> int:
    """``onnx-recurrent ARGV...`` in this process; its exit status (argparse's too)."""
    from onnx_recurrent.tools import cli

    try:
        return cli.main(list(argv))
    except SystemExit as e:  # a usage error that argparse reports itself
        return int(e.code)


def test_run_output_naming_the_models_external_data_is_refused(tmp_path, capsys):
    """-o naming the file that the model keeps its weights in (external data) was
    written over: the model could not be loaded again."""
    feeds = random_inputs("GRU", full=False)
    model = tmp_path / "m.onnx"
    onnx.save(
        node_model("GRU", feeds, {"hidden_size": 3}, constants=("W", "R")),
        model,
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    data = tmp_path / "m.data"
    before = data.read_bytes()
    (tmp_path / "alias.data").symlink_to(data)
    for output in (data, tmp_path / "alias.data"):
        assert _main("run", str(model), "-o", str(output)) == 2
        err = capsys.readouterr().err
        assert f"-o {output} is the input file {data} (the model's external data)" in err, err
        assert data.read_bytes() == before
    assert _main("run", str(model), "-o", str(tmp_path / "out.npz")) == 0


def test_run_output_naming_the_bundled_examples_files_is_refused(tmp_path, capsys, monkeypatch):
    """``run -o`` naming the bundled example's expected outputs made the self-check
    compare the outputs with themselves from then on; its input, broke ``run`` for
    good (status 0 both times)."""
    from onnx_recurrent.tools import cli

    package = Path(str(cli._data(cli.EXAMPLE))).parent
    for name in (cli.EXAMPLE, cli.EXAMPLE_INPUT, cli.EXAMPLE_EXPECTED):
        shutil.copy(package / name, tmp_path / name)
    monkeypatch.setattr(cli, "_data", lambda name: tmp_path / name)  # copies: kept safe
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for name in (cli.EXAMPLE_EXPECTED, cli.EXAMPLE_INPUT):
        feeds = random_inputs("GRU", full=False)
        (tmp_path / "m.onnx").write_bytes(
            node_model("GRU", feeds, {"hidden_size": 3}).SerializeToString()
        )
        for given in ([], [str(tmp_path / "m.onnx")]):
            assert _main("run", *given, "-o", str(tmp_path / name)) == 2
            err = capsys.readouterr().err
            assert f"is the input file {tmp_path / name} (the bundled example's)" in err, err
        (tmp_path / "m.onnx").unlink()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept


def test_an_output_that_is_standard_output_is_refused_where_a_report_goes():
    """``run -o /dev/stdout | cat > x.npz``: the report's lines went into the .npz
    (status 0, the file unreadable); ``bench --json`` the same."""
    if not os.path.exists("/dev/stdout"):
        pytest.skip("no /dev/stdout")
    for command in (["run", "-o", "/dev/stdout"], ["bench", "--json", "/dev/stdout"]):
        done = subprocess.run(
            [sys.executable, "-m", "onnx_recurrent", *command],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "/dev/stdout: is standard output, where the report is printed" in done.stderr
        assert done.stdout == ""


def test_an_onnxruntime_that_fails_to_import_stops_only_what_needs_it(tmp_path):
    """An onnxruntime installed but broken (its shared library missing) stopped every
    command, --host reference too, with its bare ImportError; the library said
    "libonnxruntime.so: ... is not installed"."""
    fake = tmp_path / "broken" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("libonnxruntime.so: cannot open shared object file")\n'
    )
    feeds = random_inputs("GRU", full=False)
    model = tmp_path / "gru.onnx"
    onnx.save(node_model("GRU", feeds, {"hidden_size": 3}, constants=("W", "R")), model)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path / "broken"), os.path.dirname(__file__), env.get("PYTHONPATH", "")]
    )

    def cli(*args):
        return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=300)

    done = cli("run", str(model), "--host", "reference")
    assert done.returncode == 0 and "host: reference" in done.stdout, done.stderr
    why = "onnxruntime failed to import (ImportError: libonnxruntime.so: cannot open shared"
    done = cli("run", str(model), "--host", "onnxruntime")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: RuntimeError: host='onnxruntime' cannot run this model: {why}" in done.stderr
    done = cli("run", str(model))  # auto: the reference host, with the reason
    assert done.returncode == 0 and "host: reference" in done.stdout, done.stderr
    assert f"warning: the reference host runs this model ({why}" in done.stderr, done.stderr
    assert "is not installed" not in done.stderr


def test_run_feeds_an_overridable_initializer(tmp_path, capsys):
    """An initializer that the graph also lists as an input: onnxruntime and
    InferenceSession take a feed of it, -i said "the model has no input 'W'"."""
    from onnx import numpy_helper

    feeds = random_inputs("GRU", full=False)
    proto = node_model("GRU", feeds, {"hidden_size": 3}, constants=("R",))
    proto.graph.initializer.append(numpy_helper.from_array(feeds["W"], "W"))
    onnx.save(proto, tmp_path / "over.onnx")
    np.save(tmp_path / "w.npy", np.zeros_like(feeds["W"]))
    out = tmp_path / "out.npz"
    for host in ("onnxruntime", "reference"):
        argv = ["run", str(tmp_path / "over.onnx"), "-i", f"W={tmp_path / 'w.npy'}"]
        assert _main(*argv, "--host", host, "-o", str(out)) == 0, capsys.readouterr().err
        assert "input W: shape [1, 9, 4] float32, given" in capsys.readouterr().out
        with np.load(out) as saved:  # W = 0 and no bias: every gate's input is 0
            assert not saved["Y"].any()
    assert _main("run", str(tmp_path / "over.onnx"), "-i", f"Z={tmp_path / 'w.npy'}") == 2
    err = capsys.readouterr().err
    assert "the model has no input 'Z' (['X']; overridable initializers ['W'])" in err


def _npy_with_header(path: Path, header: bytes, data: bytes = b"") -> None:
    """A version 1.0 ``.npy`` file of this header text (padded as numpy pads it)."""
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data)


def test_a_npy_with_a_bad_header_names_the_file(tmp_path, capsys):
    """A damaged .npy header gave tokenize's "TokenError: ('EOF in multi-line
    statement', ...)", one claiming petabytes a MemoryError: neither named -i or the
    file."""
    feeds = random_inputs("GRU", full=False)
    onnx.save(node_model("GRU", feeds, {"hidden_size": 3}), tmp_path / "gru.onnx")
    shape = b"'descr': '<f4', 'fortran_order': False, 'shape': "
    cases = {
        "bad": (b"{'descr': 'garbage", "its header is bad (EOF in multi-line statement)"),
        "huge": (
            b"{" + shape + b"(100000000000, 100000, 4), }",
            "its header claims shape [100000000000, 100000, 4] float32, 1.49e+08 GiB of "
            "data, but the file holds 0 bytes after it",
        ),
        "negative": (b"{" + shape + b"(-1, 2, 4), }", "its header is bad (shape [-1, 2, 4])"),
    }
    for name, (header, message) in cases.items():
        path = tmp_path / f"{name}.npy"
        _npy_with_header(path, header)
        assert _main("run", str(tmp_path / "gru.onnx"), "-i", f"X={path}") == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert (
            err == f"onnx-recurrent run: error: -i X={path}: not a readable .npy file: " + message
        )


@pytest.mark.parametrize(
    "args",
    [  # Python's int and float take other scripts' digits (Arabic-Indic 3, fullwidth 3,
        # Arabic-Indic 0 and 1 here) and underscores
        ["run", "{model}", "--dim", "T=\u0663"],
        ["run", "{model}", "--dim", "T=1_000"],
        ["run", "{model}", "--seed", "\uff13"],
        ["run", "{model}", "--seed", "1_0"],
        ["check", "{model}", "--atol", "\u0660"],
        ["check", "{model}", "--rtol", "0.0_1"],
        ["bench", "--list", "--budget", "\u0661"],
    ],
)
def test_numbers_are_ascii_decimal_only(tmp_path, capsys, args):
    feeds = random_inputs("GRU", full=False)
    proto = node_model("GRU", feeds, {"hidden_size": 3}, constants=("W", "R"))
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    onnx.save(proto, tmp_path / "gru.onnx")
    args = [a.format(model=tmp_path / "gru.onnx") for a in args]
    assert _main(*args) == 2
    err = capsys.readouterr().err
    given = args[-1]
    assert f"got {given!r}" in err or f"{given}: the value must be a positive" in err, err


def test_bench_json_naming_a_model_it_reads_is_refused(tmp_path):
    """``bench models --json`` over a model the run reads (from
    $ONNX_RECURRENT_MODELS_DIR, the package's example, silero's) replaced it with the
    report, status 0; ``run -o`` and ``vad -o`` refuse the same."""
    models = tmp_path / "models"
    models.mkdir()
    model = models / "dtln_model_1.onnx"
    shutil.copyfile(Path(__file__).parent / "data" / "models" / "dtln_model_1.onnx", model)
    before = model.read_bytes()
    link = tmp_path / "report.json"
    link.symlink_to(model)
    env = {**os.environ, "ONNX_RECURRENT_MODELS_DIR": str(models)}
    for output in (model, link):
        done = subprocess.run(
            [*CLI, "bench", "models", "-k", "dtln", "--json", str(output), "--list"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert f"--json {output} is {model}, a model file this run reads" in done.stderr
        assert model.read_bytes() == before


def test_a_file_written_whole_leaves_a_c_handler_of_sigterm_alone(tmp_path):
    # replacing() gave SIGTERM a handler of its own where Python's record said the
    # default, and set the default back after: a handler set in C over that record
    # (faulthandler.register(SIGTERM): a dump of the stacks on `kill`) was lost, and a
    # later SIGTERM killed the process without it (probe S). (In a child: signals.)
    code = (
        "import faulthandler, os, signal, sys, time\n"
        "from onnx_recurrent.backends.cache_dirs import write_atomic\n"
        "faulthandler.register(signal.SIGTERM, chain=False)\n"
        "assert write_atomic(sys.argv[1], b'x')\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2)\n"
        "print('alive')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out.bin")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["alive"]
    assert "most recent call first" in done.stderr  # faulthandler's dump
    assert (tmp_path / "out.bin").read_bytes() == b"x"
