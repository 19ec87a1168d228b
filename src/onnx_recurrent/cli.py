"""The ``onnx-recurrent`` command line: a thin front on the library."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import RecurrentError, RecurrentTypeError
from .runtime.feeds import load_feeds, parse_pairs, random_feeds
from .runtime.hosts import HOSTS
from .runtime.session import InferenceSession

EXAMPLE = "example_gru.onnx"


def _data(name: str) -> Path:
    return Path(str(resources.files("onnx_recurrent") / "data" / name))


def _preview(array: np.ndarray, count: int = 5) -> str:
    flat = np.asarray(array, dtype=np.float64).ravel()[:count]
    more = " ..." if array.size > count else ""
    return "[" + ", ".join(f"{v:.6g}" for v in flat) + more + "]"


def cmd_run(args: argparse.Namespace) -> int:
    expected = None
    if args.model is None:
        model = _data(EXAMPLE)
        print(
            f"model: bundled example {model.name} (PyTorch 2-layer bidirectional "
            "batch-first nn.GRU + linear head)"
        )
        feeds = {"x": np.load(_data("example_input.npy"))}
        with np.load(_data("example_expected.npz")) as f:
            expected = dict(f)
    else:
        model = args.model
        print(f"model: {model}")
        feeds = load_feeds(parse_pairs(args.input, "-i"))
    session = InferenceSession(model, host=args.host)
    print(f"host: {session.host}")
    missing = [i for i in session.get_inputs() if i.name not in feeds]
    if missing:
        dims = {k: int(v) for k, v in parse_pairs(args.dim, "--dim").items()}
        drawn = random_feeds(missing, dims, seed=args.seed)
        for name, value in drawn.items():
            print(f"input {name}: random {list(value.shape)} {value.dtype} (seed {args.seed})")
        feeds.update(drawn)
        for name, value in feeds.items():
            if name not in drawn:
                print(f"input {name}: shape {list(value.shape)} {value.dtype}")
    else:
        for name, value in feeds.items():
            print(f"input {name}: shape {list(value.shape)} {value.dtype}")
    start = time.perf_counter()
    outputs = session.run(None, feeds)
    elapsed = time.perf_counter() - start
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names, outputs, strict=True):
        print(f"output {name}: shape {list(value.shape)} {value.dtype} {_preview(value)}")
    print(f"wall time: {elapsed * 1e3:.1f} ms")
    status = 0
    if expected is not None:
        diff = max(
            float(np.max(np.abs(out.astype(np.float64) - expected[name])))
            for name, out in zip(names, outputs, strict=True)
        )
        print(f"max |difference| from PyTorch's output: {diff:.3g}")
        status = 0 if diff <= 1e-5 else 1
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs, strict=True)))
        print(f"saved: {args.output}")
    return status


def add_host_argument(parser: argparse.ArgumentParser) -> None:
    """``--host``: who runs the graph (:class:`~onnx_recurrent.InferenceSession`)."""
    parser.add_argument(
        "--host",
        choices=HOSTS,
        default="auto",
        help="who runs the non-recurrent nodes: onnxruntime (custom nodes for the recurrent "
        "ones), onnx.reference, or auto (onnxruntime where it can; default)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-recurrent",
        description="Run ONNX models; onnx-recurrent computes their GRU, RNN and LSTM nodes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model (the bundled example if none is given)")
    run.add_argument(
        "model", nargs="?", help="path to an .onnx model; omit for the bundled example"
    )
    run.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file (repeatable); inputs not given are drawn at random",
    )
    run.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="value of a named dimension for random inputs (default 1 for batch, else 8)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("-o", "--output", metavar="OUT.npz", help="save the outputs")
    add_host_argument(run)
    run.set_defaults(handler=cmd_run)
    for module in ("check", "bench"):  # each registers its own subcommand
        importlib.import_module(f".{module}", __package__).add_parser(sub)
    return parser


def note_first_use() -> None:
    """One line on stderr when the kernels have no compiled code cached yet (first use:
    numba compiles them during the first call, which takes seconds)."""
    from .backends import jit_cache, numba_backend  # noqa: F401  (decorates the kernels)

    cached, where = jit_cache.cache_state()
    if cached:
        return
    if where is None:
        print(
            "onnx-recurrent: compiling the kernels (about 10-15 s; numba cannot cache them "
            "here, so every run compiles them again)",
            file=sys.stderr,
        )
    else:
        print(
            f"onnx-recurrent: compiling the kernels on first use (about 10-15 s, once; "
            f"cached in {where})",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``onnx-recurrent``; returns the exit status."""
    args = build_parser().parse_args(argv)
    note_first_use()
    try:
        return args.handler(args)
    except (RecurrentError, RecurrentTypeError, FileNotFoundError) as e:
        print(f"onnx-recurrent: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
