"""The compiled half of :mod:`.native`: ``KernelComputeV2`` as numba ``cfunc`` s.

A kernel is a block of int64 words (the indices below), made by
:class:`.native.Kernel`. :func:`compute` reads the node's inputs through the
``OrtApi`` table whose address is in the block, checks them, asks onnxruntime for the
outputs and runs :func:`onnx_recurrent.backends.node.run_node` on onnxruntime's own
buffers. Anything it does not take goes to the block's Python path (``SLOW``). It
never raises: a failure is an ``OrtStatus``. A node whose weights come per call runs
here too while they equal, bit for bit, those its Python path last prepared
(:func:`same_weights`, the block ``DERIVED``).
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
from numba.core import types

from ...backends import halves, node
from ...backends.jit_cache import cfunc, cfunc_code, jit
from ...backends.node import ABORTED, DONE, run_node
from ...backends.sync import c_call
from ...backends.views import INTS, address, allocate, part, pointer, release
from ...scan import bucket_bounds, bucketed, buckets
from ...threads import ForkLock
from .native_block import (  # the block's words
    ABORT,
    CALLS,
    CREATE_STATUS,
    DERIVED,
    FAILED,
    FAST,
    FUNCTION_NAMES,
    FUNCTIONS,
    GATES,
    GET_DATA,
    GET_DIMENSIONS,
    GET_DIMENSIONS_COUNT,
    GET_INPUT,
    GET_INPUT_COUNT,
    GET_OUTPUT,
    GET_TYPE_AND_SHAPE,
    HIDDEN,
    INPUT,
    INTERRUPTED,
    LAYOUT,
    OUTPUTS,
    PARALLEL,
    PARALLEL_FOR,
    PLAN0,
    PLAN1,
    RELEASE_STATUS,
    RELEASE_TYPE_AND_SHAPE,
    REVERSE,
    SHAPE_REFERENCE,
    SHARE_HIDDEN,
    SLICES,
    SLOW,
    STATES,
    SYNC,
    T_C0,
    T_D0,
    T_D1,
    T_FLAGS,
    T_H0,
    T_KERNEL,
    T_LENS,
    T_N,
    T_ORDER,
    T_RESULTS,
    T_SLICES,
    T_T,
    T_X,
    T_Y,
    T_YC,
    T_YH,
    TASK,
    WEIGHT_INPUTS,
    WEIGHT_WORDS,
    WEIGHTS,
    WORDS,
    ZERO_STATES,
    D,
)

ORT_FAIL = 1

_jit = jit(nogil=True, error_model="numpy")
# the skeleton's own rule
_bucketed, _buckets, _bucket_bounds = _jit(bucketed), _jit(buckets), _jit(bucket_bounds)


@_jit
def _dims(fn, value, out):
    """``value``'s dimension count (-1 on failure, status in ``out[1]``), its dims in
    ``out[8:16]`` (up to 8)."""
    at = out.ctypes.data
    if fn[SHAPE_REFERENCE] != 0:  # the shape onnxruntime keeps: nothing allocated
        s = c_call(fn[SHAPE_REFERENCE], value, at, at + 16, at + 24, 0, 0)
        if s != 0:
            out[1] = s
            return -1
        n = out[3]
        if n <= 8:
            dims = numba.carray(pointer(out[2]), n, np.int64)
            for i in range(n):
                out[8 + i] = dims[i]
        return n
    s = c_call(fn[GET_TYPE_AND_SHAPE], value, at, 0, 0, 0, 0)
    if s != 0:
        out[1] = s
        return -1
    info = out[0]
    s = c_call(fn[GET_DIMENSIONS_COUNT], info, at, 0, 0, 0, 0)
    n = out[0]
    if s == 0 and n <= 8:
        s = c_call(fn[GET_DIMENSIONS], info, at + 64, n, 0, 0, 0)
    c_call(fn[RELEASE_TYPE_AND_SHAPE], info, 0, 0, 0, 0, 0)
    if s != 0:
        out[1] = s
        return -1
    return n


@_jit
def _data(fn, value, out):
    """The address of ``value``'s data (0 on failure, status in ``out[1]``)."""
    s = c_call(fn[GET_DATA], value, out.ctypes.data, 0, 0, 0, 0)
    if s != 0:
        out[1] = s
        return 0
    return out[0]


