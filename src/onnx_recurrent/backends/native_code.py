"""The native nodes' compiled functions, kept as machine code and loaded without numba.

numba compiles the ``cfunc`` s of :mod:`onnx_recurrent.runtime.hosts.native_compute`
once (seconds); their LLVM IR is then compiled here into an object file for this CPU
and written to the cache, and later processes load that file with llvmlite alone
(milliseconds), without importing numba or setting up its typing context (0.5 s and
about 100 MB of a session's start-up otherwise).

What makes this possible is the code's own contract: it never raises and takes its
memory from ``malloc`` (:mod:`.views`), so it needs nothing of numba's runtime. The
IR is checked for that before it is kept (no exception raised anywhere in it, no
allocation through numba's runtime); the few numba symbols it still names (the error
branch of numba's cfunc wrapper, the release of arrays that have no owner here) are
given a body that traps, inside the object itself.

A cache file is ``MAGIC``, a JSON header (the function's symbol, the digest of the
object, the file's own name) and the object; it is keyed by everything the code
depends on: the package's sources, numba's and llvmlite's versions, the CPU's name and
features. A file that does not check out (another function's file copied over it, a
named pipe) is compiled again and replaced (written to a temporary file, then
renamed); a cache that cannot be written costs a compile per process, said once
(:class:`.cache_dirs.CompileCacheWarning`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Callable
from pathlib import Path

import llvmlite
import llvmlite.binding as ll

from .. import threads
from .cache_dirs import (
    first_usable,
    read_regular,
    readable_roots,
    warn_once,
    write_atomic,
)

MAGIC = b"onnx-recurrent native code 1\n"
#: symbols the code names that only numba's runtime defines: given a trapping body
TRAPPED = re.compile(r"^(NRT_|numba_)")
_DECLARE = re.compile(
    r'^declare (?P<head>.*?)@(?P<name>"[^"]+"|[\w.$]+)\((?P<args>.*)\)(?P<tail>.*)$'
)

_loaded: dict[str, int] = {}  # name -> address, for this process


class NativeCodeError(RuntimeError):
    """The native code could not be built or loaded (the caller falls back to numba's
    own cfunc)."""


def address(name: str, build: Callable[[], tuple[str, str]]) -> int:
    """The address of the compiled function ``name`` (e.g. ``"compute-float32"``),
    loaded from the cache or, on a miss, built: ``build()`` returns its LLVM IR and
    symbol (numba's cfunc), compiled here to an object file, kept in the cache.

    Raises
    ------
    NativeCodeError
        The IR raises or allocates through numba's runtime, or the object cannot be
        loaded.
    """

    def work() -> int:  # a fork waits for a load or build to end
        found = _loaded.get(name)
        if found is None:
            found = _loaded[name] = _load_or_build(name, build)
        return found

    found = _loaded.get(name)
    return found if found is not None else threads.compiling(work)


def _load_or_build(name: str, build: Callable[[], tuple[str, str]]) -> int:
    for kept_at in _candidates(name):  # a cache that cannot be written is read too
        kept = _read(kept_at)
        if kept is not None:
            return _load(*kept)
    path = _path(name)
    symbol, obj = _compile(*build())
    if path is not None:
        _write(path, symbol, obj)
    return _load(symbol, obj)


def _compile(ir: str, symbol: str) -> tuple[str, bytes]:
    """``ir`` checked and compiled into an object file for this CPU."""
    if "picklebuf" in ir:  # numba's raised exceptions are pickled constants
        raise NativeCodeError("native code: the kernel's IR raises an exception")
    lines = []
    for line in ir.splitlines():
        m = _DECLARE.match(line)
        if m and re.match(r"^NRT_(MemInfo_alloc|Allocate)", m["name"].strip('"')):
            raise NativeCodeError(f"native code: the kernel allocates through {m['name']}")
        if m and TRAPPED.match(m["name"].strip('"')):
            line = (
                f"define internal {m['head']}@{m['name']}({m['args']}) "
                "{\n  call void @llvm.trap()\n  unreachable\n}"
            )
        lines.append(line)
    if "declare void @llvm.trap()" not in ir:
        lines.append("declare void @llvm.trap()")
    module = ll.parse_assembly("\n".join(lines))
    module.verify()
    return symbol, _machine().emit_object(module)


@functools.cache
def _machine() -> ll.TargetMachine:
    """This CPU's target machine, as numba's JIT makes it."""
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    target = ll.Target.from_default_triple()
    reloc = "static" if target.name.startswith("x86") else "default"
    return target.create_target_machine(
        cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(), opt=3,
        reloc=reloc, codemodel="jitdefault", jit=True,
    )  # fmt: skip


@functools.cache
def _engine() -> ll.ExecutionEngine:
    """The process's engine for the loaded objects (kept for the process's life: the
    code lives in it)."""
    return ll.create_mcjit_compiler(ll.parse_assembly(""), _machine())


def _load(symbol: str, obj: bytes) -> int:
    engine = _engine()
    try:
        engine.add_object_file(ll.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        found = engine.get_function_address(symbol)
    except Exception as e:  # llvmlite's errors are RuntimeError and others
        raise NativeCodeError(f"native code: cannot load {symbol}: {e}") from e
    if not found:
        raise NativeCodeError(f"native code: {symbol} not in its object")
    return found


@functools.cache
def noop() -> int:
    """The address of a compiled ``void f(void*)`` that does nothing.

    Raises
    ------
    NativeCodeError
        It cannot be compiled or loaded.
    """
    engine = _engine()
    try:
        ir = "define void @onnx_recurrent_noop(ptr %p) {\n  ret void\n}"
        engine.add_module(ll.parse_assembly(ir))
        engine.finalize_object()
        return engine.get_function_address("onnx_recurrent_noop")
    except Exception as e:
        raise NativeCodeError(f"native code: cannot compile a no-op: {e}") from e


# -- the cache ------------------------------------------------------------------------


def cached(name: str) -> tuple[bool, str | None]:
    """Whether ``name``'s machine code is in a cache (not checked), and the cache's
    directory (None: none can be written)."""
    root, _ = first_usable("native")
    return any(p.is_file() for p in _candidates(name)), root


def _candidates(name: str) -> list[Path]:
    """Where ``name``'s object may be kept: in each of our cache directories that is
    there, written to or not (a warm cache shipped read-only), in order."""
    return [Path(root) / f"{name}-{_key(name)}.o" for root in readable_roots("native")]


def _path(name: str) -> Path | None:
    """Where ``name``'s object for this package, numba, llvmlite and CPU is kept (None:
    no cache can be written: warned once)."""
    root, tried = first_usable("native")
    if root is None:
        _uncached(f"cannot write its native code cache in any of {tried}")
        return None
    return Path(root) / f"{name}-{_key(name)}.o"


def _uncached(why: str) -> None:
    """Say once per process that the native code cannot be kept, and why."""
    warn_once(
        "native",
        f"onnx-recurrent {why}: the native nodes' code is compiled again in each "
        "process (seconds).",
        stacklevel=6,
    )


@functools.cache
def _key(name: str) -> str:
    """A digest of everything ``name``'s machine code depends on."""
    h = hashlib.sha256(name.encode())
    package = Path(__file__).resolve().parent.parent
    for source in sorted(package.rglob("*.py")):
        if not source.stem.isidentifier():  # no module (an editor's ".#layers.py" link)
            continue
        try:
            data = source.read_bytes()
        except OSError:  # a dangling link, a file going away: not a module either
            continue
        h.update(str(source.relative_to(package)).encode())
        h.update(data)
    versions = (_version("numba"), llvmlite.__version__, ll.get_host_cpu_name())
    h.update(repr((versions, ll.get_host_cpu_features().flatten())).encode())
    return h.hexdigest()[:32]


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


