"""Recurrent nodes as native onnxruntime kernels: compiled code, no Python per call.

One custom operator per element type (``OnnxRecurrentFloat``, ``...Double``,
``...Float16``, ``...BFloat16``, domain ``ai.onnx.contrib``) with the inputs and
outputs of LSTM (``X W R B sequence_lens initial_h initial_c P`` -> ``Y Y_h Y_c``,
all optional but X; a GRU or RNN node uses the first seven and two). Each is an
``OrtCustomOp`` (onnxruntime's C API, struct version 16) handed to
onnxruntime-extensions' ``AddExternalCustomOp``, so that the library onnxruntime
loads with ``register_custom_ops_library`` serves it: no compiler at install.

- ``CreateKernelV2`` (Python, when a session is made): the node's ``key`` attribute
  names its :class:`~..bound.BoundNode`; the kernel is a block of int64 words
  (:class:`Kernel`) holding the prepared plans, the attributes and addresses.
- ``KernelComputeV2`` (a numba ``cfunc`` per compute type, float and double): reads
  the inputs through the ``OrtApi`` onnxruntime passed to ``CreateKernelV2``, checks
  them, asks onnxruntime for the outputs and runs :func:`..backends.node.run_node`
  on onnxruntime's buffers, with no GIL and no Python frame.
- What the compiled path does not take (float16 and bfloat16, any input that fails a
  check, a stream's empty state) goes to the node's Python path (:meth:`Kernel.compute`,
  a ctypes callback), which computes it as the reference host does, or raises the
  error the functions raise; the exception is kept for ``run``
  (:class:`~.onnxruntime.OnnxruntimeHost`) and onnxruntime gets an error status. The
  compiled code never raises.
- Weights that come per call (fed, or computed by the graph) go to the Python path
  the first time; it leaves a block for the layer it prepared (:meth:`Kernel._derive`),
  which the compiled path takes at later calls whose weights equal that layer's copies
  bit for bit (one LSTM node T=32, N=8, I=H=64 on a 2-core AMD EPYC Zen 5: 0.32 ->
  0.12 ms a call; onnxruntime alone 0.10).
- ``abort``: a word the compiled loop reads between blocks; set when SIGINT arrives
  during ``run`` (between :func:`interrupt_watch_start` and :func:`interrupt_watch_end`),
  so a long node stops within a block.

Facts of onnxruntime's C API (onnxruntime_c_api.h, append-only ``OrtApi``): the
``OrtApi*`` to use is the one onnxruntime passes to ``CreateKernelV2`` (the Python
wheel's module does not export ``OrtGetApiBase``); a cfunc's exception would return 0
(success) to onnxruntime; an external operator cannot be unregistered, so the
structures live as long as the process.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib.util
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto

from ... import backends, interrupts, threads
from ...backends import native_code, plans
from ...cells import CELLS
from ...errors import RecurrentError
from ...spec import compute_dtype
from ..bound import BoundNode
from ..graph import CUSTOM_DOMAIN, CUSTOM_OPS
from . import native_block as nc

DOMAIN = CUSTOM_DOMAIN
#: element type -> the custom operator computing it
OP_TYPES = CUSTOM_OPS
#: the operators' inputs, by position (LSTM's; the others use a prefix)
INPUTS = max((cell.inputs for cell in CELLS.values()), key=len)  # every operator's: a prefix
OUTPUTS = max((cell.outputs for cell in CELLS.values()), key=len)  # every operator's: a prefix
_X, _LENS, _H0, _C0 = (INPUTS.index(n) for n in ("X", "sequence_lens", "initial_h", "initial_c"))

#: indices in onnxruntime's ``OrtApi`` (onnxruntime_c_api.h; the struct only grows)
API = {
    "CreateStatus": 0,
    "GetErrorMessage": 2,
    "GetTensorMutableData": 51,
    "GetTensorElementType": 60,
    "GetDimensionsCount": 61,
    "GetDimensions": 62,
    "GetTensorTypeAndShape": 65,
    "ReleaseTensorTypeAndShapeInfo": 99,
    "ReleaseStatus": 93,
    "KernelInfoGetAttribute_string": 87,
    "KernelContext_GetInputCount": 88,
    "KernelContext_GetOutputCount": 89,
    "KernelContext_GetInput": 90,
    "KernelContext_GetOutput": 91,
    "KernelContext_ParallelFor": 274,
    "GetTensorElementTypeAndShapeDataReference": 414,
}
#: functions of a later onnxruntime than the least supported (1.17): the version that
#: has each (where older, its address is 0 and the kernel does without)
SINCE = {"GetTensorElementTypeAndShapeDataReference": (1, 24)}
ORT_FAIL = 1
#: multiply-adds of a call from which a native node's directions and slices of rows go
#: on onnxruntime's threads, which spin a while after each call and so wake sooner than
#: the pool's (:func:`onnx_recurrent.scan.parallel_macs`): AMD EPYC, LSTM N=8 I=H=64
#: after 10 ms pauses, two threads over one 0.91 at 2**23, 0.69 at 2**25
POOL_MACS = 1 << 23
#: blocks a node whose weights come per call makes at most (:meth:`Kernel._derive`)
MAX_DERIVED = 4
INPUT_OPTIONAL = 1
_INT32 = TensorProto.INT32

# -- onnxruntime's structures ---------------------------------------------------------


class OrtCustomOp(ctypes.Structure):
    """onnxruntime's ``struct OrtCustomOp`` up to version 16's ``KernelComputeV2``."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        *(
            (name, ctypes.c_void_p)
            for name in (
                "CreateKernel",
                "GetName",
                "GetExecutionProviderType",
                "GetInputType",
                "GetInputTypeCount",
                "GetOutputType",
                "GetOutputTypeCount",
                "KernelCompute",
                "KernelDestroy",
                "GetInputCharacteristic",
                "GetOutputCharacteristic",
                "GetInputMemoryType",
                "GetVariadicInputMinArity",
                "GetVariadicInputHomogeneity",
                "GetVariadicOutputMinArity",
                "GetVariadicOutputHomogeneity",
                "CreateKernelV2",
                "KernelComputeV2",
            )
        ),
    ]


