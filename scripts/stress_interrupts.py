"""Ctrl-C stress: many fresh processes interrupted at random moments (issue 25).

Runs tests/test_interrupts.py's child for ``--trials`` random (phase, way, moment)
draws and prints, per phase, how many raised KeyboardInterrupt, hung (the watchdog
fired), lost the interrupt or were left unusable, with the latency's median and range.

    python scripts/stress_interrupts.py --trials 40 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from test_interrupts import MODES, WINDOWS, child_script  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results: dict[str, list] = defaultdict(list)
    for _ in range(args.trials):
        phase = rng.choice(sorted(WINDOWS))
        mode = rng.choice(MODES)
        delay = round(rng.uniform(*WINDOWS[phase]), 3)
        try:
            child = subprocess.run(
                [sys.executable, "-c", child_script(phase, mode, delay, watchdog=30)],
                capture_output=True,
                text=True,
                timeout=90,
                env={**os.environ, "PYTHONPATH": os.path.join(HERE, "..", "tests")},
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
            out, code = child.stdout, child.returncode
        except subprocess.TimeoutExpired:
            out, code = "", "timeout"
        if "Timeout" in (child.stderr if code != "timeout" else "") or code == "timeout":
            outcome = "hung"
        elif "lost" in out:
            outcome = "lost"
        elif code != 0 or "usable True" not in out:
            outcome = f"failed ({code})"
        else:
            outcome = float(out.split("interrupted after ")[1].split()[0])
        results[phase].append((mode, delay, outcome))
        print(phase, mode, delay, outcome, flush=True)
    for phase, rows in sorted(results.items()):
        latencies = [o for _, _, o in rows if isinstance(o, float)]
        bad = [o for _, _, o in rows if not isinstance(o, float)]
        spread = (
            f"latency median {statistics.median(latencies):.3f} s "
            f"[{min(latencies):.3f}-{max(latencies):.3f}]"
            if latencies
            else "no latency"
        )
        print(f"{phase}: {len(latencies)} of {len(rows)} interrupted, {spread}; other: {bad}")


if __name__ == "__main__":
    main()
