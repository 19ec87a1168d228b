"""The peers: onnxruntime, onnx.reference and OpenVINO, each made lazily where installed.

One maker per peer, for check and bench alike: :func:`onnxruntime_session`,
:func:`reference_evaluator` and :func:`openvino_model` prepare a model once (the bench
then times its calls); :data:`PEERS` runs a model once on each (check, its lint and
trace).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx

from ...held import linux_libc


def onnxruntime_session(model: onnx.ModelProto, threads: int | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` on ``model`` (CPU), its errors raised, not
    logged; ``threads`` intra-op threads (None: :func:`onnxruntime_options`'s). It is
    onnxruntime's own session where a caller has put ours in its place."""
    from ...runtime.hosts.onnxruntime import ort_session_class

    return ort_session_class()(
        model.SerializeToString(), onnxruntime_options(threads), providers=["CPUExecutionProvider"]
    )


def onnxruntime_options(threads: int | None = None) -> Any:
    """The session options of :func:`onnxruntime_session`: ``threads`` intra-op
    threads; None: onnxruntime's default, or this process's CPUs where they are fewer
    than the machine's (its default pool would pin threads to the machine's other
    cores, outside ``taskset``'s mask: :func:`onnx_recurrent.threads.confined_pool_size`)."""
    import onnxruntime as ort

    from ...threads import confined_pool_size

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are reported in the tables, not logged
    count = threads or confined_pool_size()
    if count:
        options.intra_op_num_threads = count
    return options


def reference_evaluator(model: onnx.ModelProto) -> Any:
    """onnx.reference's evaluator: its own operators, recurrent ones included, ``Loop``
    corrected.

    Its ``Loop`` runs zero iterations when ``cond`` is omitted (``runtime/loop.py``): a
    mistake in no recurrent operator, which would otherwise show as this peer differing
    on any such model.
    """
    from onnx.reference import ReferenceEvaluator

    from ...runtime.loop import reference_fixes

    return ReferenceEvaluator(model, new_ops=reference_fixes())


def openvino_model(model: onnx.ModelProto, threads: int | None = None) -> Any:
    """OpenVINO's compiled ``model`` on the CPU at f32 precision; ``threads``: its
    ``INFERENCE_NUM_THREADS`` (None: its default).

    The calling thread's alternate signal stack is kept (:func:`signal_stack_kept`):
    OpenVINO's CPU plugin (2026.4) gives the thread that compiles a stack of its own,
    unmapped when its Core goes and the one before put back: Cores dropped in another
    order than made left the thread's stack unmapped, and the next signal handled on it
    (a Ctrl-C: Python's handlers run on that stack) killed the process with SIGSEGV,
    faulthandler silent. (A Core kept for the process instead hung a forked child's
    first compile.)"""
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    core = ov.Core()
    with signal_stack_kept():
        return core.compile_model(core.read_model(model.SerializeToString()), "CPU", config)


class _stack_t(ctypes.Structure):  # Linux's <signal.h> (macOS's has another order)
    _fields_ = (
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    )


#: libc's ``sigaltstack`` (Linux, where OpenVINO's stack was seen; else None)
_SIGALTSTACK = linux_libc(
    "sigaltstack", (ctypes.POINTER(_stack_t), ctypes.POINTER(_stack_t)), ctypes.c_int
)


@contextlib.contextmanager
def signal_stack_kept() -> Iterator[None]:
    """The calling thread's alternate signal stack (``sigaltstack``) as it was before
    the block, put back after it, whatever the block set."""
    if _SIGALTSTACK is None:
        yield
        return
    before = _stack_t()
    if _SIGALTSTACK(None, ctypes.byref(before)) != 0:
        yield
        return
    try:
        yield
    finally:
        before.ss_flags &= ~1  # SS_ONSTACK: a flag it reports, not one to set
        _SIGALTSTACK(ctypes.byref(before), None)


#: operators on which onnxruntime (1.32) ends the process (``std::terminate``: SIGABRT)
#: when given a batch or a sequence of 0 (GRU: both; LSTM: a batch of 0)
ENDS_ON_EMPTY = ("GRU", "LSTM")


#: the same for OpenVINO (2026.4: SIGFPE, an RNN node given a batch of 0)
OPENVINO_ENDS_ON_EMPTY = ("GRU", "LSTM", "RNN")


def _refuse_empty(model: onnx.ModelProto, feeds, ops: tuple[str, ...], why: str) -> None:
    """Raise "not run" where an input is empty and the model holds one of ``ops``: the
    peer would end this process (``why``), and check with it."""
    from ...runtime.graph import walk

    empty = [k for k, v in feeds.items() if isinstance(v, np.ndarray) and v.size == 0]
    if empty and any(
        node.op_type in ops and node.domain in ("", "ai.onnx") for _, node in walk(model.graph)
    ):
        raise RuntimeError(f"not run: the input {empty[0]!r} is empty, and {why}")


def _run_onnxruntime(model: onnx.ModelProto, feeds, names):
    _refuse_empty(
        model,
        feeds,
        ENDS_ON_EMPTY,
        "onnxruntime (1.32) ends the process on a GRU or LSTM node given a batch or a "
        "sequence of 0",
    )
    return onnxruntime_session(model).run(list(names), dict(feeds))


def _run_reference(model: onnx.ModelProto, feeds, names):
    return reference_evaluator(model).run(list(names), dict(feeds))


def _run_openvino(model: onnx.ModelProto, feeds, names):
    import openvino as ov

    graph = model.graph
    typed = [v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)]
    if onnx.TensorProto.STRING in typed + [t.data_type for t in graph.initializer]:
        raise RuntimeError(
            "not run: the model has string tensors, and OpenVINO (2026.4) ends the process "
            "on them (free(): invalid pointer, as their outputs are freed)"
        )
    _refuse_empty(
        model,
        feeds,
        OPENVINO_ENDS_ON_EMPTY,
        "OpenVINO (2026.4) ends the process (SIGFPE) on a recurrent node given a batch of 0",
    )
    compiled = openvino_model(model)
    result = compiled(dict(feeds))
    outputs = []
    for n in names:
        port = compiled.output(n)
        value = np.asarray(result[port])
        if port.get_element_type() == ov.Type.bf16:  # handed back as float16 bits
            import ml_dtypes

            value = value.view(np.uint16).view(ml_dtypes.bfloat16)
        outputs.append(value)
    return outputs


#: peer name -> (module that must be importable, runner: ``(model, feeds, names)`` ->
#: the outputs named)
PEERS: dict[str, tuple[str, Callable]] = {
    "onnxruntime": ("onnxruntime", _run_onnxruntime),
    "onnx.reference": ("onnx", _run_reference),
    "openvino": ("openvino", _run_openvino),
}


def installed_peers() -> list[str]:
    """The peers whose package can be imported here."""
    return [name for name, (module, _) in PEERS.items() if importlib.util.find_spec(module)]
