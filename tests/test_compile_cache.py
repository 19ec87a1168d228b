"""A compilation cache that never blocks use (issue 12, item 4).

The package is copied, made read-only and imported from the copy in a fresh process,
with ``NUMBA_CACHE_DIR``, ``HOME`` and ``XDG_CACHE_HOME`` unwritable: numba finds no
directory of its own to cache in. Root writes through file modes, so as root the
process runs without the capabilities that let it (``CAP_DAC_OVERRIDE``,
``CAP_DAC_READ_SEARCH``, dropped from its bounding set).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import onnx_recurrent

jit_cache = pytest.importorskip("onnx_recurrent.backends.jit_cache")

TIMEOUT = 300  # seconds: each process compiles the kernels (10-20 s here)

SCRIPT = """
import json, sys, warnings
import numpy as np

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import onnx_recurrent as orc
    from onnx_recurrent import backends
    from onnx_recurrent.backends import numba_backend, packed

    if sys.argv[1] == "gru":  # every kernel of a layer (about a minute to compile)
        rng = np.random.default_rng(0)
        X = rng.standard_normal((5, 2, 3), dtype=np.float32)
        W = rng.standard_normal((1, 12, 3), dtype=np.float32)
        R = rng.standard_normal((1, 12, 4), dtype=np.float32)
        B = rng.standard_normal((1, 24), dtype=np.float32)
        with backends.use("numba"):
            got = [orc.gru(X, W, R, B) for _ in range(2)]
        with backends.use("numpy"):
            want = orc.gru(X, W, R, B)
    else:  # two small kernels of two modules (seconds)
        from onnx_recurrent.backends.layout import panels
        from onnx_recurrent.backends.plans import CODES

        codes = np.array([CODES["sigmoid"], CODES["tanh"], CODES["tanh"]], np.int64)
        Bp = panels(np.ones((3, 40), np.float32), np.dtype(np.float32))  # aligned
        C = np.zeros((2, Bp.shape[0] * Bp.shape[2]), np.float32)
        got = [[numba_backend._standard(codes, 2, False), packed.check(Bp, 3, C[0], C, 2, 2)]]
        want = [True, True]

hits = sum(
    sum(f.stats.cache_hits.values())
    for module in (numba_backend, packed)
    for f in vars(module).values()
    if hasattr(f, "stats")
)
print(json.dumps({
    "file": orc.__file__,
    "close": all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for g in got for a, b in zip(g, want)),
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    "cache_hits": hits,
}))
"""

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def _drop_file_capabilities() -> None:
    """In the child, before exec: root without the capabilities that ignore file modes."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _preexec():
    return _drop_file_capabilities if os.geteuid() == 0 else None


def _read_only(path: Path) -> None:
    """chmod -R a-w"""
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The package copied and read-only, plus an unwritable directory, or a skip where
    file modes cannot be made to hold for the child process."""
    if not hasattr(os, "geteuid") or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux file modes (and prctl when run as root)")
    root = tmp_path_factory.mktemp("compile_cache")
    package = root / "site" / "onnx_recurrent"
    shutil.copytree(
        Path(onnx_recurrent.__file__).parent,
        package,
        ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"),
    )
    locked = root / "locked"
    locked.mkdir()
    _read_only(package.parent)
    _read_only(locked)
    probe = subprocess.run(
        [sys.executable, "-c", f"open({str(locked / 'probe')!r}, 'w')"],
        preexec_fn=_preexec(),
        capture_output=True,
        text=True,
    )
    if probe.returncode == 0 or "PermissionError" not in probe.stderr:
        pytest.skip(f"cannot make a directory unwritable for a child process: {probe.stderr}")
    yield root
    for p in [root, *root.rglob("*")]:  # let pytest remove it
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)


def _run(sandbox: Path, tmpdir: Path, kernels: str = "gru", locked: bool = True) -> dict:
    """The script in a fresh process on the read-only copy; numba's directories locked
    (``locked``; else numba's own choice, the package's ``__pycache__``); ``kernels``:
    a GRU's, or two small ones ("small")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "ONNX_RECURRENT"))}
    home = sandbox / "locked" if locked else tmpdir
    env.update(
        PYTHONPATH=str(sandbox / "site"),
        PYTHONDONTWRITEBYTECODE="1",
        HOME=str(home / "home"),
        XDG_CACHE_HOME=str(home / "cache"),
        TMPDIR=str(tmpdir),
    )
    if locked:
        env["NUMBA_CACHE_DIR"] = str(home / "numba")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, kernels],
        env=env,
        preexec_fn=_preexec() if locked else None,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert Path(result["file"]).is_relative_to(sandbox / "site"), result["file"]
    assert result["close"]
    return result


