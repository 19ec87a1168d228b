"""The VAD tool on awkward inputs: long recordings, lying headers, odd names, pipes.

Each test pins one defect of ``onnx-recurrent vad`` (issue: memory, a failing file,
``-o`` over an input, non-UTF-8 names, rounding, a closed pipe). Long recordings are
low-amplitude noise written block by block (the test process never holds them whole)
and run in a child process through a stand-in model (:class:`_Stub`: the real
pipeline of decoding, resampling, batching and segments, without the model's cost),
whose peak memory the child reports. Needs the ``vad`` extra (soundfile, soxr); the
tests that run the real model skip without it (``pip install --no-deps silero-vad``).
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx_recurrent.tools import vad

soundfile = pytest.importorskip("soundfile", reason="the VAD tool reads audio with soundfile")
soxr = pytest.importorskip("soxr", reason="the VAD tool resamples with soxr")

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "tests" / "data" / "speech_16k.wav"
SPEECH_SEGMENTS = [(0.738, 2.206), (3.074, 4.222)]  # at 3 decimals, the CLI's default


class _Stub:
    """The stand-in model (here and in the child processes): a chunk's "probability"
    is its mean absolute amplitude times 20 (at most 1); the state passes through."""

    def get_inputs(self):
        return [type("Arg", (), {"name": n})() for n in ("input", "state", "sr")]

    def run(self, names, feeds):
        x = feeds["input"][:, -512:]
        p = np.minimum(np.abs(x).mean(axis=1, keepdims=True) * 20, 1).astype(np.float32)
        return [p, feeds["state"]]


#: Source for a child process: numpy and the stand-in model.
STUB = "import numpy as np\n" + inspect.getsource(_Stub)

#: A child process: one file through analyse_files; prints its peak RSS (MB), the
#: recording's duration and its number of chunks.
CHILD = (
    STUB
    + """
import sys
from onnx_recurrent.tools import vad

