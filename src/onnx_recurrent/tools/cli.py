"""The ``onnx-recurrent`` command line: a thin front on the library.

Each subcommand is loaded when it is used (``run`` is here; ``check``, ``bench`` and
``vad`` are their packages'), so that a command does not pay for the others; ``--help``
lists them all from :data:`COMMANDS`. A usage error (a bad file or argument, a model
that cannot run) is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import io
import os
import signal
import stat
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .. import __version__
from ..errors import RecurrentError, one_line
from ..runtime.files import external_data_files, same_file, saving
from ..runtime.session import InferenceSession, load_model
from .arguments import (
    add_host,
    add_model_inputs,
    file_name,
    lost_interrupts,
    model_feeds,
    note_first_use,
    parse_pairs,
    raise_lost_interrupt,
    recurrent_elements,
    writable,
)

EXAMPLE = "example_gru.onnx"
EXAMPLE_INPUT = "example_input.npy"
EXAMPLE_EXPECTED = "example_expected.npz"

#: subcommand -> (the module whose ``add_parser`` registers it, its one-line help)
COMMANDS = {
    "run": (__name__, "run a model (the bundled example if none is given)"),
    "check": (
        "onnx_recurrent.tools.check",
        "compare a model's outputs on onnx-recurrent and every installed peer",
    ),
    "bench": (
        "onnx_recurrent.tools.bench.command",
        "time GRU/LSTM/RNN against onnxruntime, OpenVINO and onnx.reference",
    ),
    "vad": (
        "onnx_recurrent.tools.vad.command",
        "find the speech in recordings (Silero VAD): one row per speech segment",
    ),
}


def _data(name: str) -> Path:
    return Path(str(resources.files("onnx_recurrent") / "data" / name))


def _preview(array: np.ndarray, count: int = 5) -> str:
    values = (  # numbers (bfloat16's too: Python floats) to 6 digits; text, bools as such
        f"{v:.6g}" if type(v) in (int, float) else repr(v) for v in array.ravel()[:count].tolist()
    )
    return "[" + ", ".join(values) + (" ..." if array.size > count else "") + "]"


def _describe(value: Any) -> str:
    """One output for the screen: an array's shape, dtype and first values; a sequence's
    tensors; else its Python type (a map)."""
    if isinstance(value, np.ndarray):
        return f"shape {list(value.shape)} {value.dtype} {_preview(value)}"
    if isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
        shown = ", ".join(f"{list(v.shape)} {v.dtype}" for v in value[:3])
        return f"sequence of {len(value)} tensors ({shown}{', ...' if len(value) > 3 else ''})"
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return f"sequence of {len(value)} maps {value[:2]}{' ...' if len(value) > 2 else ''}"
    return f"{type(value).__name__} {value!r:.80}"


def _arrays(names: Sequence[str], outputs: Sequence[Any]) -> dict[str, np.ndarray]:
    """The outputs as named arrays for a ``.npz``: a sequence's tensors as ``NAME/0``,
    ``NAME/1``... Raises RecurrentError for an output that is neither (a map) or a
    name met twice."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in zip(names, outputs, strict=True):
        if isinstance(value, np.ndarray):
            items = [(name, _storable(value))]
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
            items = [(f"{name}/{i}", _storable(v)) for i, v in enumerate(value)]
        else:  # a map: refused before the run (cmd_run)
            raise RecurrentError(f"-o: output {name!r} is not a tensor: {_describe(value)}")
        for key, array in items:
            if key in arrays:
                raise RecurrentError(f"-o: two outputs would be saved as {key!r}")
            arrays[key] = array
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    expected = None
    output = args.output
    if output:
        writable(output, "-o", report=True)  # as given first: "model.onnx/" is no ".npz"
        if not output.endswith(".npz") and not os.path.exists(output):  # as numpy.savez
            output += ".npz"  # (an existing file, device or pipe is written as named)
        writable(output, "-o")
        inputs = [] if args.model is None else [args.model]
        inputs += parse_pairs(args.input or [], "-i").values()
        # the files the model keeps its weights in (external data) are inputs too
        data = [] if args.model is None else external_data_files(args.model)
        # and the bundled example's (run reads them with no model given)
        bundled = [str(_data(name)) for name in (EXAMPLE, EXAMPLE_INPUT, EXAMPLE_EXPECTED)]
        clash = same_file(output, inputs + data + bundled)
        if clash is not None:
            what = " (the model's external data)" if clash in data else ""
            what = " (the bundled example's)" if clash in bundled else what
            raise RecurrentError(
                f"-o {output} is the input file {clash}{what}: writing the outputs there "
                "would overwrite it; give -o another file"
            )
    if args.model is None:
        if args.input or args.dim:
            given = "-i" if args.input else "--dim"
            raise RecurrentError(
                f"{given} needs a model path (the bundled example runs on its own input)"
            )
        model = _data(EXAMPLE)
        print(
            f"model: bundled example {model.name} (PyTorch 2-layer bidirectional "
            "batch-first nn.GRU + linear head)"
        )
        given = {"x": np.load(_data(EXAMPLE_INPUT))}
        with np.load(_data(EXAMPLE_EXPECTED)) as f:
            expected = dict(f)
    else:
        model = args.model
        print(f"model: {model}")
        given = None
    proto = load_model(model)  # read once: whether there is anything to compile
    elements = recurrent_elements(proto)
    if elements:
        # a session compiles its kernels when it is made; the reference host runs layers
        layers = args.host == "reference" or not find_spec("onnxruntime")
        note_first_use(layers=layers, elements=elements)
    session = InferenceSession(proto, host=args.host)
    print(f"host: {session.host}")
    if not session.recurrent_nodes:
        print(
            "note: the model has no GRU, RNN or LSTM node: onnx-recurrent computes nothing "
            f"in it ({session.host} runs all of it)"
        )
    if output:
        maps = [o for o in session.get_outputs() if "map(" in o.type]
        if maps:
            raise RecurrentError(
                f"-o {output}: output {maps[0].name!r} is a {maps[0].type}; a .npz file holds "
                "tensors and sequences of tensors"
            )
    if given is None:
        overridable = session.get_overridable_initializers()  # -i may replace them
        feeds, drawn = model_feeds(args, session.get_inputs(), overridable)
    else:
        feeds, drawn = given, set()
    for name, value in feeds.items():
        how = f"random (seed {args.seed})" if name in drawn else "given"
        print(f"input {name}: shape {list(value.shape)} {value.dtype}, {how}")
    start = time.perf_counter()
    outputs = session.run(None, feeds)
    elapsed = time.perf_counter() - start
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names, outputs, strict=True):
        print(f"output {name}: {_describe(value)}")
    print(f"wall time: {elapsed * 1e3:.1f} ms")
    status = 0
    if expected is not None:
        diff = max(
            float(np.max(np.abs(out.astype(np.float64) - expected[name])))
            for name, out in zip(names, outputs, strict=True)
        )
        print(f"max |difference| from PyTorch's output: {diff:.3g}")
        status = 0 if diff <= 1e-5 else 1
    if output:
        save_npz(output, _arrays(names, outputs))
        print(f"saved: {output}")
    return status