_OP_VERSION = 16
_c_op = ctypes.c_void_p
_NAME = ctypes.CFUNCTYPE(ctypes.c_void_p, _c_op)
_COUNT = ctypes.CFUNCTYPE(ctypes.c_size_t, _c_op)
_AT = ctypes.CFUNCTYPE(ctypes.c_int, _c_op, ctypes.c_size_t)
_INT = ctypes.CFUNCTYPE(ctypes.c_int, _c_op)
_CREATE = ctypes.CFUNCTYPE(
    ctypes.c_void_p, _c_op, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)
_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_COMPUTE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

#: numpy dtypes of the element types a node reads and writes
_ELEMENT_DTYPES: dict[int, Callable[[], np.dtype]] = {
    TensorProto.FLOAT: lambda: np.dtype(np.float32),
    TensorProto.DOUBLE: lambda: np.dtype(np.float64),
    TensorProto.FLOAT16: lambda: np.dtype(np.float16),
    TensorProto.BFLOAT16: lambda: np.dtype(__import__("ml_dtypes").bfloat16),
    TensorProto.INT32: lambda: np.dtype(np.int32),
    TensorProto.INT64: lambda: np.dtype(np.int64),
}


_p, _size = ctypes.c_void_p, ctypes.c_size_t
_out_p, _out_size = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
#: (result, *arguments) of the ``OrtApi`` functions the Python side calls
_SIGNATURES = {
    "CreateStatus": (_p, ctypes.c_int, ctypes.c_char_p),
    "GetErrorMessage": (ctypes.c_char_p, _p),
    "ReleaseStatus": (None, _p),
    "KernelInfoGetAttribute_string": (_p, _p, ctypes.c_char_p, _p, _out_size),
    "KernelContext_GetInputCount": (_p, _p, _out_size),
    "KernelContext_GetOutputCount": (_p, _p, _out_size),
    "KernelContext_GetInput": (_p, _p, _size, _out_p),
    "KernelContext_GetOutput": (_p, _p, _size, ctypes.POINTER(ctypes.c_int64), _size, _out_p),
    "GetTensorMutableData": (_p, _p, _out_p),
    "GetTensorTypeAndShape": (_p, _p, _out_p),
    "GetTensorElementType": (_p, _p, ctypes.POINTER(ctypes.c_int)),
    "GetDimensionsCount": (_p, _p, _out_size),
    "GetDimensions": (_p, _p, ctypes.POINTER(ctypes.c_int64), _size),
    "ReleaseTensorTypeAndShapeInfo": (None, _p),
}


