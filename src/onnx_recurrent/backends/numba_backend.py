"""The numba backend: each cell's step compiled and fused, one pass per gate element.

A block of time steps is one compiled call (:func:`_part_block`): per step, the gates'
inputs ``[Xt, Ht-1] [W^T; R^T] + b`` as one product, then the cell's update row by
row, with no Python and no GIL in between (with fewer than :data:`PROJECT_BELOW` rows,
``Xt W^T`` of the whole block comes first, as one product). The products are
:mod:`.packed`'s, on ``[W^T; R^T]`` packed once. The call computes all the hidden units
or, for threads that split one direction between them, a share of them (a barrier per
step). Activations are passed as codes (:data:`CODES`) with their alpha and beta.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic

from ..activations import TABLE, ActivationCode
from . import packed
from .jit_cache import jit

#: activation name (lower case) -> its :class:`.ActivationCode`, as :func:`_apply` reads it
CODES = {name: int(kind.code) for name, kind in TABLE.items()}
_f32 = np.float32
#: rows below which a block's ``Xt W^T`` is one product ahead of its steps: a product
#: of 1-3 rows is bound by reading ``B``, which the block's rows then share (measured:
#: 10-20% faster at 1 row, equal at 4, slower above)
PROJECT_BELOW = 4
_jit = jit(fastmath={"contract", "nsz"}, nogil=True, error_model="numpy")


def _item_pointer(context, builder, array_type, array, index):
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index])


@intrinsic
def _atomic_add(typingctx, array, index, value):
    """``array[index] += value`` atomically (int64 array); returns the old value."""

    def codegen(context, builder, signature, args):
        ptr = _item_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return types.int64(array, index, types.int64), codegen


@intrinsic
def _atomic_load(typingctx, array, index):
    """``array[index]``, read atomically (int64 array)."""

    def codegen(context, builder, signature, args):
        ptr = _item_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "seq_cst", 8)

    return types.int64(array, index), codegen


@intrinsic
def _call_void(typingctx, addr):
    """Call the ``void f(void)`` at ``addr``."""

    def codegen(context, builder, signature, args):
        fn = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), []).as_pointer())
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(addr), codegen


@_jit
def _barrier(sync, parties, yield_addr):
    """Wait until all ``parties`` threads have arrived: ``sync = [arrived, generation,
    aborted]``. Spins, then yields the CPU (``yield_addr``: ``sched_yield``, or 0).
    Returns False if a party gave up (``aborted``); one party returns at once."""
    if parties == 1:
        return True
    generation = _atomic_load(sync, 1)
    if _atomic_add(sync, 0, 1) == parties - 1:
        _atomic_add(sync, 0, -parties)
        _atomic_add(sync, 1, 1)
        return True
    spins = 0
    while _atomic_load(sync, 1) == generation:
        if _atomic_load(sync, 2) != 0:
            return False
        spins += 1
        if spins > 2000 and yield_addr != 0:
            _call_void(yield_addr)
    return True


@_jit
def _tanh32(x):
    """float32 tanh as a rational function (Eigen's and MLAS's constants): no libm call,
    so loops over it vectorize; error within a few float32 ulps. Clamped at 7.9988
    (Eigen's later bound), where the function is exactly 1: tanh(+-inf) = +-1 and
    sigmoid(-inf) = 0 exactly, as in NumPy; NaN stays NaN (max/min keep their first
    argument when the comparison fails)."""
    x = min(max(x, _f32(-7.99881172180175781)), _f32(7.99881172180175781))
    x2 = x * x
    p = x2 * _f32(-2.76076847742355e-16) + _f32(2.00018790482477e-13)
    p = x2 * p + _f32(-8.60467152213735e-11)
    p = x2 * p + _f32(5.12229709037114e-08)
    p = x2 * p + _f32(1.48572235717979e-05)
    p = x2 * p + _f32(6.37261928875436e-04)
    p = x2 * p + _f32(4.89352455891786e-03)
    q = x2 * _f32(1.19825839466702e-06) + _f32(1.18534705686654e-04)
    q = x2 * q + _f32(2.26843463243900e-03)
    q = x2 * q + _f32(4.89352518554385e-03)
    return x * p / q


# float64 tanh without a libm call, so that loops over it vectorize: Cephes' rational
# function below 0.625, else 1 - 2 / (exp(2|x|) + 1) with Cephes' exp (n ln2 split in
# two parts, 2^n from a table: |x| is capped at 22, where tanh is 1 in float64).
_TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)
_EXP_P = (1.26177193074810590878e-4, 3.02994407707441961300e-2, 9.99999999999999999910e-1)
_EXP_Q = (3.00198505138664455042e-6, 2.52448340349684104192e-3, 2.27265548208155028766e-1,
          2.00000000000000000009e0)  # fmt: skip
_POW2 = np.ldexp(1.0, np.arange(65))


@_jit
def _exp_small(x):
    """exp(x) for 0 <= x <= 44, within about 1 ulp."""
    n = math.floor(x * 1.4426950408889634 + 0.5)
    r = x - n * 6.93145751953125e-1 - n * 1.42860682030941723212e-6
    r2 = r * r
    p = r * ((_EXP_P[0] * r2 + _EXP_P[1]) * r2 + _EXP_P[2])
    q = ((_EXP_Q[0] * r2 + _EXP_Q[1]) * r2 + _EXP_Q[2]) * r2 + _EXP_Q[3]
    return (1.0 + 2.0 * p / (q - p)) * _POW2[int(n)]


@_jit
def _tanh64(x):
    """float64 tanh within a few ulps, vectorizable (see above); NaN gives NaN."""
    a = abs(x)
    a = a if a < 22.0 else 22.0  # NaN too: 2^n is read from the table within bounds
    if a < 0.625:
        z = x * x
        p = (_TANH_P[0] * z + _TANH_P[1]) * z + _TANH_P[2]
        q = ((z + _TANH_Q[0]) * z + _TANH_Q[1]) * z + _TANH_Q[2]
        return x + x * z * p / q
    t = 1.0 - 2.0 / (_exp_small(2.0 * a) + 1.0)
    t = t if x > 0 else -t
    return t if x == x else x


@_jit
def _apply(code, v, alpha, beta, fast):
    """Activation ``code`` (:class:`.ActivationCode`) on ``v`` in place; one simple loop
    per code, so each vectorizes. NaN and infinities give what the NumPy kernels give:
    ``max``/``min`` keep their first argument, so NaN there stays NaN."""
    n = v.shape[0]
    tanh, sigmoid, scaled = ActivationCode.TANH, ActivationCode.SIGMOID, ActivationCode.SCALED_TANH
    if code == tanh or code == sigmoid or code == scaled:
        half = _f32(0.5)  # float32 constants keep float32 math float32
        if code != tanh:
            pre = half if code == sigmoid else beta
            for j in range(n):
                v[j] = v[j] * pre
        if fast:
            for j in range(n):
                v[j] = _tanh32(v[j])
        else:
            for j in range(n):
                v[j] = _tanh64(v[j])
        if code == sigmoid:
            for j in range(n):
                v[j] = half + half * v[j]
        elif code == scaled:
            for j in range(n):
                v[j] = alpha * v[j]
    elif code == ActivationCode.RELU:
        for j in range(n):
            v[j] = max(v[j], _f32(0))
    elif code == ActivationCode.AFFINE:
        for j in range(n):
            v[j] = alpha * v[j] + beta
    elif code == ActivationCode.LEAKY_RELU:
        for j in range(n):
            v[j] = v[j] if v[j] >= _f32(0) else alpha * v[j]
    elif code == ActivationCode.THRESHOLDED_RELU:  # ONNX: 0 unless x > alpha (NaN: 0)
        for j in range(n):
            v[j] = v[j] if v[j] > alpha else _f32(0)
    elif code == ActivationCode.HARD_SIGMOID:
        for j in range(n):
            v[j] = min(max(alpha * v[j] + beta, _f32(0)), _f32(1))
    elif code == ActivationCode.ELU:
        for j in range(n):
            v[j] = v[j] if v[j] >= _f32(0) else alpha * math.expm1(v[j])
    elif code == ActivationCode.SOFTSIGN:  # +-inf: NaN, as x / (1 + |x|) gives it
        for j in range(n):
            v[j] = v[j] / (_f32(1) + abs(v[j]))
    else:  # ActivationCode.SOFTPLUS, without overflow
        for j in range(n):
            v[j] = max(v[j], _f32(0)) + math.log1p(math.exp(-abs(v[j])))


@_jit
def _gate(a, i, v, fast):
    """Activation ``i`` of the table ``a`` = (codes, alphas, betas) on ``v`` in place."""
    _apply(a[0][i], v, a[1][i], a[2][i], fast)


@_jit
def _clip(dst, pre, clip):
    """``dst = clip(pre)``; NaN stays NaN, as in ``np.clip``."""
    for j in range(dst.shape[0]):
        dst[j] = min(max(pre[j], -clip), clip)


# --- per-row cell updates. pre: the row's gate inputs, Xt W^T + Ht-1 R^T + biases;
# g: scratch [gates*hidden]; hp: the row of Ht-1 (may be h itself: each element is
# read before it is written) ---


@_jit
def _rnn_row(pre, h, a, clip, fast):
    _clip(h, pre, clip)
    _gate(a, 0, h, fast)


@_jit
def _gru_zr_row(pre, hp, g, rh, a, clip, fast):
    """z, r into g[:2H]; r . Ht-1 into rh (linear_before_reset = 0)."""
    H = hp.shape[0]
    _clip(g[: 2 * H], pre, clip)
    _gate(a, 0, g[: 2 * H], fast)
    for j in range(H):
        rh[j] = g[H + j] * hp[j]


@_jit
def _gru_out(g, hp, h, a, fast):
    """ht = g(its clipped input, in g[2H:]), then Ht = ht + z (Ht-1 - ht) (z in g[:H])."""
    H = h.shape[0]
    n = g[2 * H : 3 * H]
    _gate(a, 1, n, fast)
    for j in range(H):
        h[j] = n[j] + g[j] * (hp[j] - n[j])


@_jit
def _gru_h_row(pre_h, hp, h, g, a, clip, fast):
    """Ht from ht's input Xt Wh^T + (r . Ht-1) Rh^T + biases (linear_before_reset = 0)."""
    H = h.shape[0]
    _clip(g[2 * H : 3 * H], pre_h, clip)
    _gru_out(g, hp, h, a, fast)


@_jit
def _gru_lbr_row(pre, xh, hh, hp, h, g, a, clip, fast):
    """linear_before_reset: ``xh`` = Xt Wh^T + Wbh, ``hh`` = Ht-1 Rh^T + Rbh."""
    H = h.shape[0]
    _clip(g[: 2 * H], pre, clip)
    _gate(a, 0, g[: 2 * H], fast)
    for j in range(H):
        g[2 * H + j] = min(max(xh[j] + g[H + j] * hh[j], -clip), clip)
    _gru_out(g, hp, h, a, fast)


@_jit
def _lstm_row(pre, h, c, P, input_forget, g, a, clip, fast):
    """Gates i o f c; P rows Pi, Po, Pf, or no columns when absent: then no peephole
    term at all, as in NumPy (a zero term would be NaN where Ct-1 is infinite)."""
    H = h.shape[0]
    i, o, f, cc = g[:H], g[H : 2 * H], g[2 * H : 3 * H], g[3 * H : 4 * H]
    peep = P.shape[1] != 0
    if peep:
        for j in range(H):
            i[j] = min(max(pre[j] + P[0, j] * c[j], -clip), clip)
    else:
        _clip(i, pre[:H], clip)
    _gate(a, 0, i, fast)
    if input_forget:
        for j in range(H):
            f[j] = _f32(1) - i[j]
    elif peep:
        for j in range(H):
            f[j] = min(max(pre[2 * H + j] + P[2, j] * c[j], -clip), clip)
        _gate(a, 0, f, fast)
    else:
        _clip(f, pre[2 * H : 3 * H], clip)
        _gate(a, 0, f, fast)
    _clip(cc, pre[3 * H :], clip)
    _gate(a, 1, cc, fast)
    for j in range(H):
        c[j] = f[j] * c[j] + i[j] * cc[j]
    if peep:
        for j in range(H):
            o[j] = min(max(pre[H + j] + P[1, j] * c[j], -clip), clip)
    else:
        _clip(o, pre[H : 2 * H], clip)
    _gate(a, 0, o, fast)
    for j in range(H):
        cc[j] = c[j]  # h(Ct): the cell state itself is not clipped
    _gate(a, 2, cc, fast)
    for j in range(H):
        h[j] = o[j] * cc[j]


# --- the step loop: one product per step, hidden units shared by 1 or more threads ---


@_jit
def _width(Bp):
    """Row length of a product's output on panels ``Bp`` (:func:`.packed.columns`)."""
    return Bp.shape[0] * Bp.shape[2] + packed.ALIGN // Bp.itemsize


@_jit
def _project(xb, F, I, bias, xw, active):
    """``xw[k, :active[k]] = xb[k, :active[k]] W^T + bias``, ``W^T``: the first ``I``
    panel rows of ``F``: one product, or one per step where rows finish."""
    steps, rows, _ = xb.shape
    A, C, ld, size = xb.ctypes.data, xw.ctypes.data, xw.shape[2], xw.itemsize
    if steps == 0:
        return
    if active[steps - 1] == rows:
        packed.mm(A, I, I, A, I, 0, steps * rows, F, 0, C, ld, bias, False)
        return
    for k in range(steps):
        a, c = A + k * rows * I * size, C + k * rows * ld * size
        packed.mm(a, I, I, a, I, 0, active[k], F, 0, c, ld, bias, False)


@_jit
def _part_block(
    sync,
    parties,
    yield_addr,
    kind,
    xb,
    project,
    F,
    bias,
    Fh,
    bias_h,
    Fr,
    bias_r,
    P,
    input_forget,
    h,
    spare,
    c,
    rh,
    j0,
    Hs,
    split,
    active,
    Y,
    write_Y,
    a,
    clip,
    fast,
):
    """Hidden units ``j0..j0+Hs-1`` of every row (weights of those units only): at each
    step, the gates' inputs ``[Xt, Ht-1] [W^T; R^T] + b`` (``F``; ``Ht-1`` whole, as all
    parties wrote it), then the cell's update row by row; then the parties wait for each
    other (:func:`_barrier`; one party: all units, no waiting). The product is one per
    step, or, if ``project`` (few rows: a product of one row is bound by reading
    ``B``), ``Xt W^T + b`` for the whole block at once and ``Ht-1 R^T`` added per step.
    ``h`` and ``spare`` alternate as ``Ht-1`` and ``Ht``; ``h`` holds the state at the
    end. GRU (``kind`` 1): ``F`` gives ``z r``; with the reset gate before the product
    (``split``, two barriers per step) ``Fh`` gives ht's input from ``[Xt, r . Ht-1]``;
    else ``Fh`` gives ``Xt Wh^T + Wbh`` and ``Fr`` ``Ht-1 Rh^T + Rbh``. Panels as
    :func:`_arranged` made them."""
    steps, rows, I = xb.shape
    H = h.shape[1]
    j1 = j0 + Hs
    size = h.itemsize
    gru = kind == 1
    lbr = gru and not split
    ahead = steps if project else 1  # steps of gate inputs kept
    pre_b = np.empty((ahead, rows, _width(F)), h.dtype)
    pre_hb = np.empty((ahead, rows if gru else 0, _width(Fh)), h.dtype)
    hh = np.empty((rows if lbr else 0, _width(Fr)), h.dtype)
    # scratch: one row (in L1), or one per row where z waits for the second product
    g = np.empty((rows if split else 1, _width(F) + _width(Fh)), h.dtype)
    bF, bFh, bFr = bias.ctypes.data, bias_h.ctypes.data, bias_r.ctypes.data
    if project:
        _project(xb, F, I, bF, pre_b, active)
        if gru:
            _project(xb, Fh, I, bFh, pre_hb, active)
    K1 = 0 if project else I  # rows of Xt in each product
    for k in range(steps):
        n = active[k]
        x = xb.ctypes.data + k * rows * I * size
        at = k if project else 0
        pre, pre_h = pre_b[at], pre_hb[at]
        old, new = (h, h) if parties == 1 else (h, spare) if k % 2 == 0 else (spare, h)
        hp0, ld = old.ctypes.data, pre.shape[1]
        packed.mm(x, I, K1, hp0, H, H, n, F, I - K1, pre.ctypes.data, ld, bF, project)
        if lbr:
            if not project:
                ldh = pre_h.shape[1]
                packed.mm(x, I, I, x, I, 0, n, Fh, 0, pre_h.ctypes.data, ldh, bFh, False)
            packed.mm(x, I, 0, hp0, H, H, n, Fr, 0, hh.ctypes.data, hh.shape[1], bFr, False)
        if parties > 1:  # finished rows keep their state
            _copy(old, new, n, rows, j0, j1)
        for b in range(n):
            hp, hb = old[b, j0:j1], new[b, j0:j1]
            if kind == 0:
                _rnn_row(pre[b], hb, a, clip, fast)
            elif split:
                _gru_zr_row(pre[b], hp, g[b], rh[b, j0:j1], a, clip, fast)
            elif gru:
                _gru_lbr_row(pre[b], pre_h[b], hh[b], hp, hb, g[0], a, clip, fast)
            else:
                _lstm_row(pre[b], hb, c[b, j0:j1], P, input_forget, g[0], a, clip, fast)
        if split:
            if not _barrier(sync, parties, yield_addr):  # r . Ht-1 complete
                return
            ldh, rh0 = pre_h.shape[1], rh.ctypes.data
            packed.mm(x, I, K1, rh0, H, H, n, Fh, I - K1, pre_h.ctypes.data, ldh, bFh, project)
            for b in range(n):
                _gru_h_row(pre_h[b], old[b, j0:j1], new[b, j0:j1], g[b], a, clip, fast)
        if write_Y:
            for b in range(n):
                yb, hb = Y[k, b], new[b, j0:j1]
                for j in range(Hs):
                    yb[j] = hb[j]
        if not _barrier(sync, parties, yield_addr):  # Ht complete
            return
    if steps % 2 == 1 and parties > 1:  # the last Ht is in spare
        _copy(spare, h, 0, rows, j0, j1)
        _barrier(sync, parties, yield_addr)


@_jit
def _copy(src, dst, b0, b1, j0, j1):
    """``dst[b0:b1, j0:j1] = src[b0:b1, j0:j1]`` (a loop: NumPy-style slice assignment
    in numba costs about a cycle per element)."""
    for b in range(b0, b1):
        for j in range(j0, j1):
            dst[b, j] = src[b, j]


_KIND = {"RNN": 0, "GRU": 1, "LSTM": 2}


@functools.lru_cache(maxsize=256)
def _table(acts: tuple, dt: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, alphas, betas) of a direction's activations, padded to 3."""
    pad = 3 - len(acts)
    return (
        np.array([CODES[act.name.lower()] for act in acts] + [0] * pad, np.int64),
        np.array([act.alpha for act in acts] + [0.0] * pad, dt),
        np.array([act.beta for act in acts] + [0.0] * pad, dt),
    )


@dataclass
class Shares:
    """What the threads that share one unit's hidden units share (:func:`_part_block`)."""

    parties: int
    sync: np.ndarray  # [arrived, generation, aborted]
    spare: np.ndarray  # [rows, hidden]: Ht on every other step
    rh: np.ndarray  # [rows, hidden]: r . Ht-1 (GRU, linear_before_reset = 0)

    def abort(self) -> None:
        """A party failed: the others stop at their next barrier."""
        self.sync[2] = 1


@functools.cache
def _sched_yield() -> int:
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError, TypeError):  # no C library by that name: spin only
        return 0


