"""What the source distribution holds: enough to run its tests and read its docs.

setuptools' default picks ``tests/test*.py`` alone: the sdist held the tests without
what they import (``conftest``, ``oracle``, ``strategies``, ``tests/data``) and the
README's linked docs, so its tests could not be collected (MANIFEST.in).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_sdist_holds_what_its_tests_and_readme_need(tmp_path):
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("not a source tree")
    # a copy of the tracked files, built as pip builds it (no git, no build isolation)
    tree = tmp_path / "tree"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes((ROOT / name).read_bytes())
    (tree / "src" / "onnx_recurrent" / "__pycache__").mkdir(exist_ok=True)
    (tree / "src" / "onnx_recurrent" / "__pycache__" / "scan.x-1.py311.1.nbc").write_bytes(b"x")
    code = "from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; " + code, str(tmp_path / "dist")],
        cwd=tree, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with tarfile.open(tmp_path / "dist" / done.stdout.split()[-1]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    needed = {
        "tests/conftest.py", "tests/oracle.py", "tests/strategies.py", "tests/models.py",
        "tests/data/speech_16k.wav", "docs/semantics.md", "CHANGELOG.md", "LICENSE",
        "src/onnx_recurrent/data/example_gru.onnx",
    }  # fmt: skip
    assert needed <= names, sorted(needed - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".nbc", ".nbi", ".pyc"))]
