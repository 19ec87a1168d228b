"""Silero VAD end to end: the real model's LSTMs on onnx_recurrent vs onnxruntime.

The recording tests/data/speech_16k.wav (made by scripts/make_speech_recording.sh:
two espeak-ng sentences with silence around and between them) is streamed chunk by
chunk through the silero-vad package's ONNX model (``pip install --no-deps
silero-vad``; the tests needing it skip without it) on both runtimes.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

import onnx_recurrent
from onnx_recurrent.tools import vad

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "speech_16k.wav"
EXAMPLE = ROOT / "examples" / "vad_segments.py"


def _silero_model_or_skip() -> Path:
    try:
        return vad.silero_model_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"needs the Silero VAD model: {e}")


def _silero_segments_function():
    """silero's own get_speech_timestamps_from_probs, taken from its source.

    silero_vad.utils_vad imports torch at the top, so the one (pure Python) function
    is compiled out of the source file instead of importing the module.
    """
    _silero_model_or_skip()
    source = Path(importlib.util.find_spec("silero_vad").origin).with_name("utils_vad.py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    defs = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "get_speech_timestamps_from_probs"
    ]
    if not defs:
        pytest.fail(f"{source} has no get_speech_timestamps_from_probs any more")
    namespace = {"List": list, "make_visualization": None}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(source), "exec"), namespace)
    return namespace["get_speech_timestamps_from_probs"]


@pytest.fixture(scope="module")
def recording() -> tuple[np.ndarray, int]:
    return vad.read_wav(RECORDING)


@pytest.fixture(scope="module")
def model_path() -> Path:
    return _silero_model_or_skip()


@pytest.fixture(scope="module")
def ort_probs(model_path, recording) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # the model's unused initializers only warn
    session = onnxruntime.InferenceSession(
        str(model_path), options, providers=["CPUExecutionProvider"]
    )
    samples, rate = recording
    return vad.speech_probabilities(session, samples, rate)


# --- the end-to-end comparison ------------------------------------------------------


def test_silero_vad_onnx_recurrent_matches_onnxruntime(host, model_path, recording, ort_probs):
    samples, rate = recording
    session = onnx_recurrent.InferenceSession(str(model_path), host=host)
    assert session.host == host
    probs = vad.speech_probabilities(session, samples, rate)

    assert probs.shape == ort_probs.shape == (-(-samples.size // 512),)
    assert probs.dtype == np.float32
    assert np.all((probs >= 0) & (probs <= 1))
    diff = float(np.max(np.abs(probs - ort_probs)))
    assert diff < 1e-4, f"max |p_onnx_recurrent - p_onnxruntime| = {diff:.3g}"

    segments = vad.speech_segments(probs, rate, num_samples=samples.size)
    ort_segments = vad.speech_segments(ort_probs, rate, num_samples=samples.size)
    assert segments == ort_segments
    # Two sentences with a second of silence between them: speech really found.
    assert len(segments) >= 2, segments
    duration = samples.size / rate
    assert all(0 <= s < e <= duration for s, e in segments)
    assert segments[0][0] > 0.3  # the recording opens with 0.75 s of silence


def test_segments_of_the_recording(recording, ort_probs):
    """The layout the script made: speech in 0.75-2.2 s and 3.2-4.2 s, nothing else."""
    samples, rate = recording
    segments = vad.speech_segments(ort_probs, rate, num_samples=samples.size)
    assert len(segments) == 2, segments
    (s1, e1), (s2, e2) = segments
    assert 0.5 < s1 < 1.0 and 1.9 < e1 < 2.5
    assert 2.8 < s2 < 3.4 and 4.0 < e2 < 4.6


def test_probabilities_match_silero_own_wrapper(model_path, recording, ort_probs):
    """Chunking, context and state carrying are silero's: same probabilities, segments."""
    torch = pytest.importorskip("torch", reason="silero's own OnnxWrapper needs torch")
    threads = torch.get_num_threads()
    try:
        from silero_vad.utils_vad import OnnxWrapper, get_speech_timestamps
    finally:
        torch.set_num_threads(threads)  # importing silero_vad sets it to 1

    samples, rate = recording
    wrapper = OnnxWrapper(str(model_path), force_onnx_cpu=True)
    expected = wrapper.audio_forward(torch.from_numpy(samples), rate).numpy().reshape(-1)
    np.testing.assert_array_equal(ort_probs, expected)

    timestamps = get_speech_timestamps(torch.from_numpy(samples), wrapper, sampling_rate=rate)
    assert vad.speech_segments(ort_probs, rate, num_samples=samples.size) == [
        (t["start"] / rate, t["end"] / rate) for t in timestamps
    ]


