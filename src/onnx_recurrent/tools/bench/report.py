"""The report of a run, of operators or of whole models: header, table, notes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .cases import CONTENDED_LOAD, OTHERS_WARNING, SHAPES, TOLERANCE, Case
from .machine import SGEMM_SIZE, sgemm_gmacs
from .models import SILERO_CHUNK, SILERO_RATE
from .runtimes import OursHost, Runtime
from .timing import CaseResult


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _others(result: CaseResult) -> str:
    if result.other_cpu is None:
        return "—"
    flag = " !" if result.other_cpu > OTHERS_WARNING else ""
    return f"{result.other_cpu:.0%}{flag}"


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def _speedup(value: float) -> str:
    return (f"{value:.2g}" if value < 10 else f"{value:.0f}") + "x"


def _diff(value: float | None) -> str:
    if value is None:
        return "—"
    flag = " !" if not value <= TOLERANCE else ""
    return f"{value:.1e}{flag}"


SHORT_NAMES = {
    "onnxruntime": "ort",
    "openvino": "ov",
    "reference": "ref",
    "fastest": "fastest",
    "layer": "Layer",
}


def _bracket(spread: tuple[float, float] | None) -> str:
    """A ratio's spread, `` [low-high]``; '' where there is none."""
    return "" if spread is None else f" [{fmt_ratio(spread[0])}-{fmt_ratio(spread[1])}]"


def _speedup_spread(result: CaseResult) -> str:
    """onnx.reference's median over our quartiles: the spread of ref/ours."""
    spread = result.spread("reference")
    if spread is None:
        return ""
    return f" [{_speedup(1.0 / spread[1])}-{_speedup(1.0 / spread[0])}]"


def _verdict_cells(result: CaseResult) -> tuple[str, str, str, str]:
    base_ratio = base_target = ref_ratio = ref_target = "—"
    ratios, targets = [], []
    for target, ratio, met in result.verdicts():
        word = "n/a" if met is None else ("PASS" if met else "MISS")
        if target.kind == "contended":  # in the table of format_contention
            continue
        if target.kind == "ratio":
            if ratio is not None:
                peer = SHORT_NAMES[result.peer(target.runtime)]
                face = "Layer/" if target.ours == "layer" else ""
                spread = _bracket(result.spread(target.runtime, target.ours))
                ratios.append(f"{face}{peer} {fmt_ratio(ratio)}{spread}")
            targets.append(f"{target.text()} {word}")
        else:
            if ratio is not None:
                ref_ratio = _speedup(1.0 / ratio) + _speedup_spread(result)
            ref_target = f"{target.text()} {word}"
    if ratios:
        base_ratio, base_target = "; ".join(ratios), "; ".join(targets)
    if base_ratio == "—":  # no peer target (float64): the ratio as information
        baseline = result.case.baseline
        r = result.ratio(baseline)
        if r is not None:
            spread = _bracket(result.spread(baseline))
            base_ratio = f"{SHORT_NAMES[baseline]} {fmt_ratio(r)}{spread}"
        if result.case.dtype == "float64":  # judged over our float32: format_double
            base_target = f"none (f32 ≤ {DOUBLE_BOUND:g} below)"
    if ref_ratio == "—":
        r = result.ratio("reference")
        if r is not None:
            ref_ratio = _speedup(1.0 / r) + _speedup_spread(result)
    return base_ratio, base_target, ref_ratio, ref_target


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, its columns padded to their widest cell."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _models(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> bool:
    """Whether the run is of whole models (ours under each host), not of operators."""
    if results:
        return not isinstance(results[0].case, Case)
    return any(isinstance(r, OursHost) for r in runtimes)


def table_columns(runtimes: Sequence[Runtime], models: bool = False) -> list[str]:
    """The table's columns: operators' (by shape, with the targets) or whole models'
    (each of ours over onnxruntime alone)."""
    ours = [r for r in runtimes if isinstance(r, OursHost)]
    faces = " / ".join(r.face.removeprefix("ours (").removesuffix(")") for r in ours)
    ratios = [f"{r.face}/ort [quartiles]" for r in ours] + [f"ref/ours ({faces})"]
    if not models:
        ratios = ["ours/peer [quartiles]", "target", "ref/ours", "target"]
    return [
        *(["case"] if models else ["shape", "case"]),
        "reps",
        "other CPU",
        *[r.title for r in runtimes],
        *ratios,
        *[r.short for r in runtimes[1:]],
    ]