@functools.cache
def _empty(dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Placeholders: no peepholes, no Y (never written)."""
    return np.zeros((3, 0), dt), np.zeros((0, 0, 0), dt)


class NumbaBackend:
    name = "numba"
    calls_blas = False  # products of its own (packed.py)

    def supports(self, spec, dtype) -> str | None:
        if spec.cell.name not in _KIND:
            return f"no numba kernel for {spec.cell.name}"
        return None

    def shares(self, spec, rows, dtype, parties) -> Shares:
        """Buffers for ``parties`` threads to split the hidden units of ``rows`` rows
        (:meth:`run_block` with ``share``)."""
        H = spec.hidden_size
        sync = np.zeros(3, np.int64)
        return Shares(parties, sync, np.empty((rows, H), dtype), np.empty((rows, H), dtype))

    def run_block(self, spec, w, acts, xb, states, active, Yb, share=None) -> None:
        kind = _KIND[spec.cell.name]
        h = states[0]
        dt = h.dtype
        H = spec.hidden_size
        clip = dt.type(np.inf if spec.clip is None else spec.clip)
        c = states[1] if len(states) > 1 else h
        split = kind == 1 and not spec.linear_before_reset
        Y = Yb if Yb is not None else _empty(dt)[1]
        xb = np.ascontiguousarray(xb, dt)
        # w: the weights of hidden units j0..j1-1 only, when shared
        shares, j0, j1 = share if share is not None else (self.shares(spec, len(h), dt, 1), 0, H)
        _part_block(
            shares.sync,
            shares.parties,
            _sched_yield(),
            kind,
            xb,
            len(h) < PROJECT_BELOW,
            *_arranged(w, dt, kind, split),
            spec.input_forget,
            h,
            shares.spare,
            c,
            shares.rh,
            j0,
            j1 - j0,
            split,
            active,
            Y,
            Yb is not None,
            _table(acts, dt),
            clip,
            dt == np.float32,
        )


def _arranged(w, dt: np.dtype, kind: int, split: bool) -> tuple:
    """``(F, bias, Fh, bias_h, Fr, bias_r, P)`` as :func:`_part_block` reads them, made
    once (kept in ``w.derived``): the panels of ``[W^T; R^T]`` (``Fh``, ``Fr``: GRU's
    ``h`` columns, see there; else empty) and their biases; LSTM's peepholes as rows
    ``Pi, Po, Pf`` (zeros when absent)."""
    key = ("numba", dt, split)
    if key not in w.derived:
        WT, RT = w.W.T, w.R.T
        f = fh = fr = (RT[:, :0], w.bias[:0])  # none
        if kind == 1:  # GRU: z r | h
            Hs = RT.shape[1] // 3
            zr, hc = slice(0, 2 * Hs), slice(2 * Hs, None)
            f = np.vstack([WT[:, zr], RT[:, zr]]), w.bias[zr]
            if split:
                fh = np.vstack([WT[:, hc], RT[:, hc]]), w.bias[hc]
            else:
                fh, fr = (WT[:, hc], w.bias[hc]), (RT[:, hc], w.extra["Rbh"])
        else:
            f = np.vstack([WT, RT]), w.bias
        P = _empty(dt)[0]
        if "Pi" in w.extra:
            P = np.stack([w.extra["Pi"], w.extra["Po"], w.extra["Pf"]]).astype(dt)
        elif kind == 2:
            P = np.zeros((3, w.R.shape[0] // 4), dt)
        arranged = [(packed.panels(B, dt), packed.padded_vector(v, dt)) for B, v in (f, fh, fr)]
        w.derived[key] = (*arranged[0], *arranged[1], *arranged[2], P)
    return w.derived[key]


BACKEND = NumbaBackend()
