"""The VAD tool: audio input, batched streams, detect over files, ``onnx-recurrent vad``.

Speech: tests/data/speech_16k.wav (scripts/make_speech_recording.sh) and the small
recordings under tests/data/vad/ (scripts/make_vad_test_audio.py: espeak-ng speech in
FLAC and OGG at 8, 16 and 22.05 kHz, mono and stereo); the resampled and stereo variants
are made here with soxr and soundfile. Needs the ``vad`` extra (soundfile, soxr) and
the Silero model (``pip install --no-deps silero-vad``); tests skip without them.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnx_recurrent.tools import vad

soundfile = pytest.importorskip("soundfile", reason="the VAD tool reads audio with soundfile")
soxr = pytest.importorskip("soxr", reason="the VAD tool resamples with soxr")

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SPEECH = DATA / "speech_16k.wav"
BUNDLED = sorted((DATA / "vad").iterdir())
CHUNK_S = 512 / 16000  # one chunk: 32 ms


def _model_or_skip() -> Path:
    try:
        return vad.silero_model_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"needs the Silero VAD model: {e}")


@pytest.fixture(scope="module")
def session():
    import onnx_recurrent

    return onnx_recurrent.InferenceSession(str(_model_or_skip()))


@pytest.fixture(scope="module")
def ort_session():
    onnxruntime = pytest.importorskip("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # the model's unused initializers only warn
    return onnxruntime.InferenceSession(
        str(_model_or_skip()), options, providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return vad.read_audio(SPEECH).samples


def _close(found, expected, tolerance=CHUNK_S):
    """Same number of segments, every boundary within ``tolerance`` seconds."""
    assert len(found) == len(expected), (found, expected)
    for (s1, e1), (s2, e2) in zip(found, expected, strict=True):
        assert abs(s1 - s2) <= tolerance + 1e-9 and abs(e1 - e2) <= tolerance + 1e-9, (
            found,
            expected,
        )


def test_optional_packages_are_imported_when_used():
    """The tool's heavy dependencies load with the work, not with the import."""
    code = (
        "import sys, onnx_recurrent; assert 'onnx_recurrent.tools.vad' not in sys.modules; "
        "import onnx_recurrent.tools.vad, onnx_recurrent.tools.vad.command; "
        "print(sorted(m for m in ('soundfile', 'soxr', 'tqdm', 'dask', 'distributed', "
        "'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- reading audio --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rate", "channels", "duration"),
    [
        ("counting_8k.flac", 8000, 1, 4.12),
        ("hello_16k.flac", 16000, 1, 1.50),
        ("weather_22k_stereo.ogg", 22050, 2, 2.85),
    ],
)
def test_read_audio_bundled(name, rate, channels, duration):
    audio = vad.read_audio(DATA / "vad" / name)
    assert (audio.sample_rate, audio.channels) == (rate, channels)
    assert audio.duration == pytest.approx(duration, abs=0.01)
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert audio.samples.size == pytest.approx(duration * 16000, abs=0.01 * 16000)
    assert 0.1 < float(np.max(np.abs(audio.samples))) <= 1.0


def test_bundled_speech_is_small():
    assert sum(p.stat().st_size for p in BUNDLED) < 80_000


def test_read_audio_mixes_and_resamples(tmp_path, speech):
    stereo = np.stack([speech, 0.5 * speech], axis=1)
    soundfile.write(tmp_path / "stereo.flac", stereo, 16000)
    audio = vad.read_audio(tmp_path / "stereo.flac")
    assert audio.channels == 2
    np.testing.assert_allclose(audio.samples, 0.75 * speech, atol=1e-4)

    soundfile.write(tmp_path / "44k.wav", soxr.resample(speech, 16000, 44100), 44100)
    audio = vad.read_audio(tmp_path / "44k.wav")
    assert audio.sample_rate == 44100
    assert abs(audio.samples.size - speech.size) <= 1
    n = min(audio.samples.size, speech.size)
    assert float(np.max(np.abs(audio.samples[:n] - speech[:n]))) < 0.05

    soundfile.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 8000)
    audio = vad.read_audio(tmp_path / "empty.wav")
    assert audio.samples.shape == (0,) and audio.duration == 0.0


