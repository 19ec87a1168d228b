"""Silero VAD over many files on a Dask (``distributed``) cluster.

:func:`detect` cuts the files into groups, one task each:
:func:`~onnx_recurrent.tools.vad.files.detect_files` on a worker, batched, through a
session over the model made once per worker process and kept there
(:func:`onnx_recurrent.tools.workers.kept_session`). Results come back as groups finish
and are yielded in input order. A worker that dies mid-run costs nothing: the scheduler
runs its groups elsewhere, and every file is yielded exactly once.
:func:`onnx_recurrent.tools.vad.detect` with ``client=`` calls it; ``distributed`` is
imported only then.

Examples
--------
>>> from distributed import Client
>>> from onnx_recurrent import vad
>>> client = Client(n_workers=2, threads_per_worker=1)  # doctest: +SKIP
>>> for path, segments in vad.detect(paths, client=client):  # doctest: +SKIP
...     print(path, segments)
"""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import RecurrentError, import_optional
from ...runtime.hosts import HOSTS
from ..workers import INSTALL_HINT, check_client, kept_session, session_options
from . import files
from .audio import path_list
from .model import silero_model_path
from .segments import check_segment_options

__all__ = ["detect"]


def _vad_session(model_path: str | None, host: str) -> Any:
    """This worker's session over the Silero model, made on first use and kept.

    onnxruntime runs it on one thread: a worker's parallelism is its Dask threads
    (each running a group), as Dask's nannies set ``OMP_NUM_THREADS=1``.
    """

    def make() -> Any:
        from ...runtime.session import InferenceSession

        path = silero_model_path() if model_path is None else model_path
        options = None
        if host != "reference" and importlib.util.find_spec("onnxruntime") is not None:
            try:
                options = session_options(
                    ((("intra_op_num_threads", 1), ("inter_op_num_threads", 1)), ())
                )
            except Exception:  # installed, failing to import: the session says what
                pass  # follows (auto: the reference host, as in one process)
        return InferenceSession(path, options, host=host)

    return kept_session(("vad", model_path, host), make)


def _picklable(value: Any) -> Any:
    """A file's error as it can travel back to the client (else its text, as such)."""
    if not isinstance(value, BaseException):
        return value
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return RuntimeError(f"{type(value).__name__}: {value}")
    return value


def _detect_group(
    paths: list[str],
    batch: int,
    host: str,
    model_path: str | None,
    segment_options: dict[str, Any],
) -> list[tuple[str, Any]]:
    """One group of files on a worker: ``(path, segments or error)`` each, in order."""
    found = files.detect_files(
        paths,
        batch=batch,
        session=_vad_session(model_path, host),
        **segment_options,
    )
    return [(path, _picklable(value)) for path, value in found]


