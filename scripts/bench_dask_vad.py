"""Scaling of VAD on a cluster (``vad.cluster.detect``): files per second, 1 vs 2 workers.

The issue's target (a 2-core machine): two single-threaded Dask workers process the
same corpus at >= 1.6x the files per second of one. For each worker count, a fresh
``distributed.LocalCluster`` of that many worker processes, one thread each (and one
compute thread per worker: ``ONNX_RECURRENT_NUM_THREADS=1`` in their environment,
onnxruntime's intra-op threads 1, as ``detect`` makes its sessions), is warmed up (each
worker makes its session and runs one file), then the whole corpus is timed
``--rounds`` times: the median, and each round. Both runs cut the corpus into the same
groups (``--group-size``, by default what ``detect`` picks for the largest cluster),
so only the number of workers differs.

The corpus: the files and directories given, or, without any, ``--make N`` recordings
of 5 to 30 s built from the test recordings under ``tests/data`` (``bench_corpus.py``,
as ``bench_vad.py`` builds its own) in a temporary directory. The rounds are timed by
the bench's :func:`~onnx_recurrent.tools.bench.time_alternating`.

Usage (from the repository root; needs the ``vad`` extra, dask, distributed and
silero-vad)::

    python scripts/bench_dask_vad.py --make 16            # small: a minute or so
    python scripts/bench_dask_vad.py --make 120 --rounds 3  # the issue's corpus size
    python scripts/bench_dask_vad.py corpus/ --workers 1 2 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_corpus import build_corpus

from onnx_recurrent.tools.bench import time_alternating


def measure(files, workers, *, batch, group_size, host, rounds, warm) -> dict:
    """``rounds`` runs of the corpus on a fresh cluster of ``workers`` (median seconds)."""
    import distributed

    from onnx_recurrent.tools.vad import cluster as vad_cluster

    env = {"ONNX_RECURRENT_NUM_THREADS": "1"}
    with (
        distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env=env,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        # each worker: its session made, the model run once (compiled code loaded)
        client.run(vad_cluster._detect_group, [warm], batch, host, None, {})
        got = {}

        def run() -> None:
            detect = vad_cluster.detect(
                client, files, batch=batch, group_size=group_size, host=host
            )
            got["results"] = list(detect)

        times = time_alternating({"detect": run}, min_repeats=rounds, max_repeats=rounds)["detect"]
        results = got["results"]
    failed = [(p, r) for p, r in results if isinstance(r, BaseException)]
    if failed:
        print(f"  {len(failed)} file(s) failed, e.g. {failed[0]}", file=sys.stderr)
    return {
        "workers": workers,
        "seconds": float(np.median(times)),
        "rounds": times,
        "files": len(files),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="audio files and directories (the corpus)")
    parser.add_argument(
        "--make",
        type=int,
        default=16,
        metavar="N",
        help="without paths: make N recordings of 5-30 s (default 16)",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--host", default="auto")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    from onnx_recurrent.tools.vad.audio import audio_duration, find_audio_files

    with tempfile.TemporaryDirectory(prefix="bench-dask-vad-") as tmp:
        if args.paths:
            files = find_audio_files(args.paths)
        else:
            files = [str(p) for p in build_corpus(Path(tmp), args.make)]
        audio = sum(audio_duration(f) or 0.0 for f in files)
        group_size = args.group_size or max(
            1, min(args.batch, math.ceil(len(files) / (4 * max(args.workers))))
        )
        print(
            f"{len(files)} files, {audio:.0f} s of audio; groups of {group_size}, "
            f"batch {args.batch}, host {args.host}, {os.cpu_count()} CPUs"
        )
        rows = []
        for workers in args.workers:
            row = measure(
                files,
                workers,
                batch=args.batch,
                group_size=group_size,
                host=args.host,
                rounds=args.rounds,
                warm=files[0],
            )
            row["files_per_s"] = len(files) / row["seconds"]
            row["realtime"] = audio / row["seconds"]
            rows.append(row)
            print(
                f"{workers} worker(s): {row['seconds']:.2f} s, {row['files_per_s']:.1f} files/s, "
                f"{row['realtime']:.0f}x realtime (rounds: "
                + ", ".join(f"{t:.2f}" for t in row["rounds"])
                + ")"
            )
    base = rows[0]
    for row in rows[1:]:
        row["speedup"] = row["files_per_s"] / base["files_per_s"]
        # the spread: the slowest and fastest rounds of one against the other's
        low = min(base["rounds"]) / max(row["rounds"])
        high = max(base["rounds"]) / min(row["rounds"])
        row["speedup_range"] = [low, high]
        print(
            f"{row['workers']} vs {base['workers']} worker(s): {row['speedup']:.2f}x "
            f"[{low:.2f}-{high:.2f}] (medians [range of the rounds]; target for 2 vs 1: "
            ">= 1.6x)"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "audio_seconds": audio,
                    "group_size": group_size,
                    "batch": args.batch,
                    "runs": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
