"""The package's two layers, its lazy loading, its import graph and its public names.

A library that computes (spec, cells, scan, backends, layers, ops, runtime, convert)
and tools on top, under ``tools/`` (cli, arguments, check, bench, vad, dask): a tool
imports the library, never the reverse, and ``import onnx_recurrent`` loads the
library only, its costly parts (the runtime and onnx, convert) when first used. The
tools' old paths (``onnx_recurrent.vad``...) are aliases of their modules; every name
the README and docs/ show imports, by either path.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

from onnx_recurrent.tools._aliases import ALIASES, target

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "onnx_recurrent"
#: the tool layer: ``tools/``, ``__main__`` and the tools' old paths (aliases)
TOOLS = ("tools", "__main__", *(old.rpartition(".")[2] for old in ALIASES))
#: imports of a tool by the library, each with its reason
ALLOWED_TOOL_IMPORTS = {
    ("onnx_recurrent", f"onnx_recurrent.{name}"): "documented attribute (old path), "
    "imported on first access by the root's __getattr__ (_SUBMODULES)"
    for name in ("vad", "dask")
}
#: the library's imports of a module named at run time (which this test cannot follow),
#: by module and function called, each with its reason
DYNAMIC_IMPORTS = {
    ("onnx_recurrent", "import_whole"): "the lazy attributes, _LAZY and _SUBMODULES "
    "(read by _imported)",
    ("onnx_recurrent.backends", "import_module"): "a backend's module, its name one of "
    "backends.NAMES (numba, numpy)",
    ("onnx_recurrent.errors", "import_module"): "import_optional: a package of another "
    "project, named by the caller",
    ("onnx_recurrent.held", "import_module"): "import_whole: its callers' names (each "
    "call found where it is made)",
}
#: import cycles (sorted members) allowed, each with its reason
ALLOWED_CYCLES = {
    ("onnx_recurrent.backends.node", "onnx_recurrent.backends.numba_backend"): "lazy: "
    "node.py compiles a whole layer call around numba_backend's step loop (_block); "
    "the backend's prepare and small_call hand small calls to it, importing it in the "
    "call (issue 22, item 4 reshapes the kernel's entry)",
}


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (``__init__`` as the package)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["onnx_recurrent", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _is_tool(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and parts[1] in TOOLS


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str) -> str | None:
    """The package's module that importing ``name`` (a module, or a module's attribute)
    comes to: an old path's submodule is its module under tools/."""
    if name not in MODULES:
        name = target(name) or name
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, statements: list[ast.stmt], everywhere: bool) -> set[str]:
    """The dotted names that ``statements`` import, made absolute: at module level
    (outside ``if TYPE_CHECKING:``), or ``everywhere`` (function bodies included).
    ``from X import y`` imports ``X.y`` where that is a module, else ``X``;
    ``importlib.import_module("...")`` and ``held.import_whole("...")`` (a relative
    name made absolute: :func:`_imported_name`), the root's lazy attributes (``_LAZY``,
    ``_SUBMODULES``) and, everywhere, a string that is a submodule's full name (the
    CLI's subcommands; not an old path) count; ``from __future__`` is no import."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    aliases = module == "onnx_recurrent.tools._aliases"  # names them all; see _imports
    found: set[str] = set()
    nodes: list[ast.AST] = list(statements)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in MODULES or target(sub) in MODULES else source)
        elif isinstance(node, ast.If) and _type_checking(node.test):
            nodes.extend(node.orelse)
        elif isinstance(node, ast.Call) and _import_call(node):
            name = _imported_name(module, package, node)
            if name is not None:
                found.add(name)
        elif module == "onnx_recurrent" and isinstance(node, ast.Assign):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if everywhere and names & {"_LAZY", "_SUBMODULES"}:
                value = ast.literal_eval(node.value)
                value = value.values() if isinstance(value, dict) else value
                found |= {f"{module}.{v}" for v in value}
        elif everywhere and isinstance(node, ast.Constant) and node.value in MODULES:
            if node.value != "onnx_recurrent" and node.value not in ALIASES and not aliases:
                found.add(node.value)  # a module named, to be imported (the CLI's)
        elif everywhere or isinstance(node, ast.If | ast.Try | ast.With | ast.Expr):
            nodes.extend(ast.iter_child_nodes(node))
    return found


#: the functions that import a module by its name: importlib's, and held's
_IMPORT_CALLS = ("import_module", "import_whole")


def _import_call(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in _IMPORT_CALLS and bool(node.args)


def _imported_name(module: str, package: str, call: ast.Call) -> str | None:
    """The absolute name an import call (:data:`_IMPORT_CALLS`) imports: its first
    argument, a constant, made absolute where relative (``".x"`` from the second
    argument: ``__name__``, ``__package__`` or a constant); None where it is computed
    at run time (:func:`_dynamic_imports`)."""
    first = call.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    name = first.value
    if not name.startswith("."):
        return name
    anchor = call.args[1] if len(call.args) > 1 else None
    anchor = next((k.value for k in call.keywords if k.arg == "package"), anchor)
    if isinstance(anchor, ast.Name) and anchor.id in ("__name__", "__package__"):
        base = module if anchor.id == "__name__" else package
    elif isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        base = anchor.value
    else:
        return None
    dots = len(name) - len(name.lstrip("."))
    parts = base.split(".")
    parts = parts[: len(parts) - dots + 1]
    return ".".join([*parts, name.lstrip(".")]) if name.lstrip(".") else ".".join(parts)


def _dynamic_imports(module: str, tree: ast.Module) -> set[tuple[str, str]]:
    """``(module, function)`` for each import call in ``tree`` whose module name
    :func:`_imported_name` cannot tell (an f-string, a variable)."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _import_call(node):
            if _imported_name(module, package, node) is None:
                func = node.func
                found.add((module, func.attr if isinstance(func, ast.Attribute) else func.id))
    return found


