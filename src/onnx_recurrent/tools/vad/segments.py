"""Speech segments from per-chunk probabilities: silero's ``get_speech_timestamps``.

:func:`speech_segments` is silero's algorithm (``get_speech_timestamps_from_probs``,
silero-vad 6) on NumPy, with its option names and defaults (:data:`SEGMENT_OPTIONS`);
:func:`check_segment_options` validates such options once, before a run over many
files.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .model import CHUNK_SAMPLES, native_rate


def check_segment_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Check options for :func:`speech_segments` by name and value.

    Parameters
    ----------
    options : mapping of str to object
        Some of :data:`SEGMENT_OPTIONS`' names.

    Returns
    -------
    dict
        The same options (only those given).

    Raises
    ------
    TypeError
        If a name is not an option of :func:`speech_segments`.
    ValueError
        If a probability is outside ``[0, 1]``, a duration is negative or not a
        number, or ``time_resolution`` is not a non-negative integer.
    """
    unknown = sorted(set(options) - set(SEGMENT_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown speech segment option(s) {', '.join(unknown)}; "
            f"the options are {', '.join(SEGMENT_OPTIONS)}"
        )
    checked = dict(options)
    for name, value in checked.items():
        if name == "use_max_poss_sil_at_max_speech":
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {value!r}")
            continue
        if value is None and name in ("neg_threshold", "time_resolution"):
            continue
        if name == "time_resolution":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (decimals), got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if math.isnan(value) or value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        if name in ("threshold", "neg_threshold") and value > 1:
            raise ValueError(f"{name} is a probability, in [0, 1]; got {value!r}")
    return checked


def _floats(values: np.ndarray, piece: int = 1 << 16) -> Iterator[float]:
    """The values as Python floats, a piece at a time (a list of them all would take
    32 bytes per chunk: 7 MB for 2 h of audio)."""
    for start in range(0, values.size, piece):
        yield from values[start : start + piece].tolist()


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

    for i, speech_prob in enumerate(_floats(speech_probs)):
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
        does (it defaults to 1), quirk included: an end that rounds up past the end of
        the audio is the audio's length, unrounded (``onnx-recurrent vad`` rounds every
        time it writes instead: ``time_resolution=None`` here, ``round`` there).
        Default: no rounding.

    Returns
    -------
    list of (float, float)
        ``(start, end)`` of each speech segment in seconds from the beginning of the
        audio, in order, not overlapping.

    Raises
    ------
    ValueError
        If ``probs`` is not one-dimensional or holds a NaN, ``sample_rate`` is not
        supported, ``num_samples`` is negative or not the length of audio of
        ``num_chunks`` chunks, or an option has a bad value
        (:func:`check_segment_options`: a probability outside ``[0, 1]``, a negative
        or NaN duration, a ``time_resolution`` that is not an integer >= 0).
    TypeError
        If ``probs`` are not numbers.
    """
    given = locals()
    check_segment_options({name: given[name] for name in SEGMENT_OPTIONS})
    model_rate, step = native_rate(sample_rate)
    speech_probs = np.asarray(probs)
    if speech_probs.dtype.kind not in "fiub":
        raise TypeError(f"probs must be numbers, got dtype {speech_probs.dtype}")
    if speech_probs.dtype not in (np.float32, np.float64):
        speech_probs = speech_probs.astype(np.float64)
    if speech_probs.ndim != 1:
        raise ValueError(f"probs must be one-dimensional, got shape {speech_probs.shape}")
    nan = np.isnan(speech_probs)
    if nan.any():  # every comparison false: no speech, silently
        raise ValueError(
            f"probs must not be NaN, got NaN at chunk {int(np.argmax(nan))} of "
            f"{speech_probs.size} ({int(nan.sum())} NaN in all)"
        )
    if num_samples is None:
        audio_length_samples = speech_probs.size * CHUNK_SAMPLES[model_rate]
    else:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        audio_length_samples = math.ceil(int(num_samples) / step)  # len(audio[::step])
        chunks = math.ceil(audio_length_samples / CHUNK_SAMPLES[model_rate])
        if chunks != speech_probs.size:  # segments would end before they start
            raise ValueError(
                f"num_samples={num_samples} at {sample_rate} Hz makes {chunks} chunk(s) of "
                f"{CHUNK_SAMPLES[model_rate]} samples at {model_rate} Hz; probs has "
                f"{speech_probs.size}: num_samples must be the length of the audio that "
                "probs were computed from"
            )

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
        if time_resolution is not None:  # silero's rounding, kept (see the docstring)
            start = max(round(start, time_resolution), 0)
            end = min(round(end, time_resolution), audio_length_samples / model_rate)
        segments.append((float(start), float(end)))
    return segments


#: The options of :func:`speech_segments` (silero's ``get_speech_timestamps`` names)
#: and their defaults (silero's; ``time_resolution``: no rounding, see there).
SEGMENT_OPTIONS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(speech_segments).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "num_samples"
}
