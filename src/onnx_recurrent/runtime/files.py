"""The files a model is read from (its own, its external data), and whether a path
names one of them: writing an output there would destroy that input (the tools'
outputs, a session's ``optimized_model_filepath``)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

import onnx
from onnx.external_data_helper import uses_external_data

from ..backends.cache_dirs import replacing


def same_file(output: str | os.PathLike, files: Sequence[str | os.PathLike]) -> str | None:
    """The one of ``files`` that ``output`` names (the same file: same device and
    inode, through any link or spelling of its path), or None: writing an output there
    would destroy that input."""
    try:
        target = os.stat(output)
    except (OSError, ValueError):  # not there yet: nothing to overwrite
        return None
    for path in files:
        try:
            found = os.stat(path)
        except (OSError, ValueError):  # a missing input gets its own error later
            continue
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            return os.fspath(path)
    return None


def external_data_files(model: str) -> list[str]:
    """The files that the model file ``model`` keeps tensors in (external data, named
    relative to the model's folder), each once; none where the model cannot be read
    (its own error comes when it is loaded) or is not a regular file (a pipe is read
    once)."""
    try:
        if not os.path.isfile(model):
            return []
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # the model's own error, later
        return []
    folder = os.path.dirname(model)
    files: dict[str, None] = {}

    def visit(initializers: Sequence[Any], sparse: Sequence[Any], nodes: Sequence[Any]) -> None:
        tensors = [*initializers]
        for node in nodes:
            for attr in node.attribute:
                tensors += [attr.t, *attr.tensors]
                sparse = [*sparse, attr.sparse_tensor, *attr.sparse_tensors]
                for graph in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                    visit(graph.initializer, graph.sparse_initializer, graph.node)
        tensors += [t for sp in sparse for t in (sp.values, sp.indices)]
        for tensor in tensors:
            if uses_external_data(tensor):
                where = {e.key: e.value for e in tensor.external_data}.get("location")
                if where:
                    files[os.path.join(folder, where)] = None

    graph = proto.graph
    visit(graph.initializer, graph.sparse_initializer, graph.node)
    for function in proto.functions:  # a function's constants
        visit([], [], function.node)
    return list(files)


def in_place(path: str) -> bool:
    """Whether ``path`` names an existing device or pipe (``/dev/null``), not a regular
    file or a directory: written in place, as named."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def output_file(path: str) -> str:
    """The file that writing ``path`` replaces (:func:`saving`), its directories and a
    link at its end resolved in turn, as the system resolves them, not by spelling
    (``os.path.realpath`` makes ``x`` of ``x/``, ``x/.`` and ``missing/../x``, where
    the system writes no file: an output there replaced the input ``x``).

    Raises
    ------
    OSError
        ``path`` ends in a directory (``/``, ``.``, ``..``: IsADirectoryError) or its
        directory is not there (FileNotFoundError); the error names ``path``.
    """
    head, tail = os.path.split(path)
    if tail in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, "names a directory, not a file", path)
    folder = head or "."
    if not os.path.isdir(folder):  # a stat: "missing/.." and "file/" are not there
        raise FileNotFoundError(errno.ENOENT, f"no such directory {folder!r}", path)
    return os.path.realpath(os.path.join(os.path.realpath(folder), tail))


@contextmanager
def saving(path: str) -> Iterator[BinaryIO]:
    """The binary file an output goes to: ``path`` (through a link, its target) replaced
    whole when the block ends, and left as it was if the block fails or is interrupted
    (:func:`~onnx_recurrent.backends.cache_dirs.replacing`); with the mode an existing
    file had, else the one the umask gives. A path that is not a regular file
    (``/dev/null``, a pipe) is written in place.

    Raises
    ------
    OSError
        The file cannot be written, or ``path`` names none (:func:`output_file`); the
        error names ``path``.
    """
    try:
        if in_place(path):
            with open(path, "wb") as f:
                yield f
            return
        real = output_file(path)
        try:
            mode = stat.S_IMODE(os.stat(real).st_mode)
        except FileNotFoundError:
            umask = os.umask(0o022)  # read by setting it: no other way to read it
            os.umask(umask)
            mode = 0o666 & ~umask
        with replacing(real, mode) as f:
            yield f
    except OSError as e:  # a write's error names no file (/dev/full: "No space left")
        if e.filename is not None or not e.errno:
            raise
        raise OSError(e.errno, e.strerror, path) from None