def _time_cell(res: CaseResult, name: str) -> str:
    """Median (first-third quartile), '*' for a caveat."""
    q = res.quartiles(name)
    spread = "" if q is None else f" ({fmt_ms(q[0])}-{fmt_ms(q[1])})"
    return fmt_ms(res.median(name)) + spread + (" *" if name in res.notes else "")


def _reps_cell(result: CaseResult, runtimes: Sequence[Runtime]) -> str:
    """The rounds, and the calls of a runtime that took part in fewer (a capped one)."""
    fewer = [
        f"{SHORT_NAMES.get(r.name, r.name)} {len(result.samples[r.name])}"
        for r in runtimes
        if 0 < len(result.samples.get(r.name, ())) < result.repeats
    ]
    return "; ".join([str(result.repeats), *fewer])


def _model_ratio_cells(result: CaseResult, runtimes: Sequence[Runtime]) -> list[str]:
    """Each of ours over onnxruntime alone [our quartiles over its median], and how
    many times faster than onnx.reference alone each is."""
    ours = [r for r in runtimes if isinstance(r, OursHost)]
    cells = []
    for r in ours:
        ratio = result.ratio("onnxruntime", r.name)
        spread = _bracket(result.spread("onnxruntime", r.name))
        cells.append("—" if ratio is None else fmt_ratio(ratio) + spread)
    faster = [result.ratio("reference", r.name) for r in ours]
    shown = ["—" if f is None else _speedup(1.0 / f) for f in faster]
    return [*cells, " / ".join(shown) if any(f is not None for f in faster) else "—"]


