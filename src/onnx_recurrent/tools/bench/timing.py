"""Timing: alternating calls, settling between them; one case run and its result."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .cases import (
    CONTENDED_LOAD,
    DOUBLE_ACCURACY,
    MAX_REPEATS,
    MIN_REPEATS,
    TOLERANCE,
    YARDSTICKS,
    Case,
    Target,
)
from .load import BackgroundLoad
from .machine import sgemm_call
from .options import MODEL_OURS, Options
from .runtimes import Call, Runtime, Unavailable, known_wrong

#: the name of the sgemm product timed beside the runtimes (:attr:`CaseResult.peak`)
SGEMM = "sgemm"


def settle(
    *,
    max_wait: float = 0.25,
    quantum: float = 0.01,
    busy_share: float = 0.5,
    clock: Callable[[], float] = time.perf_counter,
    cpu: Callable[[], float] = time.process_time,
    sleep: Callable[[float], object] = time.sleep,
) -> float:
    """Wait until this process's threads stop using CPU; return how long that took.

    onnxruntime's worker threads spin for about 40 ms after each call (its default
    ``session.intra_op.allow_spinning``): on 2 cores that takes a core from whatever
    runs next, which then takes up to twice as long. Sleep ``quantum`` seconds at a time
    until one passes in which the process used less than ``busy_share`` of a CPU (at
    most ``max_wait`` seconds). Every runtime gets at least one quantum of idle time.
    """
    start = clock()
    while clock() - start < max_wait:
        c0, w0 = cpu(), clock()
        sleep(quantum)
        if cpu() - c0 < busy_share * (clock() - w0):
            break
    return clock() - start


def time_alternating(
    calls: dict[str, Callable[[], object]],
    *,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
    budget: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    order: str = "alternate",
    seed: int = 0,
    between: Callable[[], object] | None = None,
    max_calls: Mapping[str, int] | None = None,
) -> dict[str, list[float]]:
    """Call each runtime once per round, in turn, and return each one's call times.

    Rounds go on while fewer than ``min_repeats`` are done, or while another round (at
    the mean round time so far) still fits in ``budget`` seconds, up to ``max_repeats``.
    The order within a round is shuffled (seeded), so that no runtime always runs right
    after the same other one: what ran just before (its caches, its spinning threads)
    changes the time of a call.

    ``between`` (such as :func:`settle`) is called, untimed, after every call when
    alternating, and between two runtimes' blocks with ``order="blocks"``.

    ``order="blocks"`` instead runs all of one runtime's calls, then the next one's, each
    with an equal share of the budget: a cross-check of how much the runtimes' thread
    pools disturb one another when they alternate.

    ``max_calls`` caps the calls of the runtimes it names (a slow one, such as
    onnx.reference on a whole model): such a runtime takes part in the first rounds only,
    and the next round's time is then estimated from the runtimes still taking part.
    """
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    if not names:
        return samples
    caps = dict(max_calls or {})
    if order == "blocks":
        for i, name in enumerate(names):
            if i and between is not None:  # the last runtime's threads go idle first
                between()
            cap = caps.get(name, max_repeats)
            samples[name] = time_alternating(
                {name: calls[name]},
                min_repeats=min(min_repeats, cap),
                max_repeats=min(max_repeats, cap),
                budget=budget / len(names),
                clock=clock,
            )[name]
        return samples
    if order != "alternate":
        raise ValueError(f"order must be 'alternate' or 'blocks', not {order!r}")
    shuffler = random.Random(seed)
    spent_by = dict.fromkeys(names, 0.0)  # each runtime's calls and pauses, for the caps
    start = clock()
    done = 0
    while done < max_repeats:
        active = [n for n in names if len(samples[n]) < caps.get(n, max_repeats)]
        if not active:
            break
        if done >= min_repeats:  # another round, at the mean round time, must fit
            spent = clock() - start
            if caps:  # the mean time of the runtimes that still take part
                per_round = sum(spent_by[n] / len(samples[n]) for n in active if samples[n])
            else:
                per_round = spent / done if done else 0.0
            if spent + per_round > budget or (done == 0 and budget <= 0):
                break
        round_order = list(active)
        shuffler.shuffle(round_order)
        for name in round_order:
            t0 = clock()
            calls[name]()
            samples[name].append(clock() - t0)
            if between is not None:
                between()
            spent_by[name] += clock() - t0
        done += 1
    return samples


def max_abs_diff(ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray]) -> float:
    """The largest absolute difference over all outputs (inf if the shapes disagree)."""
    if len(ours) != len(theirs):
        return math.inf
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return math.inf
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def _over(top: Any, bottom: float | None) -> Any:
    """``top`` (a time, or a pair of them) over ``bottom``; None where either is missing."""
    if top is None or not bottom:
        return None
    return top / bottom if isinstance(top, float) else (top[0] / bottom, top[1] / bottom)


@dataclass
class CaseResult:
    """What one case (an operator's :class:`Case` or a whole model's) measured. Times
    in seconds."""

    case: Any
    samples: dict[str, list[float]] = field(default_factory=dict)
    diffs: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # runtimes timed with a caveat
    error: str | None = None
    missing: str | None = None  # why a whole model did not run (not installed...)
    other_cpu: float | None = None  # share of the CPUs other processes used meanwhile
    contended: dict[str, list[float]] = field(default_factory=dict)  # under background load
    load: int = 0  # the number of busy processes beside the contended rounds
    macs: int | None = None  # multiply-adds of one call over the valid steps (ragged: fewer)
    # the sgemm product's times (:data:`SGEMM`), one in each round beside the runtimes'
    # calls, where the case is held to a share of its peak (:attr:`.Case.peak_judged`)
    peak: list[float] = field(default_factory=list)
    # a float64 case: each of our faces on its float32 twin, timed in the same rounds
    # (the ratio is judged: timed in another case, a minute apart, it measured the
    # machine's change of load as much as float64)
    twins: dict[str, list[float]] = field(default_factory=dict)

    @property
    def repeats(self) -> int:
        return max((len(s) for s in self.samples.values()), default=0)

    def median(self, name: str, samples: dict[str, list[float]] | None = None) -> float | None:
        s = (self.samples if samples is None else samples).get(name)
        return float(np.median(s)) if s else None

    def quartiles(
        self, name: str, samples: dict[str, list[float]] | None = None
    ) -> tuple[float, float] | None:
        """The first and third quartiles of ``name``'s times (the spread of its median)."""
        s = (self.samples if samples is None else samples).get(name)
        if not s:
            return None
        q1, q3 = np.percentile(s, [25, 75])
        return float(q1), float(q3)

    def fastest(self) -> str | None:
        """The faster of the :data:`~.cases.YARDSTICKS` that ran this case (by median)."""
        timed = [(self.median(p), p) for p in YARDSTICKS if self.median(p)]
        return min(timed)[1] if timed else None

    def peer(self, name: str) -> str:
        """``name``, or for "fastest" the :meth:`fastest` peer that ran."""
        return (self.fastest() or name) if name == "fastest" else name

    def ratio(self, name: str, ours: str = "ours") -> float | None:
        """``ours`` / ``name`` (median times); ``name`` "fastest": :meth:`fastest`."""
        return _over(self.median(ours), self.median(self.peer(name)))

    def spread(self, name: str, ours: str = "ours") -> tuple[float, float] | None:
        """The ratio's spread: ours' quartiles over the runtime's median."""
        return _over(self.quartiles(ours), self.median(self.peer(name)))

    def contention(self, name: str) -> float | None:
        """``name``'s median under background load over its quiet median."""
        return _over(self.median(name, self.contended), self.median(name))

    def contention_spread(self, name: str) -> tuple[float, float] | None:
        """The spread of :meth:`contention`: the loaded quartiles over the quiet median."""
        return _over(self.quartiles(name, self.contended), self.median(name))

    def verdicts(self) -> list[tuple[Target, float | None, bool | None]]:
        """Each target with the measured ratio and whether it is met (None: not judged).

        A "contended" target is judged only beside :data:`CONTENDED_LOAD` busy processes.
        """
        out = []
        for t in self.case.targets:
            if t.kind == "contended":
                r = self.contention(t.ours)
                judged = r is not None and self.load == CONTENDED_LOAD
                out.append((t, r, t.met(r) if judged else None))
                continue
            r = self.ratio(t.runtime, t.ours)
            out.append((t, r, None if r is None else t.met(r)))
        return out

    def per_chunk(self, name: str) -> float | None:
        """``name``'s median time per Silero chunk of a whole model, in seconds."""
        median, chunks = self.median(name), getattr(self.case, "chunks", 0)
        return None if median is None or not chunks else median / chunks

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.case.to_json(),
            "repeats": self.repeats,
            "samples_s": self.samples,
            "median_s": {n: self.median(n) for n in self.samples},
            "quartiles_s": {n: self.quartiles(n) for n in self.samples},
            "max_abs_diff": self.diffs,
            "skipped": self.skipped,
            "notes": self.notes,
            "error": self.error,
            "other_cpu": self.other_cpu,
        }
        if not isinstance(self.case, Case):  # a whole model
            chunks = self.case.chunks
            per_chunk = {n: self.per_chunk(n) for n in self.samples} if chunks else None
            ratios = {n: self.ratio("onnxruntime", n) for n in MODEL_OURS}
            return {
                **out,
                "over_onnxruntime": ratios,
                "per_chunk_s": per_chunk,
                "missing": self.missing,
            }
        verdicts = [
            {"runtime": t.runtime, "ours": t.ours, "kind": t.kind, "bound": t.bound}
            | {"ours_over_runtime": r, "met": met}
            for t, r, met in self.verdicts()
        ]
        return {
            **out,
            "macs": self.macs,
            "fastest_peer": self.fastest(),
            "background_load": self.load,
            "contended_samples_s": self.contended,
            "contended_over_quiet": {n: self.contention(n) for n in self.contended},
            "targets": verdicts,
            "sgemm_beside_s": self.peak,
            "float32_twin_samples_s": self.twins,
        }


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def run_case(
    case: Any,
    runtimes: Sequence[Runtime],
    options: Options | None = None,
    *,
    budget: float = 0.0,
    before_timing: Callable[[], None] | None = None,
    **changes: Any,
) -> CaseResult:
    """Build, prepare, warm up, check and time one case: an operator's (:class:`Case`) or
    a whole model's (:class:`~.models.ModelCase`), as ``options`` (with ``changes``) say.

    ``runtimes`` start with ours (:attr:`Runtime.main`); the outputs of the first that
    runs are what the others' are compared with; none of ours running is an error. A
    runtime that is missing, cannot run the case, gets it wrong (check's lint probes it:
    :func:`~.runtimes.known_wrong`), or fails is skipped with its reason; onnx.reference
    also when one call takes longer than ``reference_limit`` seconds, and on a whole
    model it makes at most ``reference_repeats`` timed calls. ``budget`` is the case's
    time in seconds, loading and warm-up included: the timed rounds get what is left
    of it (a fixed ``repeat`` ignores it). With ``background_load`` busy processes,
    half the rounds are timed quiet, half with the load running
    (:attr:`CaseResult.contended`), in the order quiet, loaded, quiet
    (:func:`_quiet_loaded_quiet`); the processes are gone when it returns or raises.
    """
    options = replace(options, **changes) if options else Options(**changes)
    start = time.perf_counter()
    result = CaseResult(case)
    result.missing = case.missing()
    if result.missing:
        return result
    try:
        model, feeds = case.make(options.seed, options.opset)
    except Exception as e:
        result.error = f"cannot build the model: {_first_line(e)}"
        return result
    caps = None
    if isinstance(case, Case):
        result.macs = case.macs
        if "sequence_lens" in feeds:  # only the valid steps of each sequence are computed
            valid = int(feeds["sequence_lens"].sum())
            result.macs = case.macs * valid // (case.shape.T * case.shape.N)
    elif options.reference_repeats:
        caps = {"reference": options.reference_repeats}
    handled = {r.name: r.handles(case) for r in runtimes}
    skip = known_wrong(model, handled, [r.name for r in runtimes])
    calls = prepare_calls(result, runtimes, model, feeds, options, skip=skip)
    if result.error is None:
        if isinstance(case, Case) and case.peak_judged:
            # the sgemm peak timed beside our calls, round by round: this machine's
            # speed drifts (a VM's neighbours, its clock) by more than the target's margin
            calls[SGEMM] = sgemm_call()
            calls[SGEMM]()  # warm-up
        if isinstance(case, Case) and case.dtype == "float64":
            calls |= _float32_twins(case, runtimes, calls, options)
        if before_timing is not None:
            before_timing()
        budget = 0.0 if options.repeat else budget - (time.perf_counter() - start)
        time_calls(result, calls, options, budget=budget, max_calls=caps)
        result.peak = result.samples.pop(SGEMM, [])
        result.contended.pop(SGEMM, None)
        for name in [n for n in result.samples if n.endswith(TWIN)]:
            result.twins[name.removesuffix(TWIN)] = result.samples.pop(name)
            result.contended.pop(name, None)
    return result