class _Api:
    """The ``OrtApi`` functions the Python side calls, from the table's address."""

    def __init__(self, address: int) -> None:
        self.address = address
        table = (ctypes.c_void_p * (max(API.values()) + 1)).from_address(address)
        for name, (restype, *argtypes) in _SIGNATURES.items():
            setattr(self, name, ctypes.CFUNCTYPE(restype, *argtypes)(table[API[name]]))

    def check(self, status: int | None) -> None:
        """Raise onnxruntime's error of a status (RuntimeError), and release it."""
        if status:
            message = self.GetErrorMessage(status).decode(errors="replace")
            self.ReleaseStatus(status)
            raise RuntimeError(f"onnxruntime: {message}")

    def status(self, code: int, message: str) -> int:
        return self.CreateStatus(code, message.encode(errors="replace")) or 0

    def input(self, context: int, index: int) -> np.ndarray | None:
        """Input ``index`` of a kernel call, a read-only view of onnxruntime's buffer
        valid during the call (None if absent)."""
        value = ctypes.c_void_p()
        self.check(self.KernelContext_GetInput(context, index, ctypes.byref(value)))
        if not value.value:
            return None
        info = ctypes.c_void_p()
        self.check(self.GetTensorTypeAndShape(value, ctypes.byref(info)))
        element, count = ctypes.c_int(), ctypes.c_size_t()
        try:
            self.check(self.GetTensorElementType(info, ctypes.byref(element)))
            self.check(self.GetDimensionsCount(info, ctypes.byref(count)))
            dims = (ctypes.c_int64 * count.value)()
            self.check(self.GetDimensions(info, dims, count.value))
        finally:
            self.ReleaseTensorTypeAndShapeInfo(info)
        dtype = _ELEMENT_DTYPES[element.value]()
        shape = tuple(dims)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size == 0:
            return np.zeros(shape, dtype)
        data = ctypes.c_void_p()
        self.check(self.GetTensorMutableData(value, ctypes.byref(data)))
        raw = (ctypes.c_char * size).from_address(data.value)
        view = np.frombuffer(raw, dtype).reshape(shape)  # valid during the call only
        view.flags.writeable = False
        return view

    def output(self, context: int, index: int, array: np.ndarray) -> None:
        """Output ``index`` of a kernel call made and filled with ``array``."""
        array = np.ascontiguousarray(array)
        dims = (ctypes.c_int64 * array.ndim)(*array.shape)
        value, data = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(
            self.KernelContext_GetOutput(context, index, dims, array.ndim, ctypes.byref(value))
        )
        if array.nbytes:
            self.check(self.GetTensorMutableData(value, ctypes.byref(data)))
            ctypes.memmove(data.value, array.ctypes.data, array.nbytes)

    def attribute(self, info: int, name: str) -> str:
        size = ctypes.c_size_t(0)
        self.check(self.KernelInfoGetAttribute_string(info, name.encode(), None, size))
        buffer = ctypes.create_string_buffer(size.value)
        self.check(self.KernelInfoGetAttribute_string(info, name.encode(), buffer, size))
        return buffer.value.decode()


_apis: dict[int, _Api] = {}


def _api(address: int) -> _Api:
    api = _apis.get(address)
    if api is None:
        api = _apis[address] = _Api(address)
    return api


# -- kernels --------------------------------------------------------------------------

