"""Any ONNX model over Dask arrays chunked on their batch axis.

A tool: it imports the library, nothing in the library imports it, and ``dask`` is
imported here only, when :func:`run` is called.

:func:`run` scores any ONNX model over Dask arrays chunked along their batch axis and
returns Dask arrays of its outputs, chunked the same way. Each block runs through an
:class:`~onnx_recurrent.InferenceSession` made once per worker process and kept there
(keyed by the model's hash, the host and the session options:
:mod:`onnx_recurrent.tools.workers`); the model's bytes are one key of the graph, so
Dask sends them to a worker once.

Silero VAD on a cluster is the vad tool's: ``vad.detect(paths, client=client)``
(:mod:`onnx_recurrent.tools.vad.cluster`). ``detect`` here, its old path, is that
module's :func:`~onnx_recurrent.tools.vad.cluster.detect` (the same function).

Examples
--------
>>> import dask.array as da, numpy as np
>>> from onnx_recurrent import dask as ordask
>>> x = da.from_array(X, chunks=(-1, 64, -1))  # doctest: +SKIP
>>> Y, Y_h = ordask.run("lstm.onnx", {"X": x}, {"X": 1})  # doctest: +SKIP
>>> Y.compute()  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import RecurrentError, RecurrentTypeError, import_optional
from .workers import INSTALL_HINT, check_client, kept_session, options_record, session_options

__all__ = ["run"]


def _session(model: bytes, key: tuple[str, str, tuple | None]) -> Any:
    """This process's session over the model, made on first use and kept.

    ``key`` is ``(the model's sha256, host, options record)``.
    """
    _, host, options = key

    def make() -> Any:
        from ..runtime.session import InferenceSession

        return InferenceSession(model, session_options(options), host=host)

    return kept_session(key, make)


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
    twice: bool,
    *firsts: np.ndarray,
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]] | None, list[str]]:
    """The outputs' shapes for ``firsts`` (the first batch element, or a model's fixed
    batch), then, where ``twice``, for two copies of it (None if not), and dtypes.

    Raises
    ------
    ValueError
        An output that is not a tensor (a sequence or a map), naming it.
    """
    session = _session(model, key)
    one = session.run(None, _feeds(static, names, firsts))
    for arg, y in zip(session.get_outputs(), one, strict=True):
        if not isinstance(y, np.ndarray):
            raise RecurrentError(
                f"output {arg.name!r} is a {arg.type} ({type(y).__name__}), not a tensor: "
                "dask.run splits tensor outputs over the batch only"
            )
    two = None
    if twice:
        twos = [np.concatenate([x, x], axis=a) for x, a in zip(firsts, axes, strict=True)]
        two = [y.shape for y in session.run(None, _feeds(static, names, twos))]
    return [y.shape for y in one], two, [y.dtype for y in one]


def _run_block(
    model: bytes,
    key: tuple[str, str, tuple | None],
    static: Mapping[str, np.ndarray],
    names: Sequence[str],
    out: Sequence[tuple[str, int, tuple[int, ...]]],
    start: int,
    size: int,
    *blocks: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """One block of the batch (rows ``start`` to ``start + size - 1``) through this
    process's session; an error of the session says which rows.

    ``out`` is each output's name, batch axis and shape as the probe had it: a block's
    output must have that shape but ``size`` along its batch axis, as the Dask array
    declares it (else its other dims depend on the data or on the batch).
    """
    where = f"the block of batch rows {start}..{start + size - 1}"
    try:
        results = _session(model, key).run(None, _feeds(static, names, blocks))
    except (RecurrentError, RecurrentTypeError) as e:  # indices in it are the block's
        raise type(e)(f"{where} (indices below count from {start}): {e}") from None
    except Exception as e:
        if hasattr(e, "add_note"):
            e.add_note(f"onnx_recurrent.dask.run: in {where}")
        raise
    for (name, axis, probed), y in zip(out, results, strict=True):
        want = tuple(size if k == axis else n for k, n in enumerate(probed))
        if y.shape == want:
            continue
        if len(y.shape) != len(want) or any(
            a != b for k, (a, b) in enumerate(zip(y.shape, want, strict=True)) if k != axis
        ):
            raise RecurrentError(
                f"output {name!r} has a dim that depends on the data or on the batch: "
                f"shape {list(y.shape)} for a block of {size}, where the first batch "
                f"element gave {list(probed)} (batch axis {axis}); such an output cannot "
                "be split over batches"
            )
        raise RecurrentError(
            f"output {name!r}: {y.shape[axis]} along its batch axis {axis} for a block "
            f"of {size} (shape {list(y.shape)}); give its batch axis in output_batch_axes"
        )
    return tuple(results)


# --- the client ---------------------------------------------------------------------------


def _current_client() -> Any:
    """The ``distributed.Client`` dask computes with now (a default client, or one
    set as the scheduler), else None."""
    from dask.base import get_scheduler

    get = get_scheduler()
    client = getattr(get, "__self__", None)
    return client if type(client).__name__ == "Client" else None


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
        One value per graph input (and, where wanted, per initializer that is also a
        graph input: a default the feed overrides). The inputs named in ``batch_axes``
        are Dask arrays; the others are arrays (NumPy, or lists, read in the input's
        element type as the session reads them) given whole to every block, copied at
        the call.
    batch_axes : dict of str to int
        The batch axis of each batched input (``{"X": 1, "initial_h": 1}`` for an LSTM
        of layout 0). Their chunks along it must agree; their other axes are made one
        chunk each (a block holds whole sequences).
    output_batch_axes : dict of str to int, optional
        The batch axis of an output. By default it is found by running the model on the
        first batch element and on two copies of it (where this runs, see Notes): the
        axis whose size follows the batch. Given, it is checked there. Every other axis
        of an output must keep the size it has for the first element, in every block.
        A model that fixes its batch (a declared dim, say 1) takes blocks of that size
        only; it runs once on the first block, and each output's batch axis is the one
        ONNX shape inference finds carrying the batch (else it must be given here).
    host : {"auto", "onnxruntime", "reference"}, default "auto"
        Who runs the graph (see :class:`~onnx_recurrent.InferenceSession`).
    sess_options : onnxruntime.SessionOptions, optional
        For the onnxruntime host; what onnxruntime lets one read back (its
        attributes: threads, optimisation level...; its configuration entries: spin,
        denormals...) is carried to the workers, as the host copies it. On
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
        size than a block's, an empty batch, an output whose batch axis cannot be found,
        an output that is not a tensor (a sequence, a map),
        a Dask array of chunks of unknown size (``compute_chunk_sizes()`` first); an
        output with another dim that follows the batch (``[N, N]``).
    TypeError
        An axis that is not an int; ``batch_axes`` or ``output_batch_axes`` not a dict;
        ``sess_options`` not an ``onnxruntime.SessionOptions``.
    ModuleNotFoundError
        ``dask`` is not installed.
    onnx_recurrent.errors.RecurrentError
        ``sess_options`` hold execution providers (they cannot be read back). At the
        call, under a ``distributed`` client
        (:func:`onnx_recurrent.tools.workers.check_client`): it is closed, or
        workers lack onnx_recurrent or have another version (named). When a block is
        computed (a ``ValueError`` too): an output whose shape is not the declared
        one (a dim that depends on the data, say the longest length in the block),
        naming the output and both shapes; the Dask array's shape would be wrong. A
        block's error from the session is of its own class, and says which rows of the
        batch the block holds (indices in the message count from its first).

    Notes
    -----
    Output shapes are learnt by one small task computed at once (the first batch
    element through the model, then two copies of it) with dask's current scheduler:
    under a ``distributed`` client it runs on a worker, whose session is then ready
    for the blocks. A client once closed is no longer dask's default: then the task
    runs here, as ``dask.compute`` would.
    """
    dask = import_optional("dask", "onnx_recurrent.dask", INSTALL_HINT)
    da = import_optional("dask.array", "onnx_recurrent.dask", INSTALL_HINT)
    from ..runtime.session import NodeArg, load_model

    proto = load_model(model)
    data = proto.SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    # an initializer listed as a graph input is a default a feed may override
    inputs = {v.name: NodeArg.of(v) for v in graph.input}
    required = [name for name in inputs if name not in initializers]
    output_names = [v.name for v in graph.output]

    if not isinstance(feeds, Mapping):
        raise TypeError(f"feeds must be a dict of input name to array, got {type(feeds)}")
    unknown = sorted(set(feeds) - set(inputs))
    missing = [name for name in required if name not in feeds]
    if unknown or missing:
        overridable = [name for name in inputs if name in initializers]
        also = f" (and initializers it may override: {overridable})" if overridable else ""
        said = [f"unknown input(s) {unknown}"] if unknown else []
        said += [f"missing input(s) {missing}"] if missing else []
        raise RecurrentError(f"{', '.join(said)}; the model's inputs are {required}{also}")
    declared = {name: arg for name, arg in inputs.items() if name in feeds}
    for what, axes_given in (("batch_axes", batch_axes), ("output_batch_axes", output_batch_axes)):
        if axes_given is not None and not isinstance(axes_given, Mapping):
            raise RecurrentTypeError(
                f"{what} must be a dict of name to axis, e.g. {{'X': 1}}, "
                f"got {type(axes_given).__name__}"
            )
    if not batch_axes:
        raise RecurrentError("batch_axes names no input: give the batch axis of at least one")
    unknown = sorted(set(batch_axes) - set(feeds))
    if unknown:
        raise RecurrentError(f"batch_axes names input(s) {unknown} that feeds does not have")

    names, axes, arrays, fixed_batch = [], [], [], None
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
        if any(math.isnan(size) for sizes in value.chunks for size in sizes):
            raise RecurrentError(
                f"input {name!r} has chunks of unknown size {value.chunks} (as after boolean "
                f"indexing): give {name}.compute_chunk_sizes() instead"
            )
        shape = declared[name].shape
        if shape is not None and len(shape) == value.ndim:
            fixed = shape[axis]
            if isinstance(fixed, int) and fixed > 0:
                if set(value.chunks[axis]) != {fixed}:
                    raise RecurrentError(
                        f"input {name!r}: the model fixes axis {axis} to {fixed} (shape "
                        f"{shape}), so it cannot take blocks of "
                        f"{sorted(set(value.chunks[axis]))}: rechunk it to blocks of "
                        f"{fixed}, or make the dim symbolic in the model"
                    )
                fixed_batch = fixed
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
    static = {n: _static(declared[n], v, n) for n, v in feeds.items() if n not in batch_axes}

    options = options_record(sess_options)
    client = _current_client()
    if client is not None:  # its workers must run our probe: else it waits forever
        check_client(client)
    token = dask.base.tokenize(
        digest, host, options, static, names, axes, [x.name for x in arrays]
    )
    model_key = dask.delayed(data, name=f"onnx-model-{digest[:16]}")
    static_key = dask.delayed(static, name=f"onnx-static-{token}")
    key = (digest, host, options)
    # the first batch element, or the batch a model fixes (every block of that size)
    first = fixed_batch or 1
    firsts = [
        x[tuple(slice(0, first) if i == a else slice(None) for i in range(x.ndim))]
        for x, a in zip(arrays, axes, strict=True)
    ]
    probe = dask.delayed(_probe, pure=True)(
        *(model_key, key, static_key, names, axes, fixed_batch is None),
        *firsts,
        dask_key_name=f"onnx-probe-{token}",
    )
    ((shapes_one, shapes_two, dtypes),) = dask.compute(probe)
    if shapes_two is None:
        assert fixed_batch is not None
        inferred = _inferred_batch_axes(proto, dict(zip(names, axes, strict=True)))
        out_axes = _fixed_output_axes(
            output_names, shapes_one, fixed_batch, inferred, output_batch_axes
        )
    else:
        out_axes = _output_axes(output_names, shapes_one, shapes_two, output_batch_axes)

    outs = list(zip(output_names, out_axes, shapes_one, strict=True))
    pieces: list[list[Any]] = [[] for _ in output_names]
    blocks = [x.to_delayed().reshape(-1) for x in arrays]
    starts = np.cumsum((0, *sizes[:-1]))
    for i, size in enumerate(sizes):
        result = dask.delayed(_run_block, pure=True, nout=len(output_names))(
            *(model_key, key, static_key, names, outs, int(starts[i]), size),
            *[b[i] for b in blocks],
            dask_key_name=f"onnx-run-{token}-{i}",
        )
        for j, (shape, axis, dtype) in enumerate(zip(shapes_one, out_axes, dtypes, strict=True)):
            piece_shape = tuple(size if k == axis else n for k, n in enumerate(shape))
            pieces[j].append(da.from_delayed(result[j], piece_shape, dtype=dtype))
    return [
        da.concatenate(p, axis=axis) if len(p) > 1 else p[0]
        for p, axis in zip(pieces, out_axes, strict=True)
    ]


