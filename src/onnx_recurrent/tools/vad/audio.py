"""Reading recordings: any sample rate, any channel count, WAV, FLAC or OGG.

:func:`open_audio` decodes a file in blocks through ``soundfile`` (libsndfile), mixes
several channels to mono and resamples each block to the model's 16 kHz with a
``soxr`` stream, so a recording of any length is read in bounded memory;
:func:`read_audio` reads a whole recording that way. soundfile and soxr come with the
``vad`` extra (``pip install 'onnx-recurrent[vad]'``) and are imported when first used.
:func:`read_wav` is the standard library's reader for mono 16-bit WAV files, kept for
environments without them.
"""

import io
import math
import os
import re
import stat
import wave
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ...errors import RecurrentTypeError, import_optional, one_line
from .model import INSTALL_EXTRA, MAX_SAMPLE_PEAK, MODEL_RATE, peak_past_bound

#: File suffixes (lower case) taken as audio when a directory is walked.
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")

#: The lowest sample rate (Hz) read: below it a file holds no speech band (the telephone
#: band needs 8000 Hz), and such a header (3 Hz, say) is usually damaged.
MIN_SAMPLE_RATE = 4000

#: Samples at 16 kHz in one block of :class:`AudioReader` (about; the last may be
#: longer by soxr's delay): 0.512 s, 32 KiB of float32. soxr is fed at most this many
#: frames at a time (its buffers grow with what it is fed: this keeps a resampler near
#: 0.2 MB).
BLOCK_SAMPLES = 1 << 13

#: The most samples (frames x channels) libsndfile decodes at a time, for one block:
#: 256 KiB of float32, freed once mixed to mono.
READ_SAMPLES = 1 << 16


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
    return import_optional("soundfile", "reading audio files", INSTALL_EXTRA)


def _resampler(rate: int) -> Any:
    """A soxr stream from ``rate`` to 16 kHz, mono float32 (soxr's high quality)."""
    soxr = import_optional("soxr", "resampling to 16 kHz", INSTALL_EXTRA)
    return soxr.ResampleStream(rate, MODEL_RATE, 1, dtype="float32")


