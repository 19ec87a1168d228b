"""``onnx-recurrent bench``: onnx-recurrent against onnxruntime, OpenVINO and onnx.reference.

Every case is one recurrent node (GRU, LSTM or RNN) at one shape. The competitors run the
same single-node ONNX model; onnx-recurrent runs through its functional API (and, in a
separate column, through :class:`~onnx_recurrent.InferenceSession`). After a warm-up, the
runtimes are called in alternation, one call each per round, and the median of the rounds
is reported with the ratio to the baseline (onnxruntime; OpenVINO where onnxruntime has no
kernel) and to onnx.reference, each against its target, and the largest absolute
difference of each competitor's outputs from ours.

The pure parts (:func:`make_cases`, :func:`time_alternating`, :func:`format_report`) are
separate from the runtimes so that the tests can exercise them on the hidden ``tiny``
shape without timing anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OPS = ("gru", "lstm", "rnn")
GATES = {"GRU": 3, "LSTM": 4, "RNN": 1}
OUTPUTS = {"GRU": ("Y", "Y_h"), "LSTM": ("Y", "Y_h", "Y_c"), "RNN": ("Y", "Y_h")}


@dataclass(frozen=True)
class Shape:
    """One size class: ``T`` steps, ``N`` batch, ``I`` input, ``H`` hidden."""

    name: str
    T: int
    N: int
    I: int
    H: int

    def __str__(self) -> str:
        return f"{self.name} (T={self.T}, N={self.N}, I={self.I}, H={self.H})"


SHAPES = {
    "S": Shape("S", 50, 1, 64, 64),
    "M": Shape("M", 100, 32, 128, 256),
    "L": Shape("L", 200, 64, 512, 512),
    # hidden: for the tests; has the variants of M so that every kind of row appears
    "tiny": Shape("tiny", 4, 3, 3, 5),
}
PUBLIC_SHAPES = ("S", "M", "L")
VARIANT_SHAPES = ("M", "tiny")  # shapes that also get ragged, layout=1 and float64 cases
# Default time budget per shape class, in seconds (warm-ups and model loading included).
DEFAULT_BUDGET = {"S": 25.0, "M": 150.0, "L": 280.0, "tiny": 0.0}
MIN_REPEATS = 3
MAX_REPEATS = 200
TOLERANCE = 1e-4  # a competitor's outputs farther than this from ours are flagged with "!"
DOUBLE_ACCURACY = 1e-10  # float64 outputs farther than this were not computed in double
OTHERS_WARNING = 0.10  # flag cases during which other processes used more of the CPUs


@dataclass(frozen=True)
class Target:
    """``ours / runtime <= bound`` (kind "ratio") or ``runtime / ours >= bound`` ("speedup")."""

    runtime: str
    kind: str
    bound: float

    def text(self) -> str:
        return f"≤ {self.bound:.1f}" if self.kind == "ratio" else f"≥ {self.bound:g}x"

    def met(self, ratio: float) -> bool:
        """Whether ``ratio`` (always ours / runtime) meets the target."""
        return ratio <= self.bound if self.kind == "ratio" else 1.0 / ratio >= self.bound


@dataclass(frozen=True)
class Case:
    """One benchmark case: an operator at a shape, with its attributes and variant."""

    op: str  # "GRU", "LSTM" or "RNN"
    shape: Shape
    direction: str = "forward"
    linear_before_reset: int = 0
    ragged: bool = False
    layout: int = 0
    dtype: str = "float32"

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def label(self) -> str:
        parts = [self.op]
        if self.op == "GRU":
            parts.append(f"lbr={self.linear_before_reset}")
        parts.append({"forward": "fwd", "bidirectional": "bidi", "reverse": "rev"}[self.direction])
        if self.ragged:
            parts.append("ragged")
        if self.layout:
            parts.append(f"layout={self.layout}")
        if self.dtype != "float32":
            parts.append(self.dtype)
        return " ".join(parts)

    @property
    def baseline(self) -> str:
        """The runtime the ratio column is taken against."""
        return "openvino" if self.layout == 1 or self.dtype != "float32" else "onnxruntime"

    @property
    def targets(self) -> tuple[Target, ...]:
        """The speed targets of the issue for this case."""
        if self.shape.name == "S":
            return (Target("onnxruntime", "ratio", 1.5),)
        if self.ragged:
            return (Target("onnxruntime", "ratio", 0.7),)
        reference = Target("reference", "speedup", 10.0)
        if self.baseline == "openvino":
            return (Target("openvino", "ratio", 1.0), reference)
        return (Target("onnxruntime", "ratio", 1.0), reference)


def parse_list(text: str, allowed: Iterable[str], what: str) -> list[str]:
    """Split ``a,b,c``; every item must be in ``allowed`` (compared case-insensitively)."""
    by_key = {a.lower(): a for a in allowed}
    items = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.lower() not in by_key:
            shown = ", ".join(a for a in allowed if a != "tiny")
            raise ValueError(f"unknown {what} {item!r}; choose from {shown}")
        items.append(by_key[item.lower()])
    if not items:
        raise ValueError(f"no {what} given")
    return items


def make_cases(ops: Sequence[str] = OPS, shapes: Sequence[str] = ("S", "M")) -> list[Case]:
    """The cases of the issue, grouped by shape in the order given.

    At every shape: GRU (linear_before_reset 0 and 1), LSTM and RNN, forward and
    bidirectional. At M (and tiny) also: ragged ``sequence_lens`` (both directions),
    ``layout=1`` and float64 (forward).
    """
    variants: list[tuple[str, int]] = []
    for op in ops:
        op = op.lower()
        if op == "gru":
            variants += [("GRU", 0), ("GRU", 1)]
        elif op in ("lstm", "rnn"):
            variants.append((op.upper(), 0))
        else:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    cases = []
    for name in shapes:
        shape = SHAPES[name]
        for extra in ({}, {"ragged": True}, {"layout": 1}, {"dtype": "float64"}):
            if extra and name not in VARIANT_SHAPES:
                continue
            directions = ("forward", "bidirectional")
            if "layout" in extra or "dtype" in extra:
                directions = ("forward",)
            for op, lbr in variants:
                for direction in directions:
                    cases.append(Case(op, shape, direction, lbr, **extra))
    return cases


def make_inputs(case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds, by ONNX input name: X, W, R, B and (ragged) sequence_lens."""
    s = case.shape
    rng = np.random.default_rng(seed)
    dtype = np.dtype(case.dtype)
    D, G = case.num_directions, GATES[case.op]
    scale = 1.0 / math.sqrt(s.H)

    def uniform(*shape: int, bound: float) -> np.ndarray:
        return rng.uniform(-bound, bound, shape).astype(dtype)

    x_shape = (s.N, s.T, s.I) if case.layout == 1 else (s.T, s.N, s.I)
    feeds = {
        "X": uniform(*x_shape, bound=1.0),
        "W": uniform(D, G * s.H, s.I, bound=scale),
        "R": uniform(D, G * s.H, s.H, bound=scale),
        "B": uniform(D, 2 * G * s.H, bound=scale),
    }
    if case.ragged:
        feeds["sequence_lens"] = rng.integers(1, s.T + 1, s.N).astype(np.int32)
    return feeds


