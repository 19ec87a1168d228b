"""Silero voice-activity detection (VAD) on top of any ONNX runtime.

The `silero-vad <https://pypi.org/project/silero-vad/>`_ package ships its model as
ONNX (``silero_vad/data/silero_vad.onnx``: opset 16, two ``LSTM`` nodes inside ``If``
branches), but its own Python helpers need torch. This module redoes, on NumPy, the
parts that surround the model:

* :func:`read_wav` reads a mono 16-bit PCM WAV file with the standard library;
* :func:`speech_probabilities` streams the audio through the model chunk by chunk, the
  way silero's ``OnnxWrapper`` does (the previous chunk's last samples prepended as
  context, the recurrent state carried from call to call), through any session object
  with onnxruntime's ``run(None, feeds)`` interface, so one function drives both
  :class:`onnx_recurrent.InferenceSession` and :class:`onnxruntime.InferenceSession`;
* :func:`speech_segments` turns the per-chunk probabilities into speech segments with
  silero's ``get_speech_timestamps`` algorithm and defaults;
* :func:`silero_model_path` finds the model file of an installed ``silero-vad``.

Install the model without torch: ``pip install --no-deps silero-vad``.

Examples
--------
>>> import onnx_recurrent
>>> from onnx_recurrent import vad
>>> session = onnx_recurrent.InferenceSession(vad.silero_model_path())  # doctest: +SKIP
>>> samples, rate = vad.read_wav("speech_16k.wav")  # doctest: +SKIP
>>> probs = vad.speech_probabilities(session, samples, rate)  # doctest: +SKIP
>>> vad.speech_segments(probs, rate, num_samples=samples.size)  # doctest: +SKIP
[(0.738, 2.206), (3.074, 4.222)]
"""

from __future__ import annotations

import importlib.util
import math
import os
import wave
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

__all__ = [
    "CHUNK_SAMPLES",
    "CONTEXT_SAMPLES",
    "STATE_SHAPE",
    "read_wav",
    "silero_model_path",
    "speech_probabilities",
    "speech_segments",
]

#: Samples per model call (the chunk, without context) at each native sample rate.
CHUNK_SAMPLES = {16000: 512, 8000: 256}
#: Samples of the previous chunk prepended to each chunk, at each native sample rate.
CONTEXT_SAMPLES = {16000: 64, 8000: 32}
#: Shape of the Silero model's recurrent ``state`` input for one stream.
STATE_SHAPE = (2, 1, 128)

_INSTALL_HINT = "pip install --no-deps silero-vad"


