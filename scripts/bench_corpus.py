"""The corpus of the VAD benchmarks (``bench_vad.py``, ``bench_dask_vad.py``): FLAC
recordings built from the bundled test speech (tests/data/speech_16k.wav and
tests/data/vad/*: espeak-ng sentences), each one pieces of it at random gains with
random silences (faint noise) between them, some at 8, 22.05, 44.1 or 48 kHz, some
stereo. Needs the ``vad`` extra (soundfile, soxr)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from onnx_recurrent.tools import vad

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
SOURCES = [DATA / "speech_16k.wav", *sorted((DATA / "vad").iterdir())]
RATE = 16000
#: Sample rates of the corpus files, and how often each is drawn.
RATES = {16000: 0.5, 8000: 0.15, 22050: 0.1, 44100: 0.15, 48000: 0.1}
STEREO_FRACTION = 0.2


def build_corpus(
    directory: Path, files: int, min_s: float = 5.0, max_s: float = 30.0, seed: int = 0
) -> list[Path]:
    """Write ``files`` recordings of ``min_s`` to ``max_s`` seconds into ``directory``;
    return their paths."""
    import soundfile
    import soxr

    rng = np.random.default_rng(seed)
    pieces = [vad.read_audio(p).samples for p in SOURCES if p.suffix in (".wav", ".flac", ".ogg")]
    rates, weights = list(RATES), np.array(list(RATES.values()))
    paths = []
    for i in range(files):
        target = rng.uniform(min_s, max_s) * RATE
        parts, size = [], 0
        while size < target:
            silence = int(rng.uniform(0.2, 2.0) * RATE)
            parts.append(rng.normal(0, 1e-3, silence).astype(np.float32))
            parts.append(pieces[rng.integers(len(pieces))] * np.float32(rng.uniform(0.3, 1.0)))
            size += parts[-2].size + parts[-1].size
        audio = np.concatenate(parts)[: int(target)]
        rate = int(rng.choice(rates, p=weights / weights.sum()))
        if rate != RATE:
            audio = soxr.resample(audio, RATE, rate)
        if rng.random() < STEREO_FRACTION:
            audio = np.stack([audio, audio * np.float32(rng.uniform(0.5, 1.0))], axis=1)
        path = directory / f"rec{i:04d}_{rate}.flac"
        soundfile.write(path, np.clip(audio, -1, 1), rate, subtype="PCM_16")
        paths.append(path)
    return paths


def describe(paths: list[Path]) -> tuple[float, str]:
    """The corpus's seconds of audio, and a line on it."""
    import soundfile

    infos = [soundfile.info(p) for p in paths]
    durations = [i.duration for i in infos]
    rates = Counter(i.samplerate for i in infos)
    stereo = sum(i.channels > 1 for i in infos)
    total = sum(durations)
    text = (
        f"{len(paths)} files, {total:.1f} s of audio ({min(durations):.1f}-"
        f"{max(durations):.1f} s each; Hz: "
        + ", ".join(f"{r}: {n}" for r, n in sorted(rates.items()))
        + f"; {stereo} stereo), FLAC"
    )
    return total, text
