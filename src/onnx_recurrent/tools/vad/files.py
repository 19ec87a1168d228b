"""Speech segments of many audio files in this process, batched.

:func:`detect_files` runs the files given (decoded in order by a second thread, block
by block just ahead of the model, and joining the batch as rows free up; the model
called once per chunk position for up to ``batch`` recordings): ``(path, segments or
error)`` out, in the order given. :func:`analyse_files` is the same run with the
probabilities and durations too (the command line's plots and progress use them).
:func:`onnx_recurrent.tools.vad.detect` walks directories and runs here or on a Dask
cluster (:mod:`onnx_recurrent.tools.vad.cluster`, which runs :func:`detect_files` on
each worker).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .audio import AudioReader, load_soundfile, open_audio, path_list
from .model import MODEL_RATE, open_session
from .segments import check_segment_options, speech_segments
from .streams import stream_probabilities

Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
Segments = list[tuple[float, float]]

#: Errors that make one file fail without stopping the others (reading it): any
#: ``Exception`` (an unreadable file, a ``MemoryError``...), not Ctrl-C.
FILE_ERRORS = (Exception,)
#: Files opened ahead of the model, each with its first block decoded
#: (:data:`~onnx_recurrent.tools.vad.audio.BLOCK_SAMPLES` samples at most).
READ_AHEAD = 4


@dataclass
class FileResult:
    """What a run found in one file."""

    #: The file, as given (or as found under a directory given).
    path: str
    #: ``(start, end)`` of each speech segment in seconds; None if the file failed.
    segments: Segments | None = None
    #: Why the file failed (an ``OSError``, ``ValueError``, ``MemoryError``... any
    #: ``Exception``); None if it did not.
    error: BaseException | None = None
    #: The recording's length in seconds (0 if it failed).
    duration: float = 0.0
    #: float32 ``(num_chunks,)``: the speech probability of each 32 ms chunk at 16 kHz.
    probabilities: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))


def analyse_files(
    paths: Paths,
    *,
    batch: int = 64,
    host: str = "auto",
    model_path: str | os.PathLike[str] | None = None,
    session: Any = None,
    progress: Callable[[float], None] | None = None,
    **segment_options: Any,
) -> Iterator[FileResult]:
    """Find the speech in audio files in this process, batched; results in input order.

    Parameters
    ----------
    paths : path or iterable of paths
        Audio files (WAV, FLAC, OGG; any rate from 4000 Hz, any channels: see
        :func:`~onnx_recurrent.tools.vad.open_audio`), taken as given: directories are not
        walked here (:func:`~onnx_recurrent.tools.vad.detect` walks them).
    batch : int, default 64
        The most recordings in one model call (fewer where the open-files limit,
        ``ulimit -n``, allows fewer files open at once).
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the model graph's other nodes (:class:`onnx_recurrent.InferenceSession`).
    model_path : path, optional
        The Silero model. Default: the installed ``silero-vad``'s.
    session : object, optional
        A session over the model to use instead of making one (then ``host`` and
        ``model_path`` are not used).
    progress : callable, optional
        Called with seconds of audio as they are processed.
    **segment_options
        Options of :func:`~onnx_recurrent.tools.vad.speech_segments` (silero's
        ``get_speech_timestamps`` names: ``threshold``, ``min_speech_duration_ms``,
        ``min_silence_duration_ms``, ``speech_pad_ms``, ...).

    Returns
    -------
    iterator of FileResult
        One per file, in the order of ``paths``; a file that fails (whatever the
        exception: unreadable, a bad header, a ``MemoryError``, at its start or
        halfway) has its ``error`` set and the others complete.

    Raises
    ------
    TypeError, ValueError
        At the call, for an unknown or bad option or ``batch``.
    ModuleNotFoundError
        At the call, if ``silero-vad`` (for the model) or soundfile is missing.

    Notes
    -----
    Each file is decoded and resampled in blocks (:func:`~onnx_recurrent.tools.vad.open_audio`)
    as the model consumes it, so memory does not grow with the recordings' length: at
    most ``batch`` recordings in the model's batch and :data:`READ_AHEAD` opened ahead,
    each holding about two blocks of :data:`~onnx_recurrent.tools.vad.audio.BLOCK_SAMPLES`
    float32 samples (32 KiB each) and, for a file not at 16 kHz, a soxr resampler
    (about 0.2 MB), plus its probabilities so far (4 bytes per 32 ms chunk: 0.45 MB per
    hour of audio).
    """
    options = check_segment_options(segment_options)
    files = path_list(paths)
    if session is None:
        session = open_session(model_path, host)
    load_soundfile()  # fail now, naming the extra, rather than once per file
    # checks batch and the model's inputs now
    stream_probabilities(session, [], batch=batch).close()
    return _analysed(files, session, _batch_for_open_files(batch), progress, options)


#: file descriptors kept free for the rest of the process (a run's interrupt pipe, a
#: model or cache file, the output)
SPARE_FILES = 16


def _batch_for_open_files(batch: int) -> int:
    """``batch``, made smaller where the process may not open that many files at once
    (``ulimit -n``): each recording in the batch and each of :data:`READ_AHEAD` holds
    one open file. The results do not depend on the batch.

    Raises
    ------
    OSError
        ``EMFILE``, if the limit leaves no room for even one recording.
    """
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        used = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (ImportError, OSError):  # not POSIX: no such limit to read
        return batch
    if soft == resource.RLIM_INFINITY:
        return batch
    room = soft - used - SPARE_FILES - READ_AHEAD
    if room < 1:
        raise OSError(
            errno.EMFILE,
            f"this process may open {soft} files (ulimit -n) and has {used} open: too "
            f"few to read recordings; allow at least {used + SPARE_FILES + READ_AHEAD + 1}",
        )
    return min(batch, room)


def _analysed(
    files: list[str],
    session: Any,
    batch: int,
    progress: Callable[[float], None] | None,
    options: dict[str, Any],
) -> Iterator[FileResult]:
    """The run of :func:`analyse_files`: a reader thread, the batched streams, results
    in order."""
    results: dict[int, FileResult] = {}
    readers: dict[int, AudioReader] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="onnx-recurrent-vad-read") as reader:
        opened = _opened(files, reader)

        def recordings() -> Iterator[tuple[int, _Blocks]]:
            for index, (path, blocks) in enumerate(zip(files, opened, strict=True)):
                if isinstance(blocks, BaseException):
                    results[index] = FileResult(path, error=blocks)
                    continue
                results[index] = FileResult(path)
                readers[index] = blocks.audio
                yield index, blocks

        streams = stream_probabilities(
            session, recordings(), batch=batch, progress=progress, return_errors=True
        )
        try:
            yield from _in_order(streams, results, readers, options, len(files))
        finally:  # ended or closed early (an error, Ctrl-C): close every file, stop reading
            streams.close()
            opened.close()


class _Blocks:
    """A file's blocks, each next one decoded by the reader thread while the model
    consumes this one (so decoding and resampling overlap the model calls: soundfile
    and soxr release the GIL). Closes the file at its end, on its error, or on
    :meth:`close`."""

    def __init__(self, audio: AudioReader, first: np.ndarray | None, reader: Any) -> None:
        self.audio = audio
        self._reader = reader
        self._first = first
        self._next: Future[np.ndarray | None] | None = None
        if first is not None:
            self._next = reader.submit(audio.read_block)

    def __iter__(self) -> _Blocks:
        return self

    def __next__(self) -> np.ndarray:
        if self._first is not None:
            block, self._first = self._first, None
            return block
        if self._next is None:
            self.close()
            raise StopIteration
        future, self._next = self._next, None
        try:
            block = future.result()
        except BaseException:
            self.close()
            raise
        if block is None:
            self.close()
            raise StopIteration
        self._next = self._reader.submit(self.audio.read_block)
        return block

    def close(self) -> None:
        """Stop reading (waiting for a block being decoded) and close the file."""
        self._first = None
        future, self._next = self._next, None
        if future is not None and not future.cancel():
            wait([future])
        self.audio.close()


def _open(path: str) -> tuple[AudioReader, np.ndarray | None] | BaseException:
    """Open a file and decode its first block, in the reader thread; or its error."""
    try:
        audio = open_audio(path)
    except FILE_ERRORS as e:
        return e
    try:
        return audio, audio.read_block()
    except FILE_ERRORS as e:
        audio.close()
        return e


def _opened(files: list[str], reader: Any) -> Iterator[_Blocks | BaseException]:
    """Each file opened (its :class:`_Blocks`) or its error, in order, opened ahead.

    The reader thread opens up to :data:`READ_AHEAD` files ahead of the consumer,
    each with its first block decoded.
    """
    pending: deque[Future[tuple[AudioReader, np.ndarray | None] | BaseException]] = deque()

    def take() -> _Blocks | BaseException:
        done = pending.popleft().result()
        if isinstance(done, BaseException):
            return done
        return _Blocks(*done, reader)

    try:
        for path in files:
            pending.append(reader.submit(_open, path))
            if len(pending) > READ_AHEAD:
                yield take()
        while pending:
            yield take()
    finally:  # closed early: drop what was not started, close what was opened
        for future in pending:
            if not future.cancel():
                done = future.result()
                if not isinstance(done, BaseException):
                    done[0].close()


def _in_order(
    streams: Iterator[tuple[int, Any]],
    results: dict[int, FileResult],
    readers: dict[int, AudioReader],
    options: dict[str, Any],
    count: int,
) -> Iterator[FileResult]:
    """Segments for each recording as it ends; results released in input order."""
    next_index = 0
    for index, probs in streams:
        result = results[index]
        audio = readers.pop(index)
        if isinstance(probs, BaseException):  # failed halfway
            result.error = probs
        else:
            result.probabilities = probs
            result.duration = audio.duration
            result.segments = speech_segments(
                probs, MODEL_RATE, num_samples=audio.samples, **options
            )
        # Release every result known from the head on (failed files are known as soon
        # as the reader has passed them).
        while next_index in results and (
            results[next_index].segments is not None or results[next_index].error is not None
        ):
            yield results.pop(next_index)
            next_index += 1
    while next_index < count:  # the rest: all known now
        yield results.pop(next_index)
        next_index += 1


def detect_files(
    paths: Paths,
    *,
    batch: int = 64,
    host: str = "auto",
    model_path: str | os.PathLike[str] | None = None,
    session: Any = None,
    **segment_options: Any,
) -> Iterator[tuple[str, Segments | Exception]]:
    """Find the speech in audio files in this process, batched.

    Parameters
    ----------
    paths : path or iterable of paths
        Audio files (directories are not walked here;
        :func:`~onnx_recurrent.tools.vad.detect` walks them).
    batch, host, model_path, session, **segment_options
        As for :func:`analyse_files` (``session``: one made beforehand and reused,
        as each Dask worker does).

    Returns
    -------
    iterator of (str, list of (float, float) or Exception)
        Per file, in the order given: its path and its speech segments (start, end in
        seconds), or the exception that made it fail (``OSError``, ``ValueError``
        such as :class:`~onnx_recurrent.tools.vad.AudioError`, ``MemoryError``... any
        ``Exception``); the other files complete.

    Raises
    ------
    TypeError, ValueError, ModuleNotFoundError
        At the call, as :func:`analyse_files`.
    """
    results = analyse_files(
        paths, batch=batch, host=host, model_path=model_path, session=session, **segment_options
    )
    return ((r.path, r.error if r.error is not None else r.segments) for r in results)