def silero_model_path(name: str = "silero_vad.onnx") -> Path:
    """Return the path of a model file shipped by the installed ``silero-vad`` package.

    The package is located without being imported (importing it would import torch),
    and the file is looked up in its ``silero_vad/data`` resource folder.

    Parameters
    ----------
    name : str, default "silero_vad.onnx"
        File name inside ``silero_vad/data``. The default is the opset-16 streaming
        model that :func:`speech_probabilities` drives.

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
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Silero VAD model comes from the silero-vad package, which is not "
            f"installed; install it without torch: {_INSTALL_HINT}",
            name="silero_vad",
        )
    for location in spec.submodule_search_locations:
        path = Path(location, "data", name)
        if path.is_file():
            return path.resolve()
    raise FileNotFoundError(
        f"silero-vad is installed but has no data/{name} "
        f"(looked in {list(spec.submodule_search_locations)}); "
        f"reinstall it: {_INSTALL_HINT}"
    )


def read_wav(path: str | os.PathLike[str] | BinaryIO) -> tuple[np.ndarray, int]:
    """Read a mono 16-bit PCM WAV file.

    Parameters
    ----------
    path : str, os.PathLike or binary file object
        The WAV file.

    Returns
    -------
    samples : numpy.ndarray
        float32, shape ``(num_samples,)``: the samples divided by 32768, so in
        ``[-1, 1)``.
    sample_rate : int
        Samples per second (Hz).

    Raises
    ------
    ValueError
        If the file is not an uncompressed PCM WAV file (``wave`` rejects it, e.g.
        float or WAVE_FORMAT_EXTENSIBLE files on Python < 3.12), has more than one
        channel, or does not store 16-bit samples. Convert it first, for example with
        ``sox IN.wav -r 16000 -c 1 -b 16 OUT.wav``.
    FileNotFoundError
        If ``path`` names no file.
    """
    source = os.fspath(path) if isinstance(path, os.PathLike) else path
    name = source if isinstance(source, str) else repr(source)
    try:
        with wave.open(source) as f:
            channels, width, rate = f.getnchannels(), f.getsampwidth(), f.getframerate()
            if channels != 1:
                raise ValueError(
                    f"{name}: {channels} channels; only mono WAV files are read "
                    "(mix down first, e.g. sox IN.wav -c 1 OUT.wav)"
                )
            if width != 2:
                raise ValueError(
                    f"{name}: {8 * width}-bit samples; only 16-bit PCM WAV files are read "
                    "(convert first, e.g. sox IN.wav -b 16 OUT.wav)"
                )
            frames = f.readframes(f.getnframes())
    except (wave.Error, EOFError) as e:
        raise ValueError(f"{name}: not a readable 16-bit PCM WAV file ({e})") from e
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / np.float32(32768.0)
    return samples, int(rate)


def _native_rate(sample_rate: int) -> tuple[int, int]:
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


def _input_names(session: Any) -> set[str] | None:
    """Return the session's input names when it can tell them, else None."""
    get_inputs = getattr(session, "get_inputs", None)
    if get_inputs is None:
        return None
    try:
        return {i.name for i in get_inputs()}
    except Exception:  # an unusual session object: fall back to the silero names
        return None


