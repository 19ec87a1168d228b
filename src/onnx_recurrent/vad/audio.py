"""Reading recordings: any sample rate, any channel count, WAV, FLAC or OGG.

:func:`read_audio` decodes through ``soundfile`` (libsndfile), mixes several channels
to mono and resamples to the model's 16 kHz with ``soxr``; both come with the ``vad``
extra (``pip install 'onnx-recurrent[vad]'``) and are imported when first used.
:func:`read_wav` is the standard library's reader for mono 16-bit WAV files, kept for
environments without them.
"""

import os
import wave
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .model import MODEL_RATE

#: File suffixes (lower case) taken as audio when a directory is walked.
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")

_EXTRA_HINT = "pip install 'onnx-recurrent[vad]'"


class AudioError(ValueError):
    """A file could not be decoded as audio.

    Attributes
    ----------
    path : str
        The file.
    reason : str
        What went wrong, without the file name.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (Dask sends errors back)
        return type(self), (self.path, self.reason)


class Audio(NamedTuple):
    """A decoded recording, as :func:`read_audio` returns it."""

    #: float32, shape ``(num_samples,)``: mono, at 16 kHz, values in ``[-1, 1]``.
    samples: np.ndarray
    #: The file's own sample rate (Hz).
    sample_rate: int
    #: The file's channel count (mixed to one in ``samples``).
    channels: int
    #: The recording's length in seconds (frames / sample_rate).
    duration: float


def load_soundfile() -> Any:
    """Import soundfile (libsndfile's binding).

    Raises
    ------
    ImportError
        soundfile or libsndfile is missing; the message names the ``vad`` extra.
    """
    try:
        import soundfile
    except ImportError as e:  # also OSError when libsndfile itself is missing
        raise ImportError(
            f"reading audio files needs soundfile: {_EXTRA_HINT} ({e})", name="soundfile"
        ) from None
    return soundfile


def _resample(samples: np.ndarray, rate: int) -> np.ndarray:
    try:
        import soxr
    except ImportError as e:
        raise ImportError(
            f"resampling to 16 kHz needs soxr: {_EXTRA_HINT} ({e})", name="soxr"
        ) from None
    return np.asarray(soxr.resample(samples, rate, MODEL_RATE), dtype=np.float32)


def read_audio(path: str | os.PathLike[str]) -> Audio:
    """Read an audio file as mono float32 samples at 16 kHz.

    Parameters
    ----------
    path : str or os.PathLike
        A WAV, FLAC or OGG (Vorbis, Opus) file, or any other format libsndfile reads,
        at any sample rate, with any number of channels.

    Returns
    -------
    Audio
        ``(samples, sample_rate, channels, duration)``: ``samples`` float32 of shape
        ``(num_samples,)`` at 16 kHz, the channels averaged, resampled with soxr's
        high-quality filter when the file is at another rate; the file's own sample
        rate and channel count; its duration in seconds.

    Raises
    ------
    AudioError
        (a ``ValueError``) If the file is not audio that libsndfile can decode; the
        message names the file and the reason.
    OSError
        If the file cannot be opened (``FileNotFoundError``, ``PermissionError``,
        ``IsADirectoryError``); ``filename`` names it.
    ImportError
        If soundfile or soxr is not installed; the message names the extra.
    """
    soundfile = load_soundfile()
    name = os.fspath(path)
    with open(name, "rb") as f:
        try:
            data, rate = soundfile.read(f, dtype="float32", always_2d=True)
        except soundfile.SoundFileError as e:
            reason = getattr(e, "error_string", None) or str(e)
            raise AudioError(str(name), f"not a readable audio file ({reason})") from None
        except (EOFError, RuntimeError, ValueError) as e:
            raise AudioError(str(name), f"not a readable audio file ({e})") from None
    frames, channels = data.shape
    samples = data[:, 0] if channels == 1 else data.mean(axis=1, dtype=np.float32)
    if rate != MODEL_RATE and frames:
        samples = _resample(samples, rate)
    return Audio(np.ascontiguousarray(samples), int(rate), int(channels), frames / rate)


def audio_duration(path: str | os.PathLike[str]) -> float | None:
    """The duration in seconds from the file's header, or None if it cannot be read."""
    try:
        return float(load_soundfile().info(os.fspath(path)).duration)
    except ImportError:
        raise
    except Exception:  # unreadable: the run reports it
        return None


def find_audio_files(paths: str | os.PathLike[str] | list[Any] | tuple[Any, ...]) -> list[str]:
    """Expand directories into the audio files under them.

    Parameters
    ----------
    paths : path or sequence of paths
        Files (kept as given, whatever their suffix, existing or not: reading them
        later reports what is wrong) and directories (walked recursively for files
        whose suffix is one of :data:`AUDIO_SUFFIXES`, any case, sorted).

    Returns
    -------
    list of str
        The files, in the order given, each directory's files in its place.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[str] = []
    for path in paths:
        name = os.fspath(path)
        if os.path.isdir(name):
            found = (
                p
                for p in Path(name).rglob("*")
                if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()
            )
            files.extend(sorted(str(p) for p in found))
        else:
            files.append(str(name))
    return files


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
