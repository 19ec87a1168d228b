"""The ``onnx-recurrent bench [models]`` command line: the arguments fill an
:class:`~.options.Options` by name."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import suppress
from typing import Any

from ...runtime.files import same_file, saving
from ...threads import MAX_THREADS
from ..arguments import (
    file_name,
    note_first_use,
    number,
    writable,
)
from . import cases
from .cases import DEFAULT_BUDGET, MIN_REPEATS, OPS, Case
from .driver import run_bench
from .models import MODEL_BUDGET, REFERENCE_REPEATS, ModelCase
from .options import COMPETITORS, MODEL_RUNTIMES, Options
from .plot import plot_path, plot_ratios
from .report import DOUBLE_BOUND, PEAK_SHARE

#: the most busy processes --background-load starts
MAX_LOAD = 256


def cmd_bench(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand and ``bench models``; returns the exit status."""
    deprecated = args.models and args.what is None  # ``bench --models``
    try:
        if deprecated and args.plot:
            raise ValueError("--models does not take --plot")
        options = Options.from_args(args)
        if args.json:
            writable(args.json, "--json", report=True)
        if getattr(args, "plot", None):
            args.plot = plot_path(args.plot)
            writable(args.plot, "--plot")
            if args.json and os.path.realpath(args.json) == os.path.realpath(args.plot):
                raise ValueError(f"--json and --plot name one file, {args.plot}")
        _check_outputs(args, options)
    except (ValueError, ImportError) as e:
        print(f"onnx-recurrent bench: error: {e}", file=sys.stderr)
        return 2
    if deprecated:
        note = "`bench --models` is deprecated, use `onnx-recurrent bench models`"
        print(f"onnx-recurrent bench: note: {note}", file=sys.stderr)
    if args.replan:
        from ...backends import tuning

        given = os.environ.get(tuning.ENV, "").strip()
        if given not in ("", "measure"):
            print(
                f"onnx-recurrent bench: error: --replan measures the plan again, while "
                f"{tuning.ENV}={given!r} gives values of it: choose one",
                file=sys.stderr,
            )
            return 2
        os.environ[tuning.ENV] = "measure"
    if args.list:
        for case in options.cases():
            print(case.key if isinstance(case, Case) else f"{case.name:<18} {case.description}")
        return 0
    _encodable_stdout()
    note_first_use()
    bench = run_bench(options, progress=None if args.quiet else _progress)
    if args.json:  # first: minutes of timing kept whatever the printing meets
        with saving(args.json) as f:
            f.write(json.dumps(bench.to_json(), indent=1).encode())
    print(bench.report())
    if args.json:
        print(f"saved: {args.json}")
    if getattr(args, "plot", None):
        info = bench.info
        title = f"onnx-recurrent bench on {info['cpu']} ({info['usable_cpus']} CPUs)"
        plot_ratios(bench.results, args.plot, title)
        print(f"saved: {args.plot}")
    return 0 if all(r.error is None for r in bench.results) else 1


def _encodable_stdout() -> None:
    """Standard output in an encoding without the report's signs (``Δ``, ``≤``: a
    latin-1 locale, Windows' cp1252 into a file) prints them as ``?`` rather than
    failing the run after its timing."""
    if getattr(sys.stdout, "errors", None) == "strict":
        with suppress(AttributeError, ValueError):  # not a TextIOWrapper; closed
            sys.stdout.reconfigure(errors="replace")