def format_table(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> str:
    """A Markdown table: one row per case, median times (quartiles), the ratios of ours
    (operators: to the fastest peer and onnx.reference, with the targets; whole models:
    to onnxruntime alone and onnx.reference alone) and each runtime's difference from
    the first of ours."""
    models = _models(results, runtimes)
    columns = table_columns(runtimes, models)
    rows = []
    for res in results:
        lead = [res.case.name] if models else [res.case.shape.name, res.case.label]
        if res.missing or res.error:
            cells = [
                *lead,
                "0",
                "—",
                f"not run: {res.missing}" if res.missing else f"error: {res.error}",
            ]
        else:
            cells = [*lead, _reps_cell(res, runtimes), _others(res)]
            cells += [_time_cell(res, r.name) for r in runtimes]
            cells += _model_ratio_cells(res, runtimes) if models else _verdict_cells(res)
            cells += [_diff(res.diffs.get(r.name)) for r in runtimes[1:]]
        rows.append(cells + ["—"] * (len(columns) - len(cells)))
    return markdown_table(columns, rows)


def format_notes(
    results: Sequence[CaseResult],
    runtimes: Sequence[Runtime],
    *,
    targets: bool = True,
    info: dict[str, Any] | None = None,
) -> str:
    """Skipped competitors (grouped by reason), disagreeing outputs, target summary
    (unless ``targets`` is false): the cases' targets and, with the run's ``info``
    (its sgemm peak), L forward's share of the peak (:data:`PEAK_SHARE`)."""
    titles = {r.name: r.title.removesuffix(" ms") for r in runtimes}
    grouped: dict[tuple[str, str], list[str]] = {}
    for res in results:
        for name, reason in res.skipped.items():
            grouped.setdefault((name, reason), []).append(res.case.key)
    caveats: dict[tuple[str, str], list[str]] = {}
    for res in results:
        for name, note in res.notes.items():
            caveats.setdefault((name, note), []).append(res.case.key)
    lines = []
    for heading, groups in (("Skipped ('—'):", grouped), ("Timed with a caveat ('*'):", caveats)):
        if groups:
            lines.append(heading)
        for (name, reason), labels in groups.items():
            which = "all cases" if len(labels) == len(results) else ", ".join(labels)
            lines.append(f"- {titles.get(name, name)}: {reason} — {which}")
    wrong = [
        f"{res.case.key} ({titles.get(n, n)} {d:.1e})"
        for res in results
        for n, d in res.diffs.items()
        if not d <= TOLERANCE
    ]
    if wrong:
        lines.append(f"Outputs farther than {TOLERANCE:g} from ours (!): " + ", ".join(wrong))
    if not targets:
        return "\n".join(lines)
    passed = missed = 0
    misses = []
    for res in results:
        for target, ratio, met in res.verdicts():
            if met is None:
                continue
            if met:
                passed += 1
            else:
                missed += 1
                if target.kind == "speedup":
                    shown = _speedup(1 / ratio)
                else:
                    shown = fmt_ratio(ratio)
                if target.kind == "contended":
                    versus = "loaded/quiet"
                else:
                    peer = res.peer(target.runtime)
                    face = "Layer " if target.ours == "layer" else ""
                    versus = f"{face}vs {titles.get(peer, peer)}"
                misses.append(
                    f"{res.case.shape.name} {res.case.label} {versus} {shown} "
                    f"(target {target.text()})"
                )
    for res, share, met in peak_verdicts(results, info or {}):
        if met:
            passed += 1
        else:
            missed += 1
            misses.append(
                f"{res.case.shape.name} {res.case.label} share of the sgemm peak "
                f"{share:.0%} (target ≥ {PEAK_SHARE:.0%})"
            )
    for res, name, _, ratio, _, met in double_verdicts(results):
        if name != "ours":  # judged through the functions, as the sgemm share
            continue
        if met:
            passed += 1
        else:
            missed += 1
            misses.append(
                f"{res.case.shape.name} {res.case.label} over our float32 "
                f"{fmt_ratio(ratio)} (target ≤ {DOUBLE_BOUND:g})"
            )
    lines.append(f"Targets: {passed} PASS, {missed} MISS.")
    lines += [f"- MISS {m}" for m in misses]
    return "\n".join(lines)


def format_contention(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> str:
    """Each runtime's median under background load over its quiet median, with the
    spread (the loaded quartiles over the quiet median), and the contended targets."""
    loaded = [r for r in results if r.contended]
    if not loaded:
        return ""
    names = [r.name for r in runtimes]
    columns = ["shape", "case", *[f"{SHORT_NAMES.get(n, n)} loaded/quiet" for n in names]]
    rows = []
    verdicts = []
    for res in loaded:
        cells = [res.case.shape.name, res.case.label]
        for n in names:
            ratio = res.contention(n)
            spread = _bracket(res.contention_spread(n))
            cells.append("—" if ratio is None else fmt_ratio(ratio) + spread)
        rows.append(cells)
        for target, ratio, met in res.verdicts():
            if target.kind != "contended" or ratio is None:
                continue
            word = "n/a" if met is None else ("PASS" if met else "MISS")
            face = "Layer" if target.ours == "layer" else "ours"
            verdicts.append(
                f"{res.case.shape.name} {res.case.label}: {face} {fmt_ratio(ratio)} "
                f"(≤ {target.bound:g}) {word}"
            )
    out = [markdown_table(columns, rows)]
    if verdicts:
        load = loaded[0].load
        unjudged = (
            ""
            if load == CONTENDED_LOAD
            else f"; not judged: the target is for {CONTENDED_LOAD} busy process, not {load}"
        )
        out.append(
            "Contended over quiet, M forward (target for ours beside "
            f"{CONTENDED_LOAD} busy process{unjudged}): " + "; ".join(verdicts)
        )
    return (
        "Under background load (loaded median / quiet median [loaded quartiles / quiet "
        "median]):\n" + "\n".join(out)
    )


def _our_faces(res: CaseResult) -> Iterator[tuple[str, str, float, tuple[float, float]]]:
    """``(runtime name, label suffix, median, quartiles)`` of each of our faces timed
    in ``res``: the functions, then the Layer."""
    for name in ("ours", "layer"):
        median, q = res.median(name), res.quartiles(name)
        if median and q is not None:
            yield name, " (Layer)" if name == "layer" else "", median, q


#: ours through the functions at L forward in GMAC/s over NumPy's sgemm product timed
#: beside them, round by round (:attr:`.CaseResult.peak`; else over the machine's peak
#: measured once in the run, the better of all threads and one), at least (issue 21;
#: besides :data:`~.cases.L_BOUND` of the fastest peer)
PEAK_SHARE = 0.9


def _gmacs(res: CaseResult, seconds: float) -> float:
    """The case's multiply-adds (over the valid steps) per ``seconds``, in GMAC/s."""
    macs = res.macs if res.macs is not None else res.case.macs
    return macs / seconds / 1e9


def _peak_judged(res: CaseResult) -> bool:
    """Whether ``res`` is held to :data:`PEAK_SHARE` (:attr:`.Case.peak_judged`)."""
    return isinstance(res.case, Case) and res.case.peak_judged and res.error is None


def peak_shares(res: CaseResult) -> np.ndarray | None:
    """Our functions' GMAC/s over the sgemm product's in the same round, one share a
    round (:attr:`.CaseResult.peak`); None where the product was not timed beside them."""
    ours = res.samples.get("ours")
    if not ours or not res.peak:
        return None
    n = min(len(ours), len(res.peak))
    ours_rate = np.array([_gmacs(res, t) for t in ours[:n]])
    return ours_rate / sgemm_gmacs(np.array(res.peak[:n]))


def peak_verdicts(
    results: Sequence[CaseResult], info: dict[str, Any]
) -> list[tuple[CaseResult, float, bool]]:
    """Each L forward case's share of the sgemm peak and whether it meets
    :data:`PEAK_SHARE`: the median of its rounds' shares (:func:`peak_shares`), else
    our functions' median GMAC/s over the better peak of ``info``; none without
    either, or where ours did not run."""
    peak = info.get("sgemm_peak_gmacs")
    out = []
    for res in results:
        median = res.median("ours")
        if not (_peak_judged(res) and median):
            continue
        shares = peak_shares(res)
        if shares is not None:
            share = float(np.median(shares))
        elif peak:
            share = _gmacs(res, median) / max(peak.values())
        else:
            continue
        out.append((res, share, share >= PEAK_SHARE))
    return out


def format_peak(results: Sequence[CaseResult], info: dict[str, Any]) -> str:
    """Ours at M and L in GMAC/s (over the valid steps: fewer when ragged), as a share of
    the machine's sgemm peak (the better of all threads and one), with the spread from
    our quartiles; at L forward, the functions' share judged against
    :data:`PEAK_SHARE`."""
    peak = info.get("sgemm_peak_gmacs")
    if not peak:
        return ""
    best = max(peak.values())
    judged = {id(res): met for res, _, met in peak_verdicts(results, info)}
    parts = []
    beside = []  # the sgemm product's GMAC/s in the rounds of the cases that timed it
    for res in results:
        if res.case.shape.name not in ("M", "L") or res.error or res.case.dtype != "float32":
            continue
        for name, face, median, q in _our_faces(res):
            rate = _gmacs(res, median)
            low, high = _gmacs(res, q[1]), _gmacs(res, q[0])
            met = judged.get(id(res)) if name == "ours" else None
            word = "" if met is None else (" PASS" if met else " MISS")
            shares = peak_shares(res) if name == "ours" else None
            if shares is None:
                share = f"{rate / best:.0%} [{low / best:.0%}-{high / best:.0%}]"
            else:
                q1, mid, q3 = np.percentile(shares, [25, 50, 75])
                share = f"{mid:.0%} [{q1:.0%}-{q3:.0%}] of the product beside it"
                beside += [sgemm_gmacs(t) for t in res.peak]
            parts.append(
                f"{res.case.shape.name} {res.case.label}{face} {rate:.0f} [{low:.0f}-{high:.0f}]"
                f" ({share}){word}"
            )
    if not parts:
        return ""
    one = f", {peak['1']:.0f} on one thread" if "1" in peak else ""
    rounds = ""
    if beside:
        q1, mid, q3 = np.percentile(beside, [25, 50, 75])
        rounds = (
            f" The same product timed once a round beside each L forward case's calls: "
            f"{mid:.0f} [{q1:.0f}-{q3:.0f}] GMAC/s; those cases' shares are round by round "
            "(ours over the product of the same round: the machine's drift cancels)."
        )
    return (
        f"sgemm peak of this machine (NumPy's BLAS, {SGEMM_SIZE}² float32 products, best of "
        f"several calls, measured once per run): {peak['all']:.0f} GMAC/s on all "
        f"threads{one}.{rounds} Ours, GMAC/s from the median [from the quartiles], "
        "counting T N D G H (I + H) multiply-adds over the valid steps (share of the "
        "better peak; target at L forward, through the functions: "
        f"≥ {PEAK_SHARE:.0%}): " + "; ".join(parts)
    )


#: ours in float64 over ours in float32 on the same case, at most (issue 21): no peer
#: computes real double (OpenVINO rounds it to float32), so the yardstick is our own
#: float32 and the vector-width factor
DOUBLE_BOUND = 2.1


def double_verdicts(
    results: Sequence[CaseResult],
) -> list[tuple[CaseResult, str, str, float, tuple[float, float], bool]]:
    """Each float64 case against its float32 twin (same operator, shape and attributes):
    ``(result, face's runtime name, face's label suffix, float64 over float32, its
    quartiles, met)`` for the functions and the Layer, judged against
    :data:`DOUBLE_BOUND`: the median of the round-by-round ratios where the twin was
    timed in the float64 case's rounds (:attr:`.CaseResult.twins`), else the medians
    of the two cases; none where a pair did not run."""
    ran = {r.case: r for r in results if not r.error}
    out = []
    for res in results:
        if res.case.dtype != "float64" or res.error:
            continue
        single = ran.get(replace(res.case, dtype="float32"))
        for name, face, double, q in _our_faces(res):
            paired = res.samples.get(name, []), res.twins.get(name, [])
            if paired[1] and len(paired[0]) == len(paired[1]):  # round by round
                ratios = np.array(paired[0]) / np.array(paired[1])
                ratio = float(np.median(ratios))
                low, high = np.percentile(ratios, [25, 75])
                spread = (float(low), float(high))
            elif single is not None and single.median(name):
                base = single.median(name)
                ratio, spread = double / base, (q[0] / base, q[1] / base)
            else:
                continue
            out.append((res, name, face, ratio, spread, ratio <= DOUBLE_BOUND))
    return out


def format_double(results: Sequence[CaseResult]) -> str:
    """Each float64 case's time over its float32 twin's (:func:`double_verdicts`), for
    the functions and the Layer, with its spread and the target :data:`DOUBLE_BOUND`;
    '' where no pair ran."""
    parts = [
        f"{res.case.shape.name} {res.case.label}{face} {fmt_ratio(ratio)} "
        f"[{fmt_ratio(q[0])}-{fmt_ratio(q[1])}] {'PASS' if met else 'MISS'}"
        for res, _, face, ratio, q, met in double_verdicts(results)
    ]
    if not parts:
        return ""
    return (
        f"float64 over our float32 on the same case (target ≤ {DOUBLE_BOUND:g}: no peer "
        "computes real double, so the yardstick is our own float32, timed in the same "
        "rounds), the median of the rounds' ratios [their quartiles]: " + "; ".join(parts)
    )


def format_header(info: dict[str, Any], shapes: Sequence[str], cases: str = "") -> str:
    """The machine, the runtimes, the shapes (or ``cases``: a line on them), the run."""
    lines = [
        f"CPU: {info['cpu']}; {info['logical_cpus']} logical CPUs, "
        f"{info['physical_cores']} physical cores, {info['usable_cpus']} usable by this process",
        f"Python {info['python']} on {info['platform']}",
    ]
    if info.get("commit"):
        lines.append(f"onnx-recurrent commit: {info['commit']}")
    for text in info["runtimes"].values():
        lines.append(f"- {text}")
    if shapes:
        lines.append("Shapes: " + "; ".join(str(SHAPES[s]) for s in shapes))
    if cases:
        lines.append(cases)
    before, after = info.get("load_average_before"), info.get("load_average_after")
    if before and after:
        lines.append(
            f"Load average (1, 5, 15 min) before: {', '.join(map(str, before))}; "
            f"after: {', '.join(map(str, after))} (other work on the machine skews the times)"
        )
    if info.get("background_load"):
        lines.append(
            f"Background load: OTHER LOAD WAS PRESENT, {info['background_load']} busy "
            "process(es) (while True: pass) during half of every case's rounds. Each case: "
            "a quarter of its rounds quiet, half beside the busy processes, the last quarter "
            "quiet again (quiet, loaded, quiet: a drift of the machine weighs on both alike). "
            "The main table gives the quiet times; the contended ones are below it"
        )
    others = info.get("other_cpu")
    if others is not None:
        lines.append(
            "CPU time used by other processes (besides --background-load's) during the run: "
            f"{others:.0%}"
        )
        if others > OTHERS_WARNING:
            lines.append(
                "WARNING: other work was running on this machine, the times are unreliable "
                "(see the column 'other CPU'; thread pools slow down badly when a core is "
                "taken)"
            )
    if "order" in info:
        how = {
            "alternate": "rounds of one call of each runtime, in a shuffled order",
            "blocks": "all of one runtime's calls, then the next one's",
        }[info["order"]]
        if info.get("settle"):
            after = "each call" if info["order"] == "alternate" else "each runtime's calls"
            how += f"; after {after}, an untimed pause until no thread of this process spins"
        lines.append(f"Timing: {info.get('warmup', 1)} warm-up call(s), then {how}")
    if "duration_s" in info:
        lines.append(f"Duration: {info['duration_s']:.0f} s")
    return "\n".join(lines)


LEGEND = (
    "Times are medians in ms over `reps` timed calls of each runtime (quiet calls only "
    "with --background-load), with the first-third quartile in parentheses; other CPU: "
    "the share of the CPUs that other processes (not --background-load's) used meanwhile "
    f"('!' above {OTHERS_WARNING:.0%}: unreliable). ours/peer: our median over the fastest "
    "peer's (ort = onnxruntime, ov = OpenVINO; ov alone where onnxruntime has no kernel; "
    "float64: OpenVINO's, shown but not judged, as it computes double in float32: the "
    "target is our own float32, below), 'Layer/': through a prepared Layer; in brackets "
    "our quartiles over that median; "
    "ref/ours: how many times faster than onnx.reference, in brackets its median over our "
    "quartiles. Δ: largest absolute difference of that runtime's outputs (Y, Y_h[, Y_c]) "
    f"from ours; '!' marks one above {TOLERANCE:g}. '—': not run, '*': timed with a caveat "
    "(see below)."
)


MODEL_LEGEND = (
    "Times are medians in ms over `reps` timed calls of each runtime on the whole model "
    "(onnx.reference alone: at most --reference-repeats of them, e.g. 'ref 20'), with the "
    "first-third quartile in parentheses; other CPU: the share of the CPUs that other "
    "processes used meanwhile. ours (ort host): "
    "onnx_recurrent.InferenceSession(host='onnxruntime'); ours (ref host): host='reference'; "
    "onnxruntime, OpenVINO, onnx.reference: each alone on the same model. ours/ort: our "
    "median over onnxruntime alone's, in brackets our quartiles over that median ('—' where "
    "onnxruntime alone did not run: see below). ref/ours: how many times faster than "
    "onnx.reference alone each of ours is. Δ: largest absolute difference of that runtime's "
    "outputs from the first of ours that ran (ort host, else ref host); '!' marks one above "
    f"{TOLERANCE:g}. '—': not run, '*': timed with a caveat (see below)."
)


def format_chunks(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> str:
    """Silero's time per 512-sample chunk (32 ms of audio at 16 kHz) of each runtime."""
    lines = []
    for res in results:
        if not getattr(res.case, "chunks", 0) or res.error or res.missing:
            continue
        parts = [
            f"{r.title.removesuffix(' ms')} {fmt_ms(res.per_chunk(r.name))}"
            for r in runtimes
            if r.name in res.samples
        ]
        lines.append(f"- {res.case.name} ({res.case.chunks} per call): " + ", ".join(parts))
    if not lines:
        return ""
    audio_ms = 1e3 * SILERO_CHUNK / SILERO_RATE
    return (
        f"Silero VAD, ms per {SILERO_CHUNK}-sample chunk ({audio_ms:g} ms of audio at "
        f"{SILERO_RATE // 1000} kHz; the median call over the chunks per call):\n"
        + "\n".join(lines)
    )


def format_report(
    results: Sequence[CaseResult],
    runtimes: Sequence[Runtime],
    info: dict[str, Any],
    shapes: Sequence[str] = (),
) -> str:
    """The whole printout: header, table, legend, notes; for operators, the targets, the
    sgemm peak share, float64 over float32 and the contention; for whole models, the
    time per Silero chunk."""
    if _models(results, runtimes):
        described = "Cases: " + "; ".join(f"{r.case.name}: {r.case.description}" for r in results)
        parts = [
            format_header(info, (), described),
            format_table(results, runtimes),
            MODEL_LEGEND,
            format_notes(results, runtimes, targets=False),
            format_chunks(results, runtimes),
        ]
    else:
        parts = [
            format_header(info, shapes),
            format_table(results, runtimes),
            LEGEND,
            format_notes(results, runtimes, info=info),
            format_peak(results, info),
            format_double(results),
            format_contention(results, runtimes),
        ]
    return "\n\n".join(p for p in parts if p)


def progress_line(result: CaseResult, runtimes: Sequence[Runtime]) -> str:
    """One case on one line: each runtime's median, the rounds (or why it did not run)."""
    if result.missing or result.error:
        return f"{result.case.key}: not run: {result.missing or result.error}"
    times = ", ".join(
        f"{r.title.removesuffix(' ms')} {fmt_ms(result.median(r.name))} ms"
        for r in runtimes
        if r.name in result.samples
    )
    return f"{result.case.key}: {times}, {result.repeats} rounds"
