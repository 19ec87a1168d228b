"""What the commands share on the command line: a model's inputs (``-i NAME=FILE.npy``,
the others drawn at random: ``--dim NAME=VALUE``, ``--seed``), ``--host``, an output
file checked before the work and replaced whole after it, and the note on the kernels'
first compilation. A tool module: the library never imports it (models are read by
:func:`onnx_recurrent.runtime.session.load_model`).

Every mistake here is a :class:`~onnx_recurrent.errors.RecurrentError` naming the
file or argument, which the command line prints as one line (exit status 2).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import stat
import sys
import threading
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx.helper import tensor_dtype_to_np_dtype

from .. import threads
from ..errors import RecurrentError, one_line
from ..runtime.files import in_place, output_file
from ..runtime.hosts import HOSTS
from ..runtime.session import NodeArg


def add_model_inputs(parser: argparse.ArgumentParser) -> None:
    """``-i NAME=FILE.npy``, ``--dim NAME=VALUE`` and ``--seed``."""
    parser.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file (repeatable); float inputs not given are drawn at random",
    )
    parser.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="size of a free dim of the random inputs, by its name, or as INPUT:AXIS for an "
        "unnamed one (default 1 for a dim whose name contains 'batch', else 8; check first "
        "infers those the model fixes)",
    )
    parser.add_argument(
        "--seed", type=number(int, 0, "a seed"), default=0, help="seed of the random inputs"
    )


def add_host(parser: argparse.ArgumentParser) -> None:
    """``--host``: who runs the graph (:class:`~onnx_recurrent.InferenceSession`)."""
    parser.add_argument(
        "--host",
        choices=HOSTS,
        default="auto",
        help="who runs the non-recurrent nodes: onnxruntime (custom nodes for the recurrent "
        "ones), onnx.reference, or auto (onnxruntime where it can; default)",
    )


def parse_pairs(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` as a dict; a clear error for an item without ``=`` and
    for a name given twice."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise RecurrentError(f"{option} expects NAME=VALUE, got {pair!r}")
        if name in parsed:
            raise RecurrentError(f"{option} {name}: given twice ({parsed[name]!r}, {value!r})")
        parsed[name] = value
    return parsed


def dim_key(name: str, axis: int, dim: int | str | None) -> str | None:
    """How ``--dim`` names axis ``axis`` of input ``name``: its dim's name, ``NAME:AXIS``
    for an unnamed free dim, None for a fixed one (0 included, as onnxruntime has it:
    drawn free, it failed the run, and ``--dim X:1=0`` is refused)."""
    if isinstance(dim, int) and dim >= 0:
        return None
    return dim if isinstance(dim, str) else f"{name}:{axis}"


def free_dims(inputs: Sequence[NodeArg]) -> dict[str, list[tuple[str, int]]]:
    """Each free dim of ``inputs`` by its ``--dim`` name (:func:`dim_key`), with the
    (input, axis) pairs it sizes."""
    keys: dict[str, list[tuple[str, int]]] = {}
    for arg in inputs:
        for axis, dim in enumerate(arg.shape or []):
            key = dim_key(arg.name, axis, dim)
            if key is not None:
                keys.setdefault(key, []).append((arg.name, axis))
    return keys


#: the largest ``--dim`` value: an ONNX dim is an int64
MAX_DIM = 2**63 - 1

#: numbers as the command line takes them: ASCII only (Python's int and float also
#: take other scripts' digits, '٣', and underscores, '1_000')
_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_dims(pairs: Sequence[str], inputs: Sequence[NodeArg]) -> dict[str, int]:
    """``--dim`` values: positive integers for the free dims of ``inputs``, named by
    their name or, for an unnamed one, as ``INPUT:AXIS``."""
    keys = free_dims(inputs)
    named = sorted({d for i in inputs for d in i.shape or [] if isinstance(d, str)})
    unnamed = [k for k in keys if k not in named]
    dims = {}
    for name, value in parse_pairs(pairs, "--dim").items():
        if name not in keys:
            if not keys:
                known = "none: every dim of its inputs is fixed"
            else:
                known = ", ".join(named) if named else "none named"
                known += f"; unnamed, as INPUT:AXIS: {', '.join(unnamed)}" if unnamed else ""
            raise RecurrentError(f"--dim {name}={value}: the model has no dim {name!r} ({known})")
        try:  # ASCII digits only: int() also takes '٣' and '1_000'
            dims[name] = int(value) if _ASCII_INT.fullmatch(value) else 0
        except ValueError:  # more digits than int() converts
            dims[name] = 0
        if not 1 <= dims[name] <= MAX_DIM:
            raise RecurrentError(
                f"--dim {name}={value}: the value must be a positive integer up to {MAX_DIM} "
                "in ASCII digits (an ONNX dim is an int64)"
            )
    return dims


def load_feeds(
    files: Mapping[str, str],
    inputs: Sequence[NodeArg],
    overridable: Sequence[NodeArg] = (),
) -> dict[str, np.ndarray]:
    """One ``.npy`` file per input name (names the model's inputs, or its
    ``overridable`` initializers: those the graph also lists as inputs, which a feed
    replaces; ``NAME=FILE`` split after the input name, which may hold ``=``)."""
    names = [i.name for i in inputs] + [i.name for i in overridable]
    types = {i.name: i.type for i in (*inputs, *overridable)}
    feeds = {}
    for name, path in files.items():
        if name not in names:  # a name with '=' in it: the longest input name it starts with
            given = f"{name}={path}"
            longest = max((n for n in names if given.startswith(f"{n}=")), key=len, default=None)
            if longest is None or longest in files or longest in feeds:
                known = f"{[i.name for i in inputs]}"
                if overridable:
                    known += f"; overridable initializers {[i.name for i in overridable]}"
                raise RecurrentError(f"-i {given}: the model has no input {name!r} ({known})")
            name, path = longest, given[len(longest) + 1 :]
        feeds[name] = _bfloat16_read(_load_npy(path, f"-i {name}={path}"), types.get(name))
    return feeds


def _bfloat16_read(array: np.ndarray, type_: str | None) -> np.ndarray:
    """``array`` as ml_dtypes' bfloat16 where the input is one and ``numpy.save`` wrote
    it as two raw bytes (``|V2``: NumPy has no name for ml_dtypes' types; ``-o`` saves
    bfloat16 outputs so): else refused as ``|V2``, and no bfloat16 input could be
    given as a file."""
    if type_ != "tensor(bfloat16)" or array.dtype != np.dtype("V2"):
        return array
    import ml_dtypes

    return array.view(ml_dtypes.bfloat16)


def _load_npy(path: str, label: str) -> np.ndarray:
    try:
        with open(path, "rb") as raw:
            f = raw if raw.seekable() else io.BytesIO(raw.read())  # a pipe: read once
            is_npy = f.read(6) == b"\x93NUMPY"
            f.seek(0)
            if is_npy:
                _check_npy_header(f, label)
                f.seek(0)
            array = np.load(f, allow_pickle=False) if is_npy else None
    except RecurrentError:
        raise
    except OSError as e:
        raise RecurrentError(
            f"{label}: cannot read it ({one_line(e, typed=False, named=False)})"
        ) from None
    except ValueError as e:  # a damaged .npy, or one of Python objects
        raise RecurrentError(
            f"{label}: not a readable .npy file ({one_line(e, typed=False)})"
        ) from None
    except MemoryError:  # as much data as the header claims, but more than the memory
        raise RecurrentError(f"{label}: the array is larger than the memory") from None
    if array is None:
        raise RecurrentError(f"{label}: not a .npy file (numpy.save writes one)")
    return array


def _check_npy_header(f: BinaryIO, label: str) -> None:
    """Read the header of the ``.npy`` file ``f`` (at its start) and refuse a bad one,
    or one that claims more data than the file holds, before ``numpy.load`` allocates
    what it claims (a damaged header gave tokenize's TokenError, or a MemoryError for
    petabytes)."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # version 3 (UTF-8 field names): numpy.load reads it alone
            return
    except (ValueError, SyntaxError, tokenize.TokenError) as e:
        token = isinstance(e, tokenize.TokenError) and e.args  # (message, position)
        why = str(e.args[0]) if token else one_line(e, typed=False)
        raise RecurrentError(
            f"{label}: not a readable .npy file: its header is bad ({why})"
        ) from None
    if any(d < 0 for d in shape):
        raise RecurrentError(
            f"{label}: not a readable .npy file: its header is bad (shape {list(shape)})"
        )
    if isinstance(f, io.BytesIO):  # a pipe's, read whole
        held = len(f.getbuffer()) - f.tell()
    elif stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        held = os.fstat(f.fileno()).st_size - f.tell()
    else:  # a device: its size is not known
        return
    if dtype.hasobject:  # Python objects: refused by numpy.load
        return
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > held:
        raise RecurrentError(
            f"{label}: not a readable .npy file: its header claims shape {list(shape)} "
            f"{dtype}, {_size(claimed)} of data, but the file holds {_size(held)} after it"
        )