def _check_outputs(args: argparse.Namespace, options: Options) -> None:
    """ValueError where ``--json`` or ``--plot`` names a file the run reads (a model):
    writing the report there would destroy it."""
    reads = [path for case in options.cases() if isinstance(case, ModelCase)
             for path in case.reads()]  # fmt: skip
    for flag, output in (("--json", args.json), ("--plot", getattr(args, "plot", None))):
        found = same_file(output, reads) if output else None
        if found is not None:
            raise ValueError(
                f"{flag} {output} is {found}, a model file this run reads: writing the "
                f"report there would overwrite it"
            )


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _add_options(p: argparse.ArgumentParser, models: bool) -> None:
    """The options of both kinds of run; ``models``: as ``bench models`` words them."""
    runtimes = (
        f"the runtimes, ours included (default: {','.join(MODEL_RUNTIMES)})"
        if models
        else f"competitors to run besides ours (default: {','.join(COMPETITORS)}; 'layer' "
        "is ours through a prepared Layer, 'session' through InferenceSession)"
    )
    p.add_argument("--runtimes", default=None, help=runtimes)
    p.add_argument(
        "--repeat",
        type=number(int, 1, "a number of rounds"),
        metavar="N",
        help="timed rounds per case (default: adaptive to the time budget, at least "
        f"{MIN_REPEATS})",
    )
    budget = (
        f"{MODEL_BUDGET:g} s per model"
        if models
        else ", ".join(f"{s} {v:g} s" for s, v in DEFAULT_BUDGET.items() if s != "tiny")
    )
    p.add_argument(
        "--budget",
        type=number(float, 0, "a duration in seconds", strict=True),
        metavar="SECONDS",
        help=f"target duration of the whole run, split over the cases (default: {budget})",
    )
    p.add_argument(
        "--warmup",
        type=number(int, 0, "a number of calls"),
        default=1,
        help="untimed calls first (default 1)",
    )
    p.add_argument(
        "--threads",
        type=number(int, 1, "a number of threads", maximum=MAX_THREADS),
        metavar="N",
        help="threads for every runtime (onnxruntime intra_op_num_threads, OpenVINO "
        "INFERENCE_NUM_THREADS, ours ONNX_RECURRENT_NUM_THREADS, NumPy's BLAS through "
        "threadpoolctl); default: each one's own default (the thread counts are printed)",
    )
    p.add_argument(
        "--reference-limit",
        type=number(float, 0, "a duration in seconds", strict=True),
        default=30.0,
        metavar="SECONDS",
        help="skip onnx.reference in a case when one call takes longer (default 30)",
    )
    p.add_argument(
        "--reference-repeats",
        type=number(int, 0, "a number of calls"),
        default=REFERENCE_REPEATS,
        metavar="N",
        help=("" if models else "with --models: ")
        + "at most N timed calls of onnx.reference alone per model "
        f"(default {REFERENCE_REPEATS}; 0: no limit)",
    )
    p.add_argument(
        "-k", dest="select", metavar="TEXT", help="only the cases whose label contains TEXT"
    )
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument(
        "--seed", type=number(int, 0, "a seed"), default=0, help="seed of the inputs (default 0)"
    )
    p.add_argument(
        "--order",
        choices=("alternate", "blocks"),
        default="alternate",
        help="alternate: one call of each runtime per round (default); blocks: all of one "
        "runtime's calls, then the next one's (to see how much they disturb one another)",
    )
    p.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="no untimed pause, after each call (alternate) or each runtime's block "
        "(blocks), until no thread of this process spins (onnxruntime's threads spin ~40 ms "
        "after each call and slow down whatever runs next)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        type=file_name,
        help="save the raw results (every time) as JSON",
    )
    p.add_argument(
        "--replan",
        action="store_true",
        help="measure the kernels' plan for this CPU again before timing (tile shapes, "
        "thread split; as ONNX_RECURRENT_PLAN=measure) and keep it for later processes",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=cmd_bench, models=models)


#: the targets over the fastest peer, as ``bench --help`` states them
_TARGETS = (
    f"step through Layer <= {cases.STEP_LAYER_BOUND:.1f} and through the functions <= "
    f"{cases.STEP_FUNCTIONS_BOUND:.1f}, S through Layer <= {cases.S_LAYER_BOUND:.1f}, M forward "
    f"<= {cases.M_FORWARD_BOUND:.1f}, M bidirectional <= {cases.M_BIDI_BOUND:.1f}, ragged <= "
    f"{cases.RAGGED_BOUND:.1f}, L <= {cases.L_BOUND:.1f}, layout=1 <= {cases.LAYOUT1_BOUND:.1f} "
    f"of OpenVINO, {cases.REFERENCE_SPEEDUP:g}x faster than onnx.reference at M and L"
)