class AudioReader:
    """An open recording, read block by block as mono float32 at 16 kHz.

    Made by :func:`open_audio`. Each :meth:`read_block` decodes the frames that make
    about :data:`BLOCK_SAMPLES` samples at 16 kHz (at most :data:`READ_SAMPLES` samples,
    frames x channels), averages the channels and resamples them to 16 kHz through a
    soxr stream (the same samples, bit for bit, as resampling the whole recording at
    once); so memory does not grow with the recording. Iterating gives the blocks.
    Close it (or use it as a context manager) when done.

    Attributes
    ----------
    path : str
        The file, as given.
    sample_rate : int
        The file's own sample rate (Hz), at least :data:`MIN_SAMPLE_RATE`.
    channels : int
        The file's channel count.
    frames : int
        Frames (samples per channel, at ``sample_rate``) decoded so far.
    samples : int
        Samples at 16 kHz given out so far.
    """

    def __init__(self, path: str, file: BinaryIO, sound: Any, errors: tuple[type, ...]) -> None:
        self.path = path
        self.sample_rate = int(sound.samplerate)
        self.channels = int(sound.channels)
        self.frames = 0
        self.samples = 0
        self._file = file
        self._sound = sound
        self._errors = errors  # what libsndfile raises when it cannot decode
        self._done = False
        # about BLOCK_SAMPLES once at 16 kHz, at most READ_SAMPLES decoded
        self._block_frames = max(
            1,
            min(
                READ_SAMPLES // self.channels,
                math.ceil(BLOCK_SAMPLES * self.sample_rate / MODEL_RATE),
            ),
        )
        self._stream = None if self.sample_rate == MODEL_RATE else _resampler(self.sample_rate)
        self._size = _size(file)  # to tell a file cut short while it is read

    @property
    def duration(self) -> float:
        """Seconds decoded so far (``frames / sample_rate``): the whole recording's
        length once :meth:`read_block` has returned None."""
        return self.frames / self.sample_rate

    def read_block(self) -> np.ndarray | None:
        """Decode the next block.

        Returns
        -------
        numpy.ndarray or None
            float32, shape ``(n,)``, ``n`` about :data:`BLOCK_SAMPLES` or fewer: the
            next samples at 16 kHz, mono (possibly none, while the resampler fills);
            None once the recording has ended.

        Raises
        ------
        AudioError
            (a ``ValueError``) If libsndfile fails to decode the file there, or its
            samples (a float file's) peak past
            :data:`~onnx_recurrent.tools.vad.MAX_SAMPLE_PEAK` (int16 values stored as
            floats), or if the file was cut short on disk while it was read; the
            message names the file, how far it got and the reason.
        """
        if self._done:
            return None
        try:
            data = self._sound.read(self._block_frames, dtype="float32", always_2d=True)
        except self._errors as e:
            self._done = True
            why = one_line(e, typed=False, named=False)  # AudioError names the file
            if not self.frames:
                raise AudioError(self.path, f"not a readable audio file ({why})") from None
            raise AudioError(
                self.path,
                f"decoding failed after {self.frames} of the {self._sound.frames} frames "
                f"its header gives ({why})",
            ) from None
        count = data.shape[0]
        peak = peak_past_bound(data)  # a float file holding int16 values, say
        if peak is not None:
            self._done = True
            raise AudioError(
                self.path,
                f"its samples peak at {peak:g} (frames {self.frames} to "
                f"{self.frames + count}), past {MAX_SAMPLE_PEAK:g} (full scale is 1): "
                "floats on the int16 scale, it seems; divide them by 32768",
            )
        self.frames += count
        last = count < self._block_frames
        if last and self._size is not None and (_size(self._file) or 0) < self._size:
            self._done = True  # libsndfile ends a WAV, AIFF or OGG there quietly
            raise AudioError(
                self.path,
                f"cut short while it was read: {self._size} bytes when opened, "
                f"{_size(self._file)} now; {self.frames} of its "
                f"{self._sound.frames} frames decoded",
            )
        block = data[:, 0] if self.channels == 1 else data.mean(axis=1, dtype=np.float32)
        del data
        if self._stream is not None:
            pieces = [
                self._stream.resample_chunk(
                    block[i : i + BLOCK_SAMPLES], last=last and i + BLOCK_SAMPLES >= count
                )
                for i in range(0, max(count, 1), BLOCK_SAMPLES)
            ]
            block = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        if last:
            self._done = True
        block = np.ascontiguousarray(block, dtype=np.float32)
        self.samples += block.size
        return block

    def __iter__(self) -> "AudioReader":
        return self

    def __next__(self) -> np.ndarray:
        block = self.read_block()
        if block is None:
            raise StopIteration
        return block

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._done = True
        self._stream = None
        try:
            self._sound.close()
        finally:
            self._file.close()

    def __enter__(self) -> "AudioReader":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _size(file: BinaryIO) -> int | None:
    """The size of the open ``file`` on disk (None: not a file on disk)."""
    try:
        return os.fstat(file.fileno()).st_size
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        return None


#: libsndfile's note on a WAV (or AIFF...) whose data chunk is shorter than its header
#: says: ``data : 158292 (should be 79124)``
_TRUNCATED = re.compile(r"^(?:data|SSND) *: *(\d+) *\(should be (\d+)\)", re.MULTILINE)
#: data sizes that streaming writers put in a header for "unknown": not a truncation
_UNKNOWN_LENGTH = 0x7FFFFFFF


#: what a file that is neither regular nor a directory is, by ``stat``'s mode
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _open_here(info: os.stat_result) -> bool:
    """Whether ``info`` is the file of one of this process's open descriptors (the
    pipe or terminal behind ``/dev/stdin``, ``/dev/fd/N``, a shell's ``<(...)``)."""
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        descriptors = [int(n) for n in os.listdir(folder) if n.isdigit()]
    except OSError:
        return False
    for fd in descriptors:
        try:
            mine = os.fstat(fd)
        except OSError:  # closed since
            continue
        if (mine.st_dev, mine.st_ino) == (info.st_dev, info.st_ino):
            return True
    return False