#: registry key (a node's ``key`` attribute) -> its bound node, while a session holds it
BOUND: dict[str, BoundNode] = {}
#: kernel block address -> its kernel, from ``CreateKernelV2`` to ``KernelDestroy``
_KERNELS: dict[int, Kernel] = {}
#: per thread inside ``run``: ``error`` (the first exception of a node's Python path),
#: ``interrupted`` (SIGINT seen), ``guarded`` (in a node's Python path)
state = threading.local()
#: the word the compiled loop reads between blocks (SIGINT during ``run``)
ABORT = np.zeros(1, np.int64)
#: the message of a node stopped by SIGINT (the host raises KeyboardInterrupt)
INTERRUPTED = "onnx-recurrent: interrupted (SIGINT)"
_INTERRUPTED = ctypes.create_string_buffer(INTERRUPTED.encode())
#: the message of a node whose memory could not be allocated (the host raises MemoryError)
OUT_OF_MEMORY = "onnx-recurrent: out of memory for a recurrent node"
_FAILED = ctypes.create_string_buffer(OUT_OF_MEMORY.encode())
#: one share's meeting words (never claimed nor waited for: one thread per call)
_ALONE = (np.zeros(8, np.int64), np.zeros(4, np.int64))


def record(error: BaseException) -> None:
    """Keep the first exception of this thread's ``run``."""
    if getattr(state, "error", None) is None:
        state.error = error


def _fill(block: np.ndarray, layer, limit: int = 0) -> tuple:
    """The words of ``block`` that compiled code reads to run ``layer`` (its prepared
    plans, attributes, sizes, threads): the plans, which the block's owner keeps."""
    spec, dt = layer.spec, compute_dtype(layer.dtype)
    kept = tuple(
        plans.get(spec, w, spec.activations[d], dt, 1) for d, w in enumerate(layer.directions())
    )
    block[nc.PLAN0] = kept[0].address
    block[nc.PLAN1] = kept[-1].address
    block[nc.D] = len(kept)
    block[nc.REVERSE] = spec.direction == "reverse"
    block[nc.LAYOUT] = spec.layout
    block[nc.HIDDEN], block[nc.INPUT] = layer.hidden_size, layer.input_size
    block[nc.SYNC], block[nc.CALLS] = _ALONE[0].ctypes.data, _ALONE[1].ctypes.data
    block[nc.GATES] = spec.cell.n_gates * spec.hidden_size
    # a call large enough for threads: its directions and slices of rows on
    # onnxruntime's threads; one row: on the pool (:mod:`onnx_recurrent.scan`)
    with threads.at_most(limit):
        count = threads.num_threads()
    block[nc.PARALLEL] = POOL_MACS if count > 1 else 0
    block[nc.SLICES] = count
    block[nc.TASK] = compiled_address("task", dt)
    block[nc.FAST] = 1
    return kept


def _descriptors(layer, weights: dict) -> np.ndarray | None:
    """The words :func:`.native_compute.same_weights` compares the weights given with
    (``weights``: those of a call, by name) to tell ``layer``'s (made from them); None
    where a weight's dims do not fit the words or its bytes are not the copy's."""
    held = np.zeros(len(nc.WEIGHT_INPUTS) * nc.WEIGHT_WORDS, np.int64)
    for j, name in enumerate(INPUTS[i] for i in nc.WEIGHT_INPUTS):
        given, kept = weights.get(name), getattr(layer, name)
        if given is None:
            continue
        if kept is None or given.ndim > nc.WEIGHT_DIMS or given.nbytes != kept.nbytes:
            return None
        words = [kept.ctypes.data, kept.nbytes, given.ndim, *given.shape]
        held[j * nc.WEIGHT_WORDS : j * nc.WEIGHT_WORDS + len(words)] = words
    return held


