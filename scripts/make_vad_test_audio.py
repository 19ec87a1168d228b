"""Make the small recordings under tests/data/vad/ that the VAD tool's tests read.

Each recording is English speech from espeak-ng (voice en-us, 175 words a minute) with
silence around and between the sentences, stored in a different container, sample rate
and channel count, so the tests cover the decoding paths (FLAC, OGG Vorbis; 8, 16 and
22.05 kHz; mono and stereo):

* ``counting_8k.flac``: 8 kHz mono FLAC, "One, two, three." and "Four, five.";
* ``hello_16k.flac``: 16 kHz mono FLAC, "Hello there.";
* ``weather_22k_stereo.ogg``: 22.05 kHz stereo OGG Vorbis, "It might rain tomorrow
  afternoon." (the right channel is the left one at 70 % gain).

Needs espeak-ng (Debian: ``apt-get install -y espeak-ng``) and the ``vad`` extra
(soundfile, soxr). The results are committed; run this only to remake them.

Usage: ``python scripts/make_vad_test_audio.py [OUTPUT_DIR]``
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile
import soxr

ROOT = Path(__file__).resolve().parent.parent

#: file name -> (sample rate, channels, format, subtype, [(silence s, sentence), ...], tail s)
RECORDINGS = {
    "counting_8k.flac": (
        8000,
        1,
        "FLAC",
        "PCM_16",
        [(0.5, "One, two, three."), (0.8, "Four, five.")],
        0.5,
    ),
    "hello_16k.flac": (16000, 1, "FLAC", "PCM_16", [(0.4, "Hello there.")], 0.4),
    "weather_22k_stereo.ogg": (
        22050,
        2,
        "OGG",
        "VORBIS",
        [(0.6, "It might rain tomorrow afternoon.")],
        0.6,
    ),
}


def speak(text: str, rate: int) -> np.ndarray:
    """espeak-ng's speech of ``text`` at ``rate`` Hz, its own silence trimmed."""
    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "175", "--stdout", text],
        capture_output=True,
        check=True,
    ).stdout
    samples, native = soundfile.read(io.BytesIO(wav), dtype="float32")
    loud = np.flatnonzero(np.abs(samples) > 1e-3)
    samples = samples[loud[0] : loud[-1] + 1]
    return soxr.resample(samples, native, rate).astype(np.float32)


def make(name: str, out_dir: Path) -> Path:
    rate, channels, fmt, subtype, parts, tail = RECORDINGS[name]
    pieces = []
    for silence, text in parts:
        pieces += [np.zeros(round(silence * rate), np.float32), speak(text, rate)]
    pieces.append(np.zeros(round(tail * rate), np.float32))
    mono = np.concatenate(pieces)
    data = mono if channels == 1 else np.stack([mono, 0.7 * mono], axis=1)
    path = out_dir / name
    soundfile.write(path, data, rate, format=fmt, subtype=subtype)
    return path


def main(argv: list[str]) -> int:
    if shutil.which("espeak-ng") is None:
        print("error: espeak-ng not found (Debian: apt-get install -y espeak-ng)", file=sys.stderr)
        return 1
    out_dir = Path(argv[0]) if argv else ROOT / "tests" / "data" / "vad"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in RECORDINGS:
        path = make(name, out_dir)
        info = soundfile.info(path)
        print(
            f"wrote {path}: {info.duration:.2f} s, {info.samplerate} Hz, "
            f"{info.channels} channel(s), {path.stat().st_size} bytes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
