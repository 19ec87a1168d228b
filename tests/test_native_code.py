"""The native nodes' machine code cache (backends/native_code.py): built once, loaded by
llvmlite without numba, rebuilt when a file does not check out, never failing a call."""

from __future__ import annotations

import ctypes
import os
import warnings

import numpy as np
import pytest

from onnx_recurrent.backends import cache_dirs, native_code
from onnx_recurrent.backends.cache_dirs import CompileCacheWarning

pytest.importorskip("numba")

# a function whose never-taken branch names a numba runtime symbol (given a trapping body)
ANSWER = """
define i64 @{name}(i64 %x) {{
  %c = icmp eq i64 %x, 12345
  br i1 %c, label %bad, label %ok
bad:
  call void @numba_gil_ensure(ptr null)
  ret i64 0
ok:
  %y = mul i64 %x, 2
  ret i64 %y
}}
declare void @numba_gil_ensure(ptr) local_unnamed_addr
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache in a directory of the test's; ``builds`` counts compiles."""
    root = tmp_path / "native"
    root.mkdir()
    monkeypatch.setattr(native_code, "first_usable", lambda kind: (str(root), [str(root)]))
    monkeypatch.setattr(native_code, "readable_roots", lambda kind: [str(root)])
    monkeypatch.setattr(native_code, "_loaded", {})
    return root


def _function(cache, name, builds):
    def build():
        builds.append(name)
        return ANSWER.format(name=name), name

    address = native_code.address(name, build)
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)


def test_built_once_then_loaded_from_the_cache(cache, monkeypatch, request):
    name = f"answer_{request.node.name[:20]}"
    builds = []
    assert _function(cache, name, builds)(21) == 42
    (kept,) = cache.glob(f"{name}-*.o")
    monkeypatch.setattr(native_code, "_loaded", {})  # as a new process
    assert _function(cache, name, builds)(5) == 10
    assert builds == [name]
    assert kept.read_bytes().startswith(native_code.MAGIC)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "header"])
def test_a_damaged_file_is_rebuilt_and_replaced(cache, monkeypatch, damage, request):
    name = f"answer_{damage}"
    builds = []
    _function(cache, name, builds)
    (kept,) = cache.glob(f"{name}-*.o")
    data = bytearray(kept.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data[len(native_code.MAGIC) : len(native_code.MAGIC) + 5] = b"xxxxx"
    kept.write_bytes(bytes(data))
    monkeypatch.setattr(native_code, "_loaded", {})
    assert _function(cache, name, builds)(4) == 8
    assert builds == [name, name]
    assert native_code._read(kept) is not None  # replaced by a good one


def test_another_functions_file_or_a_pipe_is_rebuilt(cache, monkeypatch):
    """A file copied over another name checked out (its digest is its own): another
    function ran in its place (SIGSEGV for the native nodes). A named pipe in the
    cache blocked the process for good, Ctrl-C included."""
    builds = []
    _function(cache, "answer_mine", builds)
    (mine,) = cache.glob("answer_mine-*.o")
    other = ANSWER.replace("mul i64 %x, 2", "mul i64 %x, 3").format(name="answer_other")
    address = native_code.address("answer_other", lambda: (other, "answer_other"))
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)(5) == 15
    (theirs,) = cache.glob("answer_other-*.o")
    mine.write_bytes(theirs.read_bytes())
    monkeypatch.setattr(native_code, "_loaded", {})
    assert _function(cache, "answer_mine", builds)(5) == 10
    assert builds == ["answer_mine"] * 2
    mine.unlink()
    os.mkfifo(mine)
    monkeypatch.setattr(native_code, "_loaded", {})
    assert _function(cache, "answer_mine", builds)(7) == 14
    assert builds == ["answer_mine"] * 3


def test_stale_objects_of_other_keys_are_dropped_beyond_a_few(cache, monkeypatch):
    # each upgrade or edit of the package (a new key) left another object of every
    # kernel behind, never removed; a few are kept (installs sharing a user's cache)
    builds = []
    stale = [cache / f"answer_old-{i:032x}.o" for i in range(5)]
    for age, path in enumerate(stale):
        path.write_bytes(b"old")
        os.utime(path, (1000 + age, 1000 + age))
    other = cache / f"answer_older-{0:032x}.o"  # another kernel's: not this one's to drop
    other.write_bytes(b"old")
    assert _function(cache, "answer_old", builds)(4) == 8
    kept = sorted(p.name for p in cache.glob("answer_old-*.o"))
    (new,) = [n for n in kept if n not in {p.name for p in stale}]
    assert kept == sorted([new, stale[4].name, stale[3].name])  # the newest two besides
    assert other.exists()


