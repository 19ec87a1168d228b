"""``onnx-recurrent vad PATH... [-o OUT]``: where people speak in many recordings.

One row per speech segment (file, start and end in seconds) as CSV, or as JSON lines
when ``OUT`` ends in ``.jsonl`` or ``.json``; to stdout without ``-o``. A file that
cannot be read gives an error row (file, reason) and the others complete; the exit
status is 0 when every file was processed, 1 when some failed, 2 for a bad argument
(one line on stderr; ``OUT`` naming one of the input files is one), 141 when stdout's
reader goes away (``| head``: quietly, as SIGPIPE ends Unix tools). The segment
options are silero's ``get_speech_timestamps`` ones, with its defaults. ``--workers
N`` / ``--scheduler ADDRESS`` spread the files over a Dask cluster; ``--plot DIR``
draws each recording.

Registered by :mod:`onnx_recurrent.tools.cli` through :func:`add_parser`; :func:`cmd_vad`
runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import IO, Any

from ...errors import RecurrentError, import_optional, one_line
from ...runtime.files import external_data_files, same_file, saving
from ..arguments import (
    add_host,
    ascii_number,
    file_name,
    file_name_or_stdout,
    number,
    raise_lost_interrupt,
    writable,
)
from .audio import AUDIO_SUFFIXES, AudioError, find_audio_files
from .model import INSTALL_EXTRA, silero_model_path
from .segments import SEGMENT_OPTIONS, check_segment_options

#: local worker processes per CPU at most (each holds a model and its own interpreter:
#: about 150 MB; more only wait for the CPUs, and thousands exhaust the machine)
WORKERS_PER_CPU = 8
MAX_WORKERS = WORKERS_PER_CPU * (os.cpu_count() or 1)

#: The one-line help of the subcommand.
HELP = "find the speech in recordings (Silero VAD): one row per speech segment"

#: Decimals of the times written, unless --time-resolution says otherwise.
TIME_DECIMALS = 3


def add_parser(sub: Any) -> None:
    """Register the ``vad`` subcommand on ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "vad",
        help=HELP,
        # the module docstring's second paragraph (none under python -OO)
        description=(__doc__ or "\n\n").split("\n\n")[1].replace("``", ""),
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="audio files (WAV, FLAC, OGG; any sample rate and channel count) and "
        f"directories, walked for {', '.join(AUDIO_SUFFIXES)} files",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=file_name_or_stdout,
        help="write the rows here (not one of the input files), replacing OUT when they "
        "are all there (Ctrl-C leaves it as it was): JSON lines if OUT ends in .jsonl or "
        ".json, else CSV (default, or -: CSV on stdout, row by row)",
    )
    parser.add_argument(
        "--plot",
        metavar="DIR",
        type=file_name,
        help="write a PNG per recording into DIR: waveform, speech probability, segments",
    )

    seg = parser.add_argument_group(
        "speech segments (silero's get_speech_timestamps options, with its defaults)"
    )
    d = SEGMENT_OPTIONS

    def option(name: str, **kwargs: Any) -> None:
        # --min-speech-duration-ms, and silero's spelling --min_speech_duration_ms
        # accepted too (not listed in the help)
        seg.add_argument("--" + name.replace("_", "-"), dest=name, **kwargs)
        if "_" in name:
            alias = {**kwargs, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
            seg.add_argument("--" + name, dest=name, **alias)

    option(
        "threshold",
        type=ascii_number(float),
        default=d["threshold"],
        metavar="P",
        help="probability at or above which a chunk is speech (default %(default)s)",
    )
    option(
        "neg_threshold",
        type=ascii_number(float),
        default=d["neg_threshold"],
        metavar="P",
        help="probability below which speech ends (default: threshold - 0.15)",
    )
    option(
        "min_speech_duration_ms",
        type=ascii_number(float),
        default=d["min_speech_duration_ms"],
        metavar="MS",
        help="drop shorter segments (default %(default)s)",
    )
    option(
        "max_speech_duration_s",
        type=ascii_number(float),
        default=d["max_speech_duration_s"],
        metavar="S",
        help="split longer segments (default: no limit)",
    )
    option(
        "min_silence_duration_ms",
        type=ascii_number(float),
        default=d["min_silence_duration_ms"],
        metavar="MS",
        help="silence that ends a segment (default %(default)s)",
    )
    option(
        "speech_pad_ms",
        type=ascii_number(float),
        default=d["speech_pad_ms"],
        metavar="MS",
        help="padding on each side of a segment (default %(default)s)",
    )
    option(
        "min_silence_at_max_speech",
        type=ascii_number(float),
        default=d["min_silence_at_max_speech"],
        metavar="MS",
        help="shortest silence to split a long segment at (default %(default)s)",
    )
    option(
        "use_max_poss_sil_at_max_speech",
        action=argparse.BooleanOptionalAction,
        default=d["use_max_poss_sil_at_max_speech"],
        help="split a long segment at its longest silence, else at the last one "
        "(default: longest)",
    )
    option(
        "time_resolution",
        type=ascii_number(int),
        default=TIME_DECIMALS,
        metavar="DECIMALS",
        help="decimals of the times written (default %(default)s, milliseconds; "
        "silero's return_seconds rounds to 1)",
    )

    run = parser.add_argument_group("running")
    run.add_argument(
        "--batch",
        type=number(int, 1, "a number of recordings"),
        default=64,
        help="recordings advanced together, one model call per chunk (default 64)",
    )
    add_host(run)
    run.add_argument(
        "--model",
        type=file_name,
        metavar="ONNX",
        help="the Silero model (default: the silero-vad package's)",
    )
    cluster = run.add_mutually_exclusive_group()
    cluster.add_argument(
        "--workers",
        type=number(int, 1, "a number of worker processes", maximum=MAX_WORKERS),
        metavar="N",
        help="spread the files over a local Dask cluster of N single-threaded worker processes "
        f"(at most {WORKERS_PER_CPU} per CPU, here {MAX_WORKERS}; no more than the files)",
    )
    cluster.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="spread the files over a running Dask cluster (e.g. tcp://host:8786)",
    )
    parser.set_defaults(handler=cmd_vad)