@_jit
def _state_ok(fn, value, out, d0, d1, d2, zero):
    """1: a state of shape ``[d0, d1, d2]``; 0: absent (or empty where ``zero``);
    -1: anything else (the Python path says what); -2: onnxruntime failed."""
    if value == 0:
        return 0
    n = _dims(fn, value, out)
    if n < 0:
        return -2
    if n == 3 and out[8] == d0 and out[9] == d1 and out[10] == d2:
        return 1
    if zero and n == 3 and out[8] * out[9] * out[10] == 0:
        return 0
    return -1


@_jit
def same_weights(k, fn, values, out):
    """1 if the weights given (``values``: the inputs' ``OrtValue`` s) have the dims
    and bytes of the block's descriptors (``WEIGHTS``), 0 if not, -1 if onnxruntime
    failed (its status in ``out[1]``)."""
    held = numba.carray(pointer(k[WEIGHTS]), len(WEIGHT_INPUTS) * WEIGHT_WORDS, np.int64)
    for j in range(len(WEIGHT_INPUTS)):
        w = held[j * WEIGHT_WORDS : (j + 1) * WEIGHT_WORDS]
        value = values[WEIGHT_INPUTS[j]]
        if w[0] == 0 or value == 0:
            if w[0] != 0 or value != 0:
                return 0
            continue
        n = _dims(fn, value, out)
        if n < 0:
            return -1
        if n != w[2]:
            return 0
        for i in range(n):
            if out[8 + i] != w[3 + i]:
                return 0
        p = _data(fn, value, out)
        if p == 0 and out[1] != 0:
            return -1
        if not _same_bytes(p, w[0], w[1]):
            return 0
    return 1


@_jit
def _same_bytes(a, b, n):
    """Whether the ``n`` bytes at addresses ``a`` and ``b`` are equal (in runs of
    2 KiB, each compared whole: vector code)."""
    words = n // 8
    x = numba.carray(pointer(a), words, np.uint64)
    y = numba.carray(pointer(b), words, np.uint64)
    for i in range(0, words, 256):
        differ = np.uint64(0)
        for j in range(i, min(words, i + 256)):
            differ |= x[j] ^ y[j]
        if differ != 0:
            return False
    tail = n - 8 * words
    xs = numba.carray(pointer(a + 8 * words), tail, np.uint8)
    ys = numba.carray(pointer(b + 8 * words), tail, np.uint8)
    for j in range(tail):
        if xs[j] != ys[j]:
            return False
    return True


@_jit
def _python(k, fn, kernel, context, done):
    """The node's Python path (``SLOW``); it marks the word ``done[0]`` when it
    ends: an exception that escaped it (a Ctrl-C at its first line) leaves the word
    unmarked and the callback's result undefined, so the call fails as interrupted."""
    done[0] = 0
    status = c_call(k[SLOW], kernel, context, done.ctypes.data, 0, 0, 0)
    if done[0] == 0:
        return c_call(fn[CREATE_STATUS], ORT_FAIL, k[INTERRUPTED], 0, 0, 0, 0)
    return status


@_jit
def _unread(k, fn, kernel, context, done, out):
    """An input onnxruntime holds no tensor for (one left unbound in an IOBinding): its
    status (``out[1]``) dropped for the Python path's error, which names the input."""
    c_call(fn[RELEASE_STATUS], out[1], 0, 0, 0, 0, 0)
    return _python(k, fn, kernel, context, done)


@_jit
def _failed(k, fn, result):
    """The status of a call that stopped (``result``: :func:`run_node`'s)."""
    message = k[INTERRUPTED] if result == ABORTED else k[FAILED]
    return c_call(fn[CREATE_STATUS], ORT_FAIL, message, 0, 0, 0, 0)


# OrtApi's results, the inputs, a shape, the states, the finals, a mark; 16 bits: the
# outputs Y, Y_h, Y_c are rounded into (0: not wired)
OWN = 36
NARROW_Y = 33