def _storable(array: np.ndarray) -> np.ndarray:
    """A string tensor (onnxruntime's object arrays of ``str``) as a NumPy string
    array, which ``numpy.load`` reads without unpickling; other arrays as they are."""
    if array.dtype == object and all(isinstance(v, str) for v in array.flat):
        return array.astype(np.str_)
    return array


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` into the ``.npz`` file ``path`` as :func:`numpy.savez` writes one (an
    uncompressed zip of ``NAME.npy``; :func:`numpy.load` reads it), under every name,
    ``file`` and ``allow_pickle`` too (keywords of ``savez``); ``path`` replaced whole
    (:func:`.arguments.saving`).

    Raises
    ------
    OSError
        The file cannot be written (an existing one is left as it was).
    """
    with saving(path) as f:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        target = f if regular else io.BytesIO()  # a zip seeks back; a device or pipe cannot
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, value in arrays.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
        if not regular:
            f.write(target.getvalue())


def add_parser(sub: Any) -> None:
    """Register the ``run`` subcommand."""
    run = sub.add_parser("run", help=COMMANDS["run"][1])
    run.add_argument(
        "model", nargs="?", help="path to an .onnx model; omit for the bundled example"
    )
    add_model_inputs(run)
    run.add_argument("-o", "--output", metavar="OUT.npz", type=file_name, help="save the outputs")
    add_host(run)
    run.set_defaults(handler=cmd_run)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line on stderr (status 2, as argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with ``command``'s subcommand loaded in full (the others listed with
    their help only; all of them in full when ``command`` is None)."""
    parser = _Parser(
        prog="onnx-recurrent",
        description="Run ONNX models; onnx-recurrent computes their GRU, RNN and LSTM nodes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, summary) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=summary)
        else:
            importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``onnx-recurrent``; returns the exit status.

    A bad file or argument, or a model that cannot run, is one line on stderr (no
    traceback) and status 2; so is each warning, on a line of its own, and a stdout
    that cannot be written (``> /dev/full``), named. A closed stdout (``| head``) ends
    the command quietly with status 141, as SIGPIPE ends Unix tools;
    Ctrl-C, with "interrupted" and status 130 (no traceback; files being written are
    left as they were).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    closed = sys.stdout is None
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:  # closed by the caller (>&-, 2>&-): Python's print
            setattr(sys, name, open(os.devnull, "w"))  # sent stderr's lines to stdout
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    except SystemExit as e:  # --help, --version into a closed stdout: said, as a run's
        if e.code in (0, None) and closed:
            print("onnx-recurrent: error: standard output: Bad file descriptor", file=sys.stderr)
            return 2
        raise
    prog = f"onnx-recurrent {args.command}"
    said: set[str] = set()  # each once (check makes a session twice: it warned twice)

    def warn(message: Warning | str, *_: Any, **__: Any) -> None:
        text = one_line(message, typed=False).removeprefix("onnx-recurrent: ")
        line = f"{prog}: warning: {text}"
        if line not in said:
            said.add(line)
            print(line, file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = warn
        try:
            _quiet_onnxruntime()  # (imports onnxruntime: Ctrl-C there is one line too)
            with _named_stdout(closed), lost_interrupts():
                status = args.handler(args)
                raise_lost_interrupt()  # swallowed where it landed (a finalizer)
                sys.stdout.flush()  # a reader gone away shows here, not at exit
            return status
        except BrokenPipeError:  # `onnx-recurrent ... | head`: stop quietly
            return _stdout_closed()
        except KeyboardInterrupt:  # Ctrl-C: one line, a shell's status for SIGINT
            print(f"{prog}: interrupted", file=sys.stderr)
            return 128 + int(signal.SIGINT)
        except Exception as e:  # ours and OSError bare; a host's (onnxruntime...) typed
            print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
    return 2


def _quiet_onnxruntime() -> None:
    """Turn onnxruntime's log off for the command: it logs a failing node on stderr (in
    colour, under the host's internal operator and node names) before the exception
    that the command prints in one line, and its warnings unformatted. Nothing where
    onnxruntime is not installed or fails to import (its shared library missing): a
    command that needs it says so, and the others run."""
    if find_spec("onnxruntime") is None:
        return
    try:
        import onnxruntime
    except TimeoutError:  # a timer's handler raised here: the caller's
        raise
    except Exception:  # ImportError, OSError...: the host's own message, if it is needed
        return

    onnxruntime.set_default_logger_severity(4)  # fatal only: errors reach us as exceptions


def _stdout_closed() -> int:
    """Stop as a Unix tool killed by SIGPIPE does: no message, the status a shell
    reports for it (128 + 13 = 141); stdout pointed at devnull, as Python's docs advise,
    so that flushing it at exit fails no more."""
    _to_devnull()
    return 128 + getattr(signal, "SIGPIPE", 13)


class _NamedStdout:
    """Standard output whose write errors name it (``> /dev/full``: "standard output:
    No space left on device", not the bare reason); anything else as the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:  # a reader gone away (`| head`): stopped quietly
            raise
        except OSError as e:
            _to_devnull()  # no second error when Python flushes it at exit
            raise OSError(e.errno, f"standard output: {e.strerror}") from None

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        self._named(self._stream.flush)


class _ClosedStdout:
    """Standard output whose file descriptor was closed (``>&-``): Python then sets
    ``sys.stdout`` to None, and a command's output was lost with status 0 (devnull in
    its place, which holds the descriptor: :func:`main`). A write fails as on a closed
    file (``cat``: "Bad file descriptor")."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    def flush(self) -> None:  # nothing was written
        pass

    def fileno(self) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


@contextlib.contextmanager
def _named_stdout(closed: bool = False) -> Iterator[None]:
    """:class:`_NamedStdout` as ``sys.stdout`` inside the block (of
    :class:`_ClosedStdout` where the caller closed it: ``closed``)."""
    stream = sys.stdout
    sys.stdout = _NamedStdout(_ClosedStdout() if closed else stream)
    try:
        yield
    finally:
        sys.stdout = stream


def _to_devnull() -> None:
    """Point standard output's file descriptor at devnull."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (a test's capture)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
