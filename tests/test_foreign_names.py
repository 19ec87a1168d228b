"""Private names of other packages that the package reaches (issue 22, item 5).

A scan of the source lists every reach into another package's private names (a name
starting with ``_``, neither ``__dunder__`` nor ``_sunder_``): an import of one, an
attribute of a name bound to another package (by an import, an assignment, a
parameter's annotation, a foreign base class of ``self``), ``getattr`` with one, an
override of a base class's private method, a private file named to ``glob``. The
reaches must be the ones in :data:`ALLOWED`, each with a guard test below that fails,
naming the package, its version and what to change, when the installed version no
longer has what the reach uses.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "onnx_recurrent"
OWN = "onnx_recurrent"
#: calls whose string argument names a file or module: a private name in it is a reach
NAMING_CALLS = {"glob", "rglob", "find_spec", "import_module"}

#: (module, reach) -> (package, guard test); a reach is ``file:<pattern>`` for a file
ALLOWED = {
    ("backends/jit_cache.py", "numba.core.dispatcher.Dispatcher._cache"): (
        "numba",
        "test_numba_cache_index",
    ),
    ("backends/jit_cache.py", "numba.core.dispatcher.Dispatcher._cache._cache_file"): (
        "numba",
        "test_numba_cache_index",
    ),
    (
        "backends/jit_cache.py",
        "numba.core.dispatcher.Dispatcher._cache._cache_file._load_index",
    ): ("numba", "test_numba_cache_index"),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._index_name"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._save_data"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._load_data"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._load_index"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._save_index"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._index_path"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._source_stamp"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._version"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("backends/jit_cache.py", "numba.core.caching.IndexDataCacheFile._cache_path"): (
        "numba",
        "test_numba_cache_files_sealed",
    ),
    ("convert.py", "typing.Any._forward_pre_hooks"): ("torch", "test_torch_weight_hooks"),
    ("convert.py", "typing.Any._forward_hooks"): ("torch", "test_torch_weight_hooks"),
    ("convert.py", "?._tensor_name"): ("torch", "test_torch_weight_hooks"),
    ("runtime/hosts/native.py", "file:_extensions_pydll*"): (
        "onnxruntime-extensions",
        "test_extensions_library_is_the_public_one",
    ),
    ("runtime/hosts/onnxruntime.py", "signal._signal"): (
        "python",
        "test_signal_c_module",
    ),
    ("held.py", "signal._signal"): (
        "python",
        "test_signal_c_module",
    ),
    # onnxruntime's own class, wherever ours was put in its place (ort_session_class)
    ("runtime/hosts/onnxruntime.py", "?._sess"): (
        "onnxruntime",
        "test_onnxruntime_core_session",
    ),
    ("threads.py", "ctypes.CDLL()._exit"): ("python", "test_c_library_exit"),
    ("tools/vad/command.py", "distributed.deploy.spec.SpecCluster._instances"): (
        "distributed",
        "test_distributed_cluster_instances",
    ),
    ("runtime/loop.py", "onnx.reference.ops.op_loop.Loop._run"): (
        "onnx",
        "test_onnx_reference_hooks",
    ),
    ("runtime/loop.py", "onnx.reference.ops.op_loop.Loop._run_body"): (
        "onnx",
        "test_onnx_reference_hooks",
    ),
    ("runtime/reference.py", "onnx.reference.op_run.OpRun._check_and_fix_outputs"): (
        "onnx",
        "test_onnx_reference_hooks",
    ),
    ("runtime/reference.py", "onnx.reference.op_run.OpRun._run"): (
        "onnx",
        "test_onnx_reference_hooks",
    ),
}


def _private(name: str) -> bool:
    return (
        name.startswith("_")
        and not name.startswith("__")
        and not (name.endswith("_") and len(name) > 2)  # _sunder_ (ctypes' _fields_)
    )


def _own_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every name the package defines anywhere (for attributes of unknown origin)."""
    names = {path.rpartition("/")[2].removesuffix(".py") for path in trees}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return names