class Kernel:
    """One node's kernel in one session: its block of words (see
    :mod:`.native_compute`), its bound node, and its Python path."""

    def __init__(self, node: BoundNode, api: int, element: int, limit: int = 0) -> None:
        self.node = node
        self.element = element
        #: the session's ``intra_op_num_threads`` (0: none set): also the most threads
        #: of a one-row call, which runs on onnx-recurrent's pool
        self.limit = limit
        self.plans: tuple = ()
        block = np.zeros(nc.WORDS, np.int64)
        block[nc.API] = api
        block[nc.SLOW] = ctypes.cast(_SLOW_MARKED, ctypes.c_void_p).value
        block[nc.ABORT] = ABORT.ctypes.data
        block[nc.INTERRUPTED] = ctypes.addressof(_INTERRUPTED)
        block[nc.FAILED] = ctypes.addressof(_FAILED)
        block[nc.ZERO_STATES] = node.zero_size_states
        block[nc.STATES] = 2 if node.op == "LSTM" else 1
        names = node.node.node.output
        block[nc.OUTPUTS] = sum(1 << i for i, name in enumerate(names) if name)
        self.functions = np.zeros(len(nc.FUNCTION_NAMES), np.int64)
        names = [n for n in nc.FUNCTION_NAMES if _runtime_version() >= SINCE.get(n, (0,))]
        table = (ctypes.c_void_p * (max(API[n] for n in names) + 1)).from_address(api)
        self.functions[:] = [table[API[n]] if n in names else 0 for n in nc.FUNCTION_NAMES]
        block[nc.FUNCTIONS] = self.functions.ctypes.data
        self.block = block
        self.address = int(block.ctypes.data)
        #: for weights per call: the blocks made for the weights of earlier calls
        #: (:meth:`_derive`), with what they point to; they live as long as the kernel
        self.derived: list[tuple] = []
        self._lock = threads.ForkLock()
        layer = node.layer
        if layer is not None and self._compiled(layer):
            self.plans = _fill(block, layer, limit)
        if layer is not None and (block[nc.FAST] == 0 or layer.hidden_size >= nc.SHARE_HIDDEN):
            layer.prepare()  # the Python path runs it: compiled now, not on a call

    def _compiled(self, layer) -> bool:
        """Whether compiled code computes ``layer``'s calls: of the node's type, unless
        ``ONNX_RECURRENT_BACKEND`` asks for NumPy's loops, which the Python path runs
        (:func:`~onnx_recurrent.backends.use`, a context of the caller's, reaches the
        Python path's calls only)."""
        if _ELEMENT_DTYPES[self.element]() != layer.dtype:
            return False
        try:
            return backends.environment_name() != "numpy"
        except RecurrentError:  # an unknown name: the Python path's call says so
            return False

    def _derive(self, layer, weights: dict) -> None:
        """After a Python-path call of a node whose ``weights`` come per call: a block
        for ``layer`` (the one that call used) that compiled code takes while the
        weights given equal its copies bit for bit, made the node's current one (or the
        one made before for ``layer``); at most :data:`MAX_DERIVED` a kernel (weights
        that change at every call gain nothing from it)."""
        if not self._compiled(layer):
            return
        with self._lock:
            made = next((d[0] for d in self.derived if d[2] is layer), None)
            if made is None:  # else weights seen before (calls alternating between a few)
                held = _descriptors(layer, weights)
                if held is None or len(self.derived) >= MAX_DERIVED:
                    return
                made = self.block.copy()
                plans = _fill(made, layer, self.limit)
                made[nc.DERIVED], made[nc.WEIGHTS] = 0, held.ctypes.data
                self.derived.append((made, held, layer, plans))
                _KERNELS[int(made.ctypes.data)] = self  # its Python path is this kernel's
            self.block[nc.DERIVED] = made.ctypes.data  # one word: compiled calls see it

    def compute(self, context: int) -> int:
        """The Python path: the node through :class:`BoundNode` on copies of the
        inputs, outputs copied into onnxruntime's; an ``OrtStatus*`` (0: success)."""
        api = _api(int(self.block[0]))
        node = self.node
        try:
            state.guarded = True
            if getattr(state, "interrupted", False):
                state.interrupted = False
                raise KeyboardInterrupt
            count = ctypes.c_size_t()
            api.check(api.KernelContext_GetInputCount(context, ctypes.byref(count)))
            given = [_given(api, context, i, node) for i in range(count.value)]
            given += [None] * (len(INPUTS) - len(given))
            X, lengths = given[_X], given[_LENS]
            if lengths is not None and lengths.size == 0:
                lengths = None  # an empty batch
            weights = None
            if node.dynamic:
                weights = {w: given[INPUTS.index(w)] for w in node.dynamic}
            with threads.at_most(self.limit):
                results, layer = node.run(X, lengths, given[_H0], given[_C0], weights)
            state.guarded = False
            for i, name in enumerate(node.node.node.output):
                if name:
                    api.output(context, i, results[i])
            if weights is not None:
                self._derive(layer, weights)
            return 0
        except BaseException as e:  # an exception escaping a ctypes callback is lost
            state.guarded = False
            record(e)
            return api.status(ORT_FAIL, f"onnx-recurrent: {_reason(node.label, e)}")