def _static(arg: Any, value: Any, name: str) -> Any:
    """An input given whole to every block, as the session would take it (a tensor fed
    as a list in its declared element type), copied now: later changes to the caller's
    value do not reach the blocks."""
    from ..runtime.session import feed_array

    if isinstance(value, np.ma.MaskedArray):
        return feed_array(value, value.dtype, name)  # refused: its mask would be ignored
    if not arg.type.startswith("tensor(") or isinstance(value, np.ndarray):
        return np.array(value, copy=True) if isinstance(value, np.ndarray) else value
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        dtype = np.dtype(tensor_dtype_to_np_dtype(arg.elem_type))
    except (KeyError, TypeError):
        return np.asarray(value)
    return np.array(feed_array(value, dtype, name), copy=True)


def _inferred_batch_axes(proto: Any, batched: Mapping[str, int]) -> dict[str, list[int]]:
    """Each output's axes that carry the batch by ONNX shape inference, the batched
    inputs' batch dims made one symbol (for a model that fixes them; empty where
    inference cannot tell)."""
    import onnx

    symbol = "onnx_recurrent_dask_batch"
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    for v in model.graph.input:
        if v.name in batched and v.type.tensor_type.HasField("shape"):
            dim = v.type.tensor_type.shape.dim[batched[v.name]]
            dim.Clear()
            dim.dim_param = symbol
    for v in model.graph.output:  # their declared fixed dims would win
        if v.type.HasField("tensor_type"):
            v.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an op inference does not know: no help, said by the caller
        return {}
    return {
        v.name: [k for k, d in enumerate(v.type.tensor_type.shape.dim) if d.dim_param == symbol]
        for v in model.graph.output
    }