(result,) = vad.analyse_files([sys.argv[1]], session=_Stub(), batch=64)
assert result.error is None, result.error
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(peak / 1024, result.duration, result.probabilities.size)
"""
)


def _model_or_skip() -> Path:
    try:
        return vad.silero_model_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"needs the Silero VAD model: {e}")


def _noise(path: Path, seconds: float, rate: int, channels: int = 1) -> Path:
    """Write faint noise (a few LSB of 16-bit PCM) block by block: never held whole."""
    rng = np.random.default_rng(0)
    block = 1 << 18
    noise = rng.integers(-3, 4, (block, channels)).astype(np.int16)
    total = int(seconds * rate)
    with soundfile.SoundFile(path, "w", rate, channels, subtype="PCM_16") as f:
        for start in range(0, total, block):
            f.write(noise[: min(block, total - start)])
    return path


def _child_peak(path: Path) -> tuple[float, float, int]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    peak, duration, chunks = done.stdout.split()
    return float(peak), float(duration), int(chunks)


def _vad(*args, **kwargs) -> subprocess.CompletedProcess:
    """``onnx-recurrent vad ARGS`` in a child process, as a user runs it."""
    _model_or_skip()
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run(
        [sys.executable, "-m", "onnx_recurrent", "vad", *args], timeout=300, cwd=ROOT, **kwargs
    )


def _main(capsys, *args) -> tuple[int, str, str]:
    """``onnx-recurrent vad ARGS`` in this process: (status, stdout, stderr)."""
    from onnx_recurrent.tools.cli import main

    status = main(["vad", *map(os.fspath, args)])
    out, err = capsys.readouterr()
    return status, out, err


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


# --- 1. memory does not grow with the recording ---------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize(
    ("rate", "channels", "long_s"),
    [(16000, 1, 2 * 3600), (48000, 2, 10 * 60)],
    ids=["16k-mono-2h", "48k-stereo-10min"],
)
def test_peak_memory_does_not_depend_on_length(tmp_path, rate, channels, long_s):
    """A child process's peak memory for a long recording is that for one minute: the
    file is decoded and resampled in blocks as the model consumes it. (Before: the
    recording decoded whole and copied, +900 MB for 2 h at 16 kHz.)"""
    short = _noise(tmp_path / "short.flac", 60, rate, channels)
    long = _noise(tmp_path / "long.flac", long_s, rate, channels)
    short_peak, short_duration, short_chunks = _child_peak(short)
    long_peak, long_duration, long_chunks = _child_peak(long)
    assert (short_duration, long_duration) == (60, long_s)
    assert (short_chunks, long_chunks) == (60 * 16000 // 512, long_s * 16000 // 512)
    # the long recording's own keep: its probabilities, 4 bytes per 32 ms chunk
    assert long_peak - short_peak < 16, (short_peak, long_peak)


def test_blocks_are_the_whole_recording_resampled(tmp_path):
    """Block by block, bit for bit what decoding and resampling it whole gives."""
    speech = vad.read_audio(SPEECH).samples
    stereo = soxr.resample(np.stack([speech, 0.5 * speech], axis=1), 16000, 44100)
    soundfile.write(tmp_path / "44k.flac", stereo, 44100)
    soundfile.write(tmp_path / "8k.wav", soxr.resample(speech, 16000, 8000), 8000)
    for path in (tmp_path / "44k.flac", tmp_path / "8k.wav", SPEECH):
        data, rate = soundfile.read(path, dtype="float32", always_2d=True)
        mono = data.mean(axis=1, dtype=np.float32)
        whole = mono if rate == 16000 else soxr.resample(mono, rate, 16000)
        with vad.open_audio(path) as reader:
            blocks = list(reader)
            assert (reader.sample_rate, reader.channels) == (rate, data.shape[1])
            assert reader.duration == data.shape[0] / rate
        assert len(blocks) > 4
        assert max(b.size for b in blocks) <= 1.25 * vad.audio.BLOCK_SAMPLES
        np.testing.assert_array_equal(np.concatenate(blocks), whole)


def test_streamed_blocks_equal_arrays():
    """stream_probabilities takes iterators of blocks (any sizes, empty ones, (n, 1)
    ones; decimated across block edges at 48 kHz) and gives what the arrays give."""
    rng = np.random.default_rng(3)
    for rate in (16000, 48000):
        recordings = {k: rng.uniform(-1, 1, int(rng.integers(0, 9000))) for k in range(7)}

        def blocks(samples):
            cuts = np.sort(rng.integers(0, samples.size + 1, 6))
            pieces = np.split(samples.astype(np.float32), cuts)
            return iter([p[:, None] if k % 2 else p for k, p in enumerate(pieces)])

        streamed = vad.stream_probabilities(
            _Stub(), ((k, blocks(s)) for k, s in recordings.items()), batch=3, sample_rate=rate
        )
        arrays = vad.stream_probabilities(_Stub(), recordings.items(), batch=3, sample_rate=rate)
        got, expected = dict(streamed), dict(arrays)
        assert got.keys() == expected.keys() == recordings.keys()
        for k in recordings:
            np.testing.assert_array_equal(got[k], expected[k])


def _wav_at(path: Path, rate: int, seconds: float = 4.8) -> Path:
    """A 16 kHz 16-bit WAV of the test speech whose header then says ``rate`` Hz."""
    speech = vad.read_audio(SPEECH).samples
    soundfile.write(path, np.resize(speech, int(seconds * 16000)), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    assert data[24:28] == struct.pack("<I", 16000)
    data[24:32] = struct.pack("<II", rate, 2 * rate)  # sample rate, byte rate
    path.write_bytes(bytes(data))
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS")
def test_absurd_sample_rate_is_an_error_row_in_bounded_memory(tmp_path):
    """A 155 KB WAV whose header says 3 Hz (7 h at 3 Hz: 1.6 GB once upsampled whole to
    16 kHz, and more inside soxr) is refused with a reason; the next file completes.
    Run under a 2 GB address-space limit, so that the old way fails fast."""
    lying = _wav_at(tmp_path / "three_hz.wav", 3)
    assert 150_000 < lying.stat().st_size < 160_000
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        + STUB
        + "import sys\nfrom onnx_recurrent.tools import vad\n"
        "for r in vad.analyse_files(sys.argv[1:], session=_Stub()):\n"
        "    print(r.path, '|', r.error, '|', r.duration)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(lying), str(SPEECH)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith(f"{lying} | {lying}: sample rate 3 Hz in its header")
    assert "below the 4000 Hz" in first
    assert second == f"{SPEECH} | None | {79146 / 16000}"


def test_sample_rates_from_the_minimum_are_read(tmp_path):
    assert vad.MIN_SAMPLE_RATE == 4000
    audio = vad.read_audio(_wav_at(tmp_path / "4000.wav", 4000, seconds=0.5))
    assert audio.sample_rate == 4000 and audio.samples.size == 4 * 8000
    with pytest.raises(vad.AudioError, match=r"3999\.wav: sample rate 3999 Hz") as info:
        vad.open_audio(_wav_at(tmp_path / "3999.wav", 3999, seconds=0.5))
    assert info.value.path == str(tmp_path / "3999.wav")


# --- 2. a file's failure, whatever the exception, is that file's row ------------------


def _flac_claiming(path: Path, frames: int) -> Path:
    """The test speech as FLAC, its STREAMINFO's total sample count set to ``frames``."""
    soundfile.write(path, vad.read_audio(SPEECH).samples, 16000)
    data = bytearray(path.read_bytes())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    # 8 bytes from 18: rate (20 bits), channels - 1 (3), bits - 1 (5), total (36)
    fields = int.from_bytes(data[18:26], "big")
    fields = (fields & ~((1 << 36) - 1)) | frames
    data[18:26] = fields.to_bytes(8, "big")
    path.write_bytes(bytes(data))
    return path