def _given(api: _Api, context: int, index: int, node: BoundNode) -> np.ndarray | None:
    """Input ``index``, or an error that names it where onnxruntime holds no tensor for
    it (an input left unbound in an ``IOBinding``: its own message names nothing)."""
    try:
        return api.input(context, index)
    except RuntimeError as e:
        names = node.node.node.input
        name = f" ({names[index]!r})" if index < len(names) else ""
        raise RuntimeError(
            f"{node.label}: input {INPUTS[index]}{name} has no value: {e}"
        ) from None


def _reason(label: str, error: BaseException) -> str:
    """What onnxruntime's status (and its error log) says of a node's failure: the
    error's first line, which names the node (the raised error is the one recorded)."""
    text = str(error).split("\n", 1)[0][:300]
    if text.startswith(label):
        return text
    return f"{label}: {type(error).__name__}" + (f": {text}" if text else "")


@functools.cache
def _runtime_version() -> tuple[int, ...]:
    """onnxruntime's version, as numbers (``(1, 32, 0)``)."""
    import onnxruntime

    return tuple(int(p) for p in re.findall(r"\d+", onnxruntime.__version__)[:3])


def _slow(kernel: int, context: int) -> int:
    k = _KERNELS.get(kernel)
    if k is None:  # cannot happen while onnxruntime holds the kernel
        return 0
    return k.compute(context)


def _create_kernel(op: int, api: int, info: int, out: int) -> int:
    ort = _api(api)
    try:
        key = ort.attribute(info, "key")
        node = BOUND[key]
        kernel = Kernel(node, api, _OPS_BY_ADDRESS[op], int(ort.attribute(info, "threads")))
        _KERNELS[kernel.address] = kernel
        ctypes.c_void_p.from_address(out).value = kernel.address
        return 0
    except BaseException as e:
        record(e)
        return ort.status(ORT_FAIL, f"onnx-recurrent: cannot make the kernel: {e}")


def _destroy_kernel(kernel: int) -> None:
    k = _KERNELS.pop(kernel, None)
    for derived in () if k is None else k.derived:
        _KERNELS.pop(int(derived[0].ctypes.data), None)


def _slow_marked(kernel: int, context: int, done: int) -> int:
    try:
        return _slow(kernel, context)
    except BaseException as e:  # a Ctrl-C outside compute's guard: escaping a ctypes
        record(e)  # callback, it was printed ("Exception ignored") and the status lost
        k = _KERNELS.get(kernel)
        if k is None:
            return 0
        return _api(int(k.block[0])).status(
            ORT_FAIL, f"onnx-recurrent: {_reason(k.node.label, e)}"
        )
    finally:
        ctypes.c_int64.from_address(done).value = 1


_SLOW = _COMPUTE(_slow)
#: the Python path as the compiled kernel calls it (:func:`.native_compute._python`)
_SLOW_MARKED = ctypes.CFUNCTYPE(_p, _p, _p, _p)(_slow_marked)


def _unraisable(unraisable: Any) -> Any:
    """``sys.unraisablehook`` while the native nodes are set up: the exception that
    escaped :func:`_slow_marked` (a signal handler's, raised at its first line or in its
    ``finally``, where its ``try`` cannot take it) recorded for the call to raise, not
    printed ("Exception ignored...") and taken for a Ctrl-C (the call stopped, its
    ``done`` word unmarked); a Ctrl-C escaping another of our callbacks (a session
    dropped: ``_destroy_kernel``) delivered again, once the hook has returned, not
    lost; anything else to the hook there before.

    The Ctrl-C comes back as SIGINT tripped by ``PyErr_SetInterruptEx`` run as a pending
    call: the check at the end of the hook's last call runs it, after the signals'
    turn, so Python's handler runs at the main thread's next check, past this hook
    (``signal.raise_signal`` ran it here, where CPython drops its exception).
    """
    error = unraisable.exc_value
    module, code = _origin(unraisable)
    if code is _slow_marked.__code__ and error is not None:
        record(error)
        return None
    if isinstance(error, KeyboardInterrupt) and module == __name__:
        return _ADD_PENDING(_SET_INTERRUPT, signal.SIGINT)  # the hook's last call
    return _hook_before(unraisable)