def detect(
    client: Any,
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    batch: int = 64,
    host: str = "auto",
    model_path: str | os.PathLike[str] | None = None,
    group_size: int | None = None,
    retries: int = 1,
    **segment_options: Any,
) -> Iterator[tuple[str, Any]]:
    """Find the speech in audio files on a Dask cluster; results in input order.

    The files are cut into groups (consecutive in input order) and each group is one
    task: :func:`onnx_recurrent.tools.vad.detect_files` on a worker, batched, through a
    session over the model made once per worker process and kept there. Groups run as
    workers free up; their results are yielded as soon as every earlier file's are.

    A worker that dies mid-run costs nothing: the scheduler runs its groups on another
    worker (or the one its nanny restarts), and every file is yielded exactly once. A
    group whose task fails as a whole (after ``retries``; or whose workers keep dying,
    Dask's ``KilledWorker``) yields that error for each of its files; the other groups
    complete.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    paths : path or iterable of paths
        Audio files (directories are not walked here: :func:`onnx_recurrent.tools.vad.detect`
        walks them). The workers get them as absolute paths, which must name the same
        files on their machines (a shared file system); they are yielded as given.
    batch : int, default 64
        The most recordings in one model call, on each worker.
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the model graph's other nodes.
    model_path : path, optional
        The Silero model (made absolute, as the files); default: each worker's
        installed ``silero-vad``'s.
    group_size : int, optional
        Files per task. Default: about four groups per worker thread, at most
        ``batch`` files each (smaller groups spread better and cost less when a
        worker dies; larger ones batch more recordings per model call).
    retries : int, default 1
        How many times Dask reruns a group whose task raised.
    **segment_options
        Options of :func:`onnx_recurrent.tools.vad.speech_segments` (silero's
        ``get_speech_timestamps`` names and defaults), checked here.

    Returns
    -------
    iterator of (str, list of (float, float) or Exception)
        Per file, in input order: the path and its speech segments (start, end in
        seconds), or the exception that made it fail.

    Raises
    ------
    TypeError, ValueError
        At the call: an unknown or bad segment option, a ``batch``, ``group_size`` or
        ``retries`` that is not a positive (non-negative for ``retries``) int; a
        closed client, or workers that lack onnx_recurrent or have another version
        of it (named; :func:`~onnx_recurrent.tools.workers.check_client`), whose
        groups would wait forever.
    ModuleNotFoundError
        ``distributed`` is not installed.

    Notes
    -----
    The workers' sessions run onnxruntime on one thread; for the recurrent nodes to
    use one thread too, start the workers with ``ONNX_RECURRENT_NUM_THREADS=1`` (for a
    local cluster: ``LocalCluster(..., env={"ONNX_RECURRENT_NUM_THREADS": "1"})``).
    The results come back to the client as each group ends; the iterator holds those
    that wait for an earlier group. Stopping the iteration cancels the groups not done.
    """
    distributed = import_optional(
        "distributed", "onnx_recurrent.vad on a Dask cluster", INSTALL_HINT
    )
    options = check_segment_options(segment_options)
    for name, value, least in (("batch", batch, 1), ("retries", retries, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RecurrentError(f"{name} must be an int >= {least}, got {value!r}")
    if host not in HOSTS:
        raise RecurrentError(f"host must be one of {list(HOSTS)}, got {host!r}")
    files = path_list(paths)
    check_client(client)  # closed, or workers that would never run a group
    if group_size is None:
        threads = max(1, sum(client.nthreads().values()))
        group_size = max(1, min(batch, math.ceil(len(files) / (4 * threads))))
    elif isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise RecurrentError(f"group_size must be an int >= 1, got {group_size!r}")
    groups = [files[i : i + group_size] for i in range(0, len(files), group_size)]
    model = None if model_path is None else os.path.abspath(model_path)
    run_id = uuid.uuid4().hex
    futures = [
        client.submit(
            _detect_group,
            [os.path.abspath(p) for p in group],  # the workers' working folder may differ
            batch,
            host,
            model,
            options,
            key=f"onnx-recurrent-vad-{run_id}-{index}",
            retries=retries,
        )
        for index, group in enumerate(groups)
    ]
    return _in_input_order(distributed, futures, groups)


def _in_input_order(
    distributed: Any, futures: list[Any], groups: list[list[str]]
) -> Iterator[tuple[str, Any]]:
    """Each group's results as it completes, yielded in input order, each file once."""
    index = {future.key: i for i, future in enumerate(futures)}
    done: dict[int, list[tuple[str, Any]]] = {}
    next_group = 0
    try:
        for future in distributed.as_completed(futures):
            i = index[future.key]
            if i in done or i < next_group:  # a group reported twice: already counted
                continue
            done[i] = _group_results(future, groups[i])
            futures[i] = None  # let the cluster forget it
            while next_group in done:
                yield from done.pop(next_group)
                next_group += 1
    finally:
        pending = [f for f in futures if f is not None and not f.done()]
        if pending:  # the caller stopped early
            pending[0].client.cancel(pending)


def _group_results(future: Any, group: list[str]) -> list[tuple[str, Any]]:
    try:
        found = future.result()
    except Exception as e:  # the task failed after its retries, or its workers kept dying
        return [(path, e) for path in group]
    results = []
    for k, path in enumerate(group):
        if k < len(found) and found[k][0] == os.path.abspath(path):
            results.append((path, found[k][1]))
        else:
            results.append((path, RuntimeError(f"{path}: no result came back for this file")))
    return results
