"""The ``onnx-recurrent bench`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..arguments import note_first_use, number, writable
from .cases import DEFAULT_BUDGET, MIN_REPEATS, OPS, SHAPES, make_cases, parse_list
from .driver import Bench, run_bench
from .models import (
    MODEL_BUDGET,
    MODEL_RUNTIMES,
    REFERENCE_REPEATS,
    make_model_cases,
    make_model_runtimes,
    run_models,
)
from .plot import check_plot_support, plot_ratios
from .runtimes import COMPETITORS


def cmd_bench(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand; returns the exit status."""
    if args.models:
        return cmd_bench_models(args)
    try:
        ops = parse_list(args.ops, OPS, "op")
        shapes = parse_list(args.shapes, SHAPES, "shape")
        if args.runtimes is None:
            args.runtimes = ",".join(COMPETITORS)
        runtimes = parse_list(args.runtimes, COMPETITORS, "runtime") if args.runtimes else []
        skip_reference = (
            parse_list(args.skip_reference, SHAPES, "shape") if args.skip_reference else []
        )
        _check_files(args)
        if args.k and not any(
            args.k.lower() in f"{c.shape.name} {c.label}".lower() for c in make_cases(ops, shapes)
        ):
            raise ValueError(f"-k {args.k!r} matches no case (--list shows them)")
        if args.plot:
            writable(args.plot, "--plot")
            check_plot_support()
    except (ValueError, ImportError) as e:
        print(f"onnx-recurrent bench: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for case in make_cases(ops, shapes):
            if not args.k or args.k.lower() in f"{case.shape.name} {case.label}".lower():
                print(f"{case.shape.name} {case.label}")
        return 0

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.replan:
        from ...backends import tuning

        os.environ[tuning.ENV] = "measure"
    note_first_use()
    bench = run_bench(
        ops,
        shapes,
        runtimes=runtimes,
        repeat=args.repeat,
        budget=args.budget,
        warmup=args.warmup,
        threads=args.threads,
        skip_reference=skip_reference,
        reference_limit=args.reference_limit,
        select=args.k,
        seed=args.seed,
        opset=args.opset,
        order=args.order,
        settle_between=not args.no_settle,
        background_load=args.background_load,
        progress=None if args.quiet else progress,
    )
    _print_and_save(bench, args)
    if args.plot:
        info = bench.info
        plot_ratios(
            bench.results,
            args.plot,
            f"onnx-recurrent bench on {info['cpu']} ({info['usable_cpus']} CPUs)",
        )
        print(f"saved: {args.plot}")
    return 0 if all(r.error is None for r in bench.results) else 1


def _print_and_save(bench: Bench, args: argparse.Namespace) -> None:
    print(bench.report())
    for note in bench.info.get("notes", []):
        print(note)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.to_json(), indent=1))
        print(f"saved: {args.json}")


#: options of the operator bench that --models does not take, with their defaults
_OPERATOR_ONLY = {
    "ops": ",".join(OPS),
    "shapes": "step,S,M",
    "skip_reference": "",
    "opset": 22,
    "background_load": 0,
    "plot": None,
}


