"""The tools' old paths (``onnx_recurrent.vad``...) as aliases of their modules here.

``import onnx_recurrent.vad`` runs ``onnx_recurrent/vad.py``, which calls :func:`alias`:
``sys.modules["onnx_recurrent.vad"]`` becomes ``onnx_recurrent.tools.vad`` itself, and a
finder maps each ``onnx_recurrent.vad.X`` to ``onnx_recurrent.tools.vad.X``, so that
there is one module object per module, whichever path imported it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old path -> the module it names now
ALIASES = {
    "onnx_recurrent.bench": "onnx_recurrent.tools.bench",
    "onnx_recurrent.check": "onnx_recurrent.tools.check",
    "onnx_recurrent.cli": "onnx_recurrent.tools.cli",
    "onnx_recurrent.dask": "onnx_recurrent.tools.dask",
    "onnx_recurrent.vad": "onnx_recurrent.tools.vad",
}


def target(name: str) -> str | None:
    """The module that ``name`` (an old path, or a submodule of one) names now."""
    for old, new in ALIASES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``onnx_recurrent.vad.X`` as the module ``onnx_recurrent.tools.vad.X``."""

    def find_spec(self, name, path=None, module=None):
        new = target(name)
        if new is None or name in ALIASES or importlib.util.find_spec(new) is None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        module = importlib.import_module(target(spec.name))
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


_FINDER = _Finder()


def alias(name: str) -> ModuleType:
    """Make the old path ``name`` the module it names now; returns that module."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    module = importlib.import_module(ALIASES[name])
    sys.modules[name] = module
    prefix = module.__name__ + "."
    for loaded, sub in list(sys.modules.items()):  # those loaded: no finder, no setattr
        if loaded.startswith(prefix):
            sys.modules.setdefault(name + loaded[len(module.__name__) :], sub)
    return module