def _class_names(node: ast.ClassDef) -> set[str]:
    """Names a class defines: in its body, and ``self.X = ...`` in its methods."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(child.name)
        elif isinstance(child, ast.Name | ast.Attribute) and isinstance(child.ctx, ast.Store):
            names.add(child.id if isinstance(child, ast.Name) else child.attr)
    return names


def _has(origin: str, name: str) -> bool:
    """Whether the foreign class at ``origin`` (dotted) has ``name`` (True where it
    cannot be imported: counted as a reach)."""
    module, _, qualname = origin.rpartition(".")
    while module:
        try:
            found = importlib.import_module(module)
            break
        except ImportError:
            module, _, head = module.rpartition(".")
            qualname = f"{head}.{qualname}"
    else:
        return True
    try:
        for part in qualname.split("."):
            found = getattr(found, part)
    except AttributeError:
        return True
    return hasattr(found, name)


class _Scan(ast.NodeVisitor):
    """The reaches of one module: ``(line, reach)``, a reach ``origin.name``."""

    def __init__(self, own: set[str]):
        self.own = own
        self.scopes: list[dict[str, str | None]] = [{}]
        self.classes: list[tuple[str | None, set[str]]] = []
        self.found: list[tuple[int, str]] = []

    def _bind(self, name: str, origin: str | None) -> None:
        self.scopes[-1][name] = origin

    def _lookup(self, name: str) -> str | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def origin(self, node: ast.AST | None) -> str | None:
        """The dotted origin of ``node`` in another package, or None."""
        if isinstance(node, ast.Name):
            if node.id in ("self", "cls") and self.classes:
                return self.classes[-1][0]
            return self._lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self.origin(node.value)
            return None if base is None else f"{base}.{node.attr}"
        if isinstance(node, ast.Call):
            name = _getattr_name(node)
            if name is not None:
                base = self.origin(node.args[0])
                return None if base is None else f"{base}.{name}"
            base = self.origin(node.func)
            return None if base is None else f"{base}()"
        if isinstance(node, ast.Subscript):
            base = self.origin(node.value)
            return None if base is None else f"{base}[]"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # an annotation
            try:
                return self.origin(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return None
        return None

    def _foreign(self, dotted: str) -> str | None:
        return None if dotted.split(".")[0] == OWN else dotted

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._foreign(alias.name) and any(map(_private, alias.name.split("."))):
                self.found.append((node.lineno, alias.name))
            bound = alias.name if alias.asname else alias.name.split(".")[0]
            self._bind(alias.asname or bound, self._foreign(bound))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        own = node.level or node.module == "__future__"
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if not own and self._foreign(full) and any(map(_private, full.split("."))):
                self.found.append((node.lineno, full))
            self._bind(alias.asname or alias.name, None if own else self._foreign(full))

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        origin = self.origin(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self._bind(target.id, origin)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            value = node.value if node.value is not None else node.annotation
            self._bind(node.target.id, self.origin(value))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.visit(child)
        self._bind(node.name, None)
        self.scopes.append({})
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                self._bind(arg.arg, self.origin(arg.annotation))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for child in [*node.decorator_list, *node.bases]:
            self.visit(child)
        base = next((o for o in map(self.origin, node.bases) if o), None)
        self._bind(node.name, None)
        if base is not None:  # an override of the base's private name
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt]
                    for t in targets:
                        name = t.id if isinstance(t, ast.Name) else getattr(t, "name", "")
                        if _private(name) and _has(base, name):
                            self.found.append((stmt.lineno, f"{base}.{name}"))
        self.classes.append((base, _class_names(node)))
        self.scopes.append({})
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if not _private(node.attr):
            return
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls") and self.classes:
            base, defined = self.classes[-1]
            if node.attr in defined or base is None:
                return
        origin = self.origin(value)
        if origin is not None:
            self.found.append((node.lineno, f"{origin}.{node.attr}"))
        elif node.attr not in self.own:
            self.found.append((node.lineno, f"?.{node.attr}"))

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        name = _getattr_name(node)
        if name is not None and _private(name):
            origin = self.origin(node.args[0])
            if origin is not None or name not in self.own:
                self.found.append((node.lineno, f"{origin or '?'}.{name}"))
        called = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if isinstance(node.func, ast.Name):
            called = node.func.id
        if called in NAMING_CALLS:
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    parts = arg.value.replace("/", ".").split(".")
                    if any(map(_private, parts)) and parts[0] != OWN:
                        self.found.append((node.lineno, f"file:{arg.value}"))


def _getattr_name(node: ast.Call) -> str | None:
    """``name`` of ``getattr(x, "name", ...)`` (hasattr, setattr, delattr), else None."""
    if (
        isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def reaches() -> dict[tuple[str, str], list[int]]:
    """(module, reach) -> lines, over every module of the package."""
    trees = {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    own = _own_names(trees)
    found: dict[tuple[str, str], list[int]] = {}
    for module, tree in trees.items():
        scan = _Scan(own)
        scan.visit(tree)
        for line, reach in scan.found:
            found.setdefault((module, reach), []).append(line)
    return found


def test_private_reaches_are_the_allowed_ones():
    found = reaches()
    new = sorted(f"{m}:{found[m, r][0]}: {r}" for m, r in set(found) - set(ALLOWED))
    gone = sorted(f"{m}: {r}" for m, r in set(ALLOWED) - set(found))
    assert not new, (
        "new reaches into other packages' private names: use a public API, or add each "
        "to ALLOWED with a guard test that fails when the package changes it:\n" + "\n".join(new)
    )
    assert not gone, "reaches in ALLOWED no longer in the source: drop them:\n" + "\n".join(gone)


def test_every_reach_has_its_guard():
    guards = {guard for _, guard in ALLOWED.values()}
    assert not [g for g in guards if not callable(globals().get(g))]


def test_the_scan_finds_each_kind_of_reach():
    source = """
