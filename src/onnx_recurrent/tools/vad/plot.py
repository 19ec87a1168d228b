"""A picture of one recording's VAD result, to check it at a glance.

The waveform in grey, the speech probability of each 32 ms chunk over it, the
threshold dashed and the speech segments shaded. Drawn with matplotlib's Agg canvas
(no display, no pyplot state), imported when first used (``pip install
'onnx-recurrent[vad]'``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import import_optional
from ...runtime.files import saving
from .model import CHUNK_SAMPLES, INSTALL_EXTRA, MODEL_RATE

#: The most columns the waveform is drawn with (longer recordings: min/max envelope).
_COLUMNS = 4000


def _envelope(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Times and the low and high sample of each of at most ``_COLUMNS`` columns."""
    per = max(1, -(-samples.size // _COLUMNS))
    count = -(-samples.size // per)
    padded = np.zeros(count * per, dtype=np.float32)
    padded[: samples.size] = samples
    blocks = padded.reshape(count, per)
    times = (np.arange(count) * per + per / 2) / rate
    return times, blocks.min(axis=1), blocks.max(axis=1)


def plot_recording(
    path: str | os.PathLike[str],
    samples: np.ndarray,
    probabilities: np.ndarray,
    segments: Sequence[tuple[float, float]],
    *,
    sample_rate: int = MODEL_RATE,
    threshold: float = 0.5,
    title: str | None = None,
) -> Path:
    """Write a PNG of a recording, its speech probability and its speech segments.

    Parameters
    ----------
    path : str or os.PathLike
        The PNG file to write.
    samples : (num_samples,) ndarray
        The mono recording at ``sample_rate``.
    probabilities : (num_chunks,) ndarray
        The speech probability of each chunk (512 samples at 16 kHz, 256 at 8 kHz).
    segments : sequence of (float, float)
        Speech segments, start and end in seconds.
    sample_rate : int, default 16000
        Of ``samples``: 8000 or 16000.
    threshold : float, default 0.5
        Drawn as a dashed line.
    title : str, optional
        Above the plot (e.g. the file's name).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ImportError
        If matplotlib is not installed; the message names the extra.
    OSError
        If the file cannot be written.
    """
    Figure = import_optional("matplotlib.figure", "plotting", INSTALL_EXTRA).Figure

    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    probabilities = np.asarray(probabilities, dtype=np.float32).reshape(-1)
    chunk = CHUNK_SAMPLES.get(sample_rate, 512) / sample_rate
    duration = max(samples.size / sample_rate, probabilities.size * chunk, 1e-3)

    figure = Figure(figsize=(12, 3.2), dpi=80, layout="constrained")
    wave = figure.add_subplot()
    if samples.size:
        times, low, high = _envelope(samples, sample_rate)
        wave.fill_between(times, low, high, color="0.6", linewidth=0.5, label="waveform")
    peak = float(np.max(np.abs(samples), initial=0.0)) or 1.0
    wave.set_ylim(-1.05 * peak, 1.05 * peak)
    wave.set_xlim(0, duration)
    wave.set_xlabel("time (s)")
    wave.set_yticks([])
    for k, (start, end) in enumerate(segments):
        wave.axvspan(start, end, color="tab:green", alpha=0.2, label="speech" if k == 0 else None)

    prob = wave.twinx()
    if probabilities.size:
        edges = np.arange(probabilities.size + 1) * chunk
        prob.stairs(probabilities, edges, color="tab:blue", linewidth=1.2, label="P(speech)")
    prob.axhline(threshold, color="tab:red", linestyle="--", linewidth=0.8, label="threshold")
    prob.set_ylim(-0.02, 1.02)
    prob.set_ylabel("speech probability")

    handles, labels = wave.get_legend_handles_labels()
    more_handles, more_labels = prob.get_legend_handles_labels()
    wave.legend(handles + more_handles, labels + more_labels, loc="upper right", fontsize=8)
    if title:
        wave.set_title(title, fontsize=10, loc="left")
    with saving(os.fspath(path)) as f:
        figure.savefig(f, format="png")
    return Path(path)