def _check_kind(name: str) -> None:
    """Refuse, without opening it, a file that is not a regular file (nor a directory:
    ``open`` says so) unless this process has it open already (``/dev/stdin``): a
    named pipe would wait for a writer forever, a device read without end.

    Raises
    ------
    AudioError
        Naming the file and what it is.
    """
    try:
        info = os.stat(name)
    except (OSError, ValueError):  # open() says why, naming the file
        return
    if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
        return
    kind = next((k for test, k in _KINDS if test(info.st_mode)), "not a regular file")
    if _open_here(info):
        return
    raise AudioError(
        name,
        f"{kind}, not a regular file: not opened (it could wait or read forever); "
        "pipe a recording through /dev/stdin instead (cat a.wav | onnx-recurrent vad "
        "/dev/stdin)",
    )


def open_audio(path: str | os.PathLike[str]) -> AudioReader:
    """Open an audio file for reading in blocks as mono float32 at 16 kHz.

    Parameters
    ----------
    path : str or os.PathLike
        A WAV, FLAC or OGG (Vorbis, Opus) file, or any other format libsndfile reads,
        at any sample rate from :data:`MIN_SAMPLE_RATE` Hz, with any number of
        channels; a pipe this process holds open (``/dev/stdin``, ``/dev/fd/N``) is
        read whole into memory first.

    Returns
    -------
    AudioReader
        The open file: its blocks (float32 ``(n,)`` at 16 kHz, at most about
        :data:`BLOCK_SAMPLES` each), its sample rate and channel count.

    Raises
    ------
    AudioError
        (a ``ValueError``) If the file is not audio that libsndfile can decode, is
        shorter than its header says (a WAV or AIFF cut off: libsndfile would read
        what is there as the whole recording), or its sample rate is below
        :data:`MIN_SAMPLE_RATE`; or, without opening it, if it is a named pipe
        (FIFO), socket or device that this process does not hold open (opening a
        FIFO waits for a writer, forever); the message names the file and the
        reason.
    OSError
        If the file cannot be opened (``FileNotFoundError``, ``PermissionError``,
        ``IsADirectoryError``); ``filename`` names it.
    ImportError
        If soundfile (or, for a file not at 16 kHz, soxr) is not installed; the
        message names the extra.
    """
    soundfile = load_soundfile()
    name = os.fspath(path)
    _check_kind(name)
    errors = (soundfile.SoundFileError, EOFError, RuntimeError, ValueError)
    # opened here, so that OSError names the file and any name's bytes work
    file: BinaryIO = open(name, "rb")  # the reader owns it
    try:
        if not file.seekable():  # a pipe (/dev/stdin, <(...)): libsndfile seeks, so whole
            with file:
                file = io.BytesIO(file.read())
        try:
            sound = soundfile.SoundFile(file)
        except errors as e:
            why = one_line(e, typed=False, named=False)
            raise AudioError(str(name), f"not a readable audio file ({why})") from None
        short = _TRUNCATED.search(getattr(sound, "extra_info", "") or "")
        if short and int(short[2]) < int(short[1]) < _UNKNOWN_LENGTH:
            sound.close()
            raise AudioError(
                str(name),
                f"truncated: its header gives {short[1]} bytes of samples, the file holds "
                f"{short[2]}",
            )
        if sound.samplerate < MIN_SAMPLE_RATE:
            sound.close()
            raise AudioError(
                str(name),
                f"sample rate {sound.samplerate} Hz in its header, below the "
                f"{MIN_SAMPLE_RATE} Hz the VAD reads (no speech band there; a damaged "
                "header?)",
            )
        try:
            return AudioReader(str(name), file, sound, errors)
        except BaseException:
            sound.close()
            raise
    except BaseException:
        file.close()
        raise


