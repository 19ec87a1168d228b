"""The command line, run as a user would."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

from models import node_model, random_inputs

CLI = [shutil.which("onnx-recurrent") or ""]
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
        (["run", "{model}", "-i", "X={model}"], "cannot read it"),
        (["run", "{model}", "-i", "Z={npy}"], "the model has no input 'Z' (['X', 'W', 'R'])"),
        (["run", "{model}", "--dim", "T=abc"], "--dim T=abc: the value must be a positive"),
        (["run", "{model}", "--dim", "T=0"], "--dim T=0: the value must be a positive"),
        (["run", "{model}", "--dim", "nosuch=3"], "the model has no dim 'nosuch' (N, T)"),
        (["run", "{model}", "--dim", "T"], "--dim expects NAME=VALUE"),
        (["check", "{corrupt}"], "is not an ONNX model"),
        (["check", "{model}", "--dim", "nosuch=3"], "the model has no dim 'nosuch' (N, T)"),
        (["check", "{empty}"], "is empty (0 bytes)"),
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
    paths = {"tmp": tmp_path, "model": model, "npy": tmp_path / "x.npy"}
    paths |= {"empty": tmp_path / "empty.onnx", "corrupt": tmp_path / "corrupt.onnx"}
    done = _cli(*[a.format(**paths) for a in args])
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if "compiling the kernels" not in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"onnx-recurrent {args[0]}: error: ")
    assert message in lines[0]


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
    done = _cli("run", str(path))
    assert done.returncode == 0, done.stderr
    assert "the model has no GRU, RNN or LSTM node: onnx-recurrent computes nothing" in done.stdout
    assert "output y: shape [1, 4] float32" in done.stdout


def test_a_command_loads_only_its_own_modules():
    """``run`` does not import the benchmark harness nor check; ``--help`` lists all."""
    code = "import sys; from onnx_recurrent import cli; cli.main(['run', '--help'])"
    done = subprocess.run(
        [sys.executable, "-c", code + "\n", "-"], capture_output=True, text=True, timeout=60
    )
    assert "usage: onnx-recurrent run" in done.stdout
    probe = (
        "import sys\nfrom onnx_recurrent import cli\n"
        "cli.build_parser('run')\n"
        "print(sorted(m for m in sys.modules if m.startswith('onnx_recurrent.')"
        " and m.split('.')[1] in ('bench', 'check')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    help_text = _cli("--help").stdout
    assert all(name in help_text for name in ("run", "check", "bench"))


def test_first_use_says_the_kernels_compile_once(tmp_path):
    import os

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run():
        return subprocess.run([*CLI, "run"], capture_output=True, text=True, timeout=300, env=env)

    first, second = run(), run()
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    line = [s for s in first.stderr.splitlines() if "compiling the kernels" in s]
    assert len(line) == 1 and "once; cached in" in line[0] and str(tmp_path) in line[0]
    assert "compiling" not in second.stderr
