"""A whole run: budgets, thread limits, CPU use of other processes, the cases in turn."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cases import DEFAULT_BUDGET, MAX_REPEATS, MIN_REPEATS, OPS, Case, make_cases
from .machine import git_commit, machine_info, sgemm_peak
from .report import SHORT_NAMES, fmt_ms, fmt_ratio, format_report
from .runtimes import COMPETITORS, Runtime, make_runtimes
from .timing import CaseResult, run_case


@dataclass
class Bench:
    """A whole run: its options, the machine, and the results."""

    cases: list[Case]
    runtimes: list[Runtime]
    shapes: list[str]
    results: list[CaseResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        return format_report(self.results, self.runtimes, self.info, self.shapes)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.info,
            "options": self.options,
            "results": [r.to_json() for r in self.results],
        }


def budgets(shapes: Sequence[str], total: float | None) -> dict[str, float]:
    """Each shape's share of the time budget (the defaults, scaled to ``total``)."""
    default = {s: DEFAULT_BUDGET[s] for s in shapes}
    if total is None:
        return default
    whole = sum(default.values())
    if whole <= 0:
        return {s: total / len(shapes) for s in shapes}
    return {s: total * v / whole for s, v in default.items()}


class ThreadLimit:
    """``--threads`` for ours (``ONNX_RECURRENT_NUM_THREADS``) and for NumPy's BLAS
    (through threadpoolctl: onnx.reference's products).

    :meth:`apply` is called again before each case's timed rounds: a first numba
    compilation resets OpenBLAS to one thread per core.
    """

    VARIABLE = "ONNX_RECURRENT_NUM_THREADS"

    def __init__(self, threads: int | None, notes: list[str]) -> None:
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
    ops: Sequence[str] = OPS,
    shapes: Sequence[str] = ("step", "S", "M"),
    *,
    runtimes: Sequence[str] = COMPETITORS,
    repeat: int | None = None,
    budget: float | None = None,
    warmup: int = 1,
    threads: int | None = None,
    skip_reference: Iterable[str] = (),
    reference_limit: float = 30.0,
    select: str | None = None,
    seed: int = 0,
    opset: int = 22,
    order: str = "alternate",
    settle_between: bool = True,
    background_load: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Bench:
    """Run every case and return the :class:`Bench` (``.report()`` is the printout).

    ``repeat`` fixes the number of rounds; otherwise it adapts to the time budget of each
    shape (:data:`DEFAULT_BUDGET`, or ``budget`` seconds in all), at least
    :data:`MIN_REPEATS`. ``background_load`` busy processes: every case is timed quiet,
    then under that load (:class:`~.load.BackgroundLoad`).
    """
    cases = make_cases(ops, shapes)
    if select:
        cases = [c for c in cases if select.lower() in f"{c.shape.name} {c.label}".lower()]
    bench = Bench(
        cases,
        make_runtimes(runtimes, threads=threads, skip_reference=skip_reference),
        list(shapes),
    )
    bench.options = {
        "ops": list(ops),
        "shapes": list(shapes),
        "runtimes": list(runtimes),
        "repeat": repeat,
        "budget": budget,
        "warmup": warmup,
        "threads": threads,
        "skip_reference": list(skip_reference),
        "reference_limit": reference_limit,
        "select": select,
        "seed": seed,
        "opset": opset,
        "order": order,
        "settle": settle_between,
        "background_load": background_load,
    }
    notes: list[str] = []
    record = RunRecord()
    share = budgets(shapes, budget)
    left = {s: sum(1 for c in cases if c.shape.name == s) for s in shapes}
    # once per run, before --threads limits NumPy's BLAS: "all" is every usable CPU
    peak = sgemm_peak() if {"M", "L"} & {c.shape.name for c in cases} else None
    limit = ThreadLimit(threads, notes)
    limit.apply()
    try:
        for i, case in enumerate(cases, 1):
            name = case.shape.name
            case_budget = share[name] / max(left[name], 1)
            left[name] -= 1
            start = time.perf_counter()
            meter = CpuMeter()
            fixed = repeat is not None
            result = run_case(
                case,
                bench.runtimes,
                warmup=warmup,
                min_repeats=repeat if fixed else MIN_REPEATS,
                max_repeats=repeat if fixed else MAX_REPEATS,
                budget=0.0 if fixed else case_budget,
                reference_limit=reference_limit,
                seed=seed,
                opset=opset,
                order=order,
                before_timing=limit.apply,
                settle_between=settle_between,
                background_load=background_load,
            )
            result.other_cpu = meter.others()
            spent = time.perf_counter() - start
            share[name] -= spent
            bench.results.append(result)
            if progress:
                peer = case.baseline if case.baseline == "openvino" else "fastest"
                ratio = result.ratio(peer)
                shown = "—" if ratio is None else fmt_ratio(ratio)
                if peer == "fastest":
                    peer = result.fastest() or peer
                layer = result.median("layer")
                layer_text = "" if layer is None else f", Layer {fmt_ms(layer)} ms"
                progress(
                    f"[{i}/{len(cases)}] {name} {case.label}: ours {fmt_ms(result.median('ours'))}"
                    f" ms{layer_text}, ours/{SHORT_NAMES[peer]} {shown}, {result.repeats} rounds,"
                    f" {spent:.1f} s"
                )
        bench.info = machine_info(bench.runtimes)  # inside: the thread limits still hold
    finally:
        limit.restore()
    bench.info["sgemm_peak_gmacs"] = peak
    bench.info["background_load"] = background_load
    record.complete(bench.info, notes=notes, order=order, settle=settle_between, warmup=warmup)
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

    def complete(
        self, info: dict[str, Any], *, notes: list[str], order: str, settle: bool, warmup: int
    ) -> None:
        info["notes"] = notes
        if info.get("commit") != self.commit_before:  # the checkout changed during the run
            info["commit"] = f"{self.commit_before} at the start, {info.get('commit')} at the end"
        info["load_average_before"] = self.load_before
        info["other_cpu"] = self.whole_run.others()
        info["order"] = order
        info["settle"] = settle
        info["warmup"] = warmup
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