@_jit
def compute(kernel, context, dtype, narrow):
    """The node on one call's inputs; an ``OrtStatus*`` (0: success). Never raises;
    its memory from ``malloc`` (:mod:`onnx_recurrent.backends.views`). ``narrow``: 0,
    or the 16-bit type of a node computed in ``dtype`` (float32: its inputs widened,
    its outputs rounded, :mod:`onnx_recurrent.backends.halves`)."""
    k = numba.carray(pointer(kernel), WORDS, np.int64)
    fn = numba.carray(pointer(k[FUNCTIONS]), len(FUNCTION_NAMES), np.int64)
    own = allocate(OWN, INTS)
    if own.shape[0] == 0:
        return _failed(k, fn, 2)
    own[:] = 0
    if k[FAST] == 0 and k[DERIVED] != 0:  # weights per call: the block of the last ones
        kernel = k[DERIVED]
        k = numba.carray(pointer(kernel), WORDS, np.int64)
    if k[FAST] == 0:
        status = _python(k, fn, kernel, context, own[32:33])
    else:
        status = _inputs(k, fn, kernel, context, dtype, own, narrow)
    release(own)
    return status


@_jit
def _inputs(k, fn, kernel, context, dtype, own, narrow):
    """:func:`compute` from the inputs on (``own``: its words)."""
    out, values, shape = part(own, 0, 16), part(own, 16, 8), part(own, 24, 4)
    done = own[32:33]
    at = out.ctypes.data
    s = c_call(fn[GET_INPUT_COUNT], context, at, 0, 0, 0, 0)
    if s != 0:
        return s
    for i in range(min(out[0], 8)):
        s = c_call(fn[GET_INPUT], context, i, at, 0, 0, 0)
        if s != 0:
            return s
        values[i] = out[0]
    if values[0] == 0:
        return _python(k, fn, kernel, context, done)
    if values[1] != 0:  # weights given per call: those this block was made for?
        same = same_weights(k, fn, values, out) if k[WEIGHTS] != 0 else 0
        if same < 0:
            return _unread(k, fn, kernel, context, done, out)
        if same == 0:
            return _python(k, fn, kernel, context, done)
    n = _dims(fn, values[0], out)
    if n < 0:
        return _unread(k, fn, kernel, context, done, out)
    layout, H, I, Dn = k[LAYOUT], k[HIDDEN], k[INPUT], k[D]
    if n != 3 or out[10] != I or out[8] < 0 or out[9] < 0:
        return _python(k, fn, kernel, context, done)
    d0, d1 = out[8], out[9]
    N, T = (d0, d1) if layout else (d1, d0)
    if T == 0 and k[ZERO_STATES] != 0:  # a stream's empty chunk: its states carried on
        return _python(k, fn, kernel, context, done)
    large = k[PARALLEL] != 0 and T * N * Dn * k[GATES] * (H + I) >= k[PARALLEL]
    slices = min(N, k[SLICES]) if large else 1
    if large and Dn * slices < 2 and H >= SHARE_HIDDEN:  # one row: threads share its
        return _python(k, fn, kernel, context, done)  # hidden units (scan's pool)
    xp = _data(fn, values[0], out)
    if xp == 0 and out[1] != 0:
        return out[1]
    X = numba.carray(pointer(xp), (d0, d1, I), dtype)
    lens = numba.carray(pointer(0), 0, np.int32)
    has_lens = values[4] != 0
    if has_lens:
        n = _dims(fn, values[4], out)
        if n < 0:
            return _unread(k, fn, kernel, context, done, out)
        if n != 1 or out[8] != N:
            return _python(k, fn, kernel, context, done)
        lp = _data(fn, values[4], out)
        if lp == 0 and out[1] != 0:
            return out[1]
        lens = numba.carray(pointer(lp), N, np.int32)
        for b in range(N):
            if lens[b] < 0 or lens[b] > T or (lens[b] == 0 and k[ZERO_STATES] != 0):
                return _python(k, fn, kernel, context, done)
    s0, s1 = (N, Dn) if layout else (Dn, N)
    lstm = k[STATES] == 2
    # the states given (h, then c: LSTM), as addresses (0: not given)
    given = part(own, 28, 2)
    for j in range(k[STATES]):
        ok = _state_ok(fn, values[5 + j], out, s0, s1, H, k[ZERO_STATES] != 0)
        if ok == -2:
            return _unread(k, fn, kernel, context, done, out)
        if ok == -1:
            return _python(k, fn, kernel, context, done)
        if ok == 1:
            p = _data(fn, values[5 + j], out)
            if p == 0 and out[1] != 0:
                return out[1]
            given[j] = p
    h0 = numba.carray(pointer(given[0]), (s0, s1, H) if given[0] else (0, 0, 0), dtype)
    c0 = numba.carray(pointer(given[1]), (s0, s1, H) if given[1] else (0, 0, 0), dtype)
    wired = k[OUTPUTS]
    if layout:
        shape[0], shape[1], shape[2], shape[3] = N, T, Dn, H
    else:
        shape[0], shape[1], shape[2], shape[3] = T, Dn, N, H
    Y = numba.carray(pointer(0), (0, 0, 0, 0), dtype)
    if wired & 1:
        s = c_call(fn[GET_OUTPUT], context, 0, shape.ctypes.data, 4, at, 0)
        if s != 0:
            return s
        p = _data(fn, out[0], out)
        if p == 0 and out[1] != 0:
            return out[1]
        Y = numba.carray(pointer(p), (shape[0], shape[1], shape[2], shape[3]), dtype)
    shape[0], shape[1], shape[2] = s0, s1, H
    # the final states: onnxruntime's outputs, or scratch where an output is not wired
    # (16 bits: always, as the inputs and Y, then rounded into the outputs)
    count = (2 if lstm else 1) * s0 * s1 * H
    wide = d0 * d1 * I + 2 * s0 * s1 * H + Y.size if narrow else 0
    spare = allocate(count + wide, X)
    if count + wide > 0 and spare.shape[0] == 0:
        return _failed(k, fn, 2)
    if narrow:
        at = count
        into = spare[at : at + X.size]
        halves.widen(numba.carray(pointer(xp), into.size, np.uint16), into, narrow)
        xp = into.ctypes.data  # (views by carray: a reshape's check raises, which the
        X = numba.carray(pointer(xp), (d0, d1, I), dtype)  # native code cannot take)
        at += X.size
        state = s0 * s1 * H
        for j in range(2):
            if given[j] != 0:
                into = spare[at : at + state]
                halves.widen(numba.carray(pointer(given[j]), state, np.uint16), into, narrow)
                given[j] = into.ctypes.data
            at += state
        h0 = numba.carray(pointer(given[0]), h0.shape, dtype)
        c0 = numba.carray(pointer(given[1]), c0.shape, dtype)
        own[NARROW_Y] = Y.ctypes.data if wired & 1 else 0
        Y = numba.carray(pointer(spare[at : at + Y.size].ctypes.data), Y.shape, dtype)
    status = _outputs(k, fn, kernel, context, dtype, own, X, xp, d0, d1, lens, has_lens, h0, c0,
                      Y, spare, N, T, Dn, H, slices, narrow)  # fmt: skip
    if narrow and status == 0:
        _narrowed(Y, own[NARROW_Y], narrow)
        state = s0 * s1 * H
        for j in range(k[STATES]):
            _narrowed(spare[j * state : (j + 1) * state], own[NARROW_Y + 1 + j], narrow)
    release(spare)
    return status