def test_a_dangling_link_or_an_editors_file_in_the_package_is_no_module(tmp_path, monkeypatch):
    # Emacs' lock file ".#layers.py", a dangling link, failed every session (host "auto"
    # too) with FileNotFoundError from the key's hash of the package's sources
    import shutil
    from pathlib import Path

    package = tmp_path / "onnx_recurrent"
    source = Path(native_code.__file__).resolve().parent.parent
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__", "*.nb?"))
    copy = package / "backends" / "native_code.py"
    monkeypatch.setattr(native_code, "__file__", str(copy))
    native_code._key.cache_clear()  # (once a process)
    before = native_code._key("answer")
    (package / ".#layers.py").symlink_to("root@host.1234:1733000000")
    (package / "gone.py").symlink_to(tmp_path / "nowhere.py")
    native_code._key.cache_clear()
    assert native_code._key("answer") == before
    native_code._key.cache_clear()
    monkeypatch.undo()  # the real package's key again, for the tests after


def test_a_warm_cache_shipped_read_only_is_loaded_not_built(cache, monkeypatch):
    # a cache that cannot be written (a container image's, a read-only mount) was
    # passed over for the first writable directory: everything built again, unsaid
    builds = []
    _function(cache, "answer_shipped", builds)
    empty = cache.parent / "writable"
    empty.mkdir()
    monkeypatch.setattr(native_code, "first_usable", lambda kind: (str(empty), [str(empty)]))
    monkeypatch.setattr(native_code, "readable_roots", lambda kind: [str(cache), str(empty)])
    monkeypatch.setattr(native_code, "_loaded", {})
    assert native_code.cached("answer_shipped") == (True, str(empty))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _function(cache, "answer_shipped", builds)(6) == 12
    assert builds == ["answer_shipped"] and not list(empty.iterdir())


def test_read_roots_are_the_unwritable_ones_before_the_first_writable(tmp_path, monkeypatch):
    from onnx_recurrent.backends import cache_dirs

    shipped, writable, after = (tmp_path / n for n in ("shipped", "writable", "after"))
    for d in (shipped, writable, after):
        d.mkdir()
    roots = [(str(shipped), False), (str(writable), False), (str(after), False)]
    monkeypatch.setattr(cache_dirs, "our_roots", lambda kind: roots)
    monkeypatch.setattr(cache_dirs, "writable", lambda path: path != str(shipped))
    assert cache_dirs.readable_roots("native") == [str(shipped), str(writable)]
    assert cache_dirs.first_usable("native")[0] == str(writable)


def test_no_writable_cache_compiles_with_one_warning(monkeypatch):
    monkeypatch.setattr(native_code, "first_usable", lambda kind: (None, ["/nowhere"]))
    monkeypatch.setattr(native_code, "readable_roots", lambda kind: [])
    monkeypatch.setattr(native_code, "_loaded", {})
    monkeypatch.setattr(cache_dirs, "WARNED", set())
    builds = []
    with pytest.warns(CompileCacheWarning, match="/nowhere"):
        assert _function(None, "answer_nowhere", builds)(1) == 2
    monkeypatch.setattr(native_code, "_loaded", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _function(None, "answer_nowhere", builds)(3) == 6
    assert builds == ["answer_nowhere"] * 2


def test_a_full_cache_is_said_once(cache, monkeypatch):
    # a cache folder that passes the "writable" test but whose writes fail (a full disk)
    # made every process compile again (seconds) without a word
    import errno

    from onnx_recurrent.backends import cache_dirs

    def full(path, mode=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_dirs, "replacing", full)
    monkeypatch.setattr(cache_dirs, "WARNED", set())
    builds = []
    with pytest.warns(CompileCacheWarning, match=rf"could not write .* in {cache}"):
        assert _function(cache, "answer_full", builds)(1) == 2
    assert not list(cache.glob("*"))
    monkeypatch.setattr(native_code, "_loaded", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _function(cache, "answer_full", builds)(3) == 6
    assert builds == ["answer_full"] * 2


@pytest.mark.parametrize(
    "ir, reason",
    [
        ('@".const.picklebuf.1" = internal constant i8 0\n', "raises"),
        ("declare ptr @NRT_MemInfo_alloc_aligned(i64, i32)\n", "allocates"),
    ],
)
def test_code_that_raises_or_allocates_through_numba_is_refused(cache, ir, reason):
    with pytest.raises(native_code.NativeCodeError, match=reason):
        native_code.address("refused", lambda: (ANSWER.format(name="refused") + ir, "refused"))
    assert not list(cache.iterdir())


@pytest.mark.parametrize(
    ("kind", "dtype"),
    [
        *(("compute", t) for t in (np.float32, np.float64, np.float16, "bfloat16")),
        *(("task", t) for t in (np.float32, np.float64)),  # 16 bits: float32's tasks
    ],
)
def test_the_native_nodes_code_keeps_the_contract(kind, dtype):
    # what makes the code loadable without numba: no exception raised anywhere in it,
    # no memory from numba's runtime (backends/views.py: malloc). float16 and bfloat16
    # held numba's raises (a reshape's, a view's): refused, every session of such a
    # model compiled its kernel again with numba (4.4 s, numba imported)
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    from onnx_recurrent.runtime.hosts import native_compute

    ir, symbol = native_compute.code(kind, np.dtype(dtype))
    assert symbol in ir
    name, obj = native_code._compile(ir, symbol)
    assert name == symbol and obj[:4] == b"\x7fELF"
