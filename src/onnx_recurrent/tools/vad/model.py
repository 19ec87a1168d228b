"""The Silero VAD model: where its file is, its chunk sizes and its inputs.

Shared by the rest of :mod:`onnx_recurrent.tools.vad`: the chunk and context sizes at each
native sample rate, the shape of one stream's recurrent state, silero's handling of
the sample rate, and a session over the model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import import_optional

#: The rate (Hz) recordings are brought to before they reach the model.
MODEL_RATE = 16000

#: Samples per model call (the chunk, without context) at each native sample rate.
CHUNK_SAMPLES = {16000: 512, 8000: 256}
#: Samples of the previous chunk prepended to each chunk, at each native sample rate.
CONTEXT_SAMPLES = {16000: 64, 8000: 32}
#: Shape of the Silero model's recurrent ``state`` input for one stream.
STATE_SHAPE = (2, 1, 128)
#: The largest magnitude a float sample may have. Full scale is 1; a float recording
#: may overshoot it a little (a resampler, a mix), while one on the int16 scale
#: (``x * 32768``: peaks in the thousands) would be read as [-1, 1] audio, silently.
MAX_SAMPLE_PEAK = 2.0


def peak_past_bound(samples: np.ndarray) -> float | None:
    """The peak magnitude of float ``samples`` where it is past :data:`MAX_SAMPLE_PEAK`,
    else None (NaN and infinities too: the finite check names where they are)."""
    if not samples.size:
        return None
    with np.errstate(invalid="ignore"):
        peak = max(float(samples.max()), -float(samples.min()))
    return peak if math.isfinite(peak) and peak > MAX_SAMPLE_PEAK else None


#: what to run for the model: the silero-vad package without torch
INSTALL_MODEL = "pip install --no-deps silero-vad"
#: what to run for the audio readers, progress bars, plots and Dask
INSTALL_EXTRA = "pip install 'onnx-recurrent[vad]'"


def silero_model_path(name: str = "silero_vad.onnx") -> Path:
    """Return the path of a model file shipped by the installed ``silero-vad`` package.

    The package is located without being imported (importing it would import torch),
    and the file is looked up in its ``silero_vad/data`` resource folder.

    Parameters
    ----------
    name : str, default "silero_vad.onnx"
        File name inside ``silero_vad/data``. The default is the opset-16 streaming
        model that :func:`~onnx_recurrent.tools.vad.speech_probabilities` drives.

    Returns
    -------
    pathlib.Path
        Absolute path of the model file.

    Raises
    ------
    ModuleNotFoundError
        If ``silero-vad`` is not installed; the message says to run
        ``pip install --no-deps silero-vad``.
    FileNotFoundError
        If the package is installed but has no such file.
    """
    spec = import_optional("silero_vad", "the Silero VAD model", INSTALL_MODEL, find_only=True)
    locations = list(spec.submodule_search_locations or ())
    for location in locations:
        path = Path(location, "data", name)
        if path.is_file():
            return path.resolve()
    raise FileNotFoundError(
        f"silero-vad is installed but has no data/{name} (looked in {locations}); "
        f"reinstall it: {INSTALL_MODEL}"
    )


def native_rate(sample_rate: int) -> tuple[int, int]:
    """Return ``(model_rate, step)``: silero's handling of the sample rate.

    8000 and 16000 Hz go to the model as they are; a multiple of 16000 Hz is decimated
    to 16000 Hz by keeping every ``step``-th sample, as silero does.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise ValueError(f"sample_rate must be an integer number of Hz, got {sample_rate!r}")
    sample_rate = int(sample_rate)
    if sample_rate in CHUNK_SAMPLES:
        return sample_rate, 1
    if sample_rate > 16000 and sample_rate % 16000 == 0:
        return 16000, sample_rate // 16000
    raise ValueError(
        f"Silero VAD supports 8000 and 16000 Hz (or a multiple of 16000 Hz), "
        f"got sample_rate={sample_rate}; resample first, e.g. sox IN.wav -r 16000 OUT.wav"
    )


def input_names(session: Any) -> set[str] | None:
    """Return the session's input names when it can tell them, else None."""
    get_inputs = getattr(session, "get_inputs", None)
    if get_inputs is None:
        return None
    try:
        return {i.name for i in get_inputs()}
    except Exception:  # an unusual session object: fall back to the silero names
        return None


def open_session(model_path: str | Path | None = None, host: str = "auto") -> Any:
    """Return an :class:`onnx_recurrent.InferenceSession` over the Silero VAD model.

    Parameters
    ----------
    model_path : str or pathlib.Path, optional
        The streaming Silero model (``input``, ``state``, ``sr`` -> ``output``,
        ``stateN``). Default: :func:`silero_model_path`.
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the graph's other nodes (see :class:`onnx_recurrent.InferenceSession`).

    Raises
    ------
    ModuleNotFoundError
        If no ``model_path`` is given and ``silero-vad`` is not installed.
    """
    from ...runtime.session import InferenceSession

    path = silero_model_path() if model_path is None else Path(model_path)
    return InferenceSession(str(path), host=host)