@_jit
def _narrowed(values, p, narrow):
    """``values`` rounded to 16 bits at address ``p`` (0: nowhere)."""
    if p != 0 and values.size > 0:  # values: C-contiguous float32
        flat = numba.carray(pointer(values.ctypes.data), values.size, np.float32)
        halves.narrow(flat, numba.carray(pointer(p), flat.size, np.uint16), narrow)


@_jit
def _outputs(k, fn, kernel, context, dtype, own, X, xp, d0, d1, lens, has_lens, h0, c0, Y, spare,
             N, T, Dn, H, slices, narrow):  # fmt: skip
    """:func:`compute` from the final states' outputs on: the node run here or on
    onnxruntime's threads (``spare``: the final states not wired; 16 bits: all of
    them, each wired one's output in ``own[NARROW_Y + 1 + j]``)."""
    layout, lstm, wired = k[LAYOUT], k[STATES] == 2, k[OUTPUTS]
    out, shape, given = part(own, 0, 16), part(own, 24, 4), part(own, 28, 2)
    s0, s1 = (N, Dn) if layout else (Dn, N)
    shape[0], shape[1], shape[2] = s0, s1, H
    finals = part(own, 30, 2)
    finals[0] = spare.ctypes.data
    finals[1] = finals[0] + (s0 * s1 * H * spare.itemsize if lstm else 0)
    for j in range(k[STATES]):
        if wired & (2 << j):
            s = c_call(fn[GET_OUTPUT], context, 1 + j, shape.ctypes.data, 3, out.ctypes.data, 0)
            if s != 0:
                return s
            p = _data(fn, out[0], out)
            if p == 0 and out[1] != 0:
                return out[1]
            if narrow:
                own[NARROW_Y + 1 + j] = p
            else:
                finals[j] = p
    Yh = numba.carray(pointer(finals[0]), (s0, s1, H), dtype)
    Yc = numba.carray(pointer(finals[1 if lstm else 0]), (s0, s1, H), dtype)
    flags = (
        (node.TWO_DIRECTIONS if Dn == 2 else 0) | (node.REVERSE if k[REVERSE] != 0 else 0)
        | (node.LAYOUT if layout != 0 else 0) | (node.HAS_LENS if has_lens else 0)
        | (node.HAS_H0 if given[0] != 0 else 0) | (node.HAS_C0 if given[1] != 0 else 0)
        | (node.WRITE_Y if wired & 1 else 0)
    )  # fmt: skip
    if Dn * slices > 1:  # directions and units of rows on onnxruntime's threads
        ragged = False
        for b in range(N if has_lens else 0):
            ragged = ragged or lens[b] < T
        # ragged, threads outnumbering directions: the rows by length into buckets,
        # the longest first, as the skeleton cuts them (scan._units)
        in_buckets = ragged and _bucketed(N, Dn, slices)
        units = _buckets(N) if in_buckets else slices
        total = Dn * units
        task = allocate(T_RESULTS + total + (N + T + 1 if in_buckets else 0), INTS)
        if task.shape[0] == 0:
            return _failed(k, fn, 2)
        task[:] = 0
        if in_buckets:
            order = task[T_RESULTS + total : T_RESULTS + total + N]
            node.longest_first(lens, T, order, task[T_RESULTS + total + N :])
            task[T_ORDER] = order.ctypes.data
        task[T_KERNEL], task[T_X], task[T_D0], task[T_D1] = kernel, xp, d0, d1
        task[T_N], task[T_T], task[T_SLICES] = N, T, units
        task[T_LENS] = lens.ctypes.data
        task[T_H0], task[T_C0] = given[0], given[1]
        task[T_Y], task[T_YH], task[T_YC] = Y.ctypes.data, finals[0], finals[1] if lstm else 0
        task[T_FLAGS] = flags
        s = c_call(fn[PARALLEL_FOR], context, k[TASK], total, total, task.ctypes.data, 0)
        result = DONE
        for i in range(total):
            result = max(result, task[T_RESULTS + i])
        release(task)
        if s != 0:
            return s
        return 0 if result == DONE else _failed(k, fn, result)
    sync = numba.carray(pointer(k[SYNC]), 8, np.int64)
    calls = numba.carray(pointer(k[CALLS]), 4, np.int64)
    abort = numba.carray(pointer(k[ABORT]), 1, np.int64)
    every = numba.carray(pointer(k[SYNC]), 0, np.int64)  # every row
    result = run_node(
        k[PLAN0], k[PLAN1], flags, X, lens, h0, c0, Y, Yh, Yc, every, sync, calls, abort
    )
    return 0 if result == DONE else _failed(k, fn, result)