def test_flac_header_claiming_2_36_samples_is_one_error_row(tmp_path, capsys):
    """Before: MemoryError (256 GiB for the claimed samples), exit 2, no row for the
    good file after it."""
    _model_or_skip()
    lying = _flac_claiming(tmp_path / "huge.flac", (1 << 36) - 1)
    assert soundfile.info(str(lying)).frames == (1 << 36) - 1
    status, out, err = _main(capsys, lying, SPEECH)
    assert status == 1, err
    rows = _rows(out)
    assert [(r["file"], r["start"], r["end"]) for r in rows] == [
        (str(lying), "", ""),
        *((str(SPEECH), str(s), str(e)) for s, e in SPEECH_SEGMENTS),
    ]
    assert "decoding failed after" in rows[0]["error"]
    assert "of the 68719476735 frames its header gives" in rows[0]["error"]
    assert "1 of 2 file(s) could not be read" in err


def test_any_exception_of_a_file_is_its_error(tmp_path, monkeypatch):
    """A MemoryError while a file is decoded, at once or halfway, fails that file
    alone; the error row gives the exception's type."""
    names = ("a.wav", "at_once.wav", "b.wav", "halfway.wav", "c.wav")
    for name in names:
        (tmp_path / name).write_bytes(SPEECH.read_bytes())
    real = soundfile.SoundFile.read

    def read(self, frames=-1, *args, **kwargs):
        name = Path(os.fsdecode(getattr(self.name, "name", self.name))).name
        past = frames < 0 or self.tell() + frames > 8192  # beyond the first 0.512 s
        if name == "at_once.wav" or (name == "halfway.wav" and past):
            raise MemoryError("Unable to allocate 256. GiB for an array")
        return real(self, frames, *args, **kwargs)

    monkeypatch.setattr(soundfile.SoundFile, "read", read)
    paths = [tmp_path / name for name in names]
    results = list(vad.analyse_files(paths, session=_Stub(), batch=2))
    assert [r.path for r in results] == [str(p) for p in paths]
    assert isinstance(results[1].error, MemoryError)
    assert isinstance(results[3].error, MemoryError)
    expected = next(vad.analyse_files([SPEECH], session=_Stub())).segments
    assert expected and [r.segments for r in results] == [expected, None] * 2 + [expected]

    from onnx_recurrent.tools.vad.command import _reason

    assert _reason(results[1].error) == "MemoryError: Unable to allocate 256. GiB for an array"


def test_a_file_that_breaks_halfway_is_its_error_row(tmp_path):
    """Lost sync in the middle of a FLAC: an error row saying how far it got."""
    speech = vad.read_audio(SPEECH).samples
    soundfile.write(tmp_path / "broken.flac", np.tile(speech, 4), 16000)
    data = bytearray((tmp_path / "broken.flac").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 5000] = b"\xff" * 5000
    (tmp_path / "broken.flac").write_bytes(bytes(data))
    paths = [SPEECH, tmp_path / "broken.flac", SPEECH]
    results = list(vad.analyse_files(paths, session=_Stub(), batch=2))
    error = results[1].error
    assert isinstance(error, vad.AudioError) and "decoding failed after" in error.reason
    assert results[0].segments == results[2].segments and results[0].error is None