import numba._helperlib
from numba.core import caching, _private_module
from onnx.reference.op_run import OpRun
from .ours import Mine
import signal as s

def f(d: "numba.Dispatcher", e):
    c = d._cache
    c._file
    Mine()._ours
    e._nowhere_defined
    getattr(s, "_signal", s)
    caching._CacheLocator
    Path(x).glob("_pydll*")

class Op(OpRun):
    def _run(self):
        self._run_body()
        self._mine = 1
        self._mine
        self._fields_
"""
    scan = _Scan(own={"_ours", "_mine"})
    scan.visit(ast.parse(source))
    assert sorted(r for _, r in scan.found) == sorted(
        [
            "numba._helperlib",
            "numba.core._private_module",
            "numba.Dispatcher._cache",
            "numba.Dispatcher._cache._file",
            "?._nowhere_defined",
            "signal._signal",
            "numba.core.caching._CacheLocator",
            "file:_pydll*",
            "onnx.reference.op_run.OpRun._run",
            "onnx.reference.op_run.OpRun._run_body",
        ]
    )


# The guards: each fails naming the package, its version and what to change.


def _version(distribution: str) -> str:
    if distribution == "python":
        return sys.version.split()[0]
    return importlib.metadata.version(distribution)


def _broken(distribution: str, what: str, change: str) -> str:
    return f"{distribution} {_version(distribution)}: {what}. Change {change}."


def _numba_function(directory: Path):
    """``f`` of a module file imported as a module: exec'd into a bare dict, its
    ``__module__`` was ``builtins`` and numba's cache pickled the builtins by value (a
    PyCapsule there, put by another test's import, failed the suite)."""
    import importlib.util
    import sys

    source = directory / "kernel.py"
    source.write_text("def f(x):\n    return x + 1\n")
    name = f"_foreign_names_kernel_{abs(hash(str(directory)))}"
    spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.f


