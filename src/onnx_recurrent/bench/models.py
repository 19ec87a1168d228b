"""``onnx-recurrent bench --models``: whole models, ours under each host against the
runtimes alone.

Each case is a whole ONNX model with its feeds, built in process: Silero VAD on one
stream and on 128 streams per call, the bundled example (a PyTorch 2-layer
bidirectional GRU with a linear head), and single recurrent nodes that onnxruntime
cannot run right by itself (layout=1, float64, Affine with unset alpha/beta) or that
onnx.reference and OpenVINO get wrong (input_forget=1). Ours runs through
:class:`onnx_recurrent.InferenceSession` under each host: ``host="onnxruntime"``
(onnxruntime runs the graph, the recurrent nodes are custom ops computed by
onnx-recurrent) and ``host="reference"`` (onnx.reference runs the graph). The
competitors run the same model alone: onnxruntime, OpenVINO and onnx.reference. A
runtime alone that :func:`onnx_recurrent.check.lint.lint` probes to get a model wrong
is skipped with that reason (:func:`~.runtimes.known_wrong`).

The timing is the operator bench's (:func:`~.timing.prepare_calls`,
:func:`~.timing.time_calls`: warm-up, then rounds of one call of each runtime in a
shuffled order with an untimed pause after each call until no thread spins); the
report gives medians with quartiles and each host's ratio to onnxruntime alone (the
issue's targets are ratios to onnxruntime alone), with the spread of that ratio.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cases import MAX_REPEATS, MIN_REPEATS, TOLERANCE, Case, Shape, make_inputs, make_model
from .driver import Bench, CpuMeter, RunRecord, ThreadLimit
from .machine import machine_info
from .report import (
    SHORT_NAMES,
    _diff,
    _others,
    _speedup,
    _time_cell,
    fmt_ms,
    fmt_ratio,
    format_header,
    format_notes,
    markdown_table,
)
from .runtimes import (
    OnnxRuntime,
    OpenVINO,
    Ours,
    Reference,
    Runtime,
    Unavailable,
    known_wrong,
    ort_options,
)
from .timing import CaseResult, _first_line, prepare_calls, time_calls

#: default time per case, in seconds (loading and warm-up included)
MODEL_BUDGET = 10.0
#: default cap on the timed calls of onnx.reference alone per case (it can be slow)
REFERENCE_REPEATS = 20
#: the shape of the single-node cases
NODE_SHAPE = Shape("node", 32, 8, 64, 64)
#: Silero VAD at 16 kHz: the samples of one chunk, and of the previous chunk in front
SILERO_RATE = 16000
SILERO_CHUNK = 512
SILERO_CONTEXT = 64


@dataclass(frozen=True)
class ModelCase:
    """A whole model and its feeds, built by ``build(seed)`` when the case runs.

    ``chunks``: the Silero chunks one call processes (one per stream), for the time per
    chunk; 0 for the other cases. ``requires``: a module the model comes from, with
    ``install``, its install command.
    """

    name: str
    description: str
    build: Callable[[int], tuple[Any, dict[str, np.ndarray]]] = field(compare=False, repr=False)
    dtype: str = "float32"
    chunks: int = 0
    requires: str | None = None
    install: str = ""

    @property
    def key(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        return self.name

    def missing(self) -> str | None:
        """None if what the model comes from is installed, else why not."""
        if self.requires is None:
            return None
        import importlib.util

        if importlib.util.find_spec(self.requires) is None:
            return f"{self.requires} not installed ({self.install})"
        return None


def silero_feeds(streams: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One call's feeds of Silero VAD at 16 kHz for ``streams`` streams, as
    :func:`onnx_recurrent.vad.speech_probabilities` makes them: ``input`` (streams,
    64 + 512), a 512-sample chunk with the previous chunk's last 64 samples in front
    (seeded voice-like audio: a 100-300 Hz tone with harmonics, plus noise), ``state``
    (2, streams, 128) zeros and ``sr`` 16000."""
    rng = np.random.default_rng(seed)
    n = SILERO_CONTEXT + SILERO_CHUNK
    t = np.arange(n) / SILERO_RATE
    pitch = rng.uniform(100.0, 300.0, (streams, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (streams, 1))
    audio = sum(
        0.3 / k * np.sin(2 * np.pi * k * pitch * t + k * phase) for k in (1, 2, 3, 4)
    ) + 0.02 * rng.standard_normal((streams, n))
    return {
        "input": audio.astype(np.float32),
        "state": np.zeros((2, streams, 128), np.float32),
        "sr": np.array(SILERO_RATE, np.int64),
    }


def _silero(streams: int) -> Callable[[int], tuple[Any, dict[str, np.ndarray]]]:
    def build(seed: int):
        import onnx

        from onnx_recurrent import vad

        return onnx.load(vad.silero_model_path()), silero_feeds(streams, seed)

    return build


def _example(seed: int):
    """The bundled example model and input (as ``onnx-recurrent run`` with no model)."""
    from importlib import resources

    import onnx

    data = resources.files("onnx_recurrent") / "data"
    model = onnx.load(str(data / "example_gru.onnx"))
    return model, {"x": np.load(str(data / "example_input.npy"))}


def _node(
    op: str, *, layout: int = 0, dtype: str = "float32", **extra: Any
) -> Callable[[int], tuple[Any, dict[str, np.ndarray]]]:
    """One recurrent node at :data:`NODE_SHAPE`: the operator bench's inputs and model,
    with ``extra`` attributes added to the node."""

    def build(seed: int):
        from onnx import helper

        case = Case(op, NODE_SHAPE, layout=layout, dtype=dtype)
        feeds = make_inputs(case, seed)
        model = make_model(case, feeds)
        model.graph.node[0].attribute.extend(helper.make_attribute(k, v) for k, v in extra.items())
        return model, feeds

    return build


_S = NODE_SHAPE
_AT = f"T={_S.T}, N={_S.N}, I={_S.I}, H={_S.H}"
_SILERO = dict(requires="silero_vad", install="pip install --no-deps silero-vad")
MODEL_CASES: tuple[ModelCase, ...] = (
    ModelCase(
        "silero-1",
        "Silero VAD (opset 16, LSTM inside If), 1 stream: one 512-sample chunk per call",
        _silero(1),
        chunks=1,
        **_SILERO,
    ),
    ModelCase(
        "silero-128",
        "Silero VAD, 128 streams per call: one chunk of each stream",
        _silero(128),
        chunks=128,
        **_SILERO,
    ),
    ModelCase(
        "example",
        "the bundled example_gru.onnx (PyTorch 2-layer bidirectional batch-first GRU + "
        "linear head) on example_input.npy",
        _example,
    ),
    ModelCase("gru-layout1", f"one GRU node, layout=1 ({_AT})", _node("GRU", layout=1)),
    ModelCase(
        "lstm-float64",
        f"one LSTM node, float64 ({_AT})",
        _node("LSTM", dtype="float64"),
        "float64",
    ),
    ModelCase(
        "rnn-affine",
        f"one RNN node, activations Affine, alpha/beta unset ({_AT})",
        _node("RNN", activations=["Affine"]),
    ),
    ModelCase(
        "lstm-input-forget",
        f"one LSTM node, input_forget=1 ({_AT})",
        _node("LSTM", input_forget=1),
    ),
)


def make_model_cases(select: str | None = None) -> list[ModelCase]:
    """The whole-model cases: all, the one named ``select``, or those whose name
    contains it."""
    if not select:
        return list(MODEL_CASES)
    exact = [c for c in MODEL_CASES if c.name.lower() == select.lower()]
    return exact or [c for c in MODEL_CASES if select.lower() in c.name.lower()]


# ------------------------------------------------------------------ the runtimes


def _takes_host() -> bool:
    import onnx_recurrent

    try:
        parameters = inspect.signature(onnx_recurrent.InferenceSession).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: try it
    return "host" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class OursHost(Runtime):
    """Ours: :class:`onnx_recurrent.InferenceSession` under one host, made once per case
    outside the timing."""

    host = ""
    face = ""  # how the ratio columns name it

    def _session(self, model: Any) -> Any:
        import onnx_recurrent

        kwargs: dict[str, Any] = {"host": self.host}
        if self.threads and self.host == "onnxruntime":
            kwargs["sess_options"] = ort_options(self.threads)
        try:
            return onnx_recurrent.InferenceSession(model, **kwargs)
        except TypeError as e:
            if "host" not in str(e):
                raise
            return self.without_host(model)

    def without_host(self, model: Any) -> Any:
        """The session where ``InferenceSession`` takes no ``host=``."""
        raise Unavailable(
            f"unavailable: this onnx-recurrent's InferenceSession takes no host= "
            f"(host={self.host!r} not available)"
        )

    def prepare(self, case, model, feeds):
        session = self._session(model)
        got = getattr(session, "host", self.host)
        if got != self.host:
            raise Unavailable(
                f"unavailable: asked for host {self.host!r}, the session has {got!r}"
            )

        def call():
            return session.run(None, feeds)

        if not hasattr(session, "host"):
            call.note = (
                "an InferenceSession without host= (onnx.reference runs the graph, "
                "onnx-recurrent the recurrent nodes: the reference host)"
            )
        return call


class OursOnnxRuntimeHost(OursHost):
    name, title, short = "ours-onnxruntime", "ours (ort host) ms", "Δ ort host"
    face = "ours (ort host)"
    module, install = "onnxruntime", "onnxruntime"
    host = "onnxruntime"

    def missing(self) -> str | None:
        reason = super().missing()
        if reason is None and not _takes_host():
            reason = (
                "unavailable: this onnx-recurrent's InferenceSession takes no host= "
                "(no onnxruntime host)"
            )
        return reason

    def info(self) -> str:
        import onnxruntime as ort

        threads = f"intra_op_num_threads {self.threads}" if self.threads else "default threads"
        return (
            "ours (ort host): onnx_recurrent.InferenceSession(host='onnxruntime'): "
            f"onnxruntime {ort.__version__} runs the graph ({threads}), its recurrent nodes "
            "as custom ops computed by onnx-recurrent; " + Ours(self.threads).info()
        )


class OursReferenceHost(OursHost):
    name, title, short = "ours-reference", "ours (ref host) ms", "Δ ref host"
    face = "ours (ref host)"
    host = "reference"

    def without_host(self, model: Any) -> Any:
        import onnx_recurrent

        return onnx_recurrent.InferenceSession(model)  # before the hosts: onnx.reference

    def info(self) -> str:
        import onnx

        return (
            "ours (ref host): onnx_recurrent.InferenceSession(host='reference'): onnx "
            f"{onnx.__version__}'s onnx.reference runs the graph, onnx-recurrent its "
            "recurrent nodes"
        )


class OnnxRuntimeAlone(OnnxRuntime):
    """onnxruntime alone on the whole model (what it gets wrong: :func:`known_wrong`)."""

    def unsupported(self, case):
        return None


class OpenVINOAlone(OpenVINO):
    def unsupported(self, case):
        return None

    def prepare(self, case, model, feeds):
        return self.compile(model, feeds)


class ReferenceAlone(Reference):
    def unsupported(self, case):
        return None

    def info(self) -> str:
        return super().info() + " alone, without onnx-recurrent's operators"


MODEL_OURS = ("ours-onnxruntime", "ours-reference")
MODEL_RUNTIMES: dict[str, type[Runtime]] = {
    r.name: r
    for r in (
        OursOnnxRuntimeHost,
        OursReferenceHost,
        OnnxRuntimeAlone,
        OpenVINOAlone,
        ReferenceAlone,
    )
}


def make_model_runtimes(
    names: Iterable[str] = tuple(MODEL_RUNTIMES), *, threads: int | None = None
) -> list[Runtime]:
    """The named runtimes in the standard order: ours under each host first."""
    names = set(names)
    if not names & set(MODEL_OURS):
        raise ValueError(f"--models needs one of ours: {', '.join(MODEL_OURS)}")
    return [cls(threads) for name, cls in MODEL_RUNTIMES.items() if name in names]


# ------------------------------------------------------------------ results and runs


@dataclass
class ModelResult(CaseResult):
    """What one whole-model case measured; ``missing``: why the case did not run."""

    missing: str | None = None

    def verdicts(self) -> list:
        return []  # no targets: the ratios to onnxruntime alone are reported as they are

    def per_chunk(self, name: str) -> float | None:
        """``name``'s median time per Silero chunk, in seconds."""
        median = self.median(name)
        return None if median is None or not self.case.chunks else median / self.case.chunks

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {
            "case": c.name,
            "description": c.description,
            "dtype": c.dtype,
            "chunks_per_call": c.chunks,
            "repeats": self.repeats,
            "samples_s": self.samples,
            "median_s": {n: self.median(n) for n in self.samples},
            "quartiles_s": {n: self.quartiles(n) for n in self.samples},
            "over_onnxruntime": {n: self.ratio("onnxruntime", n) for n in MODEL_OURS},
            "per_chunk_s": {n: self.per_chunk(n) for n in self.samples} if c.chunks else None,
            "max_abs_diff": self.diffs,
            "skipped": self.skipped,
            "notes": self.notes,
            "missing": self.missing,
            "error": self.error,
            "other_cpu": self.other_cpu,
        }


def run_model_case(
    case: ModelCase,
    runtimes: Sequence[Runtime],
    *,
    warmup: int = 1,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
    budget: float = 0.0,
    reference_limit: float = math.inf,
    reference_repeats: int | None = REFERENCE_REPEATS,
    seed: int = 0,
    order: str = "alternate",
    before_timing: Callable[[], None] | None = None,
    settle_between: bool = True,
) -> ModelResult:
    """Build, prepare, warm up, check and time one whole-model case.

    ``runtimes`` start with ours (:data:`MODEL_OURS`); the outputs of the first of ours
    that runs are what the others' are compared with. At most ``reference_repeats``
    timed calls of onnx.reference alone (None: no cap).
    """
    start = time.perf_counter()
    result = ModelResult(case)
    result.missing = case.missing()
    if result.missing:
        return result
    try:
        model, feeds = case.build(seed)
    except Exception as e:
        result.error = f"cannot build the model: {_first_line(e)}"
        return result
    ours = sum(r.name in MODEL_OURS for r in runtimes)
    calls = prepare_calls(
        result,
        runtimes,
        model,
        feeds,
        warmup=warmup,
        reference_limit=reference_limit,
        ours=ours,
        skip=known_wrong(model, runtimes=[r.name for r in runtimes]),
    )
    if result.error is None:
        if before_timing is not None:
            before_timing()
        time_calls(
            result,
            calls,
            min_repeats=min_repeats,
            max_repeats=max_repeats,
            budget=budget - (time.perf_counter() - start),
            seed=seed,
            order=order,
            settle_between=settle_between,
            max_calls=None if reference_repeats is None else {"reference": reference_repeats},
        )
    return result


class ModelBench(Bench):
    """A whole ``--models`` run."""

    def report(self) -> str:
        return format_model_report(self.results, self.runtimes, self.info)


def run_models(
    select: str | None = None,
    *,
    runtimes: Iterable[str] = tuple(MODEL_RUNTIMES),
    repeat: int | None = None,
    budget: float | None = None,
    warmup: int = 1,
    threads: int | None = None,
    reference_limit: float = 30.0,
    reference_repeats: int | None = REFERENCE_REPEATS,
    seed: int = 0,
    order: str = "alternate",
    settle_between: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ModelBench:
    """Run the whole-model cases (those whose name contains ``select``).

    ``repeat`` fixes the number of rounds; otherwise they adapt to ``budget`` seconds in
    all (default :data:`MODEL_BUDGET` per case; what a case leaves goes to the next),
    at least :data:`MIN_REPEATS`.
    """
    runtimes = list(runtimes)
    cases = make_model_cases(select)
    bench = ModelBench(cases, make_model_runtimes(runtimes, threads=threads), [])
    bench.options = {
        "models": True,
        "select": select,
        "runtimes": runtimes,
        "repeat": repeat,
        "budget": budget,
        "warmup": warmup,
        "threads": threads,
        "reference_limit": reference_limit,
        "reference_repeats": reference_repeats,
        "seed": seed,
        "order": order,
        "settle": settle_between,
    }
    notes: list[str] = []
    record = RunRecord()
    left = MODEL_BUDGET * len(cases) if budget is None else budget
    limit = ThreadLimit(threads, notes)
    limit.apply()
    try:
        for i, case in enumerate(cases, 1):
            began = time.perf_counter()
            meter = CpuMeter()
            fixed = repeat is not None
            result = run_model_case(
                case,
                bench.runtimes,
                warmup=warmup,
                min_repeats=repeat if fixed else MIN_REPEATS,
                max_repeats=repeat if fixed else MAX_REPEATS,
                budget=0.0 if fixed else left / (len(cases) - i + 1),
                reference_limit=reference_limit,
                reference_repeats=reference_repeats,
                seed=seed,
                order=order,
                before_timing=limit.apply,
                settle_between=settle_between,
            )
            result.other_cpu = meter.others()
            spent = time.perf_counter() - began
            left -= spent
            bench.results.append(result)
            if progress:
                progress(
                    f"[{i}/{len(cases)}] {_progress_line(result, bench.runtimes)}, {spent:.1f} s"
                )
        bench.info = machine_info(bench.runtimes)  # inside: the thread limits still hold
    finally:
        limit.restore()
    record.complete(bench.info, notes=notes, order=order, settle=settle_between, warmup=warmup)
    return bench


def _progress_line(result: ModelResult, runtimes: Sequence[Runtime]) -> str:
    name = result.case.name
    if result.missing or result.error:
        return f"{name}: not run: {result.missing or result.error}"
    times = ", ".join(
        f"{r.title.removesuffix(' ms')} {fmt_ms(result.median(r.name))} ms"
        for r in runtimes
        if r.name in result.samples
    )
    return f"{name}: {times}, {result.repeats} rounds"


# ------------------------------------------------------------------ the report


def model_columns(runtimes: Sequence[Runtime]) -> list[str]:
    ours = [r for r in runtimes if isinstance(r, OursHost)]
    faces = " / ".join(r.face.removeprefix("ours (").removesuffix(")") for r in ours)
    return [
        "case",
        "reps",
        "other CPU",
        *[r.title for r in runtimes],
        *[f"{r.face}/ort [quartiles]" for r in ours],
        f"ref/ours ({faces})",
        *[r.short for r in runtimes[1:]],
    ]


def _ratio_cell(result: ModelResult, ours: str) -> str:
    ratio, spread = result.ratio("onnxruntime", ours), result.spread("onnxruntime", ours)
    if ratio is None:
        return "—"
    text = fmt_ratio(ratio)
    return text if spread is None else f"{text} [{fmt_ratio(spread[0])}-{fmt_ratio(spread[1])}]"


def _reference_cell(result: ModelResult, ours: Sequence[Runtime]) -> str:
    cells = []
    for r in ours:
        ratio = result.ratio("reference", r.name)
        cells.append("—" if ratio is None else _speedup(1.0 / ratio))
    return " / ".join(cells) if any(c != "—" for c in cells) else "—"


def _reps_cell(result: ModelResult, runtimes: Sequence[Runtime]) -> str:
    """The rounds, and the calls of a runtime that took part in fewer (a capped one)."""
    fewer = [
        f"{SHORT_NAMES.get(r.name, r.name)} {len(result.samples[r.name])}"
        for r in runtimes
        if 0 < len(result.samples.get(r.name, ())) < result.repeats
    ]
    return "; ".join([str(result.repeats), *fewer])


def format_model_table(results: Sequence[ModelResult], runtimes: Sequence[Runtime]) -> str:
    """A Markdown table: one row per model, median times (quartiles), each of ours over
    onnxruntime alone [our quartiles over its median], how many times faster than
    onnx.reference alone, and the differences from ours."""
    columns = model_columns(runtimes)
    ours = [r for r in runtimes if isinstance(r, OursHost)]
    rows = []
    for res in results:
        if res.missing or res.error:
            why = f"not run: {res.missing}" if res.missing else f"error: {res.error}"
            cells = [res.case.name, "0", "—", why]
        else:
            cells = [res.case.name, _reps_cell(res, runtimes), _others(res)]
            cells += [_time_cell(res, r.name) for r in runtimes]
            cells += [_ratio_cell(res, r.name) for r in ours]
            cells.append(_reference_cell(res, ours))
            cells += [_diff(res.diffs.get(r.name)) for r in runtimes[1:]]
        rows.append(cells + ["—"] * (len(columns) - len(cells)))
    return markdown_table(columns, rows)


def format_chunks(results: Sequence[ModelResult], runtimes: Sequence[Runtime]) -> str:
    """Silero's time per 512-sample chunk (32 ms of audio at 16 kHz) of each runtime."""
    lines = []
    for res in results:
        if not res.case.chunks or res.error or res.missing:
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


def format_model_report(
    results: Sequence[ModelResult], runtimes: Sequence[Runtime], info: dict[str, Any]
) -> str:
    described = "Cases: " + "; ".join(f"{r.case.name}: {r.case.description}" for r in results)
    parts = [
        format_header(info, (), described),
        format_model_table(results, runtimes),
        MODEL_LEGEND,
        format_notes(results, runtimes, targets=False),
        format_chunks(results, runtimes),
    ]
    return "\n\n".join(p for p in parts if p)