def test_a_wav_cut_short_is_its_error_row(tmp_path):
    """A WAV cut in half (its header still giving the whole data size) was read as a
    shorter recording, silently; now an error row, as a FLAC cut short is."""
    data = SPEECH.read_bytes()
    (tmp_path / "half.wav").write_bytes(data[: len(data) // 2])
    (tmp_path / "streamed.wav").write_bytes(  # a streaming writer's "unknown" size
        data[:40] + struct.pack("<I", 0xFFFFFFFF) + data[44:]
    )
    paths = [SPEECH, tmp_path / "half.wav", tmp_path / "streamed.wav"]
    results = list(vad.analyse_files(paths, session=_Stub(), batch=2))
    error = results[1].error
    assert isinstance(error, vad.AudioError), results[1]
    assert "truncated: its header gives" in error.reason and "the file holds" in error.reason
    assert results[2].error is None and results[2].segments == results[0].segments


@pytest.mark.parametrize("fmt", ["WAV", "AIFF", "OGG"])
def test_a_recording_cut_short_while_it_is_read_is_an_error(tmp_path, fmt):
    """A file cut short on disk while ``vad`` read it (a recorder rotating it, a disk
    cleaner) gave the rows of what was read, no error, status 0: libsndfile ends a WAV,
    AIFF or OGG there quietly. Now an AudioError naming both sizes."""
    path = tmp_path / f"long.{fmt.lower()}"
    soundfile.write(path, np.full(10 * 16000, 0.01, np.float32), 16000, format=fmt)
    size = path.stat().st_size
    with vad.open_audio(path) as reader:
        assert reader.read_block().size
        os.truncate(path, size // 2)
        with pytest.raises(vad.AudioError, match="cut short while it was read") as caught:
            while reader.read_block() is not None:
                pass
    assert f"{size} bytes when opened, {size // 2} now" in str(caught.value)
    assert "of its 160000 frames decoded" in str(caught.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_fail_their_recording_alone(tmp_path, bad):
    """A few NaN or infinite samples made the model's state NaN to the end: "no speech"
    for the whole file, silently (and ``--plot`` then stopped every file after it)."""
    speech = vad.read_audio(SPEECH).samples.copy()
    speech[1000:1010] = bad
    soundfile.write(tmp_path / "bad.wav", speech, 16000, subtype="FLOAT")
    results = list(vad.analyse_files([tmp_path / "bad.wav", SPEECH], session=_Stub(), batch=2))
    assert "samples must be finite" in str(results[0].error) and "0.062 s" in str(results[0].error)
    assert results[1].error is None and results[1].segments
    with pytest.raises(ValueError, match=r"samples must be finite, got (nan|-?inf) at 0.062 s"):
        vad.speech_probabilities(_Stub(), speech)
    rows = dict(vad.stream_probabilities(_Stub(), [("a", speech)], return_errors=True))
    assert isinstance(rows["a"], ValueError)


def test_paths_as_bytes_are_read_and_others_refused():
    """A bytes path was taken for the name "b'...'" (not found), one bytes path for a
    list of ints, and None or a number failed with "object is not iterable"."""
    name = os.fsencode(SPEECH)
    for paths in ([name], name):
        (result,) = list(vad.analyse_files(paths, session=_Stub()))
        assert result.path == str(SPEECH) and result.error is None and result.segments
    for paths, match in (
        (None, "paths must be a path or a list of paths, got NoneType"),
        (5, "got int"),
        ([SPEECH, 5], r"paths\[1\] must be a path"),
    ):
        with pytest.raises(TypeError, match=match):
            list(vad.detect(paths))
        with pytest.raises(TypeError, match=match):
            list(vad.analyse_files(paths, session=_Stub()))


def test_integer_pcm_or_text_samples_are_refused():
    """int16 samples were read as amplitudes up to 32767 (other segments, silently), and
    text failed in NumPy ("could not convert string to float")."""
    speech = vad.read_audio(SPEECH).samples
    pcm = (speech * 32767).astype(np.int16)
    with pytest.raises(ValueError, match=r"samples are integers from -?\d+ to \d+ .*/ 32768"):
        vad.speech_probabilities(_Stub(), pcm)
    rows = dict(vad.stream_probabilities(_Stub(), [("a", pcm)], return_errors=True))
    assert "recording 'a': samples are integers" in str(rows["a"])
    with pytest.raises(TypeError, match=r"samples must be numbers, got dtype <U1"):
        vad.speech_probabilities(_Stub(), ["a", "b"])
    silence = vad.speech_probabilities(_Stub(), [0, 1, 0, -1] * 256)  # ints within [-1, 1]
    assert silence.shape == (2,)


def test_float_samples_on_the_pcm_scale_are_refused(tmp_path, capsys):
    """Floats on the int16 scale (``x * 32768``, peaks of 25738) were taken as [-1, 1]
    audio: other segments, silently; a float WAV holding them, the same. Refused past
    ``MAX_SAMPLE_PEAK``; in the command that file fails alone."""
    speech = vad.read_audio(SPEECH).samples
    scaled = speech * np.float32(32768)
    peak = r"samples peak at 2\d{4}, past 2 \(full scale is 1\).*/ 32768"
    with pytest.raises(ValueError, match=peak):
        vad.speech_probabilities(_Stub(), scaled)
    rows = dict(vad.stream_probabilities(_Stub(), [("a", scaled)], return_errors=True))
    assert re.search(r"recording 'a': samples peak at", str(rows["a"])), rows["a"]
    # a float past full scale, within the bound, is audio (a resampler's overshoot)
    assert vad.speech_probabilities(_Stub(), speech * np.float32(1.9)).size
    path = tmp_path / "pcm_scaled.wav"
    soundfile.write(path, scaled, 16000, subtype="FLOAT")
    bad, good = list(vad.analyse_files([path, SPEECH], session=_Stub()))
    assert isinstance(bad.error, vad.AudioError) and bad.segments is None
    assert str(bad.error).startswith(f"{path}: its samples peak at 2"), bad.error
    assert "divide them by 32768" in str(bad.error)
    assert good.error is None and good.segments
    status, out, err = _main(capsys, path, SPEECH)
    rows = _rows(out)
    assert status == 1 and "1 of 2 file(s) could not be read" in err
    assert [r["file"] for r in rows] == [str(path)] + [str(SPEECH)] * len(SPEECH_SEGMENTS)
    assert "its samples peak at" in rows[0]["error"] and all(not r["error"] for r in rows[1:])


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_recording_from_a_pipe_is_read():
    """``cat a.wav | onnx-recurrent vad /dev/stdin`` failed ("No 'data' chunk marker",
    and cffi's "Illegal seek" tracebacks): libsndfile seeks in the file. A pipe this
    process holds open (``/dev/stdin``, ``/dev/fd/N``, a shell's ``<(...)``) is read."""
    import threading

    read_end, write_end = os.pipe()
    data = SPEECH.read_bytes()

    def write() -> None:
        with open(write_end, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)  # never a hang at exit
    writer.start()
    try:
        (piped,) = list(vad.analyse_files([f"/dev/fd/{read_end}"], session=_Stub()))
    finally:
        writer.join(timeout=30)
        os.close(read_end)
    (read,) = list(vad.analyse_files([SPEECH], session=_Stub()))
    assert piped.error is None, piped.error
    assert piped.segments == read.segments and piped.duration == read.duration


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_among_the_files_fails_alone(tmp_path):
    """A FIFO given by name (no writer) blocked the run in open() forever, the other
    files never processed (a directory walk skips FIFOs). It is refused unopened."""
    import threading

    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    found = []
    run = threading.Thread(  # a daemon: a hang fails the test, not the whole run
        target=lambda: found.extend(vad.analyse_files([SPEECH, fifo, SPEECH], session=_Stub())),
        daemon=True,
    )
    run.start()
    run.join(60)
    if run.is_alive():  # a writer comes and goes: the reader's open() returns
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        run.join(30)
        pytest.fail("still waiting on the named pipe after 60 s")
    assert [r.path for r in found] == [str(SPEECH), str(fifo), str(SPEECH)]
    assert isinstance(found[1].error, vad.AudioError), found[1].error
    assert str(found[1].error).startswith(f"{fifo}: a named pipe (FIFO), not a regular file")
    assert found[0].segments and found[2].segments == found[0].segments
    # a device read without end: refused the same way, unless this process holds it
    if os.path.exists("/dev/zero"):
        (zero,) = list(vad.analyse_files(["/dev/zero"], session=_Stub()))
        assert "a character device, not a regular file" in str(zero.error), zero.error


# --- 3. -o naming an input ------------------------------------------------------------


def test_output_naming_an_input_is_refused(tmp_path, capsys, monkeypatch):
    """Exit 2, one line, the recording untouched: the same path spelled otherwise, an
    input found in a directory given, a hard link, a symbolic link."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calls").mkdir()
    recording = tmp_path / "calls" / "a.wav"
    recording.write_bytes(SPEECH.read_bytes())
    original = recording.read_bytes()
    os.link(recording, tmp_path / "hard.csv")
    cases = [
        ["calls/a.wav", "-o", "calls/a.wav"],
        ["calls/a.wav", "-o", "./calls/../calls/a.wav"],
        [str(tmp_path / "calls"), "-o", "calls/a.wav"],
        ["calls", "-o", str(recording)],
        ["calls/a.wav", "-o", "hard.csv"],
    ]
    if hasattr(os, "symlink"):
        os.symlink(recording, tmp_path / "link.jsonl")
        cases.append(["calls/a.wav", "-o", "link.jsonl"])
    for args in cases:
        status, out, err = _main(capsys, *args)
        assert status == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"-o {args[-1]} is the input file" in lines[0], err
        assert "overwrite" in lines[0] and out == ""
        assert recording.read_bytes() == original, args


def test_output_naming_the_default_model_is_refused(tmp_path, capsys, monkeypatch):
    """``-o`` naming silero-vad's own model (the default ``--model``) wrote the rows
    over it: every later run failed."""
    from onnx_recurrent.tools.vad import command

    recording = tmp_path / "a.wav"
    recording.write_bytes(SPEECH.read_bytes())
    default = tmp_path / "silero_vad.onnx"
    default.write_bytes(b"a stand-in for silero-vad's model")
    monkeypatch.setattr(command, "silero_model_path", lambda: default)
    status, _, err = _main(capsys, str(recording), "-o", str(default))
    assert status == 2 and f"is the input file {default}" in err, err
    assert default.read_bytes() == b"a stand-in for silero-vad's model"


def test_output_naming_the_model_or_its_external_data_is_refused(tmp_path, capsys):
    """``-o`` naming ``--model`` or the file it keeps its weights in replaced it with
    the rows (as ``run -o`` did with external data)."""
    import onnx

    recording = tmp_path / "a.wav"
    recording.write_bytes(SPEECH.read_bytes())
    # any model with external data: -o is checked before the model is loaded
    model = onnx.load(str(Path(vad.__file__).parents[2] / "data" / "example_gru.onnx"))
    onnx.save(
        model,
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for output in ("m.onnx", "m.data"):
        status, _, err = _main(
            capsys,
            str(recording),
            "--model",
            str(tmp_path / "m.onnx"),
            "-o",
            str(tmp_path / output),
        )
        assert status == 2, err
        assert f"is the input file {tmp_path / output}" in err and "overwrite the model" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == kept


def test_a_plot_never_overwrites_a_recording(tmp_path, capsys):
    """--plot DIR names a recording's plot after it (``x.wav.png``); where that is an
    input (a recording so named, in DIR), the plot takes the next free name. Before,
    the recording became a PNG."""
    pytest.importorskip("matplotlib")
    _model_or_skip()
    recording = tmp_path / "x.wav.png"  # audio, whatever its name says
    recording.write_bytes(SPEECH.read_bytes())
    other = tmp_path / "x.wav"
    other.write_bytes(SPEECH.read_bytes())
    original = recording.read_bytes()
    status, _, err = _main(capsys, recording, other, "--plot", tmp_path)
    assert status == 0, err
    assert recording.read_bytes() == original
    assert (tmp_path / "x.wav-1.png").read_bytes()[:4] == b"\x89PNG"
    # nor -o's file, not there yet (the plot was written, then replaced by the rows)
    plots = tmp_path / "plots"
    plots.mkdir()
    status, _, err = _main(capsys, other, "--plot", plots, "-o", plots / "x.wav.png")
    assert status == 0, err
    assert (plots / "x.wav.png").read_bytes()[:4] != b"\x89PNG"  # the rows
    assert (plots / "x.wav-1.png").read_bytes()[:4] == b"\x89PNG"


# --- 4. file names that are not valid UTF-8 --------------------------------------------


def _bad_name(tmp_path: Path) -> str:
    name = os.path.join(os.fsencode(tmp_path), b"bad\xff.wav")
    try:
        with open(name, "wb") as f:
            f.write(SPEECH.read_bytes())
    except (OSError, UnicodeError) as e:
        pytest.skip(f"the file system takes no such name: {e}")
    return os.fsdecode(name)  # as argv gives it: the byte as a surrogate escape


def test_names_that_are_not_utf8_are_written_as_their_bytes(tmp_path, capsys):
    """CSV and JSON lines to -o: the name's own bytes (surrogateescape), the rows
    complete. Before: UnicodeEncodeError, exit 2, no rows."""
    _model_or_skip()
    path = _bad_name(tmp_path)
    raw = os.fsencode(path)
    assert b"\xff" in raw
    out = tmp_path / "out.csv"
    out.write_text("an older output, overwritten\n")
    status, _, err = _main(capsys, path, SPEECH, "-o", out)
    assert status == 0, err
    expected = b"".join(
        b"%s,%s,%s,\n" % (name, str(s).encode(), str(e).encode())
        for name in (raw, os.fsencode(SPEECH))
        for s, e in SPEECH_SEGMENTS
    )
    assert out.read_bytes() == b"file,start,end,error\n" + expected

    status, _, err = _main(capsys, path, "-o", tmp_path / "out.jsonl")
    assert status == 0, err
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and all(raw in line for line in lines)
    rows = [json.loads(line.decode("utf-8", "surrogateescape")) for line in lines]
    assert [(r["file"], r["start"], r["end"]) for r in rows] == [
        (path, s, e) for s, e in SPEECH_SEGMENTS
    ]


def test_names_that_are_not_utf8_on_stdout(tmp_path):
    path = _bad_name(tmp_path)
    done = _vad(os.fsencode(path), env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        b"%s,%s,%s," % (os.fsencode(path), str(s).encode(), str(e).encode())
        for s, e in SPEECH_SEGMENTS
    ]


# --- 5. every time rounded alike --------------------------------------------------------


def test_command_writes_every_time_rounded(tmp_path, capsys):
    """Speech to the end of a recording of 30410 samples (1.900625 s): before, that end
    was written unrounded, whatever --time-resolution (as silero's get_speech_timestamps
    leaves it, which vad.speech_segments mirrors); now every time, in CSV and JSON."""
    _model_or_skip()
    speech = vad.read_audio(SPEECH).samples
    cut = tmp_path / "cut.wav"
    soundfile.write(cut, speech[:30410], 16000, subtype="FLOAT")  # cut inside speech
    for decimals, last_end in [(3, 1.901), (1, 1.9), (0, 2.0)]:
        option = ["--time-resolution", str(decimals)]
        status, out, err = _main(capsys, cut, SPEECH, *option)
        assert status == 0, err
        rows = [(r["start"], r["end"]) for r in _rows(out)]
        status, _, err = _main(capsys, cut, SPEECH, *option, "-o", tmp_path / "out.jsonl")
        assert status == 0, err
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        assert [(str(r["start"]), str(r["end"])) for r in map(json.loads, lines)] == rows
        assert len(rows) == 3 and float(rows[0][1]) == last_end, rows
        for time in (t for row in rows for t in row):
            assert float(time) == round(float(time), decimals), (decimals, rows)


# --- 6. a closed pipe ---------------------------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="a pipe closed under the writer")
def test_closed_stdout_ends_quietly_with_status_141():
    """``... | head -n 2``: stdout's reader gone; no message, the status a shell shows
    for a tool SIGPIPE ended (128 + 13). Before: "error: [Errno 32] Broken pipe", 2."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first row: deterministic
    try:
        done = _vad(SPEECH, SPEECH, stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_probabilities_and_session_of_the_wrong_kind_are_named():
    # NumPy's "could not convert string to float" and an AttributeError on None.run
    with pytest.raises(TypeError, match=r"probs must be numbers, got dtype <U1"):
        vad.speech_segments(["a"])
    with pytest.raises(TypeError, match=r"session must have onnxruntime's interface .*NoneType"):
        vad.speech_probabilities(None, np.zeros(16000, np.float32))