# --- speech_segments against silero's own algorithm ----------------------------------


def _smooth_random_probs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Runs of speech and silence with noise, like a VAD's output."""
    probs = np.empty(n)
    i = 0
    while i < n:
        length = int(rng.integers(1, 40))
        level = rng.choice([0.02, 0.3, 0.45, 0.55, 0.9, 0.99])
        probs[i : i + length] = level
        i += length
    return np.clip(probs + rng.normal(0, 0.08, n), 0, 1).astype(np.float32)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"threshold": 0.3},
        {"threshold": 0.6, "neg_threshold": 0.5, "speech_pad_ms": 100},
        {"min_speech_duration_ms": 0, "min_silence_duration_ms": 0, "speech_pad_ms": 0},
        {"max_speech_duration_s": 2.0},
        {"max_speech_duration_s": 1.0, "use_max_poss_sil_at_max_speech": False},
        {"max_speech_duration_s": 0.5, "min_silence_at_max_speech": 30},
        {"max_speech_duration_s": 1.0, "min_silence_at_max_speech": 64},
        {
            "max_speech_duration_s": 1.5,
            "min_silence_duration_ms": 400,
            "use_max_poss_sil_at_max_speech": False,
        },
        {"sampling_rate": 8000},
        {"sampling_rate": 8000, "max_speech_duration_s": 1.5},
    ],
)
def test_speech_segments_mirror_silero(kwargs):
    reference = _silero_segments_function()
    rng = np.random.default_rng(len(repr(kwargs)))
    rate = kwargs.pop("sampling_rate", 16000)
    for trial in range(40):
        probs = _smooth_random_probs(rng, int(rng.integers(0, 400)))
        num_samples = None
        if trial % 2 and probs.size:
            num_samples = probs.size * vad.CHUNK_SAMPLES[rate] - int(rng.integers(0, 256))
        expected = reference(
            probs.tolist(),
            sampling_rate=rate,
            audio_length_samples=num_samples,
            **kwargs,
        )
        got = vad.speech_segments(probs, rate, num_samples=num_samples, **kwargs)
        assert got == [(t["start"] / rate, t["end"] / rate) for t in expected], (trial, kwargs)

        rounded = reference(
            probs.tolist(),
            sampling_rate=rate,
            audio_length_samples=num_samples,
            return_seconds=True,
            **kwargs,
        )
        got = vad.speech_segments(
            probs, rate, num_samples=num_samples, time_resolution=1, **kwargs
        )
        assert got == [(t["start"], t["end"]) for t in rounded], (trial, kwargs)