def test_torch_weight_hooks():
    """convert._torch_weight: torch's older weight_norm, spectral_norm and its pruning
    keep their forward pre-hooks in ``Module._forward_pre_hooks``; a pruning hook names
    its weight ``_tensor_name``."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils import prune
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    change = "onnx_recurrent/convert.py's _torch_weight and _torch_forward (from_torch)"
    module = torch.nn.GRU(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(module, name="weight_hh_l0")
    prune.l1_unstructured(module, "weight_ih_l0", amount=0.5)
    hooks = list(getattr(module, "_forward_pre_hooks", {}).values())
    norm = [h for h in hooks if isinstance(h, WeightNorm)]
    pruning = [h for h in hooks if isinstance(h, prune.BasePruningMethod)]
    assert len(norm) == 1 and norm[0].name == "weight_hh_l0", _broken(
        "torch", "weight_norm's hook is not in Module._forward_pre_hooks", change
    )
    assert len(pruning) == 1 and getattr(pruning[0], "_tensor_name", None) == "weight_ih_l0", (
        _broken("torch", "a pruning hook has no _tensor_name", change)
    )
    hooked = torch.nn.GRU(3, 4)
    hooked.register_forward_hook(lambda module, args, output: output)
    assert len(getattr(hooked, "_forward_hooks", {})) == 1, _broken(
        "torch", "register_forward_hook's hook is not in Module._forward_hooks", change
    )
    spectral = torch.nn.GRU(3, 4)
    torch.nn.utils.spectral_norm(spectral, name="weight_hh_l0")
    hooks = list(getattr(spectral, "_forward_pre_hooks", {}).values())
    norm = [h for h in hooks if isinstance(h, SpectralNorm)]
    assert len(norm) == 1 and norm[0].name == "weight_hh_l0", _broken(
        "torch", "spectral_norm's hook is not in Module._forward_pre_hooks", change
    )


def test_numba_cache_index(tmp_path):
    """jit_cache.cache_index: numba's private cache index (``Dispatcher._cache``,
    ``Cache._cache_file``, ``IndexDataCacheFile._load_index``), empty until a compile."""
    numba = pytest.importorskip("numba")
    jit_cache = pytest.importorskip("onnx_recurrent.backends.jit_cache")
    change = (
        "onnx_recurrent/backends/jit_cache.py's cache_index (what cache_state and the "
        "CLI's first-use note read)"
    )
    with jit_cache.numba_cache_dir(str(tmp_path / "numba")):
        dispatcher = numba.njit(cache=True)(_numba_function(tmp_path))
    cache = getattr(dispatcher, "_cache", None)
    assert cache is not None, _broken("numba", "a dispatcher has no _cache", change)
    index = getattr(getattr(cache, "_cache_file", None), "_load_index", None)
    assert callable(index), _broken(
        "numba", "a dispatcher's _cache has no _cache_file._load_index()", change
    )
    assert jit_cache.cache_index(dispatcher) == {}, _broken(
        "numba", "the index of a function never compiled is not {}", change
    )
    dispatcher(1)
    assert jit_cache.cache_index(dispatcher), _broken(
        "numba", "the index of a compiled function is empty", change
    )
    # _load_all (jit_cache's repair of damaged files): IndexDataCacheFile.load(key)
    jit_cache._load_all(dispatcher)
    (index,) = Path(dispatcher.stats.cache_path).glob("*.nbi")
    index.write_bytes(b"")
    with pytest.raises(EOFError):  # what _heal takes for a damaged file
        jit_cache._load_all(dispatcher)
    assert Path(dispatcher.stats.cache_path).is_relative_to(tmp_path / "numba")


def test_numba_cache_files_sealed(tmp_path):
    """jit_cache._SealedCacheFile: numba's ``IndexDataCacheFile`` writes and reads each
    data file through ``_save_data(name, data)`` and ``_load_data(name)``, knows its
    function by ``_index_name``, and a cfunc's cache (``CFunc._cache`` after
    ``enable_caching``) is one of them, as a dispatcher's."""
    numba = pytest.importorskip("numba")
    jit_cache = pytest.importorskip("onnx_recurrent.backends.jit_cache")
    from numba.core.caching import IndexDataCacheFile
    from numba.core.ccallback import CFunc

    from onnx_recurrent.backends import cache_dirs

    change = "onnx_recurrent/backends/jit_cache.py's _SealedCacheFile and _seal"
    for name in ("_save_data", "_load_data", "_save_index", "_load_index"):
        assert callable(getattr(IndexDataCacheFile, name, None)), _broken(
            "numba", f"IndexDataCacheFile has no {name}", change
        )
    with jit_cache.numba_cache_dir(str(tmp_path / "numba")):
        dispatcher = numba.njit(cache=True)(_numba_function(tmp_path))
        signature = numba.core.sigutils.normalize_signature(numba.int64(numba.int64))
        native = CFunc(dispatcher.py_func, signature, {}, {})
        native.enable_caching()
    for function in (dispatcher, native):
        assert isinstance(function._cache._cache_file, IndexDataCacheFile), _broken(
            "numba", f"{type(function).__name__}._cache has no IndexDataCacheFile", change
        )
        files = function._cache._cache_file
        for name, kind in (("_index_name", str), ("_index_path", str), ("_cache_path", str),
                           ("_version", str), ("_source_stamp", object)):  # fmt: skip
            assert isinstance(getattr(files, name, None), kind), _broken(
                "numba", f"IndexDataCacheFile has no {name} ({kind.__name__})", change
            )
        assert files._index_path.startswith(files._cache_path), _broken(
            "numba", "IndexDataCacheFile's _index_path is not in its _cache_path", change
        )
    jit_cache._seal(dispatcher)
    assert dispatcher(1) == 2
    (data,) = Path(dispatcher.stats.cache_path).glob("*.nbc")
    (index,) = Path(dispatcher.stats.cache_path).glob("*.nbi")
    assert data.read_bytes().startswith(jit_cache.SEAL), _broken(
        "numba", "IndexDataCacheFile.save does not write through _save_data", change
    )
    assert index.read_bytes().startswith(jit_cache.SEAL), _broken(
        "numba", "IndexDataCacheFile.save does not write through _save_index", change
    )
    assert jit_cache.cache_index(dispatcher), _broken(
        "numba", "IndexDataCacheFile does not read its index through _load_index", change
    )
    damaged = bytearray(data.read_bytes())
    damaged[damaged.index(jit_cache.SEAL) + len(jit_cache.SEAL) + 40] ^= 1
    data.write_bytes(damaged)
    assert jit_cache.cache_index(dispatcher)
    with pytest.warns(jit_cache.CompileCacheWarning, match="is damaged") as caught:
        cache_dirs.WARNED.discard("damaged")
        loaded = dispatcher._cache._cache_file.load(next(iter(jit_cache.cache_index(dispatcher))))
    assert loaded is None and caught, _broken(
        "numba", "IndexDataCacheFile.load does not read through _load_data", change
    )


