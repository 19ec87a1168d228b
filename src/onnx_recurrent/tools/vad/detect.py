"""The face of the VAD: files and directories in, ``(path, segments or error)`` out.

:func:`detect` walks the directories given, checks the segment options, and runs the
files in this process (:func:`~onnx_recurrent.tools.vad.files.detect_files`, batched) or,
given a Dask client, on its workers (:func:`~onnx_recurrent.tools.vad.cluster.detect`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ...errors import RecurrentError
from .audio import find_audio_files
from .files import Paths, Segments, detect_files
from .segments import check_segment_options


def detect(
    paths: Paths,
    *,
    client: Any = None,
    batch: int = 64,
    host: str = "auto",
    model_path: str | os.PathLike[str] | None = None,
    group_size: int | None = None,
    retries: int | None = None,
    **segment_options: Any,
) -> Iterator[tuple[str, Segments | Exception]]:
    """Find the speech in audio files and directories, here or on a Dask cluster.

    Parameters
    ----------
    paths : path or iterable of paths
        Audio files (WAV, FLAC, OGG, any rate and channel count) and directories,
        walked for files ending in ``.wav``, ``.flac`` or ``.ogg`` (sorted).
    client : distributed.Client, optional
        Spread the files over this client's workers
        (:func:`onnx_recurrent.tools.vad.cluster.detect`). Default: run here
        (:func:`~onnx_recurrent.tools.vad.detect_files`).
    batch : int, default 64
        The most recordings in one model call (per worker with a client).
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the model graph's other nodes.
    model_path : path, optional
        The Silero model; default: the installed ``silero-vad``'s (on each worker,
        with a client).
    group_size, retries : int, optional
        With a client only: files per task and a failed task's retries
        (:func:`onnx_recurrent.tools.vad.cluster.detect`'s defaults).
    **segment_options
        Options of :func:`~onnx_recurrent.tools.vad.speech_segments`, silero's
        ``get_speech_timestamps`` names and defaults: ``threshold=0.5``,
        ``min_speech_duration_ms=250``, ``min_silence_duration_ms=100``,
        ``speech_pad_ms=30``, ...

    Returns
    -------
    iterator of (str, list of (float, float) or Exception)
        Per file, in input order (a directory's files in its place): the path and its
        speech segments in seconds, or the exception that made it fail.

    Raises
    ------
    TypeError, ValueError
        At the call, for an unknown or bad option (``group_size`` or ``retries``
        without a client); with a client, a closed one or workers that lack
        onnx_recurrent (or have another version), named.

    Examples
    --------
    >>> from onnx_recurrent import vad
    >>> for path, found in vad.detect(["calls/"]):  # doctest: +SKIP
    ...     print(path, found)
    calls/a.flac [(0.738, 2.206), (3.074, 4.222)]
    calls/b.ogg [Errno 2] No such file or directory: 'calls/b.ogg'
    """
    files = find_audio_files(paths)
    options = check_segment_options(segment_options)
    tasks = {k: v for k, v in (("group_size", group_size), ("retries", retries)) if v is not None}
    if client is None:
        if tasks:
            raise RecurrentError(
                f"{' and '.join(tasks)} cut the files into a client's tasks: give a client"
            )
        return detect_files(files, batch=batch, host=host, model_path=model_path, **options)
    from . import cluster

    return cluster.detect(
        client, files, batch=batch, host=host, model_path=model_path, **tasks, **options
    )
