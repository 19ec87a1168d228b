"""The errors onnx-recurrent raises for bad input, and the two helpers that word errors.

Both error classes subclass a builtin, so ``except ValueError`` / ``except TypeError``
catch them. :func:`one_line` puts any exception on one line (the CLI, the tools' rows
and tables); :func:`import_optional` imports an optional package or says which
``pip install`` brings it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import Any


class RecurrentError(ValueError):
    """An input or attribute has a wrong value or shape; the message names it."""


class RecurrentTypeError(TypeError):
    """An input has a wrong element type; the message names it."""


#: OpenVINO's source locations, one a line
_OPENVINO_WHERE = re.compile(r"Exception from \S+:\d+:?")
#: onnxruntime's source paths and C++ signatures
_ORT_WHERE = re.compile(r"/\S+\.(?:h|cc|cpp):\d+\s*|\S+::\S+\([^)]*\)\s*")
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : ")


def one_line(
    error: BaseException, width: int = 400, *, typed: bool | None = None, named: bool = True
) -> str:
    """``error`` on one line of at most ``width`` characters (cut with ``...``).

    The lines of its message are joined and white space folded; what the peers wrap
    around the reason is dropped: onnx.reference's "Issues with types" wrapper (its
    cause is shown), OpenVINO's source locations, onnxruntime's source paths, C++
    signatures and error-code prefix.

    Parameters
    ----------
    error : BaseException
        The exception.
    width : int, default 400
        The longest line returned.
    typed : bool, optional
        Put the type's name first. By default, unless the error is ours
        (:class:`RecurrentError`, :class:`RecurrentTypeError`) or an ``OSError``: their
        messages stand alone. An empty message gives the type's name either way.
    named : bool, default True
        An ``OSError``'s file name first (``"name: reason"``). False where the caller
        names the file: then only the reason (``strerror``, or soundfile's
        ``error_string``).

    Returns
    -------
    str
    """
    while error.__cause__ is not None and str(error).startswith("Issues with types"):
        error = error.__cause__
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror
        if named and error.filename is not None:
            text = f"{error.filename}: {text}"
    else:
        message = (None if named else getattr(error, "error_string", None)) or str(error)
        lines = [s.strip() for s in message.splitlines()]
        text = " ".join(s for s in lines if s and not _OPENVINO_WHERE.fullmatch(s))
        text = re.split(r"HAS THROWN:\s*", " ".join(text.split()))[-1]
        text = _ORT_PREFIX.sub("", _ORT_WHERE.sub("", text))
    if typed is None:
        typed = not isinstance(error, (RecurrentError, RecurrentTypeError, OSError))
    if not text:
        text = type(error).__name__
    elif typed:
        text = f"{type(error).__name__}: {text}"
    return text if len(text) <= width else text[: width - 3] + "..."


def import_optional(module: str, what: str, install: str, *, find_only: bool = False) -> Any:
    """Import ``module``, an optional dependency, or say how to install it.

    Parameters
    ----------
    module : str
        The module (``"torch"``, ``"dask.array"``...).
    what : str
        What needs it, for the message (``"from_torch"``, ``"plots"``...).
    install : str
        The command that brings it (``"pip install 'onnx-recurrent[vad]'"``).
    find_only : bool, default False
        Locate the package without importing it (its import is slow or heavy) and
        return its ``ModuleSpec``.

    Returns
    -------
    module or importlib.machinery.ModuleSpec

    Raises
    ------
    ModuleNotFoundError
        It is not installed: ``"{what} needs {module}, which is not installed:
        {install}"`` (``name`` set).
    ImportError
        It is installed but its import fails (a library it loads is missing, say);
        the message adds why.
    """
    if find_only:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ModuleNotFoundError(
                f"{what} needs {module}, which is not installed: {install}", name=module
            )
        return spec
    from .held import interrupts_held

    # whole or not at all, Ctrl-C or not (held.import_whole); a held signal's
    # exception (a timeout's TimeoutError, an OSError) raised past the try, as itself
    with interrupts_held():
        try:
            return importlib.import_module(module)
        except (ImportError, OSError) as e:  # OSError: a library it loads is missing
            failed = e
    raise _import_failed(failed, module, what, install)


def _import_failed(e: BaseException, module: str, what: str, install: str) -> ImportError:
    """The error :func:`import_optional` raises for the import of ``module`` failing."""
    name = getattr(e, "name", None)
    if isinstance(e, ModuleNotFoundError) and name and f"{module}.".startswith(f"{name}."):
        return ModuleNotFoundError(
            f"{what} needs {name}, which is not installed: {install}", name=name
        )
    return ImportError(
        f"{what} needs {module}, which cannot be imported ({one_line(e)}): {install}",
        name=module,
    )
