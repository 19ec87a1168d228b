"""Dask faces: a model over Dask arrays chunked on the batch axis, and VAD over many files.

A tool: it imports the library, nothing in the library imports it, and ``dask`` (and
``distributed`` for :func:`detect`) are imported here only, when a function is called.

* :func:`run` scores any ONNX model over Dask arrays chunked along their batch axis and
  returns Dask arrays of its outputs, chunked the same way. Each block runs through an
  :class:`~onnx_recurrent.InferenceSession` made once per worker process and kept there
  (keyed by the model's hash, the host and the session options); the model's bytes are
  one key of the graph, so Dask sends them to a worker once.
* :func:`detect` runs Silero VAD (:func:`onnx_recurrent.tools.vad.detect_files`) over many
  recordings on a ``distributed`` cluster: files go to the workers in groups, results
  come back as groups finish and are yielded in input order. A worker that dies
  mid-run costs nothing: the scheduler runs its groups elsewhere, and every file is
  yielded exactly once.

Examples
--------
>>> import dask.array as da, numpy as np
>>> from onnx_recurrent import dask as ordask
>>> x = da.from_array(X, chunks=(-1, 64, -1))  # doctest: +SKIP
>>> Y, Y_h = ordask.run("lstm.onnx", {"X": x}, {"X": 1})  # doctest: +SKIP
>>> Y.compute()  # doctest: +SKIP

>>> from distributed import Client
>>> client = Client(n_workers=2, threads_per_worker=1)  # doctest: +SKIP
>>> for path, segments in ordask.detect(client, paths):  # doctest: +SKIP
...     print(path, segments)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import pickle
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import RecurrentError

__all__ = ["detect", "run"]

_INSTALL_HINT = "pip install dask distributed"

#: onnxruntime ``SessionOptions`` attributes carried to the workers (the object itself
#: does not pickle)
_OPTION_ATTRIBUTES = (
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "enable_profiling",
    "execution_mode",
    "execution_order",
    "graph_optimization_level",
    "inter_op_num_threads",
    "intra_op_num_threads",
    "log_severity_level",
    "log_verbosity_level",
    "logid",
    "optimized_model_filepath",
    "profile_file_prefix",
    "use_deterministic_compute",
)
#: onnxruntime session configuration entries carried to the workers when set
_OPTION_ENTRIES = (
    "session.intra_op.spin_duration_us",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
)
#: sessions kept per worker process, least recently used dropped first
_MAX_SESSIONS = 4
_sessions: OrderedDict[tuple, Any] = OrderedDict()
_sessions_lock = threading.Lock()


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"onnx_recurrent.dask needs {e.name}, which is not installed: {_INSTALL_HINT}",
            name=e.name,
        ) from None


# --- sessions on the workers ------------------------------------------------------------


def _options_record(sess_options: Any) -> tuple | None:
    """The picklable part of onnxruntime ``SessionOptions``: attributes, config entries."""
    if sess_options is None:
        return None
    attributes = tuple(
        (name, getattr(sess_options, name))
        for name in _OPTION_ATTRIBUTES
        if hasattr(sess_options, name)
    )
    entries = []
    for entry in _OPTION_ENTRIES:
        try:
            entries.append((entry, sess_options.get_session_config_entry(entry)))
        except Exception:  # not set: onnxruntime raises
            pass
    return attributes, tuple(entries)


def _session_options(record: tuple | None) -> Any:
    if record is None:
        return None
    import onnxruntime

    attributes, entries = record
    options = onnxruntime.SessionOptions()
    for name, value in attributes:
        setattr(options, name, value)
    for entry, value in entries:
        options.add_session_config_entry(entry, value)
    return options


def _session(model: bytes, key: tuple[str, str, tuple | None]) -> Any:
    """This process's session over the model, made on first use and kept.

    ``key`` is ``(the model's sha256, host, options record)``.
    """
    _, host, options = key

    def make() -> Any:
        from ..runtime.session import InferenceSession

        return InferenceSession(model, _session_options(options), host=host)

    return _kept_session(key, make)


def _kept_session(key: tuple, make: Callable[[], Any]) -> Any:
    """The session kept in this process under ``key``, made by ``make()`` the first
    time; the least recently used beyond :data:`_MAX_SESSIONS` are dropped."""
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = make()
            while len(_sessions) > _MAX_SESSIONS:
                _sessions.popitem(last=False)
        else:
            _sessions.move_to_end(key)
    return session


def _feeds(
    static: Mapping[str, np.ndarray], names: Sequence[str], blocks: Sequence[np.ndarray]
) -> dict[str, np.ndarray]:
    feeds = dict(static)
    feeds.update(zip(names, blocks, strict=True))
    return feeds


def _probe(
    model: bytes,
    key: tuple[str, str, tuple | None],
    static: Mapping[str, np.ndarray],
    names: Sequence[str],
    axes: Sequence[int],
    *firsts: np.ndarray,
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[str]]:
    """The outputs' shapes at batch 1 and 2 (the first element, then twice) and dtypes."""
    session = _session(model, key)
    one = session.run(None, _feeds(static, names, firsts))
    twos = [np.concatenate([x, x], axis=a) for x, a in zip(firsts, axes, strict=True)]
    two = session.run(None, _feeds(static, names, twos))
    return [y.shape for y in one], [y.shape for y in two], [y.dtype.str for y in one]


def _run_block(
    model: bytes,
    key: tuple[str, str, tuple | None],
    static: Mapping[str, np.ndarray],
    names: Sequence[str],
    out: Sequence[tuple[str, int]],
    size: int,
    *blocks: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """One block of the batch through this process's session."""
    results = _session(model, key).run(None, _feeds(static, names, blocks))
    for (name, axis), y in zip(out, results, strict=True):
        if y.shape[axis] != size:
            raise RecurrentError(
                f"output {name!r}: {y.shape[axis]} along its batch axis {axis} for a block "
                f"of {size} (shape {list(y.shape)}); give its batch axis in output_batch_axes"
            )
    return tuple(results)


# --- run: a model over Dask arrays --------------------------------------------------------


def _axis(name: str, axis: Any, ndim: int, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"{what}[{name!r}] must be an int axis, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise RecurrentError(f"{what}[{name!r}] = {axis} is out of range for rank {ndim}")
    return int(axis) % ndim


def run(
    model: str | os.PathLike | bytes | Any,
    feeds: Mapping[str, Any],
    batch_axes: Mapping[str, int],
    *,
    output_batch_axes: Mapping[str, int] | None = None,
    host: str = "auto",
    sess_options: Any = None,
) -> list[Any]:
    """Run a model over Dask arrays chunked along their batch axis.

    Each block of the batch runs through one :class:`~onnx_recurrent.InferenceSession`
    per worker process (made on the worker's first block, then kept), so the result
    equals one session's over the whole batch. The model's bytes are one key of the
    graph: Dask sends them to each worker once, not with every block.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        The model, as :class:`~onnx_recurrent.InferenceSession` takes it.
    feeds : dict of str to dask.array.Array or array_like
        One value per graph input. The inputs named in ``batch_axes`` are Dask arrays;
        the others are arrays (NumPy) given whole to every block.
    batch_axes : dict of str to int
        The batch axis of each batched input (``{"X": 1, "initial_h": 1}`` for an LSTM
        of layout 0). Their chunks along it must agree; their other axes are made one
        chunk each (a block holds whole sequences).
    output_batch_axes : dict of str to int, optional
        The batch axis of an output. By default it is found by running the model on the
        first batch element and on two copies of it (where this runs, see Notes): the
        one axis whose size follows the batch. Give it where that is ambiguous (an
        output with two axes of the batch's size).
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the graph (see :class:`~onnx_recurrent.InferenceSession`).
    sess_options : onnxruntime.SessionOptions, optional
        For the onnxruntime host; its attributes (threads, optimisation level,
        execution mode...) and spin settings are carried to the workers. On
        single-threaded workers, ``intra_op_num_threads = 1`` (and
        ``ONNX_RECURRENT_NUM_THREADS=1`` in the workers' environment) keeps each to
        its core.

    Returns
    -------
    list of dask.array.Array
        The model's outputs in graph order, each chunked along its batch axis as the
        inputs are, the other axes one chunk.

    Raises
    ------
    ValueError
        A missing or unknown input, a batched input that is no Dask array or a Dask
        array without a batch axis, chunks along the batch that differ between inputs
        (the message lists each input's), a model that fixes a batch axis to another
        size than a block's, an empty batch, an output whose batch axis cannot be found.
    TypeError
        An axis that is not an int.
    ModuleNotFoundError
        ``dask`` is not installed.

    Notes
    -----
    Output shapes are learnt by one small task computed at once (the first batch
    element through the model, then two copies of it): under a ``distributed`` client
    it runs on a worker, whose session is then ready for the blocks.
    """
    dask = _require("dask")
    da = _require("dask.array")
    from ..runtime.session import NodeArg, load_model

    proto = load_model(model)
    data = proto.SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    declared = {v.name: NodeArg.of(v) for v in graph.input if v.name not in initializers}
    output_names = [v.name for v in graph.output]

    if not isinstance(feeds, Mapping):
        raise TypeError(f"feeds must be a dict of input name to array, got {type(feeds)}")
    unknown = sorted(set(feeds) - set(declared))
    missing = [name for name in declared if name not in feeds]
    if unknown or missing:
        raise RecurrentError(
            f"unknown input(s) {unknown}, missing input(s) {missing}; "
            f"the model's inputs are {list(declared)}"
        )
    if not batch_axes:
        raise RecurrentError("batch_axes names no input: give the batch axis of at least one")
    unknown = sorted(set(batch_axes) - set(feeds))
    if unknown:
        raise RecurrentError(f"batch_axes names input(s) {unknown} that feeds does not have")

    names, axes, arrays = [], [], []
    for name in declared:  # graph order
        value = feeds[name]
        if name not in batch_axes:
            if isinstance(value, da.Array):
                raise RecurrentError(
                    f"input {name!r} is a Dask array without a batch axis: give its axis in "
                    "batch_axes, or pass it as a NumPy array (given whole to every block)"
                )
            continue
        if not isinstance(value, da.Array):
            raise RecurrentError(
                f"input {name!r} has batch axis {batch_axes[name]} but is a "
                f"{type(value).__name__}, not a Dask array (dask.array.from_array)"
            )
        axis = _axis(name, batch_axes[name], value.ndim, "batch_axes")
        shape = declared[name].shape
        if shape is not None and len(shape) == value.ndim:
            fixed = shape[axis]
            if isinstance(fixed, int) and fixed > 0 and set(value.chunks[axis]) != {fixed}:
                raise RecurrentError(
                    f"input {name!r}: the model fixes axis {axis} to {fixed} (shape {shape}), "
                    f"so it cannot take blocks of {sorted(set(value.chunks[axis]))}; make the "
                    "dim symbolic in the model"
                )
        names.append(name)
        axes.append(axis)
        arrays.append(value.rechunk({a: -1 for a in range(value.ndim) if a != axis}))
    chunks = [x.chunks[a] for x, a in zip(arrays, axes, strict=True)]
    if any(c != chunks[0] for c in chunks):
        listed = "; ".join(
            f"{n!r} (axis {a}): {c}" for n, a, c in zip(names, axes, chunks, strict=True)
        )
        raise RecurrentError(
            f"the batched inputs' chunks along their batch axes differ: {listed}; rechunk "
            f"them alike, e.g. x.rechunk({{axis: {chunks[0]}}})"
        )
    sizes = chunks[0]
    if sum(sizes) == 0:
        raise RecurrentError(f"the batch is empty (inputs {names} have 0 along their axis)")
    static = {n: np.asarray(v) for n, v in feeds.items() if n not in batch_axes}

    options = _options_record(sess_options)
    token = dask.base.tokenize(
        digest, host, options, static, names, axes, [x.name for x in arrays]
    )
    model_key = dask.delayed(data, name=f"onnx-model-{digest[:16]}")
    static_key = dask.delayed(static, name=f"onnx-static-{token}")
    key = (digest, host, options)
    firsts = [
        x[tuple(slice(0, 1) if i == a else slice(None) for i in range(x.ndim))]
        for x, a in zip(arrays, axes, strict=True)
    ]
    probe = dask.delayed(_probe, pure=True)(
        model_key, key, static_key, names, axes, *firsts, dask_key_name=f"onnx-probe-{token}"
    )
    ((shapes_one, shapes_two, dtypes),) = dask.compute(probe)
    out_axes = _output_axes(output_names, shapes_one, shapes_two, output_batch_axes)

    outs = list(zip(output_names, out_axes, strict=True))
    pieces: list[list[Any]] = [[] for _ in output_names]
    blocks = [x.to_delayed().reshape(-1) for x in arrays]
    for i, size in enumerate(sizes):
        result = dask.delayed(_run_block, pure=True, nout=len(output_names))(
            *(model_key, key, static_key, names, outs, size),
            *[b[i] for b in blocks],
            dask_key_name=f"onnx-run-{token}-{i}",
        )
        for j, (shape, axis, dtype) in enumerate(zip(shapes_one, out_axes, dtypes, strict=True)):
            piece_shape = tuple(size if k == axis else n for k, n in enumerate(shape))
            pieces[j].append(da.from_delayed(result[j], piece_shape, dtype=np.dtype(dtype)))
    return [
        da.concatenate(p, axis=axis) if len(p) > 1 else p[0]
        for p, axis in zip(pieces, out_axes, strict=True)
    ]


def _output_axes(
    names: Sequence[str],
    shapes_one: Sequence[tuple[int, ...]],
    shapes_two: Sequence[tuple[int, ...]],
    given: Mapping[str, int] | None,
) -> list[int]:
    """Each output's batch axis: given, else the one axis that followed the batch."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise RecurrentError(
            f"output_batch_axes names output(s) {unknown}; the model's outputs are {names}"
        )
    axes = []
    for name, one, two in zip(names, shapes_one, shapes_two, strict=True):
        following = [k for k, (a, b) in enumerate(zip(one, two, strict=True)) if (a, b) == (1, 2)]
        if name in given:
            axis = _axis(name, given[name], len(one), "output_batch_axes")
            if axis not in following:
                raise RecurrentError(
                    f"output {name!r}: axis {axis} does not follow the batch (shape "
                    f"{list(one)} at batch 1, {list(two)} at batch 2)"
                )
        elif len(following) == 1:
            axis = following[0]
        else:
            raise RecurrentError(
                f"output {name!r}: "
                + ("no axis" if not following else f"axes {following}")
                + f" follow the batch (shape {list(one)} at batch 1, {list(two)} at batch 2); "
                + (
                    "an output without a batch axis cannot be split by blocks"
                    if not following
                    else "give its batch axis in output_batch_axes"
                )
            )
        axes.append(axis)
    return axes


# --- detect: Silero VAD over many files on a cluster --------------------------------------


def _vad_session(model_path: str | None, host: str) -> Any:
    """This worker's session over the Silero model, made on first use and kept.

    onnxruntime runs it on one thread: a worker's parallelism is its Dask threads
    (each running a group), as Dask's nannies set ``OMP_NUM_THREADS=1``.
    """

    def make() -> Any:
        from ..runtime.session import InferenceSession
        from .vad.model import silero_model_path

        path = silero_model_path() if model_path is None else model_path
        options = None
        if host != "reference" and importlib.util.find_spec("onnxruntime") is not None:
            options = _session_options(
                ((("intra_op_num_threads", 1), ("inter_op_num_threads", 1)), ())
            )
        return InferenceSession(path, options, host=host)

    return _kept_session(("vad", model_path, host), make)


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
    from .vad import detect_files

    found = detect_files(
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
        ``retries`` that is not a positive (non-negative for ``retries``) int.
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
    distributed = _require("distributed")
    from .vad.segments import check_segment_options

    options = check_segment_options(segment_options)
    for name, value, least in (("batch", batch, 1), ("retries", retries, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RecurrentError(f"{name} must be an int >= {least}, got {value!r}")
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files = [os.fspath(p) for p in paths]
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