_ADD_PENDING = ctypes.pythonapi.Py_AddPendingCall
_ADD_PENDING.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
#: ``int PyErr_SetInterruptEx(int)``, called as a pending call's ``int (*)(void *)``
_SET_INTERRUPT = ctypes.cast(ctypes.pythonapi.PyErr_SetInterruptEx, ctypes.c_void_p).value


def _origin(unraisable: Any) -> tuple[str | None, Any]:
    """The module and code object of the callback an unraisable exception escaped:
    ``unraisable.object``'s, or (Python 3.13's ctypes reports None there) its
    traceback's first frame's."""
    function = unraisable.object
    if function is not None:
        return getattr(function, "__module__", None), getattr(function, "__code__", None)
    trace = unraisable.exc_traceback
    if trace is None:
        return None, None
    return trace.tb_frame.f_globals.get("__name__"), trace.tb_frame.f_code


#: the hook there before :func:`register` installed :func:`_unraisable`
_hook_before = sys.unraisablehook


# -- the operators --------------------------------------------------------------------


@dataclass
class _Operator:
    element: int
    name: ctypes.Array
    struct: OrtCustomOp


_OPS_BY_ADDRESS: dict[int, int] = {}
_operators: list[_Operator] = []
_setup_lock = threads.ForkLock()


def _input_type(op: int, index: int) -> int:
    return _INT32 if index == _LENS else _OPS_BY_ADDRESS.get(op, 0)


def _output_type(op: int, index: int) -> int:
    return _OPS_BY_ADDRESS.get(op, 0)


def _name(op: int) -> int:
    for o in _operators:
        if ctypes.addressof(o.struct) == op:
            return ctypes.addressof(o.name)
    return 0


_CALLBACKS = {
    "GetName": _NAME(_name),
    "GetExecutionProviderType": _NAME(lambda op: 0),
    "GetInputType": _AT(_input_type),
    "GetInputTypeCount": _COUNT(lambda op: len(INPUTS)),
    "GetOutputType": _AT(_output_type),
    "GetOutputTypeCount": _COUNT(lambda op: len(OUTPUTS)),
    "KernelDestroy": _DESTROY(_destroy_kernel),
    "GetInputCharacteristic": _AT(lambda op, i: 0 if i == _X else INPUT_OPTIONAL),
    "GetOutputCharacteristic": _AT(lambda op, i: INPUT_OPTIONAL),
    "GetInputMemoryType": _AT(lambda op, i: 0),
    "GetVariadicInputMinArity": _INT(lambda op: 1),
    "GetVariadicInputHomogeneity": _INT(lambda op: 1),
    "GetVariadicOutputMinArity": _INT(lambda op: 1),
    "GetVariadicOutputHomogeneity": _INT(lambda op: 1),
    "CreateKernelV2": _CREATE(_create_kernel),
}


def extensions_library() -> str:
    """The path of onnxruntime-extensions' shared library, found without importing the
    package (its ``__init__`` imports torch where torch is installed: 0.8 s): the
    file of its private module ``_extensions_pydll``, what the public
    ``onnxruntime_extensions.get_library_path()`` returns (tests/test_foreign_names.py).

    Raises
    ------
    ImportError
        onnxruntime-extensions is not installed (``name`` set).
    """
    spec = importlib.util.find_spec("onnxruntime_extensions")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("onnxruntime_extensions is not installed", name="onnxruntime_extensions")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("_extensions_pydll*"))
        found = [p for p in found if p.suffix in (".so", ".pyd", ".dylib")]
        if found:
            return os.fspath(found[0])
    raise ImportError(
        "onnxruntime_extensions has no _extensions_pydll library", name="onnxruntime_extensions"
    )