#: the suffix of a float32 twin's call (:attr:`CaseResult.twins`), and our faces that
#: have one (those judged over their float32: the functions, the Layer)
TWIN = "@float32"
TWINNED = ("ours", "layer")


def _float32_twins(
    case: Any, runtimes: Sequence[Runtime], calls: Mapping[str, Call], options: Options
) -> dict[str, Call]:
    """Our faces that run a float64 ``case``, prepared and warmed up on its float32
    twin (none where it cannot be built)."""
    twin = replace(case, dtype="float32")
    try:
        model, feeds = twin.make(options.seed, options.opset)
    except Exception:  # the float64 case's own error says why
        return {}
    made = {}
    for runtime in runtimes:
        if runtime.name in TWINNED and runtime.name in calls:
            try:
                call = runtime.prepare(twin, model, feeds)
                call()
            except Exception:  # judged against the float32 case's own times then
                continue
            made[runtime.name + TWIN] = call
    return made


def prepare_calls(
    result: CaseResult,
    runtimes: Sequence[Runtime],
    model: Any,
    feeds: dict[str, np.ndarray],
    options: Options,
    skip: Mapping[str, str] | None = None,
) -> dict[str, Call]:
    """Prepare and warm up each runtime on ``result.case``; return the calls that ran.

    A runtime that is missing, cannot run the case (its own ``unsupported``, or a reason
    in ``skip``), or fails is recorded in ``result.skipped`` with the reason;
    onnx.reference also when one call takes longer than ``options.reference_limit``
    seconds. The first runtime that runs gives the outputs that the others' are
    compared with (``result.diffs``). When none of ours (:attr:`Runtime.main`) runs,
    ``result.error`` says why and no call is returned.
    """
    ours = sum(r.main for r in runtimes)
    warmup, reference_limit = options.warmup, options.reference_limit
    calls: dict[str, Call] = {}
    reference_outputs = None
    skip = skip or {}
    for index, runtime in enumerate(runtimes):
        reason = runtime.missing() or skip.get(runtime.name) or runtime.unsupported(result.case)
        if reason is None:
            try:
                call = runtime.prepare(result.case, model, feeds)
                outputs = None
                for _ in range(max(1, warmup)):
                    t0 = time.perf_counter()
                    outputs = call()
                    took = time.perf_counter() - t0
                    if runtime.name == "reference" and took > reference_limit:
                        reason = (
                            f"one call took {took:.1f} s > {reference_limit:g} s "
                            "(--reference-limit)"
                        )
                        break
                outputs = [np.array(o, copy=True) for o in outputs]
            except Unavailable as e:
                reason = str(e)
            except Exception as e:
                reason = f"failed: {_first_line(e)}"
        if reason is not None:
            if index == ours - 1 and not calls:  # none of ours runs
                result.error = reason if ours == 1 else f"{runtime.name}: {reason}"
                return {}
            result.skipped[runtime.name] = reason
            continue
        calls[runtime.name] = call
        if getattr(call, "note", None):
            result.notes[runtime.name] = call.note
        if reference_outputs is None:
            reference_outputs = outputs
        else:
            diff = max_abs_diff(reference_outputs, outputs)
            result.diffs[runtime.name] = diff
            if result.case.dtype == "float64" and DOUBLE_ACCURACY < diff <= TOLERANCE:
                result.notes.setdefault(
                    runtime.name,
                    f"float64 outputs only float32-accurate (Δ > {DOUBLE_ACCURACY:g}): "
                    "computes double in float32",
                )
    return calls