def test_uncached_with_one_warning_when_nothing_is_writable(sandbox, tmp_path):
    # the temporary directory is writable, but its entry of ours is not private: refused
    (tmp_path / f"onnx-recurrent-{os.geteuid()}").mkdir()
    (tmp_path / f"onnx-recurrent-{os.geteuid()}").chmod(0o777)
    result = _run(sandbox, tmp_path)
    assert len(result["warnings"]) == 1, result["warnings"]
    (message,) = result["warnings"]
    assert message.startswith("CompileCacheWarning: ")
    assert "without caching" in message
    for tried in ("numba", "__pycache__", "cache/onnx-recurrent/numba", "onnx-recurrent-"):
        assert tried in message
    assert not list(tmp_path.rglob("*.nbi"))


def test_per_user_cache_when_numba_has_none(sandbox, tmp_path):
    # (the GRU's kernels go the same way: the test above compiles them)
    cold = _run(sandbox, tmp_path, "small")
    assert cold["warnings"] == []
    ours = tmp_path / f"onnx-recurrent-{os.geteuid()}"
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700
    assert list((ours / "numba").rglob("*.nbi")) and list((ours / "numba").rglob("*.nbc"))
    warm = _run(sandbox, tmp_path, "small")  # a second process loads what the first compiled
    assert warm["warnings"] == []
    assert warm["cache_hits"] > 0


def test_a_warm_cache_beside_a_package_that_cannot_be_written_is_loaded(sandbox, tmp_path):
    """The package installed with its kernels cached beside it (``__pycache__``: run
    once by whoever installed it, a container image's root), then used by one who
    cannot write there: numba passed that cache over, and every process compiled the
    kernels again (1-3 minutes). Its files are now copied into the cache used."""
    warm = tmp_path / "warm"
    shutil.copytree(
        Path(onnx_recurrent.__file__).parent,
        warm / "site" / "onnx_recurrent",
        ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"),
    )
    (warm / "locked").mkdir()
    (tmp_path / "install").mkdir()
    (tmp_path / "use").mkdir()
    try:
        installed = _run(warm, tmp_path / "install", "small", locked=False)
        assert installed["warnings"] == []
        assert list((warm / "site" / "onnx_recurrent" / "backends" / "__pycache__").glob("*.nbi"))
        _read_only(warm)
        used = _run(warm, tmp_path / "use", "small")
        assert used["warnings"] == [], used["warnings"]
        assert used["cache_hits"] > 0  # loaded, not compiled
        ours = tmp_path / "use" / f"onnx-recurrent-{os.geteuid()}" / "numba"
        assert list(ours.rglob("*.nbi")) and list(ours.rglob("*.nbc"))
        # an earlier install's indexes there, of the same names but stale: nothing was
        # copied, and numba compiled every kernel again without a word
        import pickle

        import numba

        for index in ours.rglob("*.nbi"):
            with open(index, "wb") as f:
                pickle.dump(numba.__version__, f)
                f.write(pickle.dumps((b"an earlier source", {})))
        again = _run(warm, tmp_path / "use", "small")
        assert again["warnings"] == [] and again["cache_hits"] > 0, again
    finally:
        for p in [warm, *warm.rglob("*")]:  # let pytest remove it
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)