# --- output rows ----------------------------------------------------------------------


class _CsvRows:
    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._writer = csv.writer(stream, lineterminator="\n")
        self._writer.writerow(["file", "start", "end", "error"])

    def segment(self, path: str, start: float, end: float) -> None:
        self._writer.writerow([path, start, end, ""])

    def error(self, path: str, reason: str) -> None:
        self._writer.writerow([path, "", "", reason])

    def flush(self) -> None:
        self._stream.flush()


class _JsonRows:
    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def _write(self, row: dict[str, Any]) -> None:
        self._stream.write(json.dumps(row, ensure_ascii=False) + "\n")

    def segment(self, path: str, start: float, end: float) -> None:
        self._write({"file": path, "start": start, "end": end})

    def error(self, path: str, reason: str) -> None:
        self._write({"file": path, "error": reason})

    def flush(self) -> None:
        self._stream.flush()


def _reason(error: BaseException) -> str:
    """A failed file's row: why, in one line, without its name (the row names it); an
    error other than ``OSError`` or ``ValueError`` (``MemoryError``, say) with its type."""
    if isinstance(error, AudioError):
        return error.reason
    return one_line(error, named=False, typed=not isinstance(error, (OSError, ValueError)))


def _rows_stream(output: str | None, stack: ExitStack) -> IO[str]:
    """Where the rows go: ``output`` (UTF-8; a temporary file renamed over it when the
    stack closes without an exception: :func:`..arguments.saving`) or stdout. A file
    name that is not valid UTF-8 (held with surrogate escapes, as ``os.fsdecode`` gives
    it) is written as its own bytes, as Python's ``surrogateescape`` error handler does,
    in CSV and JSON lines alike."""
    if output is not None:
        binary = stack.enter_context(saving(output))
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="surrogateescape", newline="")
        return stack.enter_context(text)
    stream = sys.stdout
    errors = getattr(stream, "errors", None)
    reconfigure = getattr(stream, "reconfigure", None)
    if errors == "strict" and reconfigure is not None:
        reconfigure(errors="surrogateescape")

        def restore() -> None:
            with suppress(OSError, ValueError):  # a closed pipe: nothing left to write
                reconfigure(errors=errors)

        stack.callback(restore)
    return stream