def test_speech_segments_simple_cases():
    pad = 480  # speech_pad_ms=30 at 16 kHz, in samples

    def seconds(*ranges):
        return [(start / 16000, end / 16000) for start, end in ranges]

    assert vad.speech_segments([]) == []
    assert vad.speech_segments(np.zeros(50)) == []
    # 20 chunks of speech (0.64 s) between silences: one padded segment.
    probs = np.r_[np.zeros(10), np.ones(20), np.zeros(20)]
    assert vad.speech_segments(probs) == seconds((10 * 512 - pad, 30 * 512 + pad))
    # Too short to count (min_speech_duration_ms=250 > 5 chunks = 160 ms).
    assert vad.speech_segments(np.r_[np.zeros(10), np.ones(5), np.zeros(20)]) == []
    # Speech to the very end: the segment ends at the audio's end.
    probs = np.r_[np.zeros(10), np.ones(20)]
    assert vad.speech_segments(probs, num_samples=29 * 512 + 100) == seconds(
        (10 * 512 - pad, 29 * 512 + 100)
    )
    # A multiple of 16 kHz: the same times, num_samples at the original rate.
    assert vad.speech_segments(probs, 48000, num_samples=3 * 30 * 512) == seconds(
        (10 * 512 - pad, 30 * 512)
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((np.zeros((2, 3)),), {}, "one-dimensional"),
        ((np.zeros(3), 22050), {}, "8000 and 16000"),
        ((np.zeros(3), 16000.0), {}, "integer"),
        ((np.zeros(3),), {"num_samples": -1}, "num_samples"),
        # segments that ended before they started: [(0.738, 0.000625), ...]
        ((np.ones(155),), {"num_samples": 10}, r"makes 1 chunk\(s\) .*probs has 155"),
        ((np.ones(3),), {"num_samples": 3 * 512 + 1}, r"makes 4 chunk\(s\)"),
    ],
)
def test_speech_segments_rejects(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        vad.speech_segments(*args, **kwargs)


def test_speech_segments_checks_its_options_as_detect_does():
    """The public ``speech_segments`` took any option: ``speech_pad_ms=-2000`` gave
    segments ending before they start, ``time_resolution=-1`` (0.0, 0.0) segments,
    ``threshold=nan`` and NaN probabilities no speech, silently."""
    probs = np.array([0] * 10 + [0.9] * 40 + [0] * 10 + [0.9] * 40 + [0] * 10, np.float32)
    assert vad.speech_segments(probs, 16000) == [(0.29, 1.63), (1.89, 3.23)]
    for options, match in (
        ({"speech_pad_ms": -2000}, "speech_pad_ms must be >= 0, got -2000"),
        ({"threshold": float("nan")}, "threshold must be >= 0, got nan"),
        ({"neg_threshold": 1.5}, r"neg_threshold is a probability, in \[0, 1\]"),
        ({"time_resolution": -1}, "time_resolution must be an integer >= 0"),
        ({"min_silence_duration_ms": "100"}, "min_silence_duration_ms must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            vad.speech_segments(probs, 16000, **options)
    nan = probs.copy()
    nan[55] = np.nan
    with pytest.raises(ValueError, match=r"probs must not be NaN, got NaN at chunk 55 of 110"):
        vad.speech_segments(nan, 16000)
    with pytest.raises(ValueError, match=r"at chunk 0 of 110 \(110 NaN in all\)"):
        vad.speech_segments(np.full(110, np.nan), 16000)


# --- speech_probabilities' streaming, on a stand-in session ---------------------------


class _RecordingSession:
    """Stands in for a model: records the feeds; prob = call index / 1000."""

    def __init__(self, inputs=("input", "state", "sr")):
        self.feeds: list[dict[str, np.ndarray]] = []
        self._inputs = inputs

    def get_inputs(self):
        return [type("Arg", (), {"name": n})() for n in self._inputs]

    def run(self, output_names, feeds):
        assert output_names is None
        self.feeds.append({k: np.array(v, copy=True) for k, v in feeds.items()})
        k = len(self.feeds)
        return [np.full((1, 1), k / 1000, np.float32), feeds["state"] + 1]


@pytest.mark.parametrize(("rate", "chunk", "context"), [(16000, 512, 64), (8000, 256, 32)])
def test_speech_probabilities_streams_like_silero(rate, chunk, context):
    rng = np.random.default_rng(rate)
    samples = rng.uniform(-1, 1, 3 * chunk + 100).astype(np.float32)
    session = _RecordingSession()
    probs = vad.speech_probabilities(session, samples, rate)

    np.testing.assert_array_equal(probs, np.float32([1, 2, 3, 4]) / 1000)
    assert probs.dtype == np.float32
    padded = np.r_[samples, np.zeros(chunk - 100, np.float32)]
    for k, feeds in enumerate(session.feeds):
        assert set(feeds) == {"input", "state", "sr"}
        x, state, sr = feeds["input"], feeds["state"], feeds["sr"]
        assert x.shape == (1, context + chunk) and x.dtype == np.float32
        assert state.shape == (2, 1, 128) and state.dtype == np.float32
        assert sr.shape == () and sr.dtype == np.int64 and sr == rate
        np.testing.assert_array_equal(state, np.full((2, 1, 128), k, np.float32))
        np.testing.assert_array_equal(x[0, context:], padded[k * chunk : (k + 1) * chunk])
        previous = np.zeros(context) if k == 0 else padded[k * chunk - context : k * chunk]
        np.testing.assert_array_equal(x[0, :context], previous)


def test_speech_probabilities_decimates_multiples_of_16k():
    samples = np.arange(3 * 2 * 512, dtype=np.float32) / 10000
    session = _RecordingSession()
    probs = vad.speech_probabilities(session, samples, 48000)
    assert probs.shape == (2,)
    np.testing.assert_array_equal(session.feeds[1]["input"][0, 64:], samples[::3][512:])
    assert session.feeds[0]["sr"] == 16000


def test_speech_probabilities_edge_cases():
    assert vad.speech_probabilities(_RecordingSession(), np.zeros(0)).shape == (0,)
    # (1, n) is squeezed to n.
    assert vad.speech_probabilities(_RecordingSession(), np.zeros((1, 600))).shape == (2,)
    # A model without "sr" (e.g. silero's openvino_16k variant) is not fed one.
    session = _RecordingSession(inputs=("input", "state"))
    vad.speech_probabilities(session, np.zeros(600))
    assert all(set(f) == {"input", "state"} for f in session.feeds)
    with pytest.raises(ValueError, match="'input' and 'state'"):
        vad.speech_probabilities(_RecordingSession(inputs=("input", "h", "c")), np.zeros(600))
    with pytest.raises(ValueError, match="one-dimensional"):
        vad.speech_probabilities(_RecordingSession(), np.zeros((2, 600)))
    with pytest.raises(ValueError, match="8000 and 16000"):
        vad.speech_probabilities(_RecordingSession(), np.zeros(600), 44100)


def test_speech_probabilities_progress(capsys, monkeypatch):
    pytest.importorskip("tqdm")
    probs = vad.speech_probabilities(_RecordingSession(), np.zeros(5000), progress=True)
    assert probs.shape == (10,)
    assert "VAD" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if tqdm were not installed
    with pytest.raises(ImportError, match="pip install tqdm"):
        vad.speech_probabilities(_RecordingSession(), np.zeros(5000), progress=True)


# --- read_wav and silero_model_path ---------------------------------------------------


def test_recording(recording):
    samples, rate = recording
    assert rate == 16000
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert 3.0 < samples.size / rate <= 6.0
    assert 0.1 < float(np.max(np.abs(samples))) <= 1.0
    assert RECORDING.stat().st_size < 200_000


def _write_wav(path, channels=1, width=2, rate=16000, frames=b"\x00\x00" * 10):
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(width)
        f.setframerate(rate)
        f.writeframes(frames)


def test_read_wav(tmp_path):
    path = tmp_path / "ok.wav"
    _write_wav(path, rate=8000, frames=np.int16([0, 16384, -32768, 32767]).tobytes())
    samples, rate = vad.read_wav(path)
    assert rate == 8000
    np.testing.assert_array_equal(samples, np.float32([0, 0.5, -1, 32767 / 32768]))
    with open(path, "rb") as f:
        assert vad.read_wav(f)[1] == 8000


def test_read_wav_rejects(tmp_path):
    _write_wav(tmp_path / "stereo.wav", channels=2)
    with pytest.raises(ValueError, match="2 channels"):
        vad.read_wav(tmp_path / "stereo.wav")
    _write_wav(tmp_path / "8bit.wav", width=1)
    with pytest.raises(ValueError, match="8-bit"):
        vad.read_wav(tmp_path / "8bit.wav")
    (tmp_path / "text.wav").write_text("not a wav file")
    with pytest.raises(ValueError, match="not a readable 16-bit PCM WAV"):
        vad.read_wav(tmp_path / "text.wav")
    with pytest.raises(FileNotFoundError):
        vad.read_wav(tmp_path / "missing.wav")


def test_silero_model_path_missing(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps silero-vad"):
        vad.silero_model_path()


def test_silero_model_path_unknown_file():
    _silero_model_or_skip()
    with pytest.raises(FileNotFoundError, match=r"no data/nope\.onnx"):
        vad.silero_model_path("nope.onnx")


# --- the example ----------------------------------------------------------------------


def test_example_prints_segments(host, model_path, recording):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(RECORDING), "--host", host],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    lines = out.splitlines()
    chunks = -(-recording[0].size // 512)
    assert f"{chunks} chunks (onnx-recurrent, {host})" in lines[0]
    assert len(lines) == 3 and all(line.endswith(" s") for line in lines[1:]), out


def test_a_model_of_fixed_batch_size_gets_one_recording_a_call(model_path, recording):
    # silero's openvino_16k variant declares input [1, 576]: batches of several
    # recordings failed ("expected shape [1, 576], got [3, 576]")
    fixed = model_path.with_name("silero_vad_openvino_16k.onnx")
    if not fixed.exists():
        pytest.skip(f"{fixed.name} is not in this silero-vad")
    session = onnx_recurrent.InferenceSession(str(fixed))
    samples, _ = recording
    recordings = {"a": samples, "b": samples[: samples.size // 2], "c": samples[::-1].copy()}
    alone = {k: vad.speech_probabilities(session, v) for k, v in recordings.items()}
    batched = dict(vad.stream_probabilities(session, recordings.items(), batch=3))
    assert batched.keys() == alone.keys()
    for k, probs in alone.items():
        np.testing.assert_allclose(batched[k], probs, atol=1e-5)
    assert max(alone["a"]) > 0.5  # speech found
