"""Benchmark ``onnx-recurrent vad`` in one process against a plain onnxruntime loop.

Builds a corpus of speech recordings (FLAC, 5-30 s each, some at 8, 22.05, 44.1 or
48 kHz, some stereo; ``bench_corpus.py``) from the bundled test speech; then times, over
the same files:

(a) onnx-recurrent: :func:`onnx_recurrent.tools.vad.analyse_files`, one process, ``--batch``
    recordings advancing together (joining and leaving the batch), decoding and
    resampling included;
(b) onnxruntime alone: decode every file (the same soundfile + soxr decoding), then
    64 recordings per model call, padded to the longest of each group, with
    ``onnxruntime.InferenceSession``.

``--rounds`` rounds of one run of each, in a shuffled order, ``--pause`` idle seconds
after each run (the bench's :func:`~onnx_recurrent.tools.bench.time_alternating`);
printed: the median wall time and the aggregate speed (seconds of audio per second: "x
realtime", median [min-max]), the ratio (a)/(b) per round as median [min-max], and the
largest difference between their speech probabilities. The sessions are made (and the
kernels compiled) before the timing.

Needs the ``vad`` extra, onnxruntime and the model (``pip install --no-deps
silero-vad``). Usage::

    python scripts/bench_vad.py                     # 120 files, batch 64
    python scripts/bench_vad.py --files 12 --max-seconds 10   # a quick check
    python scripts/bench_vad.py --corpus /tmp/vad-corpus      # build once, reuse
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_corpus import build_corpus, describe

from onnx_recurrent.tools import vad
from onnx_recurrent.tools.bench import time_alternating
from onnx_recurrent.tools.vad.model import CHUNK_SAMPLES, CONTEXT_SAMPLES, MODEL_RATE, open_session


def run_ours(paths: list[Path], batch: int, session) -> dict[str, np.ndarray]:
    results = list(vad.analyse_files(paths, batch=batch, session=session))
    failed = [r for r in results if r.error is not None]
    if failed:
        raise SystemExit(f"error: {failed[0].path}: {failed[0].error}")
    return {r.path: r.probabilities for r in results}


def run_onnxruntime(
    paths: list[Path], session, group: int = 64
) -> tuple[float, dict[str, np.ndarray]]:
    chunk, context = CHUNK_SAMPLES[MODEL_RATE], CONTEXT_SAMPLES[MODEL_RATE]
    sr = np.array(MODEL_RATE, dtype=np.int64)
    start = time.perf_counter()
    decoded = [vad.read_audio(p).samples for p in paths]
    decoding = time.perf_counter() - start
    probs: dict[str, np.ndarray] = {}
    for g in range(0, len(paths), group):
        members = decoded[g : g + group]
        chunks = max(math.ceil(a.size / chunk) for a in members)
        padded = np.zeros((len(members), context + chunks * chunk), dtype=np.float32)
        for row, audio in enumerate(members):
            padded[row, context : context + audio.size] = audio
        state = np.zeros((2, len(members), 128), dtype=np.float32)
        out = np.empty((len(members), chunks), dtype=np.float32)
        for k in range(chunks):
            x = np.ascontiguousarray(padded[:, k * chunk : k * chunk + context + chunk])
            p, state = session.run(None, {"input": x, "state": state, "sr": sr})
            out[:, k] = p[:, 0]
        for row, audio in enumerate(members):
            probs[str(paths[g + row])] = out[row, : math.ceil(audio.size / chunk)]
    return decoding, probs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=120, help="recordings (default 120)")
    parser.add_argument("--min-seconds", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument(
        "--corpus", type=Path, help="build the corpus here, or reuse the FLAC files there"
    )
    parser.add_argument("--batch", type=int, default=64, help="(a)'s batch (default 64)")
    parser.add_argument("--host", default="auto", help="(a)'s graph host (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument(
        "--pause", type=float, default=1.0, help="seconds idle after each run (default 1)"
    )
    args = parser.parse_args(argv)

    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="vad-corpus-") as scratch:
        directory = args.corpus or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        paths = sorted(directory.glob("*.flac"))
        if not paths:
            started = time.perf_counter()
            paths = build_corpus(
                directory, args.files, args.min_seconds, args.max_seconds, args.seed
            )
            print(f"corpus built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        total, text = describe(paths)
        print(f"corpus: {text}, in {directory}")

        ours = open_session(None, args.host)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # the model's unused initializers only warn
        plain = onnxruntime.InferenceSession(
            str(vad.silero_model_path()), options, providers=["CPUExecutionProvider"]
        )
        run_ours(paths[:2], args.batch, ours)  # compile the kernels, warm both up
        run_onnxruntime(paths[:2], plain)

        # rounds of one run each in a shuffled order; a pause lets the threads go idle
        got: dict[str, dict[str, np.ndarray]] = {}
        t_decode: list[float] = []

        def ort() -> None:
            decoding, got["ort"] = run_onnxruntime(paths, plain)
            t_decode.append(decoding)

        time.sleep(args.pause)
        samples = time_alternating(
            {"ours": lambda: got.update(ours=run_ours(paths, args.batch, ours)), "ort": ort},
            min_repeats=args.rounds,
            max_repeats=args.rounds,
            seed=args.seed,
            between=lambda: time.sleep(args.pause),
        )
        t_ours, t_ort, p_ours, p_ort = samples["ours"], samples["ort"], got["ours"], got["ort"]

    def spread(values: list[float]) -> str:
        return f"{np.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"

    speed_ours = [total / t for t in t_ours]
    speed_ort = [total / t for t in t_ort]
    ratios = [a / b for a, b in zip(t_ort, t_ours, strict=True)]
    print(
        f"(a) onnx-recurrent vad, one process, batch {args.batch}, host {ours.host}, "
        f"decoding included: {np.median(t_ours):.2f} s, {spread(speed_ours)}x realtime"
    )
    print(
        f"(b) onnxruntime alone, 64 recordings per call padded to the longest, decoding "
        f"included ({np.median(t_decode):.2f} s of it): {np.median(t_ort):.2f} s, "
        f"{spread(speed_ort)}x realtime"
    )
    print(
        f"(a)/(b) over {args.rounds} rounds: {np.median(ratios):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}] (median [min-max])"
    )
    diff = max(float(np.max(np.abs(p_ours[k] - p_ort[k]), initial=0.0)) for k in p_ort)
    print(f"max |p(a) - p(b)| = {diff:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