_MODELS_HELP = (
    "Time whole models instead of single operators: Silero VAD v6 (1 and 128 streams per "
    "call), public streaming models bundled under tests/data/models (Silero VAD v6.0 as "
    "faster-whisper ships it, 1 chunk and 10 s per call; DTLN and GTCRN, one frame per "
    "call; read from $ONNX_RECURRENT_MODELS_DIR or the installed package that ships them "
    "outside a checkout), the bundled example, and single nodes that onnxruntime cannot "
    "run right by itself; ours through InferenceSession under each host (onnxruntime, "
    "reference) against onnxruntime, OpenVINO and onnx.reference alone, with the ratios "
    f"to onnxruntime alone (default budget {MODEL_BUDGET:g} s per model)."
)


def add_parser(subparsers: Any) -> None:
    """Register ``bench`` and ``bench models`` on ``subparsers`` (``add_subparsers()``)."""
    p = subparsers.add_parser(
        "bench",
        help="time GRU/LSTM/RNN against onnxruntime, OpenVINO and onnx.reference",
        description=(
            "Time onnx-recurrent's GRU, LSTM and RNN, through the functions and through a "
            "prepared Layer, against onnxruntime, OpenVINO (CPU, f32 precision) and "
            "onnx.reference, each where installed and where it supports the case, on the "
            "same single-node ONNX models. Prints a table of median times with their "
            "quartiles, ratios of ours to the fastest peer (onnxruntime or OpenVINO) with "
            f"their spread and issue 21's targets (PASS/MISS: {_TARGETS}), each "
            "competitor's largest difference from our outputs, our GMAC/s at M and L as a "
            "share of the machine's sgemm peak (measured once per run; at L forward timed "
            f"beside our calls, one product a round, and at least {PEAK_SHARE:.0%} of it "
            f"round by round), float64 over our own float32 (at most {DOUBLE_BOUND:g}; "
            "no peer computes real double), and with --background-load each runtime's "
            "contended over quiet time. `bench models` times whole models."
        ),
    )
    p.add_argument("--ops", default=",".join(OPS), help="operators (default: gru,lstm,rnn)")
    p.add_argument(
        "--shapes",
        default="step,S,M",
        help="shape classes: step (T=1 N=1 I=128 H=128), S (T=50 N=1 I=64 H=64), M (T=100 "
        "N=32 I=128 H=256; also ragged, layout=1, float64), L (T=200 N=64 I=512 H=512); "
        "default step,S,M",
    )
    p.add_argument(
        "--skip-reference",
        metavar="SHAPES",
        default="",
        help="shapes at which not to run onnx.reference (e.g. L)",
    )
    p.add_argument(
        "--opset", type=int, default=22, choices=(14, 22), help="ONNX opset of the models"
    )
    p.add_argument(
        "--background-load",
        type=number(int, 0, "a number of processes", maximum=MAX_LOAD),
        default=0,
        metavar="K",
        help="K busy processes (while True: pass) beside half of each case's rounds, in "
        "the order quiet, loaded, quiet (started and stopped once per case, killed also on "
        "an error or Ctrl-C); the report gives each runtime's contended / quiet time, and "
        "judges ours at M forward against its target (<= 2.5 with K=1). Default 0",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=file_name,
        help="save a bar chart of the ratios (needs matplotlib: pip install onnx-recurrent[plot])",
    )
    _add_options(p, models=False)
    p.add_argument("--models", action="store_true", help="deprecated: the same as `bench models`")
    what = p.add_subparsers(dest="what", metavar="{models}")
    m = what.add_parser(
        "models", help="whole models instead of single operators", description=_MODELS_HELP
    )
    _add_options(m, models=True)