def test_numba_cache_dir_is_set_for_the_block_only(tmp_path):
    """The process-wide side effect of jit_cache: ``numba.config.CACHE_DIR`` is ours
    inside :func:`numba_cache_dir` (numba reads it when it enables a function's cache),
    restored after it, an exception included."""
    numba = pytest.importorskip("numba")
    jit_cache = pytest.importorskip("onnx_recurrent.backends.jit_cache")
    before = numba.config.CACHE_DIR
    ours = tmp_path / "ours"
    with jit_cache.numba_cache_dir(str(ours)):
        assert numba.config.CACHE_DIR == str(ours)
        inside = numba.njit(cache=True)(_numba_function(tmp_path))
    assert numba.config.CACHE_DIR == before
    assert Path(inside.stats.cache_path).is_relative_to(ours), _broken(
        "numba",
        "a function's cache is not in numba.config.CACHE_DIR set when it is decorated",
        "onnx_recurrent/backends/jit_cache.py's numba_cache_dir (how the kernels "
        "get a cache directory where numba's own is not writable)",
    )
    with pytest.raises(RuntimeError), jit_cache.numba_cache_dir(str(ours)):
        raise RuntimeError
    assert numba.config.CACHE_DIR == before
    with jit_cache.numba_cache_dir(None):
        assert numba.config.CACHE_DIR == before


def test_extensions_library_is_the_public_one():
    """native.extensions_library finds the private ``_extensions_pydll`` file without
    importing onnxruntime-extensions: the public get_library_path's answer, with the
    C function the host calls."""
    import ctypes

    from onnx_recurrent.runtime.hosts import native

    try:
        ours = native.extensions_library()
    except ImportError:
        pytest.skip("onnxruntime-extensions is not installed")
    change = "onnx_recurrent/runtime/hosts/native.py's extensions_library"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import onnxruntime_extensions as e; print(e.get_library_path())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    public = done.stdout.strip().splitlines()[-1]
    assert os.path.realpath(ours) == os.path.realpath(public), _broken(
        "onnxruntime-extensions",
        f"its library is {public}, not the _extensions_pydll file found ({ours})",
        change,
    )
    assert hasattr(ctypes.CDLL(ours), "AddExternalCustomOp"), _broken(
        "onnxruntime-extensions",
        "its library exports no AddExternalCustomOp",
        "onnx_recurrent/runtime/hosts/native.py's register",
    )


def test_signal_c_module():
    """runtime/hosts/onnxruntime.py calls ``signal._signal.signal`` (the C function,
    without the enum wrapping: 11 µs a run less); threads.py's ``interrupts_held``
    ``signal._signal.getsignal`` (0.3 µs a signal less)."""
    c_module = getattr(signal, "_signal", None)
    for name in ("signal", "getsignal"):
        assert c_module is not None and callable(getattr(c_module, name, None)), _broken(
            "python",
            f"signal._signal.{name} is gone (our callers fall back to signal.{name}, slower)",
            "onnx_recurrent/runtime/hosts/onnxruntime.py's _signal, held.py's _getsignal",
        )