def _function_in(directory: Path):
    """A plain function whose source file lies in ``directory``."""
    source = directory / "kernel.py"
    source.write_text("def f(x):\n    return x + 1\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    return namespace["f"]


def test_a_warm_numba_cache_that_cannot_be_copied_is_said(tmp_path, monkeypatch):
    # a warm cache shipped read-only (a container image's) was passed over without a
    # word, and every kernel compiled again (318 s on 2 cores against 1.2 s): its files
    # are copied into the cache used, and where that fails, it is said
    shipped, ours = tmp_path / "shipped", tmp_path / "ours"
    source = tmp_path / "src"
    source.mkdir()
    func = _function_in(source)
    where = jit_cache._user_provided(func, str(source / "kernel.py"), str(shipped))
    os.makedirs(where)
    (Path(where) / "kernel.f-1.py311.nbi").write_bytes(b"index")  # what a warm cache holds
    monkeypatch.setattr(jit_cache, "_cache_roots", {})

    def numba_refuses(func):
        raise RuntimeError("cannot cache function: no locator available")

    monkeypatch.setattr(jit_cache.caching, "FunctionCache", numba_refuses)
    monkeypatch.setattr(jit_cache, "first_usable", lambda kind: (str(ours), [str(ours)]))
    monkeypatch.setattr(jit_cache, "readable_roots", lambda kind: [str(shipped), str(ours)])
    monkeypatch.setattr(jit_cache, "writable", lambda path: not path.startswith(str(shipped)))
    monkeypatch.setattr(jit_cache, "write_atomic", lambda path, data: False)  # a full disk
    with pytest.warns(jit_cache.CompileCacheWarning, match=r"cache in .*shipped.* cannot be"):
        assert jit_cache._cache_root(func) == str(ours)


@pytest.mark.parametrize("numba_cache_dir", [False, True])
def test_numba_choice_kept_where_it_can_write(tmp_path, monkeypatch, numba_cache_dir):
    """A writable ``__pycache__`` or NUMBA_CACHE_DIR: numba's own choice, no warning."""
    monkeypatch.setattr(jit_cache, "_cache_roots", {})
    if numba_cache_dir:
        monkeypatch.setattr(jit_cache.config, "CACHE_DIR", str(tmp_path / "numba"))
    (tmp_path / "src").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel = jit_cache.jit(nogil=True)(_function_in(tmp_path / "src"))
    assert jit_cache._cache_roots == {str(tmp_path / "src"): ""}
    where = tmp_path / "numba" if numba_cache_dir else tmp_path / "src" / "__pycache__"
    assert Path(kernel.stats.cache_path).is_relative_to(where)


TINY = """
from onnx_recurrent.backends.jit_cache import jit


@jit()
def triple(x):
    return x * 3


@jit()
def twice(x):
    return x * 2


@jit()
def sextuple(x):
    return twice(triple(x))


def sextuple_c(x):  # for a cfunc (native code)
    return twice(triple(x))
"""

TINY_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
import numba
from onnx_recurrent.backends.jit_cache import prepare
from tiny import triple
prepare(triple, (numba.float64,))
print(triple(2.0))
"""


@pytest.mark.parametrize("damage", ["empty", "cut", "garbage"])
def test_a_cache_file_cut_short_compiles_without_it(tmp_path, damage):
    """numba's index file emptied or cut short (a process killed while writing it, a
    full disk): every later process failed with an AssertionError (numba's
    ``disable_compile`` hiding its EOFError). Now compiled again and written anew (an
    index that is not sealed is taken for missing)."""
    (tmp_path / "tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}

    def run():
        return subprocess.run(
            [sys.executable, "-c", TINY_RUN, str(tmp_path)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip

    first = run()
    assert first.returncode == 0 and first.stdout.split() == ["6.0"], first.stderr
    files = list((tmp_path / "__pycache__").glob("tiny.triple-*.nbi"))
    assert files
    for path in files:
        data = path.read_bytes()
        path.write_bytes({"empty": b"", "cut": data[:20], "garbage": b"\x80\x04junk"}[damage])
    again = run()
    assert again.returncode == 0 and again.stdout.split() == ["6.0"], again.stderr
    assert "Traceback" not in again.stderr
    # written anew: the process after is quiet (every later one warned and compiled)
    after = run()
    assert after.returncode == 0 and after.stdout.split() == ["6.0"], after.stderr
    assert "compilation cache failed" not in after.stderr


SEXTUPLE_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
import numba
from onnx_recurrent.backends.jit_cache import prepare
from tiny import sextuple, triple, twice
for kernel in {kernels}:
    prepare(kernel, (numba.float64,))
print(sextuple(2.0) if sextuple in {kernels} else triple(2.0))
"""