def time_calls(
    result: CaseResult,
    calls: dict[str, Call],
    options: Options,
    *,
    budget: float = 0.0,
    max_calls: Mapping[str, int] | None = None,
) -> None:
    """Time the prepared ``calls`` into ``result`` (:func:`time_alternating`, with
    :func:`settle` after each call unless ``options.settle`` is false); ``budget``: the
    seconds left for the timed rounds. A failure sets ``result.error``."""
    timed = {
        "calls": calls,
        "order": options.order,
        "seed": options.seed,
        "between": settle if options.settle else None,
        "max_calls": max_calls,
    }
    fixed = options.repeat
    min_repeats, max_repeats = (fixed, fixed) if fixed else (MIN_REPEATS, MAX_REPEATS)
    background_load = options.background_load
    try:
        if not background_load:
            result.samples = time_alternating(
                **timed, min_repeats=min_repeats, max_repeats=max_repeats, budget=budget
            )
        else:
            result.load = background_load
            result.samples, result.contended = _quiet_loaded_quiet(
                timed, background_load, min_repeats, max_repeats, budget
            )
    except Exception as e:  # a runtime that ran its warm-up but failed later
        result.error = f"failed while timing: {_first_line(e)}"


def _quiet_loaded_quiet(
    timed: dict[str, Any], load: int, min_repeats: int, max_repeats: int, budget: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Quiet rounds, the same number of rounds beside ``load`` busy processes, quiet
    rounds again: the quiet and the loaded times, each with half the budget.

    The quiet rounds come in two halves, before and after the loaded ones (the order
    A B B A), so that a drift of the machine's speed during the case (other work, clock
    changes) weighs on both alike; the busy processes start and stop once per case.
    """
    first, second = (min_repeats + 1) // 2, min_repeats // 2
    first_max, second_max = (max_repeats + 1) // 2, max_repeats // 2
    before = time_alternating(**timed, min_repeats=first, max_repeats=first_max, budget=budget / 4)
    with BackgroundLoad(load):
        loaded = time_alternating(
            **timed, min_repeats=min_repeats, max_repeats=max_repeats, budget=budget / 2
        )
    after = time_alternating(
        **{**timed, "seed": timed["seed"] + 1},
        min_repeats=second,
        max_repeats=second_max,
        budget=budget / 4,
    )
    return {n: before[n] + after[n] for n in before}, loaded