def test_c_library_exit():
    """threads.py hands C's ``_exit`` (POSIX; a C function, not a private name) to
    glibc's ``on_exit`` at exit while a compile runs: both are in this C library, and a
    process so armed ends with its own status, skipping the other exit handlers."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc: threads.py arms nothing (no on_exit)")
    libc = ctypes.CDLL(None)
    assert callable(getattr(libc, "on_exit", None)), _broken(
        "python", "glibc has no on_exit", "onnx_recurrent/threads.py's _exit_past_a_compile"
    )
    armed = (
        "import atexit, ctypes; libc = ctypes.CDLL(None)\n"
        "libc.on_exit.argtypes = (ctypes.c_void_p, ctypes.c_void_p)\n"
        "atexit.register(print, 'python finalized')\n"
        "libc.on_exit(ctypes.cast(libc.abort, ctypes.c_void_p), None)  # skipped\n"
        "libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)\n"
        "raise SystemExit(7)\n"
    )
    done = subprocess.run([sys.executable, "-c", armed], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (7, "python finalized\n"), done.stderr


def test_onnxruntime_core_session():
    """runtime/hosts/onnxruntime.py runs ``InferenceSession._sess.run(output_names,
    feeds, run_options)`` (the C++ session that the public ``run`` calls after its
    Python checks) when arrays are fed on the CPU: the same outputs, and a missing
    input refused by the C++ session itself."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    core = getattr(session, "_sess", None)
    feeds = {"a": np.ones(2, np.float32), "b": np.arange(2, dtype=np.float32)}
    what = "InferenceSession._sess.run(output_names, feeds, run_options) is gone or changed"
    change = "onnx_recurrent/runtime/hosts/onnxruntime.py's _run_arrays (use the public run)"
    assert callable(getattr(core, "run", None)), _broken("onnxruntime", what, change)
    (got,) = core.run(["c"], feeds, None)
    np.testing.assert_array_equal(got, session.run(None, feeds)[0])
    with pytest.raises(Exception, match="b"):  # a missing input: the C++ session says so
        core.run(["c"], {"a": feeds["a"]}, None)


def test_distributed_cluster_instances():
    """tools/vad/command.py takes a local cluster interrupted while it starts out of
    ``SpecCluster._instances``, the set that distributed's exit hook
    (``close_clusters``) closes: a cluster made is in it, and the hook reads it."""
    pytest.importorskip("distributed")
    import inspect

    from distributed.deploy import spec

    instances = getattr(spec.SpecCluster, "_instances", None)
    what = "SpecCluster._instances (the clusters the exit hook closes) is gone or changed"
    change = "onnx_recurrent/tools/vad/command.py's _local_cluster"
    assert callable(getattr(instances, "discard", None)), _broken("distributed", what, change)
    hook = getattr(spec, "close_clusters", None)
    assert hook is not None and "SpecCluster._instances" in inspect.getsource(hook), _broken(
        "distributed", what, change
    )


def test_onnx_reference_hooks():
    """onnx.reference's private hooks: ``OpRun.run`` calls ``_run`` (the documented
    override point) and ``_check_and_fix_outputs`` (runtime/reference.py overrides it
    to pass None outputs); a ``Loop`` instance has ``_run_body`` (runtime/loop.py)."""
    import numpy as np
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    from onnx_recurrent.runtime.loop import Loop

    calls = []

    class Probe(OpRun):
        op_domain = ""

        def _run(self, x):
            calls.append("_run")
            return (x,)

        def _check_and_fix_outputs(self, res):
            calls.append("_check_and_fix_outputs")
            return res

    Identity = type("Identity", (Probe,), {})
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ReferenceEvaluator(model, new_ops=[Identity]).run(None, {"x": np.ones(1, np.float32)})
    assert calls == ["_run", "_check_and_fix_outputs"], _broken(
        "onnx",
        f"OpRun.run calls {calls}, not _run then _check_and_fix_outputs",
        "onnx_recurrent/runtime/reference.py's RecurrentOp (None outputs)",
    )

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Add", ["x", "x"], ["xo"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("co", TensorProto.BOOL, []),
            helper.make_tensor_value_info("xo", TensorProto.FLOAT, [1]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x0"], ["x"], body=body)],
        "g",
        [
            helper.make_tensor_value_info("M", TensorProto.INT64, []),
            helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    evaluator = ReferenceEvaluator(model, new_ops=[Loop])
    (loop,) = [n for n in evaluator.rt_nodes_ if isinstance(n, Loop)]
    assert callable(getattr(loop, "_run_body", None)), _broken(
        "onnx",
        "a Loop node has no _run_body (OpRun's runner of its body attribute)",
        "onnx_recurrent/runtime/loop.py's Loop._run",
    )
    (x,) = evaluator.run(None, {"M": np.array(3), "x0": np.ones(1, np.float32)})
    np.testing.assert_array_equal(x, [8.0])