def _fail(message: str) -> int:
    print(f"onnx-recurrent vad: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


# --- the run --------------------------------------------------------------------------


class _Progress:
    """A tqdm bar over seconds of audio on stderr, when stderr is a terminal; started
    once the model is loaded (or the cluster up), so its rate is the run's."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, files: list[str]) -> None:
        if sys.stderr is None or not sys.stderr.isatty():  # None: closed (2>&-)
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        from .audio import audio_duration

        total = sum(audio_duration(f) or 0.0 for f in files)
        self._bar = tqdm(total=total, unit="s", unit_scale=True, desc="VAD", file=sys.stderr)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, seconds: float) -> None:
        if self._bar is not None:
            self._bar.update(seconds)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Plotter:
    """Per-recording PNGs into a directory, unique names, probabilities if needed."""

    def __init__(
        self, directory: Path, args: argparse.Namespace, threshold: float, keep: list[str]
    ) -> None:
        self.directory = directory
        self._args = args
        self._threshold = threshold
        self._used: set[str] = set()
        self._session: Any = None
        #: files a plot must not overwrite: the recordings, and -o's
        self._keep = keep
        self._kept_paths = {os.path.realpath(k) for k in keep}

    def _name(self, path: str) -> Path:
        base = Path(path).name or "recording"
        name, k = base + ".png", 1
        while (
            name in self._used
            or same_file(self.directory / name, self._keep)
            or os.path.realpath(self.directory / name) in self._kept_paths  # -o, not there yet
            or (self.directory / name).is_dir()  # a directory of that name: not ours
        ):
            name, k = f"{base}-{k}.png", k + 1
        self._used.add(name)
        return self.directory / name

    def __call__(self, path: str, segments: list[tuple[float, float]], probs: Any) -> None:
        from .audio import read_audio
        from .plot import plot_recording

        samples = read_audio(path).samples
        if probs is None:  # results from Dask workers: recompute here, one stream
            from .model import open_session
            from .streams import speech_probabilities

            if self._session is None:
                self._session = open_session(self._args.model, self._args.host)
            probs = speech_probabilities(self._session, samples)
        # a name that is not valid UTF-8: its undecodable bytes shown as U+FFFD
        title = os.fsencode(path).decode(sys.getfilesystemencoding(), "replace")
        plot_recording(
            self._name(path), samples, probs, segments, threshold=self._threshold, title=title
        )


def _local_results(
    files: list[str], args: argparse.Namespace, options: dict[str, Any], bar: _Progress
) -> Iterator[tuple[str, Any, Any]]:
    from .files import analyse_files

    results = analyse_files(
        files,
        batch=args.batch,
        host=args.host,
        model_path=args.model,
        progress=bar.update,
        **options,
    )
    return (
        (r.path, r.error if r.error is not None else r.segments, r.probabilities) for r in results
    )


def _local_cluster(distributed: Any, workers: int) -> Any:
    """A local cluster of ``workers`` processes for the command. A Ctrl-C while it
    starts closes what had started: distributed's exit hook closed the half-started
    cluster and printed its AssertionError ("Exception ignored in atexit callback")."""
    from distributed.deploy.spec import SpecCluster

    before = set(SpecCluster._instances)
    try:
        return distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,  # no web server (and no bokeh) for a one-off run
            # one thread per worker for our kernels too, as the nannies do for BLAS
            env={"ONNX_RECURRENT_NUM_THREADS": "1"},
            # Ctrl-C is the command's: it stops the cluster (local_workers)
            preload=[f"{__package__}.local_workers"],
        )
    except BaseException:
        for cluster in set(SpecCluster._instances) - before:
            with contextlib.suppress(Exception):
                cluster.close(timeout=5)
            SpecCluster._instances.discard(cluster)
        raise


def _check_model(args: argparse.Namespace) -> None:
    """The model checked here as a local run checks it, before a cluster starts or
    ``-o`` is touched: a bad ``--model`` is one line and status 2, not an error row for
    every file from the workers (which replaced an earlier ``-o``)."""
    from .audio import load_soundfile
    from .model import open_session
    from .streams import stream_probabilities

    session = open_session(args.model, args.host)
    load_soundfile()
    stream_probabilities(session, [], batch=args.batch).close()


def _dask_results(
    files: list[str],
    args: argparse.Namespace,
    options: dict[str, Any],
    bar: _Progress,
    stack: ExitStack,
) -> Iterator[tuple[str, Any, Any]]:
    distributed = import_optional("distributed", "--workers or --scheduler", INSTALL_EXTRA)
    from .detect import detect

    if args.workers is not None or args.model is None or os.path.exists(args.model):
        _check_model(args)  # a remote cluster's workers may hold a path this one lacks
    if args.workers is not None:
        workers = min(args.workers, len(files))  # one more would have no file
        # the cluster's own chatter (INFO lines and tracebacks as it closes on Ctrl-C)
        # is not the command's: its errors still show
        chatter = logging.getLogger("distributed")
        stack.callback(chatter.setLevel, chatter.level)
        chatter.setLevel(logging.ERROR)
        cluster = stack.enter_context(_local_cluster(distributed, workers))
        client = stack.enter_context(distributed.Client(cluster))
        client.wait_for_workers(workers)
    else:
        client = stack.enter_context(distributed.Client(args.scheduler))
    results = detect(
        files, client=client, batch=args.batch, host=args.host, model_path=args.model, **options
    )
    from .audio import audio_duration

    def tagged() -> Iterator[tuple[str, Any, Any]]:
        for path, found in results:
            if bar.shown:
                bar.update(audio_duration(path) or 0.0)
            yield path, found, None

    return tagged()


def cmd_vad(args: argparse.Namespace) -> int:
    """Run ``onnx-recurrent vad``; return the exit status (0 all processed, 1 some file
    failed, 2 a bad argument, with one line on stderr)."""
    options = {name: getattr(args, name) for name in SEGMENT_OPTIONS}
    try:
        options = check_segment_options(options)
    except (TypeError, ValueError) as e:  # named by its option, not the keyword
        name, _, rest = str(e).partition(" ")
        return _fail(f"--{name.replace('_', '-')} {rest}" if name in options else str(e))
    # Every time written rounded alike, here: speech_segments rounds as silero does,
    # which leaves an end at the end of a recording unrounded.
    decimals, options["time_resolution"] = options["time_resolution"], None
    files = find_audio_files(args.paths)
    if not files:
        return _fail(f"no audio files ({', '.join(AUDIO_SUFFIXES)}) in {' '.join(args.paths)}")

    output = args.output
    json_lines = output is not None and Path(output).suffix.lower() in (".jsonl", ".json")
    # --model and the files it keeps its weights in are inputs too
    model = [] if args.model is None else [args.model, *external_data_files(args.model)]
    if args.model is None:  # the default model, silero-vad's file
        with suppress(Exception):  # not installed: its own error later
            model.append(str(silero_model_path()))
    clash = None if output is None else same_file(output, [*files, *model])
    if clash is not None:
        what = "the model" if clash in model else "the recording"
        return _fail(
            f"-o {output} is the input file {clash}: writing the rows there would "
            f"overwrite {what}; give -o another file"
        )
    try:  # before the work, as the other commands do
        if output is not None:
            writable(output, "-o")
        if args.plot is not None and os.path.exists(args.plot) and not os.path.isdir(args.plot):
            raise RecurrentError(f"--plot {args.plot}: not a directory")
        if args.plot is not None:  # matplotlib missing: said now, not after a recording
            import_optional("matplotlib.figure", "--plot", INSTALL_EXTRA)
    except (RecurrentError, ImportError) as e:
        return _fail(str(e))
    with ExitStack() as stack:
        plotter = None
        if args.plot is not None:
            directory = Path(args.plot)
            directory.mkdir(parents=True, exist_ok=True)
            plotter = _Plotter(
                directory,
                args,
                options["threshold"],
                [*files, *model, *([output] if output else [])],
            )
        bar = _Progress()
        stack.callback(bar.close)
        try:
            if args.workers is None and args.scheduler is None:
                results = _local_results(files, args, options, bar)
            else:
                results = _dask_results(files, args, options, bar, stack)
        except (ImportError, TypeError, ValueError) as e:
            return _fail(str(e))
        # -o replaced when the rows are all there (Ctrl-C, a bad argument: left as it was)
        stream = _rows_stream(output, stack)
        rows = _JsonRows(stream) if json_lines else _CsvRows(stream)
        bar.start(files)

        failed = 0
        for path, found, probs in results:
            raise_lost_interrupt()  # a Ctrl-C that landed in a finalizer (a Dask future's)
            if isinstance(found, BaseException):
                failed += 1
                rows.error(path, _reason(found))
            else:
                for start, end in found:
                    rows.segment(path, round(start, decimals), round(end, decimals))
            rows.flush()
            if plotter is not None and not isinstance(found, BaseException):
                plotter(path, found, probs)
    if failed:
        print(
            f"onnx-recurrent vad: {failed} of {len(files)} file(s) could not be read",
            file=sys.stderr,
        )
    return 1 if failed else 0
