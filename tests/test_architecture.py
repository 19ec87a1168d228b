"""The package's two layers, its lazy loading and its import graph.

A library that computes (spec, cells, scan, backends, layers, ops, runtime, convert)
and tools on top (cli, check, bench, vad, dask): a tool imports the library, never the
reverse, and ``import onnx_recurrent`` loads the library only, its costly parts (the
runtime and onnx, convert) when first used.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "onnx_recurrent"
#: the tool layer: ``tools/``, ``__main__`` and the tools' old paths (aliases)
TOOLS = ("tools", "__main__", "cli", "check", "bench", "vad", "dask")


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


def _imports(module: str, statements: list[ast.stmt], everywhere: bool) -> set[str]:
    """The package's modules that ``statements`` import: at module level (outside ``if
    TYPE_CHECKING:``), or ``everywhere`` (function bodies included). ``from X import y``
    imports ``X.y`` where that is a module, else ``X``; ``from __future__`` is no import."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
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
                found.add(sub if sub in MODULES else source)
        elif isinstance(node, ast.If) and _type_checking(node.test):
            nodes.extend(node.orelse)
        elif everywhere or isinstance(node, ast.If | ast.Try | ast.With):
            nodes.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in MODULES}


def _graph(everywhere: bool) -> dict[str, set[str]]:
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}
    return {m: _imports(m, tree.body, everywhere) - {m} for m, tree in trees.items()}


def test_the_library_imports_no_tool():
    """By the source (any import statement, function bodies included)."""
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph(everywhere=True).items()
        if not _is_tool(module)
        for target in sorted(targets)
        if _is_tool(target)
    ]
    assert not wrong, wrong
    assert any(_is_tool(m) for m in MODULES) and any(not _is_tool(m) for m in MODULES)


def test_no_import_cycles():
    """Module-level imports among the package's modules form no cycle (Tarjan's SCCs)."""
    graph = _graph(everywhere=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # recursive Tarjan: the graph is small
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
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
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_finder_finds_one(tmp_path, monkeypatch):
    """The test above can fail: two modules importing each other are found."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("from .a import x\nif TYPE_CHECKING:\n    from . import c\n")
    (tmp_path / "c.py").write_text("from __future__ import annotations\nfrom .b import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    graph = _graph(everywhere=False)
    assert graph["onnx_recurrent.a"] == {"onnx_recurrent.b"}
    assert graph["onnx_recurrent.b"] == {"onnx_recurrent.a"}  # c under TYPE_CHECKING
    assert graph["onnx_recurrent.c"] == {"onnx_recurrent.b"}


def test_import_loads_the_library_only():
    """In a fresh interpreter: no tool, no onnx, no convert until asked for; then every
    public name is there, lazily (PEP 562)."""
    code = """
import sys
import onnx_recurrent
loaded = sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx_recurrent."))
print(" ".join(loaded))
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
    loaded = done.stdout.split()
    costly = ("onnx_recurrent.convert", "onnx_recurrent.runtime")
    assert not [m for m in loaded if _is_tool(m) or m == "onnx" or m.startswith(costly)]
    assert "onnx_recurrent.ops" in loaded and "onnx_recurrent.layers" in loaded


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
        "onnx_recurrent.tools.bench.cases",  # gates (multiply-adds), outputs
        "onnx_recurrent.tools.check.probes",  # outputs, functions, default activations
        "onnx_recurrent.tools.check.dims",  # outputs
        "onnx_recurrent.tools.check.trace",  # gate letters and activation slots
    }
    assert expected <= readers, expected - readers
