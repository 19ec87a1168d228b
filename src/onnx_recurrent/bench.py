"""The old path of :mod:`onnx_recurrent.tools.bench`: the same module (and submodules)."""

from .tools._aliases import alias

alias(__name__)
