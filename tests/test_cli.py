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
    assert "input R: random [1, 9, 3] float32 (seed 0)" in done.stdout
    with np.load(out) as saved:
        assert saved["Y"].shape == (5, 1, 3, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "/nonexistent.onnx"], "no such file"),
        (["run", "{model}", "-i", "X"], "-i expects NAME=VALUE"),
        (["run", "{model}", "-i", "X=/nonexistent.npy"], "cannot read"),
    ],
)
def test_errors_exit_2_with_a_message(tmp_path, args, message):
    model = tmp_path / "m.onnx"
    onnx.save(node_model("RNN", random_inputs("RNN", full=False), {}), model)
    done = _cli(*[a.format(model=model) for a in args])
    assert done.returncode == 2
    assert message in done.stderr


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