def _progress_bar(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError as e:
        raise ImportError(
            "progress=True needs tqdm: pip install tqdm (or pip install 'onnx-recurrent[vad]')"
        ) from e
    return tqdm(total=total, unit="chunk", desc="VAD", leave=False)


def speech_probabilities(
    session: Any,
    samples: np.ndarray | Iterable[float],
    sample_rate: int = 16000,
    *,
    progress: bool = False,
) -> np.ndarray:
    """Run the streaming Silero VAD model over a whole recording.

    Mirrors silero's ``OnnxWrapper`` / ``get_speech_timestamps``: the audio is cut into
    chunks of 512 samples (256 at 8 kHz), the last one zero-padded; each model call
    gets the previous call's last 64 samples (32 at 8 kHz; zeros for the first chunk)
    in front of its chunk, so ``input`` has shape ``(1, 576)`` at 16 kHz, plus the
    ``state`` the previous call returned (zeros for the first chunk) and ``sr``.

    Parameters
    ----------
    session : object
        A session over the Silero model (e.g. from :func:`silero_model_path`) with
        onnxruntime's interface: ``session.run(None, feeds)`` returning
        ``[output, stateN]``, where ``feeds`` maps ``"input"`` to float32
        ``(1, context + chunk)``, ``"state"`` to float32 ``(2, 1, 128)`` and ``"sr"``
        to a 0-d int64 array. :class:`onnx_recurrent.InferenceSession` and
        :class:`onnxruntime.InferenceSession` both qualify. If the session has
        ``get_inputs()``, ``"sr"`` is fed only when the model declares it.
    samples : array_like of float
        The mono recording, shape ``(num_samples,)`` (size-1 axes are squeezed away),
        values in ``[-1, 1]``; converted to float32.
    sample_rate : int, default 16000
        Sample rate of ``samples`` in Hz: 8000, 16000, or a multiple of 16000 (then
        decimated to 16000 Hz by keeping every n-th sample, as silero does).
    progress : bool, default False
        Show a tqdm progress bar (on stderr), one step per chunk.

    Returns
    -------
    numpy.ndarray
        float32, shape ``(num_chunks,)`` with
        ``num_chunks = ceil(num_samples_at_model_rate / chunk)``: the speech
        probability of each chunk of 512 samples (32 ms at 16 kHz; 256 samples at
        8 kHz), in ``[0, 1]``. Empty for empty audio.

    Raises
    ------
    ValueError
        If ``samples`` is not one-dimensional, ``sample_rate`` is not supported, the
        session's model lacks the ``input``/``state`` inputs, or a call returns fewer
        than two outputs.
    ImportError
        If ``progress=True`` and tqdm is not installed.
    """
    model_rate, step = _native_rate(sample_rate)
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim > 1:
        audio = audio.squeeze()
    if audio.ndim != 1:
        raise ValueError(f"samples must be one-dimensional (mono), got shape {np.shape(samples)}")
    if step > 1:
        audio = audio[::step]

    names = _input_names(session)
    if names is not None and not {"input", "state"} <= names:
        raise ValueError(
            "the session's model is not the streaming Silero VAD model: it needs inputs "
            f"'input' and 'state' (and usually 'sr'), it has {sorted(names)}"
        )
    feed_sr = names is None or "sr" in names

    chunk = CHUNK_SAMPLES[model_rate]
    context_size = CONTEXT_SAMPLES[model_rate]
    num_chunks = math.ceil(audio.size / chunk)
    padded = np.zeros(num_chunks * chunk, dtype=np.float32)
    padded[: audio.size] = audio

    probs = np.empty(num_chunks, dtype=np.float32)
    state = np.zeros(STATE_SHAPE, dtype=np.float32)
    context = np.zeros(context_size, dtype=np.float32)
    sr = np.array(model_rate, dtype=np.int64)
    bar = _progress_bar(num_chunks) if progress else None
    try:
        for k in range(num_chunks):
            x = np.concatenate((context, padded[k * chunk : (k + 1) * chunk]))[np.newaxis, :]
            feeds = {"input": x, "state": state}
            if feed_sr:
                feeds["sr"] = sr
            outputs = session.run(None, feeds)
            if len(outputs) < 2:
                raise ValueError(
                    f"the session returned {len(outputs)} output(s); the Silero model "
                    "returns two (output, stateN)"
                )
            probs[k] = np.asarray(outputs[0], dtype=np.float32).reshape(-1)[0]
            state = np.asarray(outputs[1], dtype=np.float32)
            context = x[0, -context_size:]
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return probs


def _speech_sample_ranges(
    speech_probs: np.ndarray,
    sampling_rate: int,
    threshold: float,
    min_speech_duration_ms: float,
    max_speech_duration_s: float,
    min_silence_duration_ms: float,
    speech_pad_ms: float,
    neg_threshold: float | None,
    min_silence_at_max_speech: float,
    use_max_poss_sil_at_max_speech: bool,
    audio_length_samples: int,
) -> list[dict[str, int]]:
    """Silero's ``get_speech_timestamps_from_probs`` state machine, line for line.

    Works in samples at the model rate (8000 or 16000 Hz); returns dicts with
    ``start``/``end`` sample indices, padded and clipped as silero does.
    """
    window_size_samples = CHUNK_SAMPLES[sampling_rate]
    min_speech_samples = sampling_rate * min_speech_duration_ms / 1000
    speech_pad_samples = sampling_rate * speech_pad_ms / 1000
    max_speech_samples = (
        sampling_rate * max_speech_duration_s - window_size_samples - 2 * speech_pad_samples
    )
    min_silence_samples = sampling_rate * min_silence_duration_ms / 1000
    min_silence_samples_at_max_speech = sampling_rate * min_silence_at_max_speech / 1000

    triggered = False
    speeches: list[dict[str, int]] = []
    current_speech: dict[str, int] = {}

    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    temp_end = 0  # a potential segment end (tolerating some silence)
    prev_end = next_start = 0  # segment limits in case the maximum length is reached
    possible_ends: list[tuple[int, int]] = []

    for i, speech_prob in enumerate(speech_probs.tolist()):
        cur_sample = window_size_samples * i

        # Speech returns after a temp_end: keep the silence as a candidate cut if long.
        if (speech_prob >= threshold) and temp_end:
            sil_dur = cur_sample - temp_end
            if sil_dur > min_silence_samples_at_max_speech:
                possible_ends.append((temp_end, sil_dur))
            temp_end = 0
            if next_start < prev_end:
                next_start = cur_sample

        # Start of speech.
        if (speech_prob >= threshold) and not triggered:
            triggered = True
            current_speech["start"] = cur_sample
            continue

        # Maximum speech length reached: decide where to cut.
        if triggered and (cur_sample - current_speech["start"] > max_speech_samples):
            if use_max_poss_sil_at_max_speech and possible_ends:
                # The longest candidate silence in the current segment.
                prev_end, dur = max(possible_ends, key=lambda x: x[1])
                current_speech["end"] = prev_end
                speeches.append(current_speech)
                current_speech = {}
                next_start = prev_end + dur
                # (Kept exactly as silero writes it.)
                if next_start < prev_end + cur_sample:
                    current_speech["start"] = next_start
                else:
                    triggered = False
                prev_end = next_start = temp_end = 0
                possible_ends = []
            elif prev_end:
                # Legacy cut: at the last valid silence.
                current_speech["end"] = prev_end
                speeches.append(current_speech)
                current_speech = {}
                if next_start < prev_end:
                    triggered = False
                else:
                    current_speech["start"] = next_start
                prev_end = next_start = temp_end = 0
                possible_ends = []
            else:
                # No silence to cut at: cut at the current sample.
                current_speech["end"] = cur_sample
                speeches.append(current_speech)
                current_speech = {}
                prev_end = next_start = temp_end = 0
                triggered = False
                possible_ends = []
                continue

        # Silence while in speech.
        if (speech_prob < neg_threshold) and triggered:
            if not temp_end:
                temp_end = cur_sample
            sil_dur_now = cur_sample - temp_end

            if (
                not use_max_poss_sil_at_max_speech
                and sil_dur_now > min_silence_samples_at_max_speech
            ):
                prev_end = temp_end

            if sil_dur_now < min_silence_samples:
                continue
            current_speech["end"] = temp_end
            if (current_speech["end"] - current_speech["start"]) > min_speech_samples:
                speeches.append(current_speech)
            current_speech = {}
            prev_end = next_start = temp_end = 0
            triggered = False
            possible_ends = []
            continue

    if current_speech and (audio_length_samples - current_speech["start"]) > min_speech_samples:
        current_speech["end"] = audio_length_samples
        speeches.append(current_speech)

    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - speech_pad_samples))
        if i != len(speeches) - 1:
            silence_duration = speeches[i + 1]["start"] - speech["end"]
            if silence_duration < 2 * speech_pad_samples:
                speech["end"] += int(silence_duration // 2)
                speeches[i + 1]["start"] = int(
                    max(0, speeches[i + 1]["start"] - silence_duration // 2)
                )
            else:
                speech["end"] = int(min(audio_length_samples, speech["end"] + speech_pad_samples))
                speeches[i + 1]["start"] = int(
                    max(0, speeches[i + 1]["start"] - speech_pad_samples)
                )
        else:
            speech["end"] = int(min(audio_length_samples, speech["end"] + speech_pad_samples))
    return speeches


def speech_segments(
    probs: np.ndarray | Iterable[float],
    sample_rate: int = 16000,
    *,
    num_samples: int | None = None,
    threshold: float = 0.5,
    neg_threshold: float | None = None,
    min_speech_duration_ms: float = 250,
    max_speech_duration_s: float = float("inf"),
    min_silence_duration_ms: float = 100,
    speech_pad_ms: float = 30,
    min_silence_at_max_speech: float = 98,
    use_max_poss_sil_at_max_speech: bool = True,
    time_resolution: int | None = None,
) -> list[tuple[float, float]]:
    """Turn per-chunk speech probabilities into speech segments.

    The algorithm, parameters and defaults are those of silero's
    ``get_speech_timestamps`` (``get_speech_timestamps_from_probs``, silero-vad 6):
    speech starts at a chunk with probability ``>= threshold`` and ends after
    ``min_silence_duration_ms`` of chunks below ``neg_threshold``; segments not longer
    than ``min_speech_duration_ms`` are dropped, the rest are padded by
    ``speech_pad_ms`` on each side (sharing a shorter gap between neighbours), and
    segments longer than ``max_speech_duration_s`` are split.

    Parameters
    ----------
    probs : array_like of float
        Shape ``(num_chunks,)``: per-chunk speech probabilities, as returned by
        :func:`speech_probabilities`.
    sample_rate : int, default 16000
        The sample rate (Hz) of the audio ``probs`` was computed from, as passed to
        :func:`speech_probabilities`: 8000, 16000 or a multiple of 16000.
    num_samples : int, optional
        Length of that audio in samples at ``sample_rate``; the last segment may end
        there. Default: ``num_chunks`` whole chunks (silero's default too), which can
        overshoot the real end by up to one chunk.
    threshold : float, default 0.5
        Probability at or above which a chunk is speech.
    neg_threshold : float, optional
        Probability below which a chunk is silence once in speech. Default
        ``max(threshold - 0.15, 0.01)``.
    min_speech_duration_ms : float, default 250
        Segments not longer than this (ms, before padding) are dropped.
    max_speech_duration_s : float, default inf
        Segments longer than this (s) are split, preferably at a silence.
    min_silence_duration_ms : float, default 100
        Silence (ms) needed to end a segment.
    speech_pad_ms : float, default 30
        Padding (ms) added on each side of a segment.
    min_silence_at_max_speech : float, default 98
        Shortest silence (ms) considered as a cut point when a segment is split.
    use_max_poss_sil_at_max_speech : bool, default True
        Split at the longest silence found (True) or at the last one (False).
    time_resolution : int, optional
        Round the times to this many decimals, as silero's ``return_seconds=True``
        does (it defaults to 1). Default: no rounding.

    Returns
    -------
    list of (float, float)
        ``(start, end)`` of each speech segment in seconds from the beginning of the
        audio, in order, not overlapping.

    Raises
    ------
    ValueError
        If ``probs`` is not one-dimensional, ``sample_rate`` is not supported, or
        ``num_samples`` is negative.
    """
    model_rate, step = _native_rate(sample_rate)
    speech_probs = np.asarray(probs, dtype=np.float64)
    if speech_probs.ndim != 1:
        raise ValueError(f"probs must be one-dimensional, got shape {speech_probs.shape}")
    if num_samples is None:
        audio_length_samples = speech_probs.size * CHUNK_SAMPLES[model_rate]
    else:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        audio_length_samples = math.ceil(int(num_samples) / step)  # len(audio[::step])

    ranges = _speech_sample_ranges(
        speech_probs,
        model_rate,
        threshold=threshold,
        min_speech_duration_ms=min_speech_duration_ms,
        max_speech_duration_s=max_speech_duration_s,
        min_silence_duration_ms=min_silence_duration_ms,
        speech_pad_ms=speech_pad_ms,
        neg_threshold=neg_threshold,
        min_silence_at_max_speech=min_silence_at_max_speech,
        use_max_poss_sil_at_max_speech=use_max_poss_sil_at_max_speech,
        audio_length_samples=audio_length_samples,
    )
    segments = []
    for r in ranges:
        start, end = r["start"] / model_rate, r["end"] / model_rate
        if time_resolution is not None:
            start = max(round(start, time_resolution), 0)
            end = min(round(end, time_resolution), audio_length_samples / model_rate)
        segments.append((float(start), float(end)))
    return segments