def attributes(case: Case) -> dict[str, Any]:
    """The node's attributes (also the keyword arguments of the functional API)."""
    attrs: dict[str, Any] = {
        "hidden_size": case.shape.H,
        "direction": case.direction,
        "layout": case.layout,
    }
    if case.op == "GRU":
        attrs["linear_before_reset"] = case.linear_before_reset
    return attrs


def make_model(case: Case, feeds: dict[str, np.ndarray], opset: int = 22):
    """The single-node ONNX model that every competitor runs (ir_version 8)."""
    from onnx import helper

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype))
    inputs = list(feeds)
    outputs = list(OUTPUTS[case.op])
    graph = helper.make_graph(
        [helper.make_node(case.op, inputs, outputs, **attributes(case))],
        f"bench_{case.op.lower()}",
        [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for n, a in feeds.items()
        ],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def output_shapes(case: Case) -> list[tuple[int, ...]]:
    """The shapes of Y, Y_h[, Y_c] that the specification gives for ``case``."""
    s, D = case.shape, case.num_directions
    if case.layout == 1:
        y, h = (s.N, s.T, D, s.H), (s.N, D, s.H)
    else:
        y, h = (s.T, D, s.N, s.H), (D, s.N, s.H)
    return [y, h, h] if case.op == "LSTM" else [y, h]


def make_transposed_model(case: Case, feeds: dict[str, np.ndarray], opset: int = 22):
    """A ``layout=1`` case as Transposes around the same node with ``layout=0``.

    Same inputs and outputs as :func:`make_model`'s model, for runtimes that compute
    ``layout=1`` wrongly (OpenVINO 2026.4 ignores it).
    """
    from onnx import helper

    if case.layout != 1:
        raise ValueError("only layout=1 cases have a transposed equivalent")
    model = make_model(case, feeds, opset)
    graph = model.graph
    node = graph.node[0]
    outputs = list(node.output)
    inner = helper.make_node(
        case.op,
        ["X_time_major", *list(node.input)[1:]],
        [f"{o}_time_major" for o in outputs],
        **{**attributes(case), "layout": 0},
    )
    nodes = [helper.make_node("Transpose", ["X"], ["X_time_major"], perm=[1, 0, 2]), inner]
    for o in outputs:
        perm = [2, 0, 1, 3] if o == "Y" else [1, 0, 2]
        nodes.append(helper.make_node("Transpose", [f"{o}_time_major"], [o], perm=perm))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


# ---------------------------------------------------------------------------- runtimes

Call = Callable[[], Sequence[np.ndarray]]


class Runtime:
    """A competitor. Subclasses say whether they are installed, what they cannot run,
    and how to prepare one call of a case."""

    name = ""  # key, used in --runtimes and the JSON
    title = ""  # column title
    short = ""  # column title of its difference from ours
    module: str | None = None  # imported to see whether it is installed
    install = ""  # pip name

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def missing(self) -> str | None:
        """None if installed, else why not."""
        if self.module is None:
            return None
        try:
            importlib.import_module(self.module)
        except ImportError as e:
            return f"not installed ({e}; pip install {self.install})"
        return None

    def unsupported(self, case: Case) -> str | None:
        """None if it can run ``case``, else why not."""
        return None

    def prepare(self, case: Case, model: Any, feeds: dict[str, np.ndarray]) -> Call:
        raise NotImplementedError

    def info(self) -> str:
        return ""


class Ours(Runtime):
    name, title, short = "ours", "ours ms", ""

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        fn = getattr(onnx_recurrent, case.op.lower())
        args = [feeds["X"], feeds["W"], feeds["R"], feeds["B"], feeds.get("sequence_lens")]
        kwargs = {**attributes(case), "output_sequence": True}
        return lambda: fn(*args, **kwargs)

    def info(self) -> str:
        import onnx_recurrent
        from onnx_recurrent.scan import num_threads

        parts = [f"onnx-recurrent {onnx_recurrent.__version__}", f"NumPy {np.__version__}"]
        parts.append(_blas_info())
        if "numba" in sys.modules:
            parts.append(f"numba {sys.modules['numba'].__version__}")
        parts.append(f"own threads {num_threads()}")
        return ", ".join(parts)


class OursSession(Runtime):
    name, title, short = "session", "session ms", "Δ session"

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        session = onnx_recurrent.InferenceSession(model)
        return lambda: session.run(None, feeds)

    def info(self) -> str:
        return "ours through onnx_recurrent.InferenceSession"


class OnnxRuntime(Runtime):
    name, title, short = "onnxruntime", "onnxruntime ms", "Δ ort"
    module, install = "onnxruntime", "onnxruntime"

    def unsupported(self, case):
        if case.layout == 1:
            return "no CPU kernel for layout=1"
        if case.dtype == "float64":
            return "no CPU kernel for double"
        return None

    def _options(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.threads:
            options.intra_op_num_threads = self.threads
        return options

    def prepare(self, case, model, feeds):
        import onnxruntime as ort

        session = ort.InferenceSession(
            model.SerializeToString(), self._options(), providers=["CPUExecutionProvider"]
        )
        return lambda: session.run(None, feeds)

    def info(self) -> str:
        import onnxruntime as ort

        n = self._options().intra_op_num_threads
        threads = (
            f"intra_op_num_threads {n}"
            if n
            else f"intra_op_num_threads default (0: one per physical core, {physical_cores()})"
        )
        return f"onnxruntime {ort.__version__} CPUExecutionProvider, {threads}"


class OpenVINO(Runtime):
    name, title, short = "openvino", "OpenVINO ms", "Δ ov"
    module, install = "openvino", "openvino"

    def __init__(self, threads: int | None = None) -> None:
        super().__init__(threads)
        self.threads_used: int | None = None

    def prepare(self, case, model, feeds):
        import openvino as ov

        core = ov.Core()
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads

        def compile_call(onnx_model) -> Call:
            compiled = core.compile_model(
                core.read_model(onnx_model.SerializeToString()), "CPU", config
            )
            with contextlib.suppress(Exception):
                self.threads_used = int(compiled.get_property("INFERENCE_NUM_THREADS"))
            request = compiled.create_infer_request()
            count = len(compiled.outputs)

            def call():
                request.infer(feeds, share_inputs=True)
                return [request.get_output_tensor(i).data for i in range(count)]

            return call

        call = compile_call(model)
        if case.layout == 1:
            # OpenVINO 2026.4 ignores layout=1 (it computes as if X were time-major):
            # if its outputs have the wrong shapes, time the equivalent model instead.
            got = [tuple(o.shape) for o in call()]
            if got != output_shapes(case):
                call = compile_call(
                    make_transposed_model(case, feeds, model.opset_import[0].version)
                )
                call.note = (
                    "ignores layout=1 (computes as if X were [T, N, I]; wrong output shapes):"
                    " timed instead on the equivalent model, Transposes around a layout=0 node"
                )
        return call

    def info(self) -> str:
        import openvino as ov

        version = ov.__version__.split("-")[0]
        threads = self.threads_used if self.threads_used is not None else "?"
        return (
            f"OpenVINO {version} CPU, INFERENCE_PRECISION_HINT f32, "
            f"INFERENCE_NUM_THREADS {threads}, one reused infer request"
        )


class Reference(Runtime):
    name, title, short = "reference", "onnx.reference ms", "Δ ref"
    module, install = "onnx.reference", "onnx"

    def __init__(self, threads: int | None = None, skip_shapes: Iterable[str] = ()) -> None:
        super().__init__(threads)
        self.skip_shapes = set(skip_shapes)

    def unsupported(self, case):
        if case.ragged:
            return "ignores sequence_lens (wrong semantics): not run on ragged cases"
        if case.shape.name in self.skip_shapes:
            return f"skipped at {case.shape.name} (--skip-reference)"
        return None

    def prepare(self, case, model, feeds):
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return lambda: evaluator.run(None, feeds)

    def info(self) -> str:
        import onnx

        return f"onnx {onnx.__version__} (onnx.reference.ReferenceEvaluator)"


RUNTIMES: dict[str, type[Runtime]] = {
    r.name: r for r in (Ours, OursSession, OnnxRuntime, OpenVINO, Reference)
}
COMPETITORS = ("session", "onnxruntime", "openvino", "reference")


def make_runtimes(
    names: Sequence[str] = COMPETITORS,
    *,
    threads: int | None = None,
    skip_reference: Iterable[str] = (),
) -> list[Runtime]:
    """Ours first, then the named competitors in the standard column order."""
    runtimes: list[Runtime] = [Ours(threads)]
    for name in COMPETITORS:
        if name not in names:
            continue
        if name == "reference":
            runtimes.append(Reference(threads, skip_reference))
        else:
            runtimes.append(RUNTIMES[name](threads))
    return runtimes


# ---------------------------------------------------------------------------- machine


def _blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            p = pools[0]
            return f"BLAS {p.get('internal_api')} threads {p.get('num_threads')}"
    except ImportError:
        pass
    name = "?"
    with contextlib.suppress(Exception):
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        name = f"{blas['name']} {blas.get('version', '')}".strip()
    names = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
    env = [f"{v}={os.environ[v]}" for v in names if v in os.environ]
    return f"BLAS {name} threads " + (", ".join(env) if env else "default (one per core)")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def physical_cores() -> int:
    cores = set()
    with contextlib.suppress(OSError):
        physical = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                physical = value.strip()
            elif key == "core id":
                core = value.strip()
                cores.add((physical, core))
    return len(cores) or (os.cpu_count() or 1)


def git_commit() -> str | None:
    """The checkout's short commit (with '+ changes' if the tree is dirty), if any."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} + uncommitted changes" if dirty else head


def machine_info(runtimes: Sequence[Runtime]) -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 1
    info = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "physical_cores": physical_cores(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": git_commit(),
        "runtimes": {},
    }
    for r in runtimes:
        if r.missing() is None:
            with contextlib.suppress(Exception):
                info["runtimes"][r.name] = r.info()
    return info


# ---------------------------------------------------------------------------- timing


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
) -> dict[str, list[float]]:
    """Call each runtime once per round, in turn, and return each one's call times.

    Rounds go on while fewer than ``min_repeats`` are done, or while another round (at
    the mean round time so far) still fits in ``budget`` seconds, up to ``max_repeats``.
    The order within a round is shuffled (seeded), so that no runtime always runs right
    after the same other one: what ran just before (its caches, its spinning threads)
    changes the time of a call.

    ``between`` (such as :func:`settle`) is called, untimed, after every call when
    alternating.

    ``order="blocks"`` instead runs all of one runtime's calls, then the next one's, each
    with an equal share of the budget: a cross-check of how much the runtimes' thread
    pools disturb one another when they alternate.
    """
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    if not names:
        return samples
    if order == "blocks":
        for name in names:
            samples[name] = time_alternating(
                {name: calls[name]},
                min_repeats=min_repeats,
                max_repeats=max_repeats,
                budget=budget / len(names),
                clock=clock,
            )[name]
        return samples
    if order != "alternate":
        raise ValueError(f"order must be 'alternate' or 'blocks', not {order!r}")
    shuffler = random.Random(seed)
    start = clock()
    done = 0
    while done < max_repeats:
        if done >= min_repeats:
            spent = clock() - start
            if spent + spent / done > budget:
                break
        round_order = list(names)
        shuffler.shuffle(round_order)
        for name in round_order:
            t0 = clock()
            calls[name]()
            samples[name].append(clock() - t0)
            if between is not None:
                between()
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


@dataclass
class CaseResult:
    """What one case measured. Times in seconds."""

    case: Case
    samples: dict[str, list[float]] = field(default_factory=dict)
    diffs: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # runtimes timed with a caveat
    error: str | None = None
    other_cpu: float | None = None  # share of the CPUs other processes used meanwhile

    @property
    def repeats(self) -> int:
        return max((len(s) for s in self.samples.values()), default=0)

    def median(self, name: str) -> float | None:
        s = self.samples.get(name)
        return float(np.median(s)) if s else None

    def ratio(self, name: str) -> float | None:
        """ours / ``name`` (median times)."""
        ours, theirs = self.median("ours"), self.median(name)
        if ours is None or not theirs:
            return None
        return ours / theirs

    def verdicts(self) -> list[tuple[Target, float | None, bool | None]]:
        """Each target with the measured ratio ours / runtime and whether it is met."""
        out = []
        for t in self.case.targets:
            r = self.ratio(t.runtime)
            out.append((t, r, None if r is None else t.met(r)))
        return out

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {
            "label": c.label,
            "shape": c.shape.name,
            "T": c.shape.T,
            "N": c.shape.N,
            "I": c.shape.I,
            "H": c.shape.H,
            "op": c.op,
            "direction": c.direction,
            "linear_before_reset": c.linear_before_reset,
            "ragged": c.ragged,
            "layout": c.layout,
            "dtype": c.dtype,
            "baseline": c.baseline,
            "repeats": self.repeats,
            "samples_s": self.samples,
            "median_s": {n: self.median(n) for n in self.samples},
            "max_abs_diff": self.diffs,
            "skipped": self.skipped,
            "notes": self.notes,
            "error": self.error,
            "other_cpu": self.other_cpu,
            "targets": [
                {
                    "runtime": t.runtime,
                    "kind": t.kind,
                    "bound": t.bound,
                    "ours_over_runtime": r,
                    "met": met,
                }
                for t, r, met in self.verdicts()
            ],
        }


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def run_case(
    case: Case,
    runtimes: Sequence[Runtime],
    *,
    warmup: int = 1,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
    budget: float = 0.0,
    reference_limit: float = math.inf,
    seed: int = 0,
    opset: int = 22,
    order: str = "alternate",
    before_timing: Callable[[], None] | None = None,
    settle_between: bool = True,
) -> CaseResult:
    """Prepare, warm up, check and time one case; ``runtimes[0]`` must be ours.

    A competitor that is missing, cannot run the case, or fails is skipped with its
    reason; onnx.reference is also skipped when one of its calls takes longer than
    ``reference_limit`` seconds. ``budget`` is the case's time in seconds, loading and
    warm-up included: the timed rounds get what is left of it.
    """
    start = time.perf_counter()
    result = CaseResult(case)
    feeds = make_inputs(case, seed)
    model = make_model(case, feeds, opset)
    calls: dict[str, Call] = {}
    reference_outputs = None
    for runtime in runtimes:
        reason = runtime.missing() or runtime.unsupported(case)
        if reason is None:
            try:
                call = runtime.prepare(case, model, feeds)
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
            except Exception as e:
                reason = f"failed: {_first_line(e)}"
        if reason is not None:
            if runtime is runtimes[0]:
                result.error = reason
                return result
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
            if case.dtype == "float64" and DOUBLE_ACCURACY < diff <= TOLERANCE:
                result.notes.setdefault(
                    runtime.name,
                    f"float64 outputs only float32-accurate (Δ > {DOUBLE_ACCURACY:g}): "
                    "computes double in float32",
                )
    if before_timing is not None:
        before_timing()
    try:
        result.samples = time_alternating(
            calls,
            min_repeats=min_repeats,
            max_repeats=max_repeats,
            budget=budget - (time.perf_counter() - start),
            order=order,
            seed=seed,
            between=settle if settle_between else None,
        )
    except Exception as e:  # a runtime that ran its warm-up but failed later
        result.error = f"failed while timing: {_first_line(e)}"
    return result


# ---------------------------------------------------------------------------- report


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _others(result: CaseResult) -> str:
    if result.other_cpu is None:
        return "—"
    flag = " !" if result.other_cpu > OTHERS_WARNING else ""
    return f"{result.other_cpu:.0%}{flag}"


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def _speedup(value: float) -> str:
    return (f"{value:.2g}" if value < 10 else f"{value:.0f}") + "x"


def _diff(value: float | None) -> str:
    if value is None:
        return "—"
    flag = " !" if not value <= TOLERANCE else ""
    return f"{value:.1e}{flag}"


SHORT_NAMES = {"onnxruntime": "ort", "openvino": "ov", "reference": "ref"}


def _verdict_cells(result: CaseResult) -> tuple[str, str, str, str]:
    base_ratio = base_target = ref_ratio = ref_target = "—"
    for target, ratio, met in result.verdicts():
        word = "n/a" if met is None else ("PASS" if met else "MISS")
        if target.kind == "ratio":
            if ratio is not None:
                base_ratio = f"{_ratio(ratio)} ({SHORT_NAMES[target.runtime]})"
            base_target = f"{target.text()} {word}"
        else:
            if ratio is not None:
                ref_ratio = _speedup(1.0 / ratio)
            ref_target = f"{target.text()} {word}"
    if base_ratio == "—":  # no baseline target (not expected, but show the ratio anyway)
        r = result.ratio(result.case.baseline)
        if r is not None:
            base_ratio = f"{_ratio(r)} ({SHORT_NAMES[result.case.baseline]})"
    if ref_ratio == "—":
        r = result.ratio("reference")
        if r is not None:
            ref_ratio = _speedup(1.0 / r)
    return base_ratio, base_target, ref_ratio, ref_target


def table_columns(runtimes: Sequence[Runtime]) -> list[str]:
    competitors = [r for r in runtimes if r.name != "ours"]
    return [
        "shape",
        "case",
        "reps",
        "other CPU",
        *[r.title for r in runtimes],
        "ours/base",
        "target",
        "ref/ours",
        "target",
        *[r.short for r in competitors],
    ]


def format_table(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> str:
    """A Markdown table: one row per case, median times and ratios, targets, differences."""
    columns = table_columns(runtimes)
    rows = []
    for res in results:
        if res.error:
            cells = [res.case.shape.name, res.case.label, "0", "—", f"error: {res.error}"]
            cells += ["—"] * (len(columns) - len(cells))
        else:
            cells = [res.case.shape.name, res.case.label, str(res.repeats), _others(res)]
            cells += [
                _ms(res.median(r.name)) + (" *" if r.name in res.notes else "") for r in runtimes
            ]
            cells += list(_verdict_cells(res))
            cells += [_diff(res.diffs.get(r.name)) for r in runtimes if r.name != "ours"]
        rows.append(cells)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def format_notes(results: Sequence[CaseResult], runtimes: Sequence[Runtime]) -> str:
    """Skipped competitors (grouped by reason), disagreeing outputs, target summary."""
    titles = {r.name: r.title.removesuffix(" ms") for r in runtimes}
    grouped: dict[tuple[str, str], list[str]] = {}
    for res in results:
        for name, reason in res.skipped.items():
            grouped.setdefault((name, reason), []).append(
                f"{res.case.shape.name} {res.case.label}"
            )
    caveats: dict[tuple[str, str], list[str]] = {}
    for res in results:
        for name, note in res.notes.items():
            caveats.setdefault((name, note), []).append(f"{res.case.shape.name} {res.case.label}")
    lines = []
    for heading, groups in (("Skipped ('—'):", grouped), ("Timed with a caveat ('*'):", caveats)):
        if groups:
            lines.append(heading)
        for (name, reason), labels in groups.items():
            which = "all cases" if len(labels) == len(results) else ", ".join(labels)
            lines.append(f"- {titles.get(name, name)}: {reason} — {which}")
    wrong = [
        f"{res.case.shape.name} {res.case.label} ({titles.get(n, n)} {d:.1e})"
        for res in results
        for n, d in res.diffs.items()
        if not d <= TOLERANCE
    ]
    if wrong:
        lines.append(f"Outputs farther than {TOLERANCE:g} from ours (!): " + ", ".join(wrong))
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
                shown = _ratio(ratio) if target.kind == "ratio" else _speedup(1 / ratio)
                misses.append(
                    f"{res.case.shape.name} {res.case.label} "
                    f"vs {titles.get(target.runtime, target.runtime)} {shown} "
                    f"(target {target.text()})"
                )
    lines.append(f"Targets: {passed} PASS, {missed} MISS.")
    lines += [f"- MISS {m}" for m in misses]
    return "\n".join(lines)


def format_header(info: dict[str, Any], shapes: Sequence[str]) -> str:
    lines = [
        f"CPU: {info['cpu']}; {info['logical_cpus']} logical CPUs, "
        f"{info['physical_cores']} physical cores, {info['usable_cpus']} usable by this process",
        f"Python {info['python']} on {info['platform']}",
    ]
    if info.get("commit"):
        lines.append(f"onnx-recurrent commit: {info['commit']}")
    for text in info["runtimes"].values():
        lines.append(f"- {text}")
    lines.append("Shapes: " + "; ".join(str(SHAPES[s]) for s in shapes))
    before, after = info.get("load_average_before"), info.get("load_average_after")
    if before and after:
        lines.append(
            f"Load average (1, 5, 15 min) before: {', '.join(map(str, before))}; "
            f"after: {', '.join(map(str, after))} (other work on the machine skews the times)"
        )
    others = info.get("other_cpu")
    if others is not None:
        lines.append(f"CPU time used by other processes during the run: {others:.0%}")
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
            how += "; after each call, an untimed pause until no thread of this process spins"
        lines.append(f"Timing: {info.get('warmup', 1)} warm-up call(s), then {how}")
    if "duration_s" in info:
        lines.append(f"Duration: {info['duration_s']:.0f} s")
    return "\n".join(lines)


LEGEND = (
    "Times are medians in ms over `reps` timed calls of each runtime; other CPU: the share of the "
    f"CPUs that other processes used meanwhile ('!' above {OTHERS_WARNING:.0%}: unreliable). "
    "ours/base: our time over the "
    "baseline's (ort = onnxruntime; ov = OpenVINO, used where onnxruntime has no kernel); "
    "ref/ours: how many times faster than onnx.reference. Δ: largest absolute difference "
    "of that runtime's outputs (Y, Y_h[, Y_c]) from ours; '!' marks one above "
    f"{TOLERANCE:g}. '—': not run, '*': timed with a caveat (see below)."
)


def format_report(
    results: Sequence[CaseResult],
    runtimes: Sequence[Runtime],
    info: dict[str, Any],
    shapes: Sequence[str],
) -> str:
    return "\n\n".join(
        [
            format_header(info, shapes),
            format_table(results, runtimes),
            LEGEND,
            format_notes(results, runtimes),
        ]
    )


# ---------------------------------------------------------------------------- plot


def check_plot_support() -> None:
    """Raise ImportError with the install hint if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "--plot needs matplotlib: pip install onnx-recurrent[plot] (or pip install matplotlib)"
        ) from e


def plot_ratios(results: Sequence[CaseResult], path: str | os.PathLike, title: str = "") -> None:
    """A bar chart of ours/baseline per case (log scale, targets marked) and, where
    onnx.reference ran, of its time over ours."""
    check_plot_support()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in results if r.error is None]
    labels = [f"{r.case.shape.name} {r.case.label}" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.38 * len(rows) + 2), 9), sharex=True)
    panels = (("ratio", axes[0]), ("speedup", axes[1]))
    for kind, ax in panels:
        values, colors, bounds = [], [], []
        for r in rows:
            if kind == "ratio":
                value = r.ratio(r.case.baseline)
            else:
                ratio = r.ratio("reference")
                value = None if ratio is None else 1.0 / ratio
            target = next((t for t in r.case.targets if t.kind == kind), None)
            met = (
                None
                if target is None or value is None
                else target.met(value if kind == "ratio" else 1.0 / value)
            )
            values.append(np.nan if value is None else value)
            colors.append("tab:gray" if met is None else ("tab:green" if met else "tab:red"))
            bounds.append(np.nan if target is None else target.bound)
        hatches = ["//" if (kind == "ratio" and r.case.baseline in r.notes) else "" for r in rows]
        ax.bar(x, values, color=colors, hatch=hatches)
        ax.scatter(x, bounds, marker="_", s=300, color="black", label="target", zorder=3)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.legend(loc="best")
        if kind == "ratio":
            ax.set_ylabel("ours / baseline time\n(onnxruntime; OpenVINO where none)")
            ax.set_title(title or "onnx-recurrent bench: lower is better")
        else:
            ax.set_ylabel("onnx.reference time / ours\n(higher is better)")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(labels, rotation=70, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- driver


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
        if threads:
            try:
                import threadpoolctl  # noqa: F401
            except ImportError:
                notes.append(
                    "--threads: NumPy's BLAS threads not limited (pip install threadpoolctl)"
                )

    def apply(self) -> None:
        if not self.threads:
            return
        os.environ[self.VARIABLE] = str(self.threads)
        with contextlib.suppress(ImportError):
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
    shapes: Sequence[str] = ("S", "M"),
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
    progress: Callable[[str], None] | None = None,
) -> Bench:
    """Run every case and return the :class:`Bench` (``.report()`` is the printout).

    ``repeat`` fixes the number of rounds; otherwise it adapts to the time budget of each
    shape (:data:`DEFAULT_BUDGET`, or ``budget`` seconds in all), at least
    :data:`MIN_REPEATS`.
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
    }
    notes: list[str] = []
    load_before = _load_average()
    commit_before = git_commit()
    whole_run = CpuMeter()
    began = time.perf_counter()
    share = budgets(shapes, budget)
    left = {s: sum(1 for c in cases if c.shape.name == s) for s in shapes}
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
            )
            result.other_cpu = meter.others()
            spent = time.perf_counter() - start
            share[name] -= spent
            bench.results.append(result)
            if progress:
                ratio = result.ratio(case.baseline)
                shown = "—" if ratio is None else _ratio(ratio)
                progress(
                    f"[{i}/{len(cases)}] {name} {case.label}: ours {_ms(result.median('ours'))}"
                    f" ms, ours/{SHORT_NAMES[case.baseline]} {shown}, {result.repeats} rounds,"
                    f" {spent:.1f} s"
                )
        bench.info = machine_info(bench.runtimes)  # inside: the thread limits still hold
    finally:
        limit.restore()
    bench.info["notes"] = notes
    if bench.info.get("commit") != commit_before:  # the checkout changed during the run
        bench.info["commit"] = (
            f"{commit_before} at the start, {bench.info.get('commit')} at the end"
        )
    bench.info["load_average_before"] = load_before
    bench.info["other_cpu"] = whole_run.others()
    bench.info["order"] = order
    bench.info["settle"] = settle_between and order == "alternate"
    bench.info["warmup"] = warmup
    bench.info["load_average_after"] = _load_average()
    bench.info["duration_s"] = time.perf_counter() - began
    return bench


class CpuMeter:
    """The share of the machine's CPU time that other processes used since it was made.

    From /proc/stat (all CPUs) less this process's own CPU time (every thread of every
    runtime, spinning included); None where /proc/stat is not available. Anything else
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
        return sum(ticks) / hz, (sum(ticks) - idle) / hz, own.user + own.system

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


