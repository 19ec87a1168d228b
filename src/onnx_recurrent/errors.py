"""The errors onnx-recurrent raises for bad input.

Both subclass a builtin, so ``except ValueError`` / ``except TypeError`` catch them.
"""

from __future__ import annotations


class RecurrentError(ValueError):
    """An input or attribute has a wrong value or shape; the message names it."""


class RecurrentTypeError(TypeError):
    """An input has a wrong element type; the message names it."""