@_jit
def task(usr, i, dtype):
    """ParallelFor's task ``i`` of a large call (words ``T_*`` at ``usr``): direction
    ``i % D`` of the ``i // D``-th slice of the batch's rows, on views of
    onnxruntime's buffers; its result (1: aborted) in ``T_RESULTS + i``."""
    t = numba.carray(pointer(usr), T_RESULTS, np.int64)
    k = numba.carray(pointer(t[T_KERNEL]), WORDS, np.int64)
    Dn, layout, H, I = k[D], k[LAYOUT] != 0, k[HIDDEN], k[INPUT]
    N, T, S, flags = t[T_N], t[T_T], t[T_SLICES], t[T_FLAGS]
    d, s = i % Dn, i // Dn
    # a slice of the batch (views), or all of it and a bucket's rows
    lo, hi = (0, N) if t[T_ORDER] != 0 else (s * N // S, (s + 1) * N // S)
    X = numba.carray(pointer(t[T_X]), (t[T_D0], t[T_D1], I), dtype)
    state = (N, Dn, H) if layout else (Dn, N, H)
    lstm = k[STATES] == 2
    lens = numba.carray(pointer(t[T_LENS]), N if flags & node.HAS_LENS else 0, np.int32)
    h0 = numba.carray(pointer(t[T_H0]), state if flags & node.HAS_H0 else (0, 0, 0), dtype)
    c0 = numba.carray(pointer(t[T_C0]), state if flags & node.HAS_C0 else (0, 0, 0), dtype)
    Yh = numba.carray(pointer(t[T_YH]), state, dtype)
    Yc = numba.carray(pointer(t[T_YC] if lstm else t[T_YH]), state, dtype)
    write_Y = (flags & node.WRITE_Y) != 0
    shape = ((N, T, Dn, H) if layout else (T, Dn, N, H)) if write_Y else (0, 0, 0, 0)
    Y = numba.carray(pointer(t[T_Y]), shape, dtype)
    if layout:
        Xs, Ys = X[lo:hi], Y[lo:hi, :, d : d + 1]
        h0s, c0s = h0[lo:hi, d : d + 1], c0[lo:hi, d : d + 1]
        Yhs, Ycs = Yh[lo:hi, d : d + 1], Yc[lo:hi, d : d + 1]
    else:
        Xs, Ys = X[:, lo:hi], Y[:, d : d + 1, lo:hi]
        h0s, c0s = h0[d : d + 1, lo:hi], c0[d : d + 1, lo:hi]
        Yhs, Ycs = Yh[d : d + 1, lo:hi], Yc[d : d + 1, lo:hi]
    plan = k[PLAN0 + d]
    sync = numba.carray(pointer(k[SYNC]), 8, np.int64)
    calls = numba.carray(pointer(k[CALLS]), 4, np.int64)
    abort = numba.carray(pointer(k[ABORT]), 1, np.int64)
    results = numba.carray(pointer(usr), T_RESULTS + Dn * S, np.int64)
    one = flags & ~(node.TWO_DIRECTIONS | node.REVERSE)  # this slice's one direction
    if k[REVERSE] != 0 or d == 1:
        one |= node.REVERSE
    rows = lens[lo:hi] if flags & node.HAS_LENS else lens
    bucket = numba.carray(pointer(k[SYNC]), 0, np.int64)  # none: every row of the views
    if t[T_ORDER] != 0:
        b0, b1 = _bucket_bounds(s, N)
        bucket = numba.carray(pointer(t[T_ORDER] + b0 * 8), b1 - b0, np.int64)
    results[T_RESULTS + i] = run_node(
        plan, plan, one, Xs, rows, h0s, c0s, Ys, Yhs, Ycs, bucket, sync, calls, abort
    )


_SIGNATURE = types.voidptr(types.voidptr, types.voidptr)
_TASK_SIGNATURE = types.void(types.voidptr, types.uintp)


def _task_float(usr, i):
    task(address(usr), i, np.float32)


def _task_double(usr, i):
    task(address(usr), i, np.float64)


_TASKS = {np.dtype(np.float32): _task_float, np.dtype(np.float64): _task_double}


def _compute_float(kernel, context):
    return pointer(compute(address(kernel), address(context), np.float32, 0))


def _compute_double(kernel, context):
    return pointer(compute(address(kernel), address(context), np.float64, 0))


def _compute_half(kernel, context):
    return pointer(compute(address(kernel), address(context), np.float32, halves.FLOAT16))


def _compute_bfloat(kernel, context):
    return pointer(compute(address(kernel), address(context), np.float32, halves.BFLOAT16))


_COMPUTES = {
    np.dtype(np.float32): _compute_float,
    np.dtype(np.float64): _compute_double,
    np.dtype(np.float16): _compute_half,
    np.dtype(ml_dtypes.bfloat16): _compute_bfloat,
}
_FUNCTIONS = {"compute": (_SIGNATURE, _COMPUTES), "task": (_TASK_SIGNATURE, _TASKS)}
_compiled: dict[tuple, object] = {}  # numba's cfuncs: their code lives as long as they
_lock = ForkLock()


def code(kind: str, dt: np.dtype) -> tuple[str, str]:
    """The LLVM IR and symbol of ``KernelComputeV2`` (``kind`` "compute") or of the
    ParallelFor callback ("task") for nodes computing in ``dt``, compiled now (for
    :mod:`onnx_recurrent.backends.native_code`)."""
    signature, functions = _FUNCTIONS[kind]
    return cfunc_code(signature, functions[np.dtype(dt)], nogil=True)


def cfunc_address(kind: str, dt: np.dtype) -> int:
    """The address of numba's own cfunc of :func:`code` (compiled or loaded by numba's
    cache), where the native code cannot be loaded."""
    key = (kind, np.dtype(dt))
    with _lock:
        if key not in _compiled:
            signature, functions = _FUNCTIONS[kind]
            _compiled[key] = cfunc(signature, functions[key[1]], nogil=True)
        return _compiled[key].address