# ---------------------------------------------------------------------------- command


def cmd_bench(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand; returns the exit status."""
    try:
        ops = parse_list(args.ops, OPS, "op")
        shapes = parse_list(args.shapes, SHAPES, "shape")
        runtimes = parse_list(args.runtimes, COMPETITORS, "runtime") if args.runtimes else []
        skip_reference = (
            parse_list(args.skip_reference, SHAPES, "shape") if args.skip_reference else []
        )
        if args.plot:
            check_plot_support()
    except (ValueError, ImportError) as e:
        print(f"onnx-recurrent bench: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for case in make_cases(ops, shapes):
            if not args.k or args.k.lower() in f"{case.shape.name} {case.label}".lower():
                print(f"{case.shape.name} {case.label}")
        return 0

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    bench = run_bench(
        ops,
        shapes,
        runtimes=runtimes,
        repeat=args.repeat,
        budget=args.budget,
        warmup=args.warmup,
        threads=args.threads,
        skip_reference=skip_reference,
        reference_limit=args.reference_limit,
        select=args.k,
        seed=args.seed,
        opset=args.opset,
        order=args.order,
        settle_between=not args.no_settle,
        progress=None if args.quiet else progress,
    )
    print(bench.report())
    for note in bench.info.get("notes", []):
        print(note)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.to_json(), indent=1))
        print(f"saved: {args.json}")
    if args.plot:
        info = bench.info
        plot_ratios(
            bench.results,
            args.plot,
            f"onnx-recurrent bench on {info['cpu']} ({info['usable_cpus']} CPUs)",
        )
        print(f"saved: {args.plot}")
    return 0 if all(r.error is None for r in bench.results) else 1


def add_parser(subparsers: Any) -> None:
    """Register the ``bench`` subcommand on ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser(
        "bench",
        help="time GRU/LSTM/RNN against onnxruntime, OpenVINO and onnx.reference",
        description=(
            "Time onnx-recurrent's GRU, LSTM and RNN against onnxruntime, OpenVINO (CPU, "
            "f32 precision) and onnx.reference, each where installed and where it supports "
            "the case, on the same single-node ONNX models. Prints a table of median times, "
            "ratios to onnxruntime (OpenVINO where onnxruntime has no kernel) with the "
            "targets, and each competitor's largest difference from our outputs."
        ),
    )
    p.add_argument("--ops", default=",".join(OPS), help="operators (default: gru,lstm,rnn)")
    p.add_argument(
        "--shapes",
        default="S,M",
        help="shape classes: S (T=50 N=1 I=64 H=64), M (T=100 N=32 I=128 H=256; also "
        "ragged, layout=1, float64), L (T=200 N=64 I=512 H=512); default S,M",
    )
    p.add_argument(
        "--runtimes",
        default=",".join(COMPETITORS),
        help="competitors to run besides ours (default: session,onnxruntime,openvino,"
        "reference; 'session' is ours through InferenceSession)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="timed rounds per case (default: adaptive to the time budget, at least "
        f"{MIN_REPEATS})",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="target duration of the whole run, split over the shapes (default: "
        + ", ".join(f"{s} {v:g} s" for s, v in DEFAULT_BUDGET.items() if s != "tiny")
        + ")",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="threads for every runtime (onnxruntime intra_op_num_threads, OpenVINO "
        "INFERENCE_NUM_THREADS, ours ONNX_RECURRENT_NUM_THREADS, NumPy's BLAS through "
        "threadpoolctl); default: each one's own default (the thread counts are printed)",
    )
    p.add_argument(
        "--skip-reference",
        metavar="SHAPES",
        default="",
        help="shapes at which not to run onnx.reference (e.g. L)",
    )
    p.add_argument(
        "--reference-limit",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="skip onnx.reference in a case when one call takes longer (default 30)",
    )
    p.add_argument("-k", metavar="TEXT", help="only the cases whose label contains TEXT")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    p.add_argument(
        "--opset", type=int, default=22, choices=(14, 22), help="ONNX opset of the models"
    )
    p.add_argument(
        "--order",
        choices=("alternate", "blocks"),
        default="alternate",
        help="alternate: one call of each runtime per round (default); blocks: all of one "
        "runtime's calls, then the next one's (to see how much they disturb one another)",
    )
    p.add_argument(
        "--no-settle",
        action="store_true",
        help="alternate without the untimed pause after each call until no thread spins "
        "(onnxruntime's spin ~40 ms after each call and slow down whatever runs next)",
    )
    p.add_argument("--json", metavar="FILE", help="save the raw results (every time) as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="save a bar chart of the ratios (needs matplotlib: pip install onnx-recurrent[plot])",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=cmd_bench)