def read_audio(path: str | os.PathLike[str]) -> Audio:
    """Read a whole audio file as mono float32 samples at 16 kHz.

    The recording is held whole (4 bytes per sample at 16 kHz: 230 MB for 2 h); to
    go through a long one in bounded memory, read it in blocks with
    :func:`open_audio`, as :func:`~onnx_recurrent.tools.vad.detect` does.

    Parameters
    ----------
    path : str or os.PathLike
        A WAV, FLAC or OGG (Vorbis, Opus) file, or any other format libsndfile reads,
        at any sample rate from :data:`MIN_SAMPLE_RATE` Hz, with any number of
        channels; a pipe this process holds open (``/dev/stdin``, ``/dev/fd/N``) is
        read whole into memory first.

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
        (a ``ValueError``) If the file is not audio that libsndfile can decode, is
        shorter than its header says (a WAV or AIFF cut off: libsndfile would read
        what is there as the whole recording), its sample rate is below
        :data:`MIN_SAMPLE_RATE`, or its samples (a float file's) peak past
        :data:`~onnx_recurrent.tools.vad.MAX_SAMPLE_PEAK` (int16 values stored as
        floats: divide them by 32768); or, without opening it, if it is a named
        pipe (FIFO), socket or device that this process does not hold open; the
        message names the file and the reason.
    OSError
        If the file cannot be opened (``FileNotFoundError``, ``PermissionError``,
        ``IsADirectoryError``); ``filename`` names it.
    ImportError
        If soundfile or soxr is not installed; the message names the extra.
    """
    with open_audio(path) as reader:
        blocks = list(reader)
    samples = np.concatenate(blocks) if blocks else np.empty(0, dtype=np.float32)
    return Audio(samples, reader.sample_rate, reader.channels, reader.duration)


def audio_duration(path: str | os.PathLike[str]) -> float | None:
    """The duration in seconds from the file's header, or None if it cannot be read or
    is no regular file (a pipe's header read here would be missing for the run; a
    FIFO's open waits for a writer)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return float(load_soundfile().info(os.fspath(path)).duration)
    except ImportError:
        raise
    except Exception:  # unreadable: the run reports it
        return None


def path_list(paths: Any) -> list[str]:
    """``paths`` (one path, or an iterable of them: str, bytes or ``os.PathLike``) as a
    list of str (bytes decoded as the file system does, undecodable ones kept).

    Raises
    ------
    TypeError
        ``paths`` is neither, or one of its entries is not a path (named by index).
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    elif not isinstance(paths, Iterable):
        raise RecurrentTypeError(
            f"paths must be a path or a list of paths, got {type(paths).__name__}"
        )
    files = []
    for i, path in enumerate(paths):
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise RecurrentTypeError(
                f"paths[{i}] must be a path (str, bytes or os.PathLike), got {type(path).__name__}"
            )
        files.append(os.fsdecode(path))
    return files


def find_audio_files(paths: str | os.PathLike[str] | list[Any] | tuple[Any, ...]) -> list[str]:
    """Expand directories into the audio files under them.

    Parameters
    ----------
    paths : path or sequence of paths
        Files (kept as given, whatever their suffix, existing or not: reading them
        later reports what is wrong) and directories (walked recursively for files
        whose suffix is one of :data:`AUDIO_SUFFIXES`, any case, sorted: whatever is
        not a directory, broken links, FIFOs and sockets included, which reading
        reports); str, bytes or ``os.PathLike``.

    Returns
    -------
    list of str
        The files, in the order given, each directory's files in its place.

    Raises
    ------
    TypeError
        ``paths`` or one of its entries is not a path (:func:`path_list`).
    """
    files: list[str] = []
    for name in path_list(paths):
        if os.path.isdir(name):
            found = (
                p
                for p in Path(name).rglob("*")
                if p.suffix.lower() in AUDIO_SUFFIXES and not p.is_dir()
            )  # a broken link, a FIFO, a socket kept: reading it says what it is
            files.extend(sorted(str(p) for p in found))
        else:
            files.append(name)
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
