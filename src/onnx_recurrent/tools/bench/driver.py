"""A whole run: budgets, thread limits, CPU use of other processes, the cases in turn."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .machine import git_commit, machine_info, sgemm_peak
from .options import Options
from .report import format_report, progress_line
from .runtimes import Runtime, make_runtimes
from .timing import CaseResult, run_case


@dataclass
class Bench:
    """A whole run: its options, cases and runtimes, the machine, and the results."""

    options: Options
    cases: list[Any]
    runtimes: list[Runtime]
    results: list[CaseResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        shapes = () if self.options.models else self.options.shapes
        return format_report(self.results, self.runtimes, self.info, shapes)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.info,
            "options": self.options.to_json(),
            "results": [r.to_json() for r in self.results],
        }


class ThreadLimit:
    """``--threads`` for ours (``ONNX_RECURRENT_NUM_THREADS``) and for NumPy's BLAS
    (through threadpoolctl: onnx.reference's products).

    :meth:`apply` is called again before each case's timed rounds: a first numba
    compilation resets OpenBLAS to one thread per core.
    """

    VARIABLE = "ONNX_RECURRENT_NUM_THREADS"

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self.original: Any = None
        self.variable_before = os.environ.get(self.VARIABLE)

    def apply(self) -> None:
        if not self.threads:
            return
        os.environ[self.VARIABLE] = str(self.threads)
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(self.threads)
        if self.original is None:
            self.original = limiter

    def restore(self) -> None:
        if self.original is not None:
            self.original.restore_original_limits()
        if not self.threads:
            return
        if self.variable_before is None:
            os.environ.pop(self.VARIABLE, None)
        else:
            os.environ[self.VARIABLE] = self.variable_before


def run_bench(
    options: Options | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    **changes: Any,
) -> Bench:
    """Run every case of ``options`` (with ``changes``; :class:`Options`) and return the
    :class:`Bench` (``.report()`` is the printout); ``progress`` gets a line per case.

    ``repeat`` fixes the number of rounds; otherwise they adapt to the time budget of
    each shape (:data:`~.cases.DEFAULT_BUDGET`) or of the whole models
    (:data:`~.models.MODEL_BUDGET` each), or ``budget`` seconds in all: what a case
    leaves goes to the next of its group. At least :data:`~.cases.MIN_REPEATS`.
    """
    options = replace(options, **changes) if options else Options(**changes)
    cases = options.cases()
    bench = Bench(options, cases, make_runtimes(options))
    record = RunRecord()
    share = options.budgets(cases)
    left = Counter(c.group for c in cases)
    # once per run, before --threads limits NumPy's BLAS: "all" is every usable CPU
    peak = sgemm_peak() if {"M", "L"} & set(left) else None
    limit = ThreadLimit(options.threads)
    limit.apply()
    try:
        for i, case in enumerate(cases, 1):
            budget = share[case.group] / max(left[case.group], 1)
            left[case.group] -= 1
            start = time.perf_counter()
            meter = CpuMeter()
            result = run_case(
                case, bench.runtimes, options, budget=budget, before_timing=limit.apply
            )
            result.other_cpu = meter.others()
            spent = time.perf_counter() - start
            share[case.group] -= spent
            bench.results.append(result)
            if progress:
                line = progress_line(result, bench.runtimes)
                progress(f"[{i}/{len(cases)}] {line}, {spent:.1f} s")
        bench.info = machine_info(bench.runtimes)  # inside: the thread limits still hold
    finally:
        limit.restore()
    if not options.models:
        bench.info["sgemm_peak_gmacs"] = peak
        bench.info["background_load"] = options.background_load
    record.complete(bench.info, options)
    return bench


class RunRecord:
    """What the header tells of a whole run besides the machine: the load average before
    and after, the commit at both ends, other processes' CPU use, the duration.

    Made at the start of the run; :meth:`complete` adds it to the run's ``info``.
    """

    def __init__(self) -> None:
        self.load_before = _load_average()
        self.commit_before = git_commit()
        self.whole_run = CpuMeter()
        self.began = time.perf_counter()

    def complete(self, info: dict[str, Any], options: Options) -> None:
        info["notes"] = []  # kept for the JSON's readers: nothing writes notes any more
        if info.get("commit") != self.commit_before:  # the checkout changed during the run
            info["commit"] = f"{self.commit_before} at the start, {info.get('commit')} at the end"
        info["load_average_before"] = self.load_before
        info["other_cpu"] = self.whole_run.others()
        info["order"] = options.order
        info["settle"] = options.settle
        info["warmup"] = options.warmup
        info["load_average_after"] = _load_average()
        info["duration_s"] = time.perf_counter() - self.began


class CpuMeter:
    """The share of the machine's CPU time that other processes used since it was made.

    From /proc/stat (all CPUs) less this process's own CPU time (every thread of every
    runtime, spinning included) and its reaped children's (the busy processes of
    ``--background-load``); None where /proc/stat is not available. Anything else
    running skews every time in the table: a thread pool that needs both cores of a
    2-core machine waits for the scheduler at every step when one is taken.
    """

    def __init__(self) -> None:
        self.begin = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
            ticks = [int(v) for v in fields]
            hz = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return None
        own = os.times()
        idle = ticks[3] + ticks[4]  # idle + iowait
        mine = own.user + own.system + own.children_user + own.children_system
        return sum(ticks) / hz, (sum(ticks) - idle) / hz, mine

    def others(self) -> float | None:
        end = self._sample()
        if self.begin is None or end is None:
            return None
        total = end[0] - self.begin[0]
        if total <= 0:
            return None
        busy = end[1] - self.begin[1]
        own = end[2] - self.begin[2]
        return min(1.0, max(0.0, (busy - own) / total))


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the system has them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None