def test_a_damaged_cache_file_of_a_callee_is_written_anew(tmp_path):
    """A callee's index emptied (a full disk, a crash before the write reached it): the
    next kernel to compile loads it, and numba's EOFError escaped the fall back (which
    turned off the cache of the kernel prepared only), in every process for good."""
    (tmp_path / "tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}

    def run(kernels):
        code = SEXTUPLE_RUN.format(kernels=kernels)
        return subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip

    first = run("[triple, twice]")  # cached, and so is the callee...
    assert first.returncode == 0 and first.stdout.split() == ["6.0"], first.stderr
    for path in (tmp_path / "__pycache__").glob("tiny.triple-*.nbi"):
        path.write_bytes(b"")  # ... cut short
    for _ in range(2):
        done = run("[sextuple]")  # compiles, calling triple
        assert done.returncode == 0 and done.stdout.split() == ["12.0"], done.stderr
    assert "compilation cache failed" not in done.stderr  # written anew by the first
    # the native code's build (a cfunc over the cached callees) likewise
    for path in (tmp_path / "__pycache__").glob("tiny.triple-*.nbi"):
        path.write_bytes(b"")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from onnx_recurrent.backends.jit_cache import cfunc_code\n"
        "from tiny import sextuple_c\n"
        "print(cfunc_code('float64(float64)', sextuple_c)[1].startswith('cfunc'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr[-2000:]


def test_no_memory_to_load_a_kernel_is_a_memory_error_not_a_cache_fault(tmp_path, monkeypatch):
    # under a memory limit, numba failing to load a cached kernel was taken for a file
    # cut short: the cache dropped for the process, with a warning to delete it (a cold
    # compile of minutes for nothing)
    (tmp_path / "tiny.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import numba
    from tiny import triple

    real, calls = triple.compile, []

    def compile(signature):
        calls.append(signature)
        if len(calls) == 1:
            raise MemoryError("std::bad_alloc")
        return real(signature)

    monkeypatch.setattr(triple, "compile", compile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CompileCacheWarning
        with pytest.raises(MemoryError):
            jit_cache.prepare(triple, (numba.float64,))
        jit_cache.prepare(triple, (numba.float64,))  # memory back: it loads or compiles
    assert triple(2.0) == 6.0
    assert not isinstance(triple._cache, jit_cache.caching.NullCache)


NO_TEMPORARY = """
import sys, tempfile

def none_usable():  # as tempfile says when no candidate can be written (a full /tmp)
    raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

tempfile.gettempdir = none_usable
import numpy as np
import onnx_recurrent as orc
from onnx_recurrent.backends import cache_dirs
X = np.ones((2, 1, 3), np.float32)
W = np.full((1, 12, 3), 0.1, np.float32)
print(orc.gru(X, W, np.full((1, 12, 4), 0.1, np.float32))[1].shape)
print([root for root, _ in cache_dirs.our_roots()])
"""


def test_no_usable_temporary_directory_still_imports_and_computes(tmp_path):
    # the temporary directory was looked up on import: a full /tmp (or ulimit -f 0)
    # failed `import onnx_recurrent` and every command with tempfile's error
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", NO_TEMPORARY],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    shape, roots = done.stdout.splitlines()[-2:]
    assert shape == "(1, 1, 4)"
    assert roots == repr([str(tmp_path / "onnx-recurrent" / "numba")])


DAMAGED_RUN = """
import ctypes, sys, warnings
sys.path.insert(0, sys.argv[1])
import numba
from onnx_recurrent.backends.jit_cache import cfunc, prepare
from tiny import sextuple_c, triple
warnings.simplefilter("always")
prepare(triple, (numba.float64,))
native = cfunc("float64(float64)", sextuple_c)
call = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(native.address)
print(triple(2.0), call(2.0), sum(triple.stats.cache_hits.values()), native.cache_hits)
"""


def _tiny(code: str, directory: Path) -> subprocess.CompletedProcess:
    """``code`` run by a child Python given ``directory`` (holding tiny.py), numba's
    cache beside it; it must end with status 0."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_a_cache_file_damaged_on_disk_is_compiled_again_not_run(tmp_path):
    """numba runs the machine code of its cache files as it finds them: a constant
    changed in a data file (a bit flipped on disk, a bad copy) gave a wrong answer in
    every later process (triple(2.0) = 8.0 with 3.0 made 4.0), other flips crashed
    them. Each data file is now sealed with its sha256: it fails the check, its kernel
    is compiled again (one warning) and the file written anew."""
    (tmp_path / "tiny.py").write_text(TINY)

    def run():
        done = _tiny(DAMAGED_RUN, tmp_path)
        return done.stdout.split(), done.stderr

    assert run()[0] == ["6.0", "12.0", "0", "0"]  # compiled, and cached...
    assert run()[0] == ["6.0", "12.0", "1", "1"]  # ... loaded from the cache
    three, four = struct.pack("<d", 3.0), struct.pack("<d", 4.0)
    damaged = 0
    for path in (tmp_path / "__pycache__").glob("tiny.*.nbc"):
        data = path.read_bytes()
        damaged += three in data
        path.write_bytes(data.replace(three, four))
    assert damaged == 2  # triple's and the cfunc's (triple inlined) machine code
    out, err = run()
    assert out == ["6.0", "12.0", "0", "0"], err  # compiled again: not 8.0 nor 17.0
    assert err.count("is damaged (it fails its sha256)") == 1
    out, err = run()  # written anew: loaded, quiet
    assert out == ["6.0", "12.0", "1", "1"] and "damaged" not in err, err


def test_a_flipped_bit_in_an_index_or_a_pipe_for_a_data_file_is_compiled_again(tmp_path):
    """One flipped bit in an index's pickle (a length: 79 of 11320 single flips) made
    every later process fail with MemoryError, never healed; a named pipe put for a data
    file hung every later process. The index is sealed too, and both are read as
    regular files of bounded size, their sha256 checked before anything in them."""
    (tmp_path / "tiny.py").write_text(TINY)
    assert _tiny(TINY_RUN, tmp_path).stdout.split() == ["6.0"]
    cache = tmp_path / "__pycache__"
    (index,) = cache.glob("tiny.triple-*.nbi")
    data = bytearray(index.read_bytes())
    data[-3] ^= 0x10
    index.write_bytes(bytes(data))
    done = _tiny(TINY_RUN, tmp_path)
    assert done.stdout.split() == ["6.0"] and "is damaged (it fails its sha256)" in done.stderr
    (data_file,) = cache.glob("tiny.triple-*.1.nbc")
    data_file.unlink()
    os.mkfifo(data_file)
    done = _tiny(TINY_RUN, tmp_path)  # (a hang: its timeout)
    assert done.stdout.split() == ["6.0"], done.stderr


def test_an_index_naming_another_kernels_file_is_a_miss(tmp_path):
    """An index whose entry names the data file of another kernel (a bit flipped in a
    file name, files copied over each other) ran that kernel's code: the key saved in
    each sealed data file must match."""
    (tmp_path / "tiny.py").write_text(TINY)
    code = TINY_RUN.replace("prepare(triple", "from tiny import twice\nprepare(twice")
    code = code.replace("print(triple(2.0))", "prepare(triple, (numba.float64,))\n" + (
        "print(triple(2.0), twice(2.0), sum(triple.stats.cache_hits.values()))"
    ))  # fmt: skip

    def run():
        return _tiny(code, tmp_path).stdout.split()

    assert run() == ["6.0", "4.0", "0"]
    cache = tmp_path / "__pycache__"
    (twice,) = cache.glob("tiny.twice-*.1.nbc")
    (triple,) = cache.glob("tiny.triple-*.1.nbc")
    shutil.copyfile(twice, triple)  # triple's index now leads to twice's code
    assert run() == ["6.0", "4.0", "0"]  # not 4.0 for triple: compiled again
    assert run() == ["6.0", "4.0", "1"]