def _size(count: int) -> str:
    """A number of bytes to read: ``40 bytes``, ``1.5 GiB``."""
    if count < 2**30:
        return f"{count} bytes"
    return f"{count / 2**30:.3g} GiB"


def random_feeds(
    inputs: Sequence[NodeArg], dims: Mapping[str, int], seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded standard-normal float arrays for the given inputs.

    A free dim takes its value from ``dims`` by its ``--dim`` name (its name, or
    ``INPUT:AXIS`` if it has none: :func:`dim_key`), else 1 for a name containing
    "batch" and 8 for any other.

    Raises
    ------
    ValueError
        An input of a non-float type (its values cannot be guessed), or of a shape too
        large for the memory (``--dim``).
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in inputs:
        dtype = np.dtype(tensor_dtype_to_np_dtype(arg.elem_type))
        if dtype.kind != "f" and dtype.name != "bfloat16":
            raise RecurrentError(
                f"input {arg.name!r} is {arg.type}: its values cannot be drawn at random; "
                f"give it as -i {arg.name}=FILE.npy"
            )
        shape = []
        for axis, d in enumerate(arg.shape or []):
            key = dim_key(arg.name, axis, d)
            if key is None:
                shape.append(d)
            elif key in dims:
                shape.append(int(dims[key]))
            else:
                shape.append(1 if isinstance(d, str) and "batch" in d.lower() else 8)
        try:
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        except (MemoryError, ValueError):  # ValueError: more than NumPy can index
            size = np.prod(shape, dtype=float) * 8 / 2**30
            raise RecurrentError(
                f"input {arg.name!r}: drawing shape {shape} needs {size:.3g} GiB, more "
                "memory than there is: give its dims smaller with --dim"
            ) from None
    return feeds


def with_given_dims(
    dims: Mapping[str, int], inputs: Sequence[NodeArg], feeds: Mapping[str, Any]
) -> dict[str, int]:
    """``dims`` (by ``--dim`` name) with the sizes of the free dims that the arrays in
    ``feeds`` have, so that inputs drawn at random share them.

    Raises
    ------
    ValueError
        (``RecurrentError``) a ``--dim`` that a given array contradicts (it was
        ignored, or the drawn inputs took it and the model failed on them)."""
    fixed = dict(dims)
    for arg in inputs:
        shape = np.shape(feeds[arg.name]) if arg.name in feeds else None
        if shape is None or arg.shape is None or len(shape) != len(arg.shape):
            continue
        for axis, d in enumerate(arg.shape):
            key = dim_key(arg.name, axis, d)
            if key is None:
                continue
            if key in dims and dims[key] != shape[axis]:
                raise RecurrentError(
                    f"--dim {key}={dims[key]} disagrees with -i {arg.name}: its array has "
                    f"{shape[axis]} on axis {axis} (shape {list(shape)})"
                )
            fixed.setdefault(key, int(shape[axis]))
    return fixed


def model_feeds(
    args: argparse.Namespace, inputs: Sequence[NodeArg], overridable: Sequence[NodeArg] = ()
) -> tuple[dict[str, np.ndarray], set[str]]:
    """The feeds of ``-i``, ``--dim`` and ``--seed`` for a model of these ``inputs``
    (``-i`` may also replace an ``overridable`` initializer: :func:`load_feeds`), and
    the names of those drawn at random (a dim they share with a given input takes its
    size)."""
    feeds = load_feeds(parse_pairs(args.input, "-i"), inputs, overridable)
    given = [*inputs, *overridable]
    dims = with_given_dims(parse_dims(args.dim, inputs), given, feeds)
    missing = [i for i in inputs if i.name not in feeds]
    drawn = random_feeds(missing, dims, seed=args.seed)
    return {**feeds, **drawn}, set(drawn)


def number(
    kind: type, minimum: float, what: str, strict: bool = False, maximum: float = math.inf
) -> Any:
    """An argparse type: a finite ``kind`` number (``int`` or ``float``) in ASCII
    digits, >= ``minimum`` (> with ``strict``), at most ``maximum``; argparse exits with
    status 2 and one line on anything else (another script's digits, ``1_000``)."""
    bound = f"more than {minimum:g}" if strict else f"{minimum:g} or more"
    if maximum < math.inf:
        bound += f", at most {maximum:g}"

    ascii_number = _ASCII_INT if kind is int else _ASCII_FLOAT

    def parse(text: str) -> Any:
        try:
            value = kind(text) if ascii_number.fullmatch(text) else None
        except ValueError:  # more digits than int() converts
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or value < minimum
            or (strict and value == minimum)
            or value > maximum
        ):
            raise argparse.ArgumentTypeError(f"expected {what}, {bound}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


#: a Ctrl-C that Python could not raise where it landed (in a finalizer: distributed's
#: ``Future.__del__`` printed "Exception ignored ... KeyboardInterrupt", and ``vad
#: --workers`` went on to the end, status 0): kept by :func:`lost_interrupts`
_lost = threading.Event()


@contextmanager
def lost_interrupts() -> Iterator[None]:
    """A command's block in which a KeyboardInterrupt that Python swallows (an
    unraisable exception) is kept for :func:`raise_lost_interrupt`, not printed; other
    unraisable exceptions go to the hook before."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            _lost.set()
        else:
            previous(unraisable)

    _lost.clear()
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def raise_lost_interrupt() -> None:
    """Raise the KeyboardInterrupt that :func:`lost_interrupts` kept, if any."""
    if _lost.is_set():
        _lost.clear()
        raise KeyboardInterrupt


def ascii_number(kind: type) -> Any:
    """An argparse type: a ``kind`` number (``int`` or ``float``, ``inf`` and ``nan``
    taken, for a later check that names the option) written in ASCII: Python reads
    another script's digits too (``٠.٥`` as 0.5)."""

    def parse(text: str) -> Any:
        try:
            if text.isascii():
                return kind(text)
        except ValueError:
            pass
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")

    parse.__name__ = kind.__name__  # argparse's "invalid float value"
    return parse


def file_name(text: str) -> str:
    """An argparse type: a file name (not empty: an empty one wrote nothing, silently;
    not ``-``, which wrote a file named ``-`` where standard output was meant)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got ''")
    if text == "-":
        raise argparse.ArgumentTypeError(
            "expected a file name, got '-': this is not written to standard output "
            "(for a file named -, give ./-)"
        )
    return text


def file_name_or_stdout(text: str) -> str | None:
    """An argparse type: a file name, or ``-`` for standard output (None)."""
    return None if text == "-" else file_name(text)


def writable(path: str, option: str, report: bool = False) -> None:
    """Check, before the work, that ``path`` can be written (:func:`saving`): it names
    a file (:func:`output_file`) whose directory (through a link, its target's) exists
    and may be written, and so may the file if it is there; a device or pipe may be
    written, but not (``report``: the command prints a report there) the pipe or file
    that standard output is (``/dev/stdout``: the report went into the output)."""
    if os.path.isdir(path):
        raise RecurrentError(f"{option} {path}: is a directory")
    if report and _is_stdout(path):
        raise RecurrentError(
            f"{option} {path}: is standard output, where the report is printed (the two "
            "would be mixed in one file): give another file"
        )
    if in_place(path):
        if not os.access(path, os.W_OK):
            raise RecurrentError(f"{option} {path}: not writable")
        return
    try:
        folder = os.path.dirname(output_file(path))  # there: output_file checked it
    except OSError as e:
        raise RecurrentError(f"{option} {path}: {e.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise RecurrentError(f"{option} {path}: the directory {folder!r} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise RecurrentError(f"{option} {path}: the file is not writable")


def _is_stdout(path: str) -> bool:
    """Whether ``path`` names the pipe, socket or file that standard output is."""
    try:
        out = os.fstat(sys.stdout.fileno())
        target = os.stat(path)
    except (OSError, ValueError, AttributeError):  # no stdout (closed, replaced)
        return False
    if not (stat.S_ISFIFO(out.st_mode) or stat.S_ISREG(out.st_mode) or stat.S_ISSOCK(out.st_mode)):
        return False  # a terminal or /dev/null: nothing is mixed in a file
    return (out.st_dev, out.st_ino) == (target.st_dev, target.st_ino)


#: the name of each element type's native code (the onnxruntime host's nodes)
NATIVE_ELEMENTS = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}


def recurrent_elements(model: onnx.ModelProto) -> set[int]:
    """The ONNX element types of ``model``'s recurrent nodes (their ``X``'s, else
    ``W``'s; float where neither can be told)."""
    from ..runtime.graph import RECURRENT_OPS, element_types, hosted, walk

    nodes = [n for _, n in walk(hosted(model).graph) if n.op_type in RECURRENT_OPS]
    if not nodes:
        return set()
    types = element_types(model)
    return {
        next((types[i] for i in n.input[:2] if i in types), onnx.TensorProto.FLOAT) for n in nodes
    }


def _numba_cache_state() -> tuple[bool, str | None]:
    from ..backends import jit_cache, numba_backend  # noqa: F401  (decorates the kernels)

    return jit_cache.cache_state()


def note_first_use(layers: bool = True, elements: set[int] | None = None) -> None:
    """One line on stderr when the kernels a command runs have no compiled code cached
    yet (first use: compiling takes seconds). ``layers``: the command runs layers
    (numba's kernels: the reference host, the bench, the check's peers) besides the
    native nodes of a session under onnxruntime (their machine code's own cache);
    ``elements``: the element types of the model's recurrent nodes (None: float's)."""
    from ..backends import native_code

    if elements is None:
        elements = {onnx.TensorProto.FLOAT}
    native = [f"compute-{n}" for e, n in NATIVE_ELEMENTS.items() if e in elements]
    found = [native_code.cached(kind) for kind in native]
    cached = all(c for c, _ in found)
    where = next((w for _, w in found if w is not None), None)
    if layers:
        # as the library loads its backend: whole, a handler's exception (a Ctrl-C, a
        # timer's) raised in the wait (numba half-imported failed every later call)
        numba_cached, numba_where = threads.compiling(_numba_cache_state)
        cached, where = cached and numba_cached, where if where is not None else numba_where
    if cached:
        return
    if where is None:
        print(
            "onnx-recurrent: compiling the kernels and planning them for this CPU (1-2 "
            "minutes on 2 cores; they cannot be cached here, so every run compiles them again)",
            file=sys.stderr,
        )
    else:
        print(
            f"onnx-recurrent: compiling the kernels and planning them for this CPU on first "
            f"use (1-3 minutes on 2 cores, once; cached in {where})",
            file=sys.stderr,
        )