def _imports(module: str, statements: list[ast.stmt], everywhere: bool) -> set[str]:
    """The package's modules that ``statements`` import (see :func:`_imported`); an old
    path (an alias) imports the module it names."""
    found = {_resolve(name) for name in _imported(module, statements, everywhere)}
    if module in ALIASES:
        found.add(ALIASES[module])
    return {m for m in found if m is not None}


def _graph(everywhere: bool) -> dict[str, set[str]]:
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}
    return {m: _imports(m, tree.body, everywhere) - {m} for m, tree in trees.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # recursive Tarjan: the graph is small
        index[node] = low[node] = len(index)
        stack.append(node)
        for target_ in graph[node]:
            if target_ not in index:
                visit(target_)
                low[node] = min(low[node], low[target_])
            elif target_ in stack:
                low[node] = min(low[node], index[target_])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def _tool_imports(graph: dict[str, set[str]]) -> list[str]:
    """The library's imports of a tool, but for the allowed ones."""
    return [
        f"{module} imports {target_}"
        for module, targets in graph.items()
        if not _is_tool(module)
        for target_ in sorted(targets)
        if _is_tool(target_) and (module, target_) not in ALLOWED_TOOL_IMPORTS
    ]


def test_the_library_imports_no_tool():
    """By the source: any import statement, function bodies included, and
    ``import_module`` calls; an old path (``onnx_recurrent.vad``) is a tool."""
    graph = _graph(everywhere=True)
    wrong = _tool_imports(graph)
    assert not wrong, wrong
    assert set(ALLOWED_TOOL_IMPORTS) <= {(m, t) for m, ts in graph.items() for t in ts}
    assert any(_is_tool(m) for m in MODULES) and any(not _is_tool(m) for m in MODULES)
    assert "onnx_recurrent.tools.vad.cluster" in graph["onnx_recurrent.tools.vad.detect"]
    dynamic = {
        found
        for m, path in MODULES.items()
        if not _is_tool(m)
        for found in _dynamic_imports(m, ast.parse(path.read_text()))
    }
    assert dynamic <= set(DYNAMIC_IMPORTS), f"give each a reason: {sorted(dynamic)}"
    assert set(DYNAMIC_IMPORTS) <= dynamic, f"gone (drop them): {set(DYNAMIC_IMPORTS) - dynamic}"


def test_the_tool_finder_finds_lazy_ones(tmp_path, monkeypatch):
    """The test above can fail: a tool imported in a function, by an old path's
    submodule, or by ``import_module``, is found."""
    for folder in ("tools/vad", "tools/bench"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("__init__", "vad", "tools/__init__", "tools/vad/__init__", "tools/vad/audio"):
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "tools/bench/__init__.py").write_text("")
    (tmp_path / "spec.py").write_text(
        "import importlib\ndef f():\n    from .vad.audio import x\n"
        "def g():\n    importlib.import_module('onnx_recurrent.tools.bench')\n"
    )
    (tmp_path / "ops.py").write_text("def h():\n    from . import vad\n")
    # relative names given to import_module and held.import_whole; one computed
    (tmp_path / "cells.py").write_text(
        "import importlib\ndef f():\n    importlib.import_module('.tools.vad', 'onnx_recurrent')\n"
    )
    (tmp_path / "scan.py").write_text(
        "from .held import import_whole\ndef g():\n    import_whole('.tools', __package__)\n"
        "def h(t):\n    import_whole(f'onnx_recurrent.tools.{t}')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    assert _tool_imports(_graph(everywhere=False)) == []
    assert sorted(_tool_imports(_graph(everywhere=True))) == [
        "onnx_recurrent.cells imports onnx_recurrent.tools.vad",
        "onnx_recurrent.ops imports onnx_recurrent.vad",
        "onnx_recurrent.scan imports onnx_recurrent.tools",
        "onnx_recurrent.spec imports onnx_recurrent.tools.bench",
        "onnx_recurrent.spec imports onnx_recurrent.tools.vad.audio",
    ]
    scan = ast.parse((tmp_path / "scan.py").read_text())
    assert _dynamic_imports("onnx_recurrent.scan", scan) == {
        ("onnx_recurrent.scan", "import_whole")
    }


def test_nothing_imports_the_old_paths():
    """Inside the package the tools are imported by their paths under tools/: the old
    paths are for users (and the root's lazy attributes, the aliases themselves)."""
    wrong = [
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if module not in ALIASES
        for name in sorted(_imported(module, ast.parse(path.read_text()).body, True))
        if target(name) not in (None, name) and module != "onnx_recurrent"
    ]
    assert not wrong, wrong


def test_no_import_cycles():
    """Imports among the package's modules form no cycle, counting those in function
    bodies (lazy ones) and ``import_module`` calls; an allowed one says why."""
    cycles = {tuple(c) for c in _cycles(_graph(everywhere=True))}
    allowed = set(ALLOWED_CYCLES)
    assert cycles <= allowed, f"import cycles: {sorted(cycles - allowed)}"
    assert allowed <= cycles, f"no longer cycles (drop them): {sorted(allowed - cycles)}"
    assert not _cycles(_graph(everywhere=False))  # and none at all at module level


def test_the_cycle_finder_finds_one(tmp_path, monkeypatch):
    """The test above can fail: two modules importing each other are found, at module
    level or in a function (lazily), by statement or by ``import_module``."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("from .a import x\nif TYPE_CHECKING:\n    from . import c\n")
    (tmp_path / "c.py").write_text("from __future__ import annotations\nfrom .b import y\n")
    (tmp_path / "d.py").write_text("def f():\n    from .e import z\n")
    (tmp_path / "e.py").write_text(
        "import importlib\ndef g():\n    importlib.import_module('onnx_recurrent.d')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    graph = _graph(everywhere=False)
    assert graph["onnx_recurrent.a"] == {"onnx_recurrent.b"}
    assert graph["onnx_recurrent.b"] == {"onnx_recurrent.a"}  # c under TYPE_CHECKING
    assert graph["onnx_recurrent.c"] == {"onnx_recurrent.b"}
    assert _cycles(graph) == [["onnx_recurrent.a", "onnx_recurrent.b"]]
    lazy = _graph(everywhere=True)
    assert lazy["onnx_recurrent.d"] == {"onnx_recurrent.e"}
    assert lazy["onnx_recurrent.e"] == {"onnx_recurrent.d"}
    assert sorted(_cycles(lazy)) == [
        ["onnx_recurrent.a", "onnx_recurrent.b"],
        ["onnx_recurrent.d", "onnx_recurrent.e"],
    ]


def test_import_loads_the_library_only():
    """In a fresh interpreter: no tool, no onnx, no convert until asked for, not even
    the layers (NumPy, llvmlite: a command's Ctrl-C while they loaded was a traceback);
    then every public name is there, lazily (PEP 562)."""
    code = """
import sys
import onnx_recurrent
loaded = sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx_recurrent."))
print(" ".join(loaded), "llvmlite" in sys.modules)
from onnx_recurrent import Layer, gru
assert onnx_recurrent.gru is gru and "onnx_recurrent.ops" in sys.modules
assert Layer.__module__ == "onnx_recurrent.layers"
from onnx_recurrent import InferenceSession
assert onnx_recurrent.convert.from_torch and onnx_recurrent.vad
assert onnx_recurrent.StreamingSession and InferenceSession is onnx_recurrent.InferenceSession
assert set(onnx_recurrent.__all__) <= set(dir(onnx_recurrent)), onnx_recurrent.__all__
assert {"InferenceSession", "convert", "vad", "gru"} <= set(onnx_recurrent.__all__)
try:
    onnx_recurrent.nothing_of_that_name
except AttributeError as e:
    assert "nothing_of_that_name" in str(e)
else:
    raise AssertionError("no AttributeError")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    *loaded, llvmlite = done.stdout.split()
    costly = ("onnx_recurrent.convert", "onnx_recurrent.runtime", "onnx_recurrent.layers")
    assert not [m for m in loaded if _is_tool(m) or m == "onnx" or m.startswith(costly)]
    assert "onnx_recurrent.ops" not in loaded and llvmlite == "False"


def test_ml_dtypes_is_loaded_only_for_bfloat16():
    """ml_dtypes 0.7 takes 0.4 s to import: a float32 call of the functions or a
    ``Layer`` does not load it (a fresh process 0.87-0.91 s -> 0.49-0.52 s on a Zen 5);
    an array of bfloat16 has loaded it, and is told from the others without it."""
    code = """
import sys
import numpy as np
import onnx_recurrent as orc
from onnx_recurrent.spec import compute_dtype, is_bfloat16

X = np.ones((5, 2, 3), np.float32)
W, R = np.full((1, 12, 3), 0.1, np.float32), np.full((1, 12, 4), 0.1, np.float32)
orc.gru(X, W, R)
orc.Layer("GRU", W, R, attributes={"hidden_size": 4})(X)
assert compute_dtype(np.dtype(np.int32)) is None and not is_bfloat16(np.float32)
print("ml_dtypes" in sys.modules)
import ml_dtypes

assert is_bfloat16(np.dtype(ml_dtypes.bfloat16))
assert compute_dtype(np.dtype(ml_dtypes.bfloat16)) == np.float32
bf16 = ml_dtypes.bfloat16
Y, Y_h = orc.gru(X.astype(bf16), W.astype(bf16), R.astype(bf16))
assert Y.dtype == bf16
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


OPERATORS = ("GRU", "LSTM", "RNN")


def _operator_tables(tree: ast.AST) -> list[int]:
    """Lines of dict displays keyed by two or more operator names whose values are
    literals (numbers, strings, tuples or dicts of them): operator facts written down."""

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Tuple | ast.List):
            return all(literal(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            pairs = zip(node.keys, node.values, strict=True)
            return all(k is not None and literal(k) and literal(v) for k, v in pairs)
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if sum(k in OPERATORS for k in keys) >= 2 and all(literal(v) for v in node.values):
                found.append(node.lineno)
    return found


def test_operator_facts_live_in_the_cells():
    """Gates, activation slots, outputs, states, peepholes and the compiled step's code
    of each operator are written in cells.py only; the backends, the runtime and the
    tools read them there (cells.CELLS). Where they are read, so that adding an
    operator is its cell plus its compiled step: listed below."""
    # PyTorch's and Keras' gate orders, PyTorch's modes: the frameworks' facts
    interop = {"onnx_recurrent.convert": 2}  # _ORDERS, _TORCH_MODES
    tables = {
        name: lines
        for name, path in MODULES.items()
        if name != "onnx_recurrent.cells"
        and len(lines := _operator_tables(ast.parse(path.read_text()))) > interop.get(name, 0)
    }
    assert not tables, f"operator facts written outside cells.py: {tables}"
    readers = {
        name
        for name, path in MODULES.items()
        if "CELLS" in path.read_text() and name != "onnx_recurrent.cells"
    }
    expected = {
        "onnx_recurrent.backends.plans",  # the compiled step's code (kind)
        "onnx_recurrent.runtime.graph",  # versions, inputs by position
        "onnx_recurrent.runtime.streaming",  # which inputs and outputs are states
        "onnx_recurrent.convert",  # gates, default activations, own attribute
        "onnx_recurrent.runtime.hosts.native",  # the nodes' outputs
        "onnx_recurrent.tools.bench.cases",  # gates (multiply-adds)
        "onnx_recurrent.tools.check.probes",  # outputs, functions, default activations
        "onnx_recurrent.tools.check.dims",  # outputs
        "onnx_recurrent.tools.check.trace",  # gate letters and activation slots
    }
    assert expected <= readers, expected - readers


# --- the public names: documented ones and each module's __all__, by either path ---------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: what ends a file's name (``convert.py``), not a Python name
FILE_SUFFIXES = ("py", "md", "onnx", "npy", "npz", "json", "html", "csv", "wav")
#: old path -> new and back
RENAMES = {**ALIASES, **{new: old for old, new in ALIASES.items()}}


def _code(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text, then its inline code spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _documented_names() -> set[str]:
    """Dotted names the docs show: what ``from onnx_recurrent... import X`` and ``import
    onnx_recurrent... [as y]`` import, ``onnx_recurrent.X...`` written out, and ``y.X``
    where ``y`` is a name that code imported from the package."""
    names: set[str] = set()
    for path in DOCS:
        codes, local = _code(path.read_text()), {}  # names imported anywhere in the file
        for code in codes:
            for source, listed in re.findall(
                r"^\s*from (onnx_recurrent[\w.]*) import (\([^)]*\)|[\w ,]+)", code, re.M
            ):
                for part in listed.strip("()").split(","):
                    name, _, alias = part.strip().partition(" as ")
                    if name:
                        names.add(f"{source}.{name}")
                        local[alias or name] = f"{source}.{name}"
            for source, alias in re.findall(
                r"^\s*import (onnx_recurrent[\w.]*)(?: as (\w+))?", code, re.M
            ):
                names.add(source)
                local[alias or source] = source
        for code in codes:
            names |= set(re.findall(r"\bonnx_recurrent(?:\.\w+)+", code))
            for name, full in local.items():
                pattern = rf"(?<![\w.]){re.escape(name)}((?:\.\w+)+)(?![\w/])"
                names |= {full + attrs for attrs in re.findall(pattern, code)}
    return {n for n in names if n.rpartition(".")[2] not in FILE_SUFFIXES}


def _load(name: str) -> object:
    """What the dotted ``name`` names: a module, or an attribute of one."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as e:
            if e.name != ".".join(parts[:end]):
                raise
            continue
        break
    for attr in parts[end:]:
        found = getattr(found, attr)
    return found


def _other_path(name: str) -> str | None:
    """``name`` by the other path: an old path's by tools/, a tool's by its old path."""
    for start, other in RENAMES.items():
        if name == start or name.startswith(start + "."):
            return other + name[len(start) :]
    return None


def _public_names() -> set[str]:
    """Each module's ``__all__``, as ``module.name`` (found in the source)."""
    names = set()
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names |= {f"{module}.{n}" for n in ast.literal_eval(node.value)}
    return names


def test_the_documented_names_import():
    """Every name the README and docs/ show, and every ``__all__``, resolves; a tool's
    name by its old path and by tools/ alike, to the same object."""
    documented = _documented_names()
    assert {"onnx_recurrent.vad.detect", "onnx_recurrent.dask.run"} <= documented
    assert "onnx_recurrent.convert.from_torch" in documented  # ``convert.from_torch``
    public = _public_names()
    assert "onnx_recurrent.tools.vad.detect" in public
    wrong = []
    for name in sorted(documented | public):
        try:
            found = _load(name)
            other = _other_path(name)
            if other is not None and _load(other) is not found:
                wrong.append(f"{name}: {other} is another object")
        except (ImportError, AttributeError) as e:
            wrong.append(f"{name}: {type(e).__name__}: {e}")
    assert not wrong, wrong


def test_the_old_paths_are_the_same_modules():
    """In a fresh interpreter, each tool module imported by its old path first, then
    by tools/: one module object per file, whichever path came first."""
    tools = [m for m in MODULES if m.startswith("onnx_recurrent.tools.") and "._" not in m]
    olds = [_other_path(m) for m in tools]
    code = f"""
import importlib, sys
olds, news = {[o for o in olds if o]!r}, {[m for m, o in zip(tools, olds, strict=True) if o]!r}
for old, new in zip(olds, news):
    assert importlib.import_module(old) is importlib.import_module(new), old
    assert sys.modules[old] is sys.modules[new] and sys.modules[new].__name__ == new, old
    assert sys.modules[new].__spec__.name == new, old
files = {{}}
for name, module in list(sys.modules.items()):
    if name.startswith("onnx_recurrent") and getattr(module, "__file__", None):
        files.setdefault(module.__file__, set()).add(id(module))
assert all(len(ids) == 1 for ids in files.values()), files
import onnx_recurrent.vad as vad
assert callable(vad.detect) and vad.detect.__module__ == "onnx_recurrent.tools.vad.detect"
print(len(olds))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 25


def test_the_entry_points():
    """The console script is the tools' ``main``, which runs tools/cli's inside Ctrl-C's
    one line; ``python -m onnx_recurrent`` runs it."""
    text = (ROOT / "pyproject.toml").read_text()
    (script,) = re.findall(r'^onnx-recurrent = "([\w.]+):(\w+)"$', text, re.M)
    assert script == ("onnx_recurrent.tools", "main")
    main = getattr(importlib.import_module(script[0]), script[1])
    assert main is importlib.import_module("onnx_recurrent.__main__").main
    assert "onnx_recurrent.tools" in _graph(everywhere=False)["onnx_recurrent.__main__"]


def _map_names() -> set[str]:
    """The ``name.py`` and ``folder/`` words of docs/architecture.md's map (its first
    code block)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```", 2)[1]
    names = set()
    for token in re.findall(r"[\w./]+", block):  # runtime/hosts/, bench/models.py, cli.py
        *folders, last = token.split("/")
        if last.endswith(".py") or (folders and not last):
            names |= {f"{f}/" for f in folders if f} | ({last} if last else set())
    return names


def test_the_architecture_map_names_every_module():
    """docs/architecture.md's map of the folder names each module (its file, or its
    folder for a package's ``__init__``; the old paths are named as a group) and no
    file that is not there."""
    files = {
        path.relative_to(PACKAGE)
        for module, path in MODULES.items()
        if module not in ALIASES and module != "onnx_recurrent"
    }
    named = _map_names()
    missing = sorted(
        str(f)
        for f in files
        if (f.parent.name + "/" if f.name == "__init__.py" else f.name) not in named
    )
    assert not missing, f"docs/architecture.md's map does not name {missing}"
    existing = {f.name for f in files} | {f"{p.name}/" for f in files for p in f.parents}
    assert named - existing <= {"vad.py"}, sorted(named - existing)  # vad.py: an old path
