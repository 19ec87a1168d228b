"""Run thousands of mutated models through InferenceSession and count what happens.

Each mutant (``tests/fuzz.py``: the bundled example, the exported streaming models,
Silero VAD where installed and one-node models, changed by seeded byte and field
mutations) runs under each host in a worker process; the outcome is outputs, a clear
error (counted by type), or a defect (crash, hang, an unclear exception type, an
error leaked from a helper library, outputs of the wrong shape, hosts that disagree),
listed with its seed. The exit status is 1 when there is a defect.

Usage (from the repository root)::

    python scripts/fuzz_models.py --count 3000 --seed 0 --jobs 2
    python scripts/fuzz_models.py --replay 2874 --host onnxruntime   # one, traceback

The figures of a run are in docs/robustness.md.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from fuzz import DEFECTS, fuzz, outcome_label, replay  # noqa: E402


def _hosts(choice: str) -> list[str]:
    if choice != "both":
        return [choice]
    packages = ("onnxruntime", "onnxruntime_extensions")
    if all(importlib.util.find_spec(p) for p in packages):
        return ["reference", "onnxruntime"]
    print("onnxruntime or onnxruntime-extensions missing: the reference host only")
    return ["reference"]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="mutants (default 3000)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--host",
        choices=["both", "reference", "onnxruntime", "auto"],
        default="both",
        help="the hosts each mutant runs under (default: reference and onnxruntime)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a mutant may take (default 60)"
    )
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run one mutant here")
    args = parser.parse_args(argv)
    hosts = _hosts(args.host)
    if args.replay is not None:
        replay(args.replay, hosts)
        return 0

    versions = ", ".join(
        f"{p} {_version(p)}"
        for p in ("onnx-recurrent", "onnx", "onnxruntime", "onnxruntime-extensions", "numpy")
    )
    seeds = range(args.seed, args.seed + args.count)
    print(f"{args.count} mutants (seeds {seeds.start}..{seeds.stop - 1}), hosts {hosts}")
    print(f"{versions}; {args.jobs} workers, {args.timeout:g} s a mutant")
    done = [0]
    start = time.monotonic()

    def progress(result: dict) -> None:
        done[0] += 1
        if done[0] % 500 == 0:
            print(f"  {done[0]} done, {time.monotonic() - start:.0f} s", flush=True)

    results = fuzz(seeds, hosts, jobs=args.jobs, timeout=args.timeout, progress=progress)
    elapsed = time.monotonic() - start
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    defects = []
    for r in results:
        for host, outcome in r["hosts"].items():
            label = outcome_label(outcome)
            counts[label][host] += 1
            if outcome["kind"] in DEFECTS:
                defects.append((r, host, outcome))
    columns = [*hosts, *sorted({h for c in counts.values() for h in c} - set(hosts))]
    width = max(len(label) for label in counts) + 2

    def order(label: str) -> tuple:
        return (label.startswith("DEFECT"), label != "outputs", -sum(counts[label].values()))

    print(f"\n{'outcome':<{width}}" + "".join(f"{h:>14}" for h in columns))
    for label in sorted(counts, key=order):
        print(f"{label:<{width}}" + "".join(f"{counts[label][h]:>14}" for h in columns))
    print(f"{'total':<{width}}" + "".join(f"{len(results):>14}" for _ in columns))
    print(f"\n{len(results)} mutants in {elapsed:.0f} s; {len(defects)} defects")
    for r, host, outcome in defects:
        print(f"\nseed {r['seed']} ({host}): {outcome_label(outcome)}")
        print(f"  model {r.get('model')}: {'; '.join(r.get('mutations') or [])}")
        message = outcome.get("message", "")
        print("  " + (message[-1500:] if outcome["kind"] == "fuzzer" else message[:500]))
        if outcome.get("where"):
            print("  " + outcome["where"][-1500:].replace("\n", "\n  "))
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