def _given_axes(names: Sequence[str], given: Mapping[str, int] | None) -> dict[str, int]:
    """``output_batch_axes`` (None: none), every name one of the model's outputs."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise RecurrentError(
            f"output_batch_axes names output(s) {unknown}; the model's outputs are {names}"
        )
    return given


def _fixed_output_axes(
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    fixed: int,
    inferred: Mapping[str, list[int]],
    given: Mapping[str, int] | None,
) -> list[int]:
    """Each output's batch axis for a model that fixes its batch to ``fixed`` (every
    block of that size): given (checked), else the one axis shape inference finds
    carrying the batch."""
    given = _given_axes(names, given)
    axes = []
    for name, shape in zip(names, shapes, strict=True):
        candidates = [k for k, n in enumerate(shape) if n == fixed]
        if name in given:
            axis = _axis(name, given[name], len(shape), "output_batch_axes")
            if axis not in candidates:
                raise RecurrentError(
                    f"output {name!r}: axis {axis} is {shape[axis]} (shape {list(shape)}), "
                    f"not the batch of {fixed} the model fixes"
                )
        else:
            found = [k for k in inferred.get(name, []) if k in candidates]
            if len(found) != 1:
                raise RecurrentError(
                    f"output {name!r} (shape {list(shape)}): its batch axis cannot be found, "
                    f"as the model fixes the batch to {fixed} (it cannot be run at another "
                    f"batch to see which axis follows); give it in output_batch_axes (one "
                    f"of axes {candidates})"
                )
            axis = found[0]
        axes.append(axis)
    return axes


def _output_axes(
    names: Sequence[str],
    shapes_one: Sequence[tuple[int, ...]],
    shapes_two: Sequence[tuple[int, ...]],
    given: Mapping[str, int] | None,
) -> list[int]:
    """Each output's batch axis: given, else the one axis that followed the batch."""
    given = _given_axes(names, given)
    axes = []
    for name, one, two in zip(names, shapes_one, shapes_two, strict=True):
        shapes = f"shape {list(one)} at batch 1, {list(two)} at batch 2"
        if len(one) != len(two):
            raise RecurrentError(
                f"output {name!r} has a rank that depends on the batch ({shapes}); such an "
                "output cannot be split over batches"
            )
        following = [k for k, (a, b) in enumerate(zip(one, two, strict=True)) if (a, b) == (1, 2)]
        if name in given:
            axis = _axis(name, given[name], len(one), "output_batch_axes")
            if axis not in following:
                raise RecurrentError(
                    f"output {name!r}: axis {axis} does not follow the batch ({shapes})"
                )
        elif following:
            axis = following[0]  # more than one: refused below
        else:
            raise RecurrentError(
                f"output {name!r}: no axis follows the batch ({shapes}); an output without "
                "a batch axis cannot be split by blocks"
            )
        # the blocks are joined along the batch axis: every other dim must stay put
        moving = [k for k, (a, b) in enumerate(zip(one, two, strict=True)) if k != axis and a != b]
        if moving:
            raise RecurrentError(
                f"output {name!r} has a dim that depends on the batch: axis "
                f"{', '.join(map(str, moving))} besides its batch axis {axis} ({shapes}); "
                "such an output cannot be split over batches"
            )
        axes.append(axis)
    return axes


def __getattr__(name: str) -> Any:
    """``detect``, the old path of VAD on a cluster: the vad tool's
    :func:`onnx_recurrent.tools.vad.cluster.detect` itself."""
    if name == "detect":
        from .vad.cluster import detect

        return detect
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