def cmd_bench_models(args: argparse.Namespace) -> int:
    """``bench --models``: the whole-model cases."""
    given = [n for n, default in _OPERATOR_ONLY.items() if getattr(args, n) != default]
    try:
        if given:
            names = ", ".join("--" + n.replace("_", "-") for n in given)
            raise ValueError(f"--models does not take {names}")
        runtimes = (
            list(MODEL_RUNTIMES)
            if args.runtimes is None
            else parse_list(args.runtimes, MODEL_RUNTIMES, "runtime")
        )
        make_model_runtimes(runtimes)  # at least one of ours
        _check_files(args)
        if not make_model_cases(args.k):
            raise ValueError(f"-k {args.k!r} matches no case (--models --list shows them)")
    except ValueError as e:
        print(f"onnx-recurrent bench: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for case in make_model_cases(args.k):
            print(f"{case.name:<18} {case.description}")
        return 0

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    note_first_use()
    bench = run_models(
        args.k,
        runtimes=runtimes,
        repeat=args.repeat,
        budget=args.budget,
        warmup=args.warmup,
        threads=args.threads,
        reference_limit=args.reference_limit,
        reference_repeats=args.reference_repeats or None,
        seed=args.seed,
        order=args.order,
        settle_between=not args.no_settle,
        progress=None if args.quiet else progress,
    )
    _print_and_save(bench, args)
    return 0 if all(r.error is None for r in bench.results) else 1


def _check_files(args: argparse.Namespace) -> None:
    """The files the run writes at its end, checked before it starts."""
    if args.json:
        writable(args.json, "--json")


_count = number(int, 0, "a number of processes")


def add_parser(subparsers: Any) -> None:
    """Register the ``bench`` subcommand on ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser(
        "bench",
        help="time GRU/LSTM/RNN against onnxruntime, OpenVINO and onnx.reference",
        description=(
            "Time onnx-recurrent's GRU, LSTM and RNN, through the functions and through a "
            "prepared Layer, against onnxruntime, OpenVINO (CPU, f32 precision) and "
            "onnx.reference, each where installed and where it supports the case, on the "
            "same single-node ONNX models. Prints a table of median times with their "
            "quartiles, ratios of ours to the fastest peer (onnxruntime or OpenVINO) with "
            "their spread and the issue's targets (PASS/MISS), each competitor's largest "
            "difference from our outputs, our GMAC/s at M and L as a share of the "
            "machine's sgemm peak (measured once per run), and with --background-load each "
            "runtime's contended over quiet time."
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
        "--models",
        action="store_true",
        help="whole models instead of single operators: Silero VAD v6 (1 and 128 streams "
        "per call), public streaming models bundled under tests/data/models (Silero VAD "
        "v6.0 as faster-whisper ships it, 1 chunk and 10 s per call; DTLN and GTCRN, one "
        "frame per call; read from $ONNX_RECURRENT_MODELS_DIR or the installed package "
        "that ships them outside a checkout), the bundled example, and single nodes that "
        "onnxruntime cannot run right by itself; ours through InferenceSession under each "
        "host (onnxruntime, reference) against onnxruntime, OpenVINO and onnx.reference "
        "alone, with the ratios to onnxruntime alone (default budget "
        f"{MODEL_BUDGET:g} s per model)",
    )
    p.add_argument(
        "--runtimes",
        default=None,
        help="competitors to run besides ours (default: layer,session,onnxruntime,openvino,"
        "reference; 'layer' is ours through a prepared Layer, 'session' through "
        "InferenceSession). With --models, the runtimes, ours included (default: "
        + ",".join(MODEL_RUNTIMES)
        + ")",
    )
    p.add_argument(
        "--repeat",
        type=number(int, 1, "a number of rounds"),
        metavar="N",
        help="timed rounds per case (default: adaptive to the time budget, at least "
        f"{MIN_REPEATS})",
    )
    p.add_argument(
        "--budget",
        type=number(float, 0, "a duration in seconds", strict=True),
        metavar="SECONDS",
        help="target duration of the whole run, split over the shapes (default: "
        + ", ".join(f"{s} {v:g} s" for s, v in DEFAULT_BUDGET.items() if s != "tiny")
        + ")",
    )
    p.add_argument(
        "--warmup",
        type=number(int, 0, "a number of calls"),
        default=1,
        help="untimed calls first (default 1)",
    )
    p.add_argument(
        "--threads",
        type=number(int, 1, "a number of threads"),
        metavar="N",
        help="threads for every runtime (onnxruntime intra_op_num_threads, OpenVINO "
        "INFERENCE_NUM_THREADS, ours ONNX_RECURRENT_NUM_THREADS, NumPy's BLAS through "
        "threadpoolctl); default: each one's own default (the thread counts are printed)",
    )
    p.add_argument(
        "--skip-reference",
        metavar="SHAPES",
        default="",
        help="shapes at which not to run onnx.reference (e.g. L)",
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
        help="with --models: at most N timed calls of onnx.reference alone per model "
        f"(default {REFERENCE_REPEATS}; 0: no limit)",
    )
    p.add_argument("-k", metavar="TEXT", help="only the cases whose label contains TEXT")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    p.add_argument(
        "--opset", type=int, default=22, choices=(14, 22), help="ONNX opset of the models"
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
        action="store_true",
        help="no untimed pause, after each call (alternate) or each runtime's block "
        "(blocks), until no thread of this process spins (onnxruntime's threads spin ~40 ms "
        "after each call and slow down whatever runs next)",
    )
    p.add_argument(
        "--background-load",
        type=_count,
        default=0,
        metavar="K",
        help="K busy processes (while True: pass) beside half of each case's rounds, in "
        "the order quiet, loaded, quiet (started and stopped once per case, killed also on "
        "an error or Ctrl-C); the report gives each runtime's contended / quiet time, and "
        "judges ours at M forward against its target (<= 2.5 with K=1). Default 0",
    )
    p.add_argument("--json", metavar="FILE", help="save the raw results (every time) as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="save a bar chart of the ratios (needs matplotlib: pip install onnx-recurrent[plot])",
    )
    p.add_argument(
        "--replan",
        action="store_true",
        help="measure the kernels' plan for this CPU again before timing (tile shapes, "
        "thread split; as ONNX_RECURRENT_PLAN=measure) and keep it for later processes",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=cmd_bench)