def test_read_audio_errors_name_the_file(tmp_path):
    (tmp_path / "text.wav").write_text("not audio")
    with pytest.raises(vad.AudioError, match=r"text\.wav: not a readable audio file") as info:
        vad.read_audio(tmp_path / "text.wav")
    assert isinstance(info.value, ValueError)
    assert info.value.path == str(tmp_path / "text.wav")
    (tmp_path / "empty.flac").write_bytes(b"")
    with pytest.raises(vad.AudioError, match=r"empty\.flac"):
        vad.read_audio(tmp_path / "empty.flac")
    with pytest.raises(FileNotFoundError) as info:
        vad.read_audio(tmp_path / "missing.ogg")
    assert info.value.filename == str(tmp_path / "missing.ogg")
    with pytest.raises(IsADirectoryError):
        vad.read_audio(tmp_path)


def test_find_audio_files(tmp_path):
    for name in ("b.wav", "a.FLAC", "sub/c.ogg", "notes.txt", "sub/d.mp3"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    found = vad.find_audio_files([tmp_path / "notes.txt", tmp_path, "missing.wav"])
    assert found == [
        str(tmp_path / "notes.txt"),  # a file is taken as given
        str(tmp_path / "a.FLAC"),
        str(tmp_path / "b.wav"),
        str(tmp_path / "sub" / "c.ogg"),
        "missing.wav",
    ]
    assert vad.find_audio_files(str(tmp_path / "sub")) == [str(tmp_path / "sub" / "c.ogg")]
    # a broken link is kept (reading it fails alone, named), a directory named .wav is not
    # (its files are): it was skipped silently
    (tmp_path / "sub" / "gone.wav").symlink_to(tmp_path / "nowhere.wav")
    (tmp_path / "sub" / "dir.wav").mkdir()
    (tmp_path / "sub" / "dir.wav" / "e.wav").write_bytes(b"")
    assert vad.find_audio_files(str(tmp_path / "sub")) == [
        str(tmp_path / "sub" / name) for name in ("c.ogg", "dir.wav/e.wav", "gone.wav")
    ]


def test_command_names_a_broken_link_in_a_directory(tmp_path):
    shutil.copy(SPEECH, tmp_path / "a.wav")
    (tmp_path / "b.wav").symlink_to(tmp_path / "moved.wav")
    done = _vad(tmp_path)
    assert done.returncode == 1, done.stderr
    rows = done.stdout.strip().splitlines()
    assert any(row.startswith(f"{tmp_path / 'a.wav'},") for row in rows)
    assert [row for row in rows if "b.wav" in row] == [
        f"{tmp_path / 'b.wav'},,,No such file or directory"
    ]


# --- batched streams ------------------------------------------------------------------


class _CountingSession:
    """Stands in for the model: prob = mean of the row's input; state + 1 per call."""

    def __init__(self):
        self.rows: list[int] = []
        self.states: list[np.ndarray] = []

    def get_inputs(self):
        return [type("Arg", (), {"name": n})() for n in ("input", "state", "sr")]

    def run(self, output_names, feeds):
        x, state = feeds["input"], feeds["state"]
        assert x.shape[0] == state.shape[1] and state.shape[::2] == (2, 128)
        assert feeds["sr"] == 16000
        self.rows.append(x.shape[0])
        self.states.append(state[0, :, 0].copy())
        return [x.mean(axis=1, keepdims=True), state + 1]


def test_streams_join_and_leave_the_batch():
    """Each stream's state counts its own calls (zero on joining), rows are compacted."""
    rng = np.random.default_rng(0)
    lengths = [5, 1, 3, 0, 8, 2, 2]  # chunks
    recordings = [
        (k, rng.uniform(-1, 1, max(0, 512 * n - 100)).astype(np.float32))
        for k, n in enumerate(lengths)
    ]
    fake = _CountingSession()
    got = dict(vad.stream_probabilities(fake, iter(recordings), batch=3))
    assert sorted(got) == list(range(len(lengths)))
    for k, samples in recordings:
        expected = vad.speech_probabilities(_CountingSession(), samples)
        np.testing.assert_array_equal(got[k], expected)
    assert max(fake.rows) == 3 and min(fake.rows) < 3  # full, then draining
    assert sum(fake.rows) == sum(lengths)  # no padded rows: finished rows leave
    # Streams 0, 1, 2 start together; 1 ends after one call and 4 joins at zero.
    np.testing.assert_array_equal(fake.states[0], [0, 0, 0])
    np.testing.assert_array_equal(fake.states[1], [1, 1, 0])


def test_streams_order_and_progress():
    recordings = [("long", np.zeros(512 * 4)), ("short", np.zeros(600)), ("none", [])]
    seconds = []
    found = vad.stream_probabilities(
        _CountingSession(), recordings, batch=2, progress=seconds.append
    )
    order = [key for key, _ in found]
    assert order == ["short", "none", "long"]  # yielded as they end
    assert sum(seconds) == pytest.approx((512 * 4 + 600) / 16000)


def test_streams_reject():
    with pytest.raises(ValueError, match="batch"):
        vad.stream_probabilities(_CountingSession(), [], batch=0)
    with pytest.raises(ValueError, match="8000 and 16000"):
        vad.stream_probabilities(_CountingSession(), [], sample_rate=44100)
    with pytest.raises(ValueError, match="one-dimensional"):
        list(vad.stream_probabilities(_CountingSession(), [("x", np.zeros((2, 600)))]))


def test_batched_equals_one_at_a_time(session, speech):
    """Real model, recordings of different lengths, batch smaller than their count."""
    rng = np.random.default_rng(1)
    recordings = [(p.name, vad.read_audio(p).samples) for p in BUNDLED]
    recordings.append(("speech", speech))
    for k in range(4):
        start = int(rng.integers(0, speech.size // 2))
        recordings.append((f"piece{k}", speech[start : start + int(rng.integers(300, 40000))]))
    rows = []

    class Counting:
        def get_inputs(self):
            return session.get_inputs()

        def run(self, names, feeds):
            rows.append(feeds["input"].shape[0])
            return session.run(names, feeds)

    got = dict(vad.stream_probabilities(Counting(), recordings, batch=3))
    assert max(rows) == 3 and len(set(rows)) > 1
    for key, samples in recordings:
        alone = vad.speech_probabilities(session, samples)
        assert got[key].shape == alone.shape
        diff = float(np.max(np.abs(got[key] - alone)))
        assert diff <= 1e-5, (key, diff)


# --- detect ---------------------------------------------------------------------------


def test_detect_walks_directories_in_order(session):
    found = list(vad.detect([DATA / "vad", SPEECH], batch=2))
    assert [path for path, _ in found] == [str(p) for p in BUNDLED] + [str(SPEECH)]
    for path, segments in found:
        assert isinstance(segments, list) and segments, path
        duration = vad.read_audio(path).duration
        assert all(0 <= s < e <= duration + 1e-9 for s, e in segments)
    assert dict(found)[str(SPEECH)] == [(0.738, 2.206), (3.074, 4.222)]


def test_unreadable_file_among_good_ones(tmp_path, session):
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio")
    paths = [BUNDLED[0], bad, tmp_path / "missing.flac", SPEECH, BUNDLED[1]]
    found = list(vad.detect_files(paths, batch=2))
    assert [p for p, _ in found] == [str(p) for p in paths]
    assert isinstance(found[1][1], vad.AudioError)
    assert isinstance(found[2][1], FileNotFoundError)
    good = dict(vad.detect_files([BUNDLED[0], SPEECH, BUNDLED[1]]))
    assert {p: s for p, s in found if not isinstance(s, Exception)} == good


def test_read_ahead_is_bounded_and_stops_with_the_consumer(session, monkeypatch):
    """Files are decoded by a second thread a few ahead of the model, never all at once,
    and a run closed early (an error, Ctrl-C) leaves no reader behind."""
    import importlib
    import threading

    detect_module = importlib.import_module("onnx_recurrent.tools.vad.files")

    reads: list[str] = []
    real = detect_module.open_audio

    def counting(path):
        reads.append(str(path))
        assert threading.current_thread() is not threading.main_thread()
        return real(path)

    monkeypatch.setattr(detect_module, "open_audio", counting)
    paths = [BUNDLED[0]] * 40
    results = vad.analyse_files(paths, batch=1, session=session)
    first = next(results)
    assert first.error is None and first.segments
    results.close()
    # batch 1: the first recording, the one in flight when it ended, READ_AHEAD queued
    assert len(reads) <= 2 + detect_module.READ_AHEAD + 1, len(reads)
    readers = [t for t in threading.enumerate() if t.name.startswith("onnx-recurrent-vad-read")]
    assert not readers, readers


def test_detect_options(session):
    plain = dict(vad.detect([SPEECH]))[str(SPEECH)]
    padded = dict(vad.detect([SPEECH], speech_pad_ms=100, time_resolution=1))[str(SPEECH)]
    assert padded == [(round(s - 0.07, 1), round(e + 0.07, 1)) for s, e in plain]
    assert dict(vad.detect([SPEECH], min_speech_duration_ms=2000))[str(SPEECH)] == []
    with pytest.raises(TypeError, match="unknown speech segment option"):
        vad.detect([SPEECH], min_speech_ms=100)
    with pytest.raises(ValueError, match="threshold"):
        vad.detect([SPEECH], threshold=1.5)
    with pytest.raises(ValueError, match="batch"):
        vad.detect_files([SPEECH], batch=0)


def _variants(tmp_path: Path, speech: np.ndarray) -> dict[str, Path]:
    """The same speech at other rates, channel counts and containers."""
    made = {}

    def write(name, data, rate, **kwargs):
        made[name] = tmp_path / name
        soundfile.write(made[name], data, rate, **kwargs)

    write("8k.flac", soxr.resample(speech, 16000, 8000), 8000)
    write("44k.wav", soxr.resample(speech, 16000, 44100), 44100, subtype="PCM_16")
    write("48k.ogg", soxr.resample(speech, 16000, 48000), 48000)
    write("stereo_16k.flac", np.stack([speech, 0.6 * speech], axis=1), 16000)
    stereo = np.stack([speech, 0.8 * speech], axis=1)
    write("stereo_44k.flac", soxr.resample(stereo, 16000, 44100), 44100)
    return made


def test_resampled_variants_give_the_same_segments(tmp_path, session, speech):
    variants = _variants(tmp_path, speech)
    soundfile.write(tmp_path / "mono_16k.wav", speech, 16000, subtype="FLOAT")
    reference = dict(vad.detect([tmp_path / "mono_16k.wav"]))[str(tmp_path / "mono_16k.wav")]
    assert len(reference) == 2
    for path, segments in vad.detect(list(variants.values()), batch=3):
        assert not isinstance(segments, Exception), (path, segments)
        _close(segments, reference)


def test_segments_agree_with_silero(ort_session, session):
    """Ours (batched, onnx-recurrent) vs silero's own algorithm on onnxruntime's
    probabilities of the same 16 kHz audio: every boundary within one chunk."""
    from test_silero_vad import _silero_segments_function

    reference_function = _silero_segments_function()
    paths = [*BUNDLED, SPEECH]
    ours = dict(vad.detect(paths, batch=2))
    for path in paths:
        samples = vad.read_audio(path).samples
        probs = vad.speech_probabilities(ort_session, samples)
        expected = reference_function(
            probs.tolist(), sampling_rate=16000, audio_length_samples=samples.size
        )
        _close(ours[str(path)], [(t["start"] / 16000, t["end"] / 16000) for t in expected])


def test_segments_agree_with_silero_get_speech_timestamps(session):
    torch = pytest.importorskip("torch", reason="silero's own get_speech_timestamps needs torch")
    threads = torch.get_num_threads()
    try:
        from silero_vad.utils_vad import OnnxWrapper, get_speech_timestamps
    finally:
        torch.set_num_threads(threads)  # importing silero_vad sets it to 1
    wrapper = OnnxWrapper(str(_model_or_skip()), force_onnx_cpu=True)
    paths = [*BUNDLED, SPEECH]
    ours = dict(vad.detect(paths))
    for path in paths:
        samples = torch.from_numpy(vad.read_audio(path).samples)
        wrapper.reset_states()
        expected = get_speech_timestamps(samples, wrapper, return_seconds=False)
        _close(ours[str(path)], [(t["start"] / 16000, t["end"] / 16000) for t in expected])


def test_plot(tmp_path, speech):
    pytest.importorskip("matplotlib")
    from onnx_recurrent.tools.vad.plot import plot_recording

    probs = np.r_[np.zeros(20), np.ones(60), np.zeros(75)].astype(np.float32)
    out = plot_recording(tmp_path / "p.png", speech, probs, [(0.6, 2.6)], title="speech")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_recording(tmp_path / "empty.png", np.zeros(0), np.zeros(0), [])
    assert (tmp_path / "empty.png").stat().st_size > 0


# --- the command line -----------------------------------------------------------------


def _vad(*args, **kwargs) -> subprocess.CompletedProcess:
    """``onnx-recurrent vad ARGS`` as a user runs it."""
    _model_or_skip()
    if "stderr" not in kwargs:
        kwargs["capture_output"] = True
    kwargs.setdefault("cwd", ROOT)
    return subprocess.run(
        [sys.executable, "-m", "onnx_recurrent", "vad", *map(str, args)],
        text=True,
        timeout=300,
        **kwargs,
    )


def _csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_command_csv_to_stdout_with_a_bad_file(tmp_path):
    bad = tmp_path / "bad.ogg"
    bad.write_text("not audio")
    done = _vad(SPEECH, bad, DATA / "vad", "--batch", "2")
    assert done.returncode == 1, done.stderr
    rows = _csv_rows(done.stdout)
    assert list(rows[0]) == ["file", "start", "end", "error"]
    speech_rows = [(float(r["start"]), float(r["end"])) for r in rows if r["file"] == str(SPEECH)]
    assert speech_rows == [(0.738, 2.206), (3.074, 4.222)]
    errors = [r for r in rows if r["error"]]
    assert [(r["file"], r["start"], r["end"]) for r in errors] == [(str(bad), "", "")]
    assert "not a readable audio file" in errors[0]["error"]
    files = list(dict.fromkeys(r["file"] for r in rows))
    assert files == [str(SPEECH), str(bad), *map(str, BUNDLED)]  # input order
    assert "1 of 5 file(s) could not be read" in done.stderr
    assert "VAD:" not in done.stderr  # no progress bar off a terminal


def test_command_json_lines_csv_file_and_plots(tmp_path):
    expected = dict(vad.detect([SPEECH, *BUNDLED]))
    out = tmp_path / "out.jsonl"
    done = _vad(SPEECH, *BUNDLED, "-o", out, "--plot", tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(set(r) == {"file", "start", "end"} for r in rows)
    got = {}
    for r in rows:
        got.setdefault(r["file"], []).append((r["start"], r["end"]))
    assert got == {p: [(round(s, 3), round(e, 3)) for s, e in seg] for p, seg in expected.items()}
    plots = sorted((tmp_path / "plots").iterdir())
    assert [p.name for p in plots] == sorted(Path(p).name + ".png" for p in expected)
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in plots)

    out = tmp_path / "out.csv"
    done = _vad(SPEECH, "-o", out, "--threshold", "0.6", "--speech-pad-ms", "0")
    assert done.returncode == 0, done.stderr
    rows = _csv_rows(out.read_text())
    segments = dict(vad.detect([SPEECH], threshold=0.6, speech_pad_ms=0, time_resolution=3))
    assert [(float(r["start"]), float(r["end"])) for r in rows] == segments[str(SPEECH)]


def test_an_earlier_output_survives_a_bad_model_and_ctrl_c(tmp_path, monkeypatch):
    """-o's file was opened (emptied) before the model loaded, and held the rows so far
    when Ctrl-C came: now it is replaced when the rows are all there, and left as it
    was otherwise."""
    from onnx_recurrent.tools import cli
    from onnx_recurrent.tools.vad import command

    out = tmp_path / "rows.csv"
    out.write_text("earlier rows\n")
    done = _vad(SPEECH, "-o", out, "--model", tmp_path / "missing.onnx")
    assert done.returncode == 2 and "missing.onnx" in done.stderr
    assert out.read_text() == "earlier rows\n"
    whole = command._local_results

    def interrupted(*args, **kwargs):
        for i, result in enumerate(whole(*args, **kwargs)):
            if i == 1:
                raise KeyboardInterrupt
            yield result

    monkeypatch.setattr(command, "_local_results", interrupted)
    assert cli.main(["vad", str(SPEECH), str(BUNDLED[0]), "-o", str(out)]) == 130
    assert out.read_text() == "earlier rows\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]
    monkeypatch.undo()
    assert cli.main(["vad", str(SPEECH), "-o", str(out)]) == 0
    assert out.read_text().startswith(f"file,start,end,error\n{SPEECH},")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold", "1.5"], "threshold"),
        (["--batch", "0"], "--batch"),
        (["--workers", "2", "--scheduler", "tcp://x:1"], "not allowed with"),
        # 100000 local workers hung starting them
        (["--workers", "100000"], "--workers: expected a number of worker processes"),
        # named by the option given, not by the Python keyword
        (["--min-silence-duration-ms", "-1"], "error: --min-silence-duration-ms must be"),
        (["--threshold", "2"], "error: --threshold is a probability"),
        # another script's digits were read (0.5, 3), as no other option reads them;
        # an empty --model was "model '.' is a directory"
        (["--threshold", "\u0660.\u0665"], "--threshold: expected a number, got '\u0660.\u0665'"),
        (["--time-resolution", "\u0663"], "--time-resolution: expected an integer"),
        (["--time-resolution", "1.5"], "--time-resolution: expected an integer, got '1.5'"),
        (["--model", ""], "--model: expected a file name, got ''"),
        (["-o", "/nonexistent/rows.csv"], "-o /nonexistent/rows.csv: no such directory"),
        (["--plot", str(SPEECH)], f"--plot {SPEECH}: not a directory"),
    ],
)
def test_command_bad_arguments(args, message):
    # -o and --plot checked before the work (-o's error named a temporary file after it)
    done = _vad(SPEECH, *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.parametrize("spelling", ["{}/", "{}/.", "missing/../{}"])
def test_command_output_spelled_as_a_directory_keeps_the_recording(tmp_path, spelling):
    # -o rec.wav/ (or rec.wav/., missing/../rec.wav) replaced rec.wav by the CSV, status 0
    recording = tmp_path / "rec.wav"
    shutil.copy(SPEECH, recording)
    done = _vad("rec.wav", "-o", spelling.format("rec.wav"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert recording.read_bytes() == SPEECH.read_bytes()


def test_plot_without_matplotlib_fails_before_the_work(tmp_path):
    """``--plot`` without matplotlib failed after the first recording (its rows printed,
    status 2, an empty plot folder left); bench says so before timing anything."""
    _model_or_skip()
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from onnx_recurrent.tools.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    plots = tmp_path / "plots"
    done = subprocess.run(
        [sys.executable, "-c", code, "vad", str(SPEECH), str(SPEECH), "--plot", str(plots)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "--plot needs matplotlib" in done.stderr and "onnx-recurrent[vad]" in done.stderr
    assert not plots.exists()


def test_command_no_audio_files(tmp_path):
    done = _vad(tmp_path)
    assert done.returncode == 2
    assert "no audio files" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_command_on_local_dask_workers(tmp_path):
    pytest.importorskip("distributed")
    bad = tmp_path / "bad.flac"
    bad.write_text("not audio")
    done = _vad(SPEECH, bad, *BUNDLED, "--workers", "2", "--batch", "2")
    assert done.returncode == 1, done.stderr
    here = _vad(SPEECH, bad, *BUNDLED, "--batch", "2")
    assert done.stdout == here.stdout


def test_a_worker_where_onnxruntime_fails_to_import_still_makes_its_session(monkeypatch, session):
    """onnxruntime installed but failing to import (a wheel built for another NumPy, a
    missing library): ``vad`` in one process fell back to the reference host, and on
    Dask workers every file failed (its options were made with onnxruntime first)."""
    from onnx_recurrent.tools import workers
    from onnx_recurrent.tools.vad import cluster

    _model_or_skip()

    def broken(record):
        raise ImportError("libonnxruntime.so: cannot open shared object file")

    monkeypatch.setattr(cluster, "session_options", broken)
    monkeypatch.setattr(workers, "SESSIONS", type(workers.SESSIONS)())
    made = cluster._vad_session(None, "auto")
    speech = vad.read_audio(SPEECH).samples
    np.testing.assert_allclose(
        vad.speech_probabilities(made, speech),
        vad.speech_probabilities(session, speech),
        atol=1e-5,
    )


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (and theirs), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        todo += kids
    return found


def _vad_workers_over_links(tmp_path: Path, count: int, **popen: Any) -> subprocess.Popen:
    """``onnx-recurrent vad DIR --workers 2`` started on ``count`` links to the speech
    recording (stdout and stderr piped)."""
    pytest.importorskip("distributed")
    _model_or_skip()
    for i in range(count):
        (tmp_path / f"s{i:02d}.wav").symlink_to(SPEECH)
    return subprocess.Popen(
        [sys.executable, "-m", "onnx_recurrent", "vad", str(tmp_path), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        **popen,
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_ctrl_c_from_a_terminal_stops_local_workers_quietly(tmp_path):
    # a terminal's Ctrl-C reaches the whole process group: each Dask worker printed
    # its own KeyboardInterrupt traceback, and the cluster's close its own
    child = _vad_workers_over_links(
        tmp_path,
        40,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stdout.readline() == "file,start,end,error\n"
    assert child.stdout.readline().startswith(str(tmp_path))  # the workers at work
    assert len(_children(child.pid)) >= 2
    os.killpg(child.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert err.strip().splitlines()[-1] == "onnx-recurrent vad: interrupted", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert time.monotonic() - sent < 5  # was 10 s: the workers' own interrupts


def test_ctrl_c_while_the_local_cluster_starts_leaves_nothing_for_the_exit_hook(monkeypatch):
    # interrupted while it started, the half-started cluster stayed in distributed's
    # instances: its exit hook closed it and printed "Exception ignored in atexit
    # callback: close_clusters ... AssertionError: Status.running"
    distributed = pytest.importorskip("distributed")
    from distributed.deploy import spec

    from onnx_recurrent.tools.vad import command

    closed = []

    class HalfStarted:
        shutdown_on_close, status = True, spec.Status.running

        def close(self, timeout=None):
            closed.append(timeout)
            raise AssertionError(spec.Status.running)

    def interrupted(**options):
        spec.SpecCluster._instances.add(half)
        raise KeyboardInterrupt

    half = HalfStarted()
    monkeypatch.setattr(distributed, "LocalCluster", interrupted)
    with pytest.raises(KeyboardInterrupt):
        command._local_cluster(distributed, 2)
    assert closed == [5] and half not in spec.SpecCluster._instances
    spec.close_clusters()  # what runs at exit: nothing left to close


@pytest.mark.skipif(os.name != "posix", reason="a pseudo-terminal")
def test_command_progress_bar_on_a_terminal():
    import fcntl
    import pty
    import struct
    import termios
    import threading

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    received = bytearray()

    def read():
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:
                return
            if not data:
                return
            received.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = _vad(SPEECH, *BUNDLED, stderr=child, stdout=subprocess.PIPE)
    finally:
        os.close(child)
    reader.join(5)
    os.close(main)
    assert done.returncode == 0
    bar = bytes(received).decode(errors="replace")
    assert "VAD: 100%" in bar and "s/s" in bar, bar


@pytest.mark.skipif(os.name != "posix", reason="ulimit -n")
def test_a_low_open_files_limit_batches_fewer_recordings(tmp_path):
    import resource

    for i in range(40):
        (tmp_path / f"s{i:02d}.wav").symlink_to(SPEECH)

    def limit(n):
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    free = _vad(tmp_path)
    assert free.returncode == 0 and free.stdout.count("s39.wav") >= 1, free.stderr
    # 64 recordings at once failed the whole run: "error: Too many open files"
    limited = _vad(tmp_path, preexec_fn=limit(34))
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout == free.stdout
    too_low = _vad(tmp_path, preexec_fn=limit(12))
    assert too_low.returncode != 0
    assert "(ulimit -n)" in too_low.stderr and "allow at least" in too_low.stderr


def test_output_dash_is_standard_output(tmp_path):
    # -o - wrote a file named '-'
    done = _vad(SPEECH, "-o", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == _vad(SPEECH).stdout and done.stdout.count("\n") > 1
    assert list(tmp_path.iterdir()) == []


# --- what the fourth probe found (twenty-sixth session) -----------------------------------


def _on_a_terminal(args: list[str], stdin: Path | None = None, timeout: float = 120) -> tuple:
    """``onnx-recurrent vad ARGS`` with stderr on a pseudo-terminal, as in a shell (the
    progress bar shows), stdin a pipe from ``stdin``; (status, stdout)."""
    import pty

    _model_or_skip()
    master, slave = pty.openpty()
    feeder = None
    if stdin is not None:
        feeder = subprocess.Popen(["cat", str(stdin)], stdout=subprocess.PIPE)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "onnx_recurrent", "vad", *args],
            stdin=feeder.stdout if feeder else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            cwd=ROOT,
        )
        os.close(slave)
        try:
            out, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
    finally:
        os.close(master)
        if feeder is not None:
            feeder.stdout.close()
            feeder.wait()
    return child.returncode, out.decode()


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_recording_piped_through_dev_stdin_in_a_terminal():
    """The progress bar read each file's header for its total first: a pipe's header
    was gone for the run ("not a readable audio file", status 1), the command the
    README gives, whenever stderr was a terminal."""
    status, out = _on_a_terminal(["/dev/stdin"], stdin=SPEECH)
    expected = _vad(SPEECH).stdout.replace(str(SPEECH), "/dev/stdin")
    assert status == 0 and out == expected, out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_in_a_terminal_is_its_own_error_row_not_a_hang(tmp_path):
    """With stderr a terminal, the progress bar opened a FIFO for its header: waiting for
    a writer for good, before any file was processed."""
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    status, out = _on_a_terminal([str(SPEECH), str(fifo)], timeout=120)
    rows = _csv_rows(out)
    assert status == 1 and rows[-1]["file"] == str(fifo), out
    assert "a named pipe (FIFO)" in rows[-1]["error"] and rows[0]["file"] == str(SPEECH)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_or_socket_in_a_directory_is_listed_not_skipped(tmp_path):
    """A walked directory's FIFO or socket with an audio suffix was skipped silently
    (status 0, no row), where the same file given by name was an error row."""
    import socket

    shutil.copy(SPEECH, tmp_path / "a.wav")
    os.mkfifo(tmp_path / "b.wav")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "c.wav"))
    try:
        assert vad.find_audio_files(tmp_path) == [
            str(tmp_path / n) for n in "a.wav b.wav c.wav".split()
        ]
        from onnx_recurrent.tools.vad.audio import audio_duration

        assert audio_duration(tmp_path / "b.wav") is None  # not opened
        done = _vad(tmp_path)
    finally:
        server.close()
    rows = _csv_rows(done.stdout)
    assert done.returncode == 1, done.stderr
    errors = {Path(r["file"]).name: r["error"] for r in rows if r["error"]}
    assert errors["b.wav"].startswith("a named pipe (FIFO)"), errors
    assert errors["c.wav"].startswith("a socket"), errors


def test_workers_with_a_bad_model_fail_at_once_and_keep_an_earlier_output(tmp_path):
    """With --workers the model was first loaded on the workers: every file became an
    error row, status 1, an earlier -o replaced by them, each worker's traceback."""
    pytest.importorskip("distributed")
    out = tmp_path / "rows.csv"
    out.write_text("earlier rows\n")
    other = ROOT / "src" / "onnx_recurrent" / "data" / "example_gru.onnx"
    for model in (tmp_path / "missing.onnx", other):  # none, and not Silero
        done = _vad(SPEECH, SPEECH, "--workers", "2", "-o", out, "--model", model)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert out.read_text() == "earlier rows\n"


def test_a_plot_name_taken_by_a_directory_gets_another(tmp_path):
    """``--plot DIR`` where ``DIR/<recording>.png`` is a directory: the run stopped
    there (status 2, -o's rows lost, later files never read), naming a temporary file."""
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    (plots / f"{SPEECH.name}.png").mkdir(parents=True)
    out = tmp_path / "rows.csv"
    done = _vad(SPEECH, BUNDLED[0], "--plot", plots, "-o", out)
    assert done.returncode == 0, done.stderr
    assert (plots / f"{SPEECH.name}-1.png").read_bytes()[:4] == b"\x89PNG"
    assert (plots / f"{BUNDLED[0].name}.png").is_file()
    assert {r["file"] for r in _csv_rows(out.read_text())} == {str(SPEECH), str(BUNDLED[0])}


def test_workers_are_quiet_when_the_reader_goes_away(tmp_path):
    """``vad --workers 2 ... | head -1``: the workers' log said "Async instruction ...
    ended with CancelledError" after the command had ended quietly (status 141)."""
    child = _vad_workers_over_links(tmp_path, 60)
    assert child.stdout.readline().startswith(b"file,start,end")
    child.stdout.close()  # as head -1 does
    _, err = child.communicate(timeout=300)
    assert child.returncode in (0, 141), err.decode()
    assert err == b"", err.decode()