#: the most bytes a kept object may have (a few hundred KiB each)
_MOST = 1 << 28


def _read(path: Path) -> tuple[str, bytes] | None:
    """The symbol and object kept at ``path``, or None if it is missing or does not
    check out (not a regular file, truncated, another format, its digest wrong, or
    written for another file name: another function's object would be run)."""
    try:
        data = read_regular(path, _MOST)
    except OSError:
        return None
    if data is None or not data.startswith(MAGIC):
        return None
    header, _, obj = data[len(MAGIC) :].partition(b"\n")
    try:
        meta = json.loads(header)
        symbol, digest, file = meta["symbol"], meta["sha256"], meta["file"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(symbol, str) or file != path.name:
        return None
    if hashlib.sha256(obj).hexdigest() != digest:
        return None
    return symbol, obj


def _write(path: Path, symbol: str, obj: bytes) -> None:
    """Keep ``obj`` at ``path`` with its header (:func:`.cache_dirs.write_atomic`); a
    write that fails (a full disk) is said once, as a cache that cannot be written."""
    digest = hashlib.sha256(obj).hexdigest()
    header = json.dumps({"symbol": symbol, "sha256": digest, "file": path.name})
    if not write_atomic(path, MAGIC + header.encode() + b"\n" + obj):
        _uncached(f"could not write its native code cache in {path.parent} (full?)")
        return
    _drop_stale(path)


#: the objects kept of one kernel, newest first: an upgrade or an edit of the package
#: gives a new key (a few installs sharing a user's cache each keep theirs)
KEEP = 3


def _drop_stale(path: Path) -> None:
    """Remove all but the :data:`KEEP` newest objects of ``path``'s kernel (other keys:
    the cache grew by one each upgrade); what cannot be removed stays."""
    name = path.name.rsplit("-", 1)[0]
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{32}\.o")
    try:
        found = [p for p in path.parent.iterdir() if pattern.fullmatch(p.name)]
        found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:  # one removed meanwhile, by another process
        return
    for stale in found[KEEP:]:
        if stale.name != path.name:  # this one stays, whatever the clock says
            with contextlib.suppress(OSError):
                stale.unlink()