def register() -> str:
    """The operators handed to onnxruntime-extensions' library, once per process (an
    external operator cannot be taken back); the library's path, for
    ``SessionOptions.register_custom_ops_library``."""
    with _setup_lock:
        library = extensions_library()
        if _operators:
            return library
        add = ctypes.CDLL(library).AddExternalCustomOp
        add.argtypes, add.restype = [ctypes.c_void_p], None
        slow = ctypes.cast(_SLOW, ctypes.c_void_p).value
        for element, name in OP_TYPES.items():
            struct = OrtCustomOp(version=_OP_VERSION)
            for field, callback in _CALLBACKS.items():
                setattr(struct, field, ctypes.cast(callback, ctypes.c_void_p).value)
            # the Python path until :func:`prepare` compiles this type's
            struct.KernelComputeV2 = slow
            operator = _Operator(element, ctypes.create_string_buffer(name.encode()), struct)
            _operators.append(operator)
            _OPS_BY_ADDRESS[ctypes.addressof(struct)] = element
        _install_unraisable()
        for operator in _operators:
            add(ctypes.addressof(operator.struct))
        atexit.register(_at_exit)
        return library


def _install_unraisable() -> None:
    """:func:`_unraisable` as ``sys.unraisablehook`` from the operators' registration
    (their callbacks can run from then on), chained to the hook there before."""
    global _hook_before
    if sys.unraisablehook is not _unraisable:
        _hook_before = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _at_exit() -> None:
    """Sessions that outlive the interpreter's shutdown destroy their kernels after
    Python's objects are gone: ``KernelDestroy`` becomes compiled code that does
    nothing (a Python callback then crashes the process)."""
    try:
        noop = native_code.noop()
    except native_code.NativeCodeError:  # cannot happen where the engine loads code
        return
    for operator in _operators:
        operator.struct.KernelDestroy = noop


def prepare(elements: set[int]) -> None:
    """The compiled ``KernelComputeV2`` of each of ``elements`` (float16 and bfloat16
    computed in float32: their inputs widened, outputs rounded), compiled or loaded now
    (before a session that has such nodes is made) and put in its operator
    (onnxruntime reads the field at each call)."""
    for operator in _operators:
        if operator.element in elements:
            dtype = _ELEMENT_DTYPES[operator.element]()
            operator.struct.KernelComputeV2 = compiled_address("compute", dtype)


def compiled_address(kind: str, dt: np.dtype) -> int:
    """The address of the compiled ``KernelComputeV2`` (``kind`` "compute") or
    ParallelFor callback ("task") for nodes computing in ``dt``: the machine code
    kept by :mod:`onnx_recurrent.backends.native_code` (numba not loaded), else
    numba's own cfunc (:func:`.native_compute.cfunc_address`)."""
    dt = np.dtype(dt)

    def code() -> tuple[str, str]:
        from . import native_compute

        return native_compute.code(kind, dt)

    name = f"{kind}-{dt.name}"
    if name not in _refused:
        try:
            return native_code.address(name, code)
        except native_code.NativeCodeError:  # once: its IR was made (numba) for nothing
            _refused.add(name)
    from . import native_compute

    return native_compute.cfunc_address(kind, dt)


#: the kernels the native code refused in this process (numba's cfuncs run them)
_refused: set[str] = set()


# -- Ctrl-C during a native node ------------------------------------------------------


def interrupt_watch_start() -> int:
    """On the main thread, before ``run``: SIGINT sets :data:`ABORT` (the compiled
    loops stop within a block) as well as calling Python's handler later
    (:func:`onnx_recurrent.interrupts.watch_start`). Returns the previous wake-up fd,
    for :func:`interrupt_watch_end`."""
    return interrupts.watch_start(ABORT)


def interrupt_watch_abandon() -> None:
    """The window of :func:`interrupt_watch_start` closed after an exception tore it
    (it may or may not have opened): the wake-up fd it replaced back, :data:`ABORT`
    clear."""
    interrupts.watch_abandon(ABORT)


def interrupt_watch_end(previous: int) -> bool:
    """The previous wake-up fd back; whether a SIGINT stopped or would stop a node.
    :data:`ABORT` is clear after it, whenever the watcher reads the pipe (a SIGINT
    read late would otherwise stop the next call, unwatched: seen under load)."""
    return interrupts.watch_end(ABORT, previous)
