"""The numba backend: each cell's step compiled and fused, one pass per gate element.

A block of time steps is one compiled call (:func:`_part_block`): per step, the gates'
inputs ``[Xt, Ht-1] [W^T; R^T] + b`` as one product, then the cell's update row by
row, with no Python and no GIL in between (with fewer than :data:`PROJECT_BELOW` rows,
``Xt W^T`` of the whole block comes first, as one product). The products are
:mod:`.packed`'s, on ``[W^T; R^T]`` packed once. The call computes all the hidden units
or, for threads that split one direction between them, a share of them (a barrier per
step). Activations are passed as codes (:data:`.plans.CODES`) with their alpha and beta.
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import numba
import numpy as np
from llvmlite import ir

if numba.config.DISABLE_JIT:  # the kernels would be plain Python: the numpy backend
    raise ImportError("numba's compiler is turned off (NUMBA_DISABLE_JIT)")
from numba.core import cgutils, types
from numba.core.extending import intrinsic, overload

from .. import threads
from ..activations import ActivationCode
from . import packed, plans
from .jit_cache import jit, prepare
from .plans import ARRAYS, HEAD
from .sync import Sync, claim, cycles, finish, wait
from .views import INTS, keep, part, unowned, view

_f32 = np.float32
#: rows below which a block's ``Xt W^T`` is one product ahead of its steps: a product
#: of 1-3 rows is bound by reading ``B``, which the block's rows then share (measured:
#: 10-20% faster at 1 row, equal at 4, slower above)
PROJECT_BELOW = 4
_OPTIONS = {"fastmath": {"contract", "nsz"}, "nogil": True, "error_model": "numpy"}
_jit = jit(**_OPTIONS)
#: inlined into its caller's IR (a call per step with a dozen arrays costs ~0.2 µs)
_inline = jit(**_OPTIONS, inline="always")


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
# function below 0.625, else 1 - 2 / (E + 1) with E = exp(2|x|) from Cephes' exp (n ln2
# split in two parts, 2^n from its bits: |x| is capped at 22, where tanh is 1 in float64).
_TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)
_EXP_P = (1.26177193074810590878e-4, 3.02994407707441961300e-2, 9.99999999999999999910e-1)
_EXP_Q = (3.00198505138664455042e-6, 2.52448340349684104192e-3, 2.27265548208155028766e-1,
          2.00000000000000000009e0)  # fmt: skip


@intrinsic
def _pow2(typingctx, n):
    """``2.0**n`` for an int64 ``n`` in [-1022, 1023], from its bits (a table read was a
    gather per vector: the float64 tanh 1.40 -> 1.08 ns an element, AMD EPYC)."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        bits = builder.shl(builder.add(args[0], ir.Constant(i64, 1023)), ir.Constant(i64, 52))
        return builder.bitcast(bits, ir.DoubleType())

    return types.float64(types.int64), codegen


@_inline
def _exp_parts(y):
    """``(e, d)`` with ``e / d = exp(y)`` for ``y`` in [-708, 708], left undivided so
    that the caller divides once: Cephes' exp, ``n ln 2`` split in two parts, ``(q +
    p) / (q - p)`` on the rest and ``2^n`` from its bits."""
    n = math.floor(y * 1.4426950408889634 + 0.5)
    r = y - n * 6.93145751953125e-1 - n * 1.42860682030941723212e-6
    r2 = r * r
    p = r * ((_EXP_P[0] * r2 + _EXP_P[1]) * r2 + _EXP_P[2])
    q = ((_EXP_Q[0] * r2 + _EXP_Q[1]) * r2 + _EXP_Q[2]) * r2 + _EXP_Q[3]
    return (q + p) * _pow2(np.int64(n)), q - p


@_inline
def _tanh64(x):
    """float64 tanh within 2 ulps, vectorizable (see above); NaN gives NaN. Both
    branches are computed as a numerator and a denominator, then one division (three
    divisions before: a 512-bit division issues every 16 cycles on Sapphire Rapids).
    Inlined: as a call, the loops over it stayed scalar."""
    a = abs(x)
    a = a if a < 22.0 else 22.0  # NaN too: n stays within 0 .. 64
    z = x * x  # |x| < 0.625: x + x z P(z) / Q(z)
    p_s = (_TANH_P[0] * z + _TANH_P[1]) * z + _TANH_P[2]
    q_s = ((z + _TANH_Q[0]) * z + _TANH_Q[1]) * z + _TANH_Q[2]
    e, d = _exp_parts(2.0 * a)  # else E = e / d = exp(2|x|): tanh = 1 - 2 d / (e + d)
    one = 1.0 if x > 0 else -1.0
    small = a < 0.625
    t = (x if small else one) + (x * z * p_s if small else -2.0 * one * d) / (
        q_s if small else e + d
    )
    return t if x == x else x


@_inline
def _sigmoid64(x):
    """float64 sigmoid, vectorizable: with ``E = e / d = exp(-|x|)`` (Cephes' exp, as in
    :func:`_tanh64`), ``1 / (1 + E) = d / (d + e)`` for ``x >= 0``, else ``E / (1 + E) =
    e / (d + e)``: one exp and one division, where ``0.5 + 0.5 tanh(x / 2)`` took the
    tanh's two branches and two more passes. 0 below -708 (the result would be
    subnormal) and for -inf, 1 for +inf; NaN gives NaN."""
    a = abs(x)
    a = a if a < 708.0 else 708.0  # NaN too: 2^n stays normal
    e, d = _exp_parts(-a)
    t = (d if x >= 0.0 else e) / (d + e)
    t = 0.0 if x < -708.0 else t
    return t if x == x else x


@_jit
def _apply(code, v, alpha, beta, fast):
    """Activation ``code`` (:class:`.ActivationCode`) on ``v`` in place; one simple loop
    per code, so each vectorizes. NaN and infinities give what the NumPy kernels give:
    ``max``/``min`` keep their first argument, so NaN there stays NaN."""
    n = v.shape[0]
    tanh, sigmoid, scaled = ActivationCode.TANH, ActivationCode.SIGMOID, ActivationCode.SCALED_TANH
    if code == sigmoid and not fast:
        for j in range(n):
            v[j] = _sigmoid64(v[j])
    elif code == tanh or code == sigmoid or code == scaled:
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


@_inline
def _clipped(x, clip):
    """``x`` within ``[-clip, clip]``; NaN stays NaN, as in ``np.clip``."""
    return min(max(x, -clip), clip)


@_jit
def _clip(dst, pre, clip):
    """``dst = clip(pre)`` (:func:`_clipped`)."""
    for j in range(dst.shape[0]):
        dst[j] = _clipped(pre[j], clip)


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
    """ht = g(its clipped input, in g[2H:]), then Ht = (1 - z) ht + z Ht-1 (z in g[:H])."""
    H = h.shape[0]
    n = g[2 * H : 3 * H]
    _gate(a, 1, n, fast)
    for j in range(H):
        h[j] = _blend(g[j], n[j], hp[j])


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
        g[2 * H + j] = _clipped(xh[j] + g[H + j] * hh[j], clip)
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
            i[j] = _clipped(pre[j] + P[0, j] * c[j], clip)
    else:
        _clip(i, pre[:H], clip)
    _gate(a, 0, i, fast)
    if input_forget:
        for j in range(H):
            f[j] = _f32(1) - i[j]
    elif peep:
        for j in range(H):
            f[j] = _clipped(pre[2 * H + j] + P[2, j] * c[j], clip)
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
            o[j] = _clipped(pre[H + j] + P[1, j] * c[j], clip)
    else:
        _clip(o, pre[H : 2 * H], clip)
    _gate(a, 0, o, fast)
    for j in range(H):
        cc[j] = c[j]  # h(Ct): the cell state itself is not clipped
    _gate(a, 2, cc, fast)
    for j in range(H):
        h[j] = o[j] * cc[j]


# --- the operators' default activations (RNN: Tanh; GRU: Sigmoid, Tanh; LSTM: Sigmoid,
# Tanh, Tanh; no peepholes): a share's rows in one pass over their units, every value in
# registers, one call a share (AMD EPYC Zen 5, an LSTM share of 128 units: 0.9 ns a unit,
# against 2.7 in passes per gate and activation and a call per row). The same values as
# the passes' up to the fused multiply-adds that the compiler forms. Each row is a 1-D
# view (a loop indexing the 2-D arrays stayed scalar: 11.6 against 0.8 ns a unit); the
# activations go by the element type (float32: the rational tanh), not by a flag that
# the loop would branch on (it then stays scalar too) ---


def _sigmoid(x):
    """One element's sigmoid, as :func:`_apply` computes it for its type (compiled
    code only)."""
    raise TypeError("_sigmoid is for compiled code")


def _tanh(x):
    """One element's tanh, as :func:`_apply` computes it for its type (compiled code
    only)."""
    raise TypeError("_tanh is for compiled code")


@overload(_sigmoid, jit_options=_OPTIONS)
def _sigmoid_typed(x):
    if x == types.float32:
        return lambda x: _f32(0.5) + _f32(0.5) * _tanh32(x * _f32(0.5))
    return lambda x: _sigmoid64(x)


@overload(_tanh, jit_options=_OPTIONS)
def _tanh_typed(x):
    if x == types.float32:
        return lambda x: _tanh32(x)
    return lambda x: _tanh64(x)


@intrinsic
def _blend(typingctx, z, ht, hp):
    """GRU's ``Ht = (1 - z) ht + z Ht-1`` as the spec writes it (``ht + z (Ht-1 - ht)``
    loses ``Ht-1`` where ``|ht|`` is far larger, and makes NaN of an infinite ``ht``):
    ``fma(z, Ht-1, (1 - z) ht)``, its instructions without fast-math flags, so that
    the same bits come out of every loop it is inlined into (with contraction allowed,
    the compiler may fuse either product)."""
    if not isinstance(z, types.Float) or not z == ht == hp:
        return None

    def codegen(context, builder, signature, args):
        z_, ht_, hp_ = args
        t = context.get_value_type(signature.return_type)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(t, [t] * 3), f"llvm.fma.f{z.bitwidth}"
        )
        rest = builder.fmul(builder.fsub(ir.Constant(t, 1.0), z_), ht_)
        return builder.call(fma, [z_, hp_, rest])

    return z(z, ht, hp), codegen


@_jit
def _standard(codes, kind, peepholes):
    """Whether a cell of ``kind`` (0 RNN, 1 GRU, 2 LSTM) with activation ``codes`` and
    ``peepholes`` (bool) runs the one-pass rows below."""
    if peepholes or codes[0] != (ActivationCode.TANH if kind == 0 else ActivationCode.SIGMOID):
        return False
    for i in range(1, kind + 1):
        if codes[i] != ActivationCode.TANH:
            return False
    return True


# Each function below takes the share's ``n`` rows and its units ``j0 .. j1`` of the
# states; ``pre``, ``pre_h``, ``hh``, ``gz``: the share's own columns (its gates side by
# side). Where ``Ht`` is written over ``Ht-1`` (one share), the loop gets one view for
# both: else the compiler's check that the two do not overlap fails and the loop runs
# scalar (2.4 against 0.3 ns a unit).


@_jit
def _rnn_rows(pre, new, n, j0, j1, clip):
    """Ht = tanh(clip(pre))."""
    for b in range(n):
        p, h = pre[b], new[b, j0:j1]
        for j in range(j1 - j0):
            h[j] = _tanh(_clipped(p[j], clip))


@_jit
def _gru_zr_rows(pre, old, z, rh, n, j0, j1, clip):
    """z into ``z`` (the share's scratch, kept for the second phase), r . Ht-1 into
    ``rh`` (``linear_before_reset`` 0)."""
    H = j1 - j0
    for b in range(n):
        p, hp, zb, r = pre[b], old[b, j0:j1], z[b], rh[b, j0:j1]
        for j in range(H):
            zb[j] = _sigmoid(_clipped(p[j], clip))
            r[j] = _sigmoid(_clipped(p[H + j], clip)) * hp[j]


@_inline
def _gru_h_pass(pre_h, hp, h, z, clip):
    for j in range(h.shape[0]):
        ht = _tanh(_clipped(pre_h[j], clip))
        h[j] = _blend(z[j], ht, hp[j])


@_jit
def _gru_h_rows(pre_h, old, new, z, n, j0, j1, clip):
    """Ht = (1 - z) ht + z Ht-1, ht from its input ``pre_h`` (``linear_before_reset`` 0)."""
    same = old.ctypes.data == new.ctypes.data
    for b in range(n):
        h = new[b, j0:j1]
        if same:
            _gru_h_pass(pre_h[b], h, h, z[b], clip)
        else:
            _gru_h_pass(pre_h[b], old[b, j0:j1], h, z[b], clip)


@_inline
def _gru_lbr_pass(pre, xh, hh, hp, h, clip):
    H = h.shape[0]
    for j in range(H):
        z = _sigmoid(_clipped(pre[j], clip))
        r = _sigmoid(_clipped(pre[H + j], clip))
        ht = _tanh(_clipped(xh[j] + r * hh[j], clip))
        h[j] = _blend(z, ht, hp[j])


@_jit
def _gru_lbr_rows(pre, xh, hh, old, new, n, j0, j1, clip):
    """``linear_before_reset``: ``xh`` = Xt Wh^T + Wbh, ``hh`` = Ht-1 Rh^T + Rbh."""
    same = old.ctypes.data == new.ctypes.data
    for b in range(n):
        h = new[b, j0:j1]
        if same:
            _gru_lbr_pass(pre[b], xh[b], hh[b], h, h, clip)
        else:
            _gru_lbr_pass(pre[b], xh[b], hh[b], old[b, j0:j1], h, clip)


@_jit
def _lstm_rows(pre, new, c, input_forget, n, j0, j1, clip):
    """Gates i o f c of the share's units side by side in ``pre``; Ct into ``c``."""
    H = j1 - j0
    for b in range(n):
        p, h, cb = pre[b], new[b, j0:j1], c[b, j0:j1]
        for j in range(H):
            i = _sigmoid(_clipped(p[j], clip))
            f = _sigmoid(_clipped(p[2 * H + j], clip))
            f = _f32(1) - i if input_forget else f  # a select: the loop stays one
            cj = f * cb[j] + i * _tanh(_clipped(p[3 * H + j], clip))
            cb[j] = cj
            h[j] = _sigmoid(_clipped(p[H + j], clip)) * _tanh(cj)


# --- the step loop: one product per step, hidden units in shares claimed by threads ---


@_jit
def _project(xb, F, I, bias, xw, active, tile):
    """``xw[k, :active[k]] = xb[k, :active[k]] W^T + bias``, ``W^T``: the first ``I``
    panel rows of ``F``: one product, or one per step where rows finish (``tile``:
    the plan's rows, span, depth)."""
    steps, rows, _ = xb.shape
    A, C, ld, size = xb.ctypes.data, xw.ctypes.data, xw.shape[2], xw.itemsize
    R, G, KB = tile
    P = F.shape[0]
    if steps == 0:
        return
    if active[steps - 1] == rows:
        packed.mm(A, I, I, A, I, 0, steps * rows, F, 0, P, 0, C, ld, bias, False, R, G, KB)
        return
    for k in range(steps):
        a, c = A + k * rows * I * size, C + k * rows * ld * size
        packed.mm(a, I, I, a, I, 0, active[k], F, 0, P, 0, c, ld, bias, False, R, G, KB)


@_inline
def _check(plan, xb, h, pre, pre_h, hh):
    """Whether the products' operands and the states agree with the plan, once per
    block (:func:`.packed.check`)."""
    rows, I, H = xb.shape[1], xb.shape[2], h.shape[1]
    ok = packed.check(plan.panels, I + H, plan.bias, pre, rows, _most(plan.starts))
    if plan.kind == 1:
        K = I + H if plan.split else I
        ok = ok and packed.check(plan.panels_h, K, plan.bias_h, pre_h, rows, _most(plan.starts_h))
        if not plan.split:
            ok = ok and packed.check(plan.panels_r, H, plan.bias_r, hh, rows, _most(plan.starts_r))
    return ok and h.shape[0] >= rows and plan.bounds[plan.bounds.shape[0] - 1] == H


@_jit
def _most(p):
    """The most panels of one share (``p``: each share's first panel, and the end)."""
    most = 0
    for s in range(p.shape[0] - 1):
        most = max(most, p[s + 1] - p[s])
    return most


@_inline
def block_scratch(plan, steps, rows, project):
    """Elements of the scratch :func:`_block` takes for ``steps`` steps of ``rows``
    rows."""
    ahead = steps if project else 1  # steps of gate inputs kept
    rows_h = rows if plan.kind == 1 else 0
    rows_r = rows if plan.kind == 1 and not plan.split else 0
    return (ahead * (rows * plan.width + rows_h * plan.width_h) + rows_r * plan.width_r
            + plan.width + plan.width_h)  # fmt: skip


@_inline
def _block(plan, sync, calls, first, phase0, xb, h, spare, c, gz, rh, active, Y, write_Y,
           step0, project, scratch, to):  # fmt: skip
    """Steps ``step0 ..`` of one direction (``xb``: their inputs), with the weights
    and activations of ``plan`` (:func:`load_plan`); False if the arrays disagree
    with it (nothing computed). Each step (GRU with the reset gate before the
    product: two phases) is cut into the plan's shares of hidden units; this thread
    computes the shares it claims (:mod:`.sync`; share ``first`` first; the
    meeting's phases from ``phase0``; one share: all of it, no waiting), then waits
    for the others'. A share is the gates' inputs ``[Xt, Ht-1] [W^T; R^T] + b`` of its
    units as one product, then the cell's update row by row; or, if ``project`` (one
    share, few rows: a product of one row is bound by reading ``B``), ``Xt W^T + b``
    for the whole block first. With several shares ``h`` and ``spare`` alternate as
    ``Ht-1`` and ``Ht`` by the step's parity (the caller settles which holds the end;
    rows that end are copied along to the block's end); with one, ``h`` is updated in
    place. ``gz``: each
    share's row scratch (kept between GRU's two phases), ``rh``: ``r . Ht-1``;
    ``scratch``: :func:`block_scratch` elements at least, the caller's. Each share
    writes its part of the rows' new states straight into ``Y`` (with ``write_Y``)
    where ``to`` places them (:func:`_into`). Never raises, allocates nothing."""
    steps, rows, I = xb.shape
    S = plan.bounds.shape[0] - 1
    phases = 2 if plan.split else 1
    ahead = steps if project else 1
    rows_h = rows if plan.kind == 1 else 0
    rows_r = rows if plan.kind == 1 and not plan.split else 0
    if scratch.shape[0] < block_scratch(plan, steps, rows, project):
        return False
    pre_b = part(scratch, 0, (ahead, rows, plan.width))
    o = ahead * rows * plan.width
    pre_hb = part(scratch, o, (ahead, rows_h, plan.width_h))
    o += ahead * rows_h * plan.width_h
    hh = part(scratch, o, (rows_r, plan.width_r))
    o += rows_r * plan.width_r
    g = part(scratch, o, (plan.width + plan.width_h,))  # one row's scratch (in L1)
    if not _check(plan, xb, h, pre_b[0], pre_hb[0], hh):
        return False
    if project:
        tile = (plan.rows, plan.span, plan.depth)
        _project(xb, plan.panels, I, plan.bias.ctypes.data, pre_b, active, tile)
        if plan.kind == 1:
            _project(xb, plan.panels_h, I, plan.bias_h.ctypes.data, pre_hb, active, tile)
    for k in range(steps):
        kg = step0 + k
        old, new = (h, h) if S == 1 else (h, spare) if kg % 2 == 0 else (spare, h)
        at = k if project else 0
        for sub in range(phases):
            phase = phase0 + k * phases + sub
            s = 0 if S == 1 else claim(sync, phase, S, first)
            while s >= 0:
                started = cycles() if S > 1 else 0
                _share(plan, s, sub, xb, k, active[k], old, new, c, gz, rh, pre_b[at],
                       pre_hb[at], hh, g, Y, write_Y and sub == phases - 1, project, to,
                       kg)  # fmt: skip
                if S == 1:
                    break
                finish(sync, phase, S, calls, started)
                s = claim(sync, phase, S, first)
            if S > 1 and not wait(sync, phase, S, calls):
                return True  # aborted
    return True


@_jit
def _part_block(address, sync, calls, first, xb, h, spare, c, gz, rh, active, Y, write_Y,
                step0, project):  # fmt: skip
    """:func:`_block` on the plan at ``address`` (a :class:`.plans.Plan`'s, which the
    caller keeps), called from Python: its scratch made here.

    Raises
    ------
    ValueError
        The arrays disagree with the plan."""
    sync, calls, xb, h, spare = (
        unowned(sync),
        unowned(calls),
        unowned(xb),
        unowned(h),
        unowned(spare),
    )
    c, gz, rh, active, Y = unowned(c), unowned(gz), unowned(rh), unowned(active), unowned(Y)
    plan = load_plan(address, h)
    own = np.empty(block_scratch(plan, xb.shape[0], xb.shape[1], project), h.dtype)
    rows = np.arange(xb.shape[1])  # Y's rows in order, its steps from step0
    phase0 = step0 * (2 if plan.split else 1)
    to = (rows, rows, 0, False, False, step0)
    ok = _block(plan, sync, calls, first, phase0, xb, h, spare, c, gz, rh, active, Y, write_Y,
                step0, project, unowned(own), to)  # fmt: skip
    keep(own)
    keep(rows)
    if not ok:
        raise ValueError("step loop: states and weights disagree")


@_inline
def _share(plan, s, sub, xb, k, n, old, new, c, gz, rh, pre, pre_h, hh, g, Y, write_Y, project,
           to, kg):  # fmt: skip
    """Share ``s`` of step ``k`` (``kg`` of the unit)'s phase ``sub`` for its ``n``
    running rows."""
    rows, I = xb.shape[1], xb.shape[2]
    H = old.shape[1]
    j0, j1 = plan.bounds[s], plan.bounds[s + 1]
    size = old.itemsize
    L = plan.panels.shape[2]
    x = xb.ctypes.data + k * rows * I * size
    hp0 = old.ctypes.data
    K1 = 0 if project else I  # rows of Xt in each product
    a = (plan.codes, plan.alphas, plan.betas)
    clip, fast, kind = plan.clip, plan.fast, plan.kind
    fused = _standard(plan.codes, kind, plan.peepholes.shape[1] != 0)  # one pass
    R, G, KB = plan.rows, plan.span, plan.depth  # the products' tiles
    q0, q1 = plan.starts_h[s], plan.starts_h[s + 1]
    bias_h, ldh = plan.bias_h.ctypes.data + q0 * L * size, pre_h.shape[1]  # its address
    if sub == 1:  # GRU: ht's input from [Xt, r . Ht-1], then Ht
        rh0 = rh.ctypes.data
        packed.mm(x, I, K1, rh0, H, H, n, plan.panels_h, q0, q1, I - K1, pre_h.ctypes.data, ldh,
                  bias_h, project, R, G, KB)  # fmt: skip
        if fused:
            _gru_h_rows(pre_h, old, new, gz[s], n, j0, j1, clip)
        else:
            for b in range(n):
                _gru_h_row(pre_h[b], old[b, j0:j1], new[b, j0:j1], gz[s, b], a, clip, fast)
    else:
        p0, p1 = plan.starts[s], plan.starts[s + 1]
        bias = plan.bias.ctypes.data + p0 * L * size
        packed.mm(x, I, K1, hp0, H, H, n, plan.panels, p0, p1, I - K1, pre.ctypes.data,
                  pre.shape[1], bias, project, R, G, KB)  # fmt: skip
        lbr = kind == 1 and not plan.split
        if lbr:
            if not project:
                packed.mm(x, I, I, x, I, 0, n, plan.panels_h, q0, q1, 0, pre_h.ctypes.data, ldh,
                          bias_h, False, R, G, KB)  # fmt: skip
            r0, r1 = plan.starts_r[s], plan.starts_r[s + 1]
            bias_r = plan.bias_r.ctypes.data + r0 * L * size
            packed.mm(x, I, 0, hp0, H, H, n, plan.panels_r, r0, r1, 0, hh.ctypes.data,
                      hh.shape[1], bias_r, False, R, G, KB)  # fmt: skip
        if old.ctypes.data != new.ctypes.data:  # finished rows keep their state
            _copy(old, new, n, rows, j0, j1)
        if fused:
            if kind == 0:
                _rnn_rows(pre, new, n, j0, j1, clip)
            elif plan.split:
                _gru_zr_rows(pre, old, gz[s], rh, n, j0, j1, clip)
            elif lbr:
                _gru_lbr_rows(pre, pre_h, hh, old, new, n, j0, j1, clip)
            else:
                _lstm_rows(pre, new, c, plan.input_forget, n, j0, j1, clip)
        else:
            for b in range(n):
                hp, hb = old[b, j0:j1], new[b, j0:j1]
                if kind == 0:
                    _rnn_row(pre[b], hb, a, clip, fast)
                elif plan.split:
                    _gru_zr_row(pre[b], hp, gz[s, b], rh[b, j0:j1], a, clip, fast)
                elif lbr:
                    _gru_lbr_row(pre[b], pre_h[b], hh[b], hp, hb, g, a, clip, fast)
                else:
                    _lstm_row(pre[b], hb, c[b, j0:j1], plan.peepholes[:, j0:j1], plan.input_forget,
                              g, a, clip, fast)  # fmt: skip
    if write_Y:
        for b in range(n):
            yb, hb = _into(Y, to, kg, b), new[b]
            for j in range(j0, j1):
                yb[j] = hb[j]


@_inline
def _into(Y, to, kg, i):
    """Where the unit's row ``i`` writes its state of step ``kg``: ``Y[t, d, b]``
    (``Y[b, t, d]`` if ``layout``) for ``to = (order, L, d, back, layout, t0)``: ``b =
    order[i]``, ``t = kg - t0``, or ``L[i] - 1 - kg`` if ``back`` (its own last valid
    step first)."""
    order, L, d, back, layout, t0 = to
    t = L[i] - 1 - kg if back else kg - t0
    return Y[order[i], t, d] if layout else Y[t, d, order[i]]


@_jit
def _copy(src, dst, b0, b1, j0, j1):
    """``dst[b0:b1, j0:j1] = src[b0:b1, j0:j1]`` (a loop: NumPy-style slice assignment
    in numba costs about a cycle per element)."""
    for b in range(b0, b1):
        for j in range(j0, j1):
            dst[b, j] = src[b, j]


#: a plan as compiled code reads it (:func:`load_plan`): the record's scalars and views
PlanView = namedtuple(
    "PlanView",
    ("kind", "split", "input_forget", "fast", "width", "width_h", "width_r", "rows", "span",
     "depth", *ARRAYS),
)  # fmt: skip
_CODES, _ALPHAS, _BETAS, _CLIP, _BOUNDS = (HEAD + 4 * i for i in range(5))
_PANELS, _STARTS, _BIAS, _PANELS_H, _STARTS_H, _BIAS_H = (HEAD + 4 * i for i in range(5, 11))
_PANELS_R, _STARTS_R, _BIAS_R, _PEEPHOLES = (HEAD + 4 * i for i in range(11, 15))


@_inline
def load_plan(address, like):
    """The :class:`PlanView` of the record at ``address`` (:class:`.plans.Plan`), its
    floats of ``like``'s dtype: views without an owner, made without allocating."""
    r = view(address, (plans.WORDS,), INTS)
    return PlanView(
        r[plans.KIND_], r[plans.SPLIT] != 0, r[plans.INPUT_FORGET] != 0, r[plans.FAST] != 0,
        r[plans.WIDTH], r[plans.WIDTH_H], r[plans.WIDTH_R], r[plans.ROWS], r[plans.SPAN],
        r[plans.DEPTH],
        view(r[_CODES], (r[_CODES + 1],), r), view(r[_ALPHAS], (r[_ALPHAS + 1],), like),
        view(r[_BETAS], (r[_BETAS + 1],), like), view(r[_CLIP], (1,), like)[0],
        view(r[_BOUNDS], (r[_BOUNDS + 1],), r),
        view(r[_PANELS], (r[_PANELS + 1], r[_PANELS + 2], r[_PANELS + 3]), like),
        view(r[_STARTS], (r[_STARTS + 1],), r), view(r[_BIAS], (r[_BIAS + 1],), like),
        view(r[_PANELS_H], (r[_PANELS_H + 1], r[_PANELS_H + 2], r[_PANELS_H + 3]), like),
        view(r[_STARTS_H], (r[_STARTS_H + 1],), r), view(r[_BIAS_H], (r[_BIAS_H + 1],), like),
        view(r[_PANELS_R], (r[_PANELS_R + 1], r[_PANELS_R + 2], r[_PANELS_R + 3]), like),
        view(r[_STARTS_R], (r[_STARTS_R + 1],), r), view(r[_BIAS_R], (r[_BIAS_R + 1],), like),
        view(r[_PEEPHOLES], (r[_PEEPHOLES + 1], r[_PEEPHOLES + 2]), like),
    )  # fmt: skip


@functools.cache
def _entries(dt: np.dtype) -> tuple:
    """The entries' signatures for plans of ``dt``: arrays that a call may pass as
    views typed ``'A'``, inputs read-only; states and scratch C-ordered
    (:meth:`NumbaBackend.run_block` passes them so). Made once: a type costs µs."""
    element = numba.from_dtype(dt)

    def array(ndim: int, layout: str = "C", readonly: bool = False) -> types.Array:
        return types.Array(element, ndim, layout, readonly=readonly)

    ints, flag = types.Array(types.int64, 1, "C"), types.boolean
    head = (types.int64, ints, ints, types.int64)
    block = (*head, array(3, "A", True), array(2), array(2), array(2), array(3), array(2), ints,
             array(4, "A"), flag, types.int64, flag)  # fmt: skip
    return ((_part_block, block),)


@dataclass
class Shares:
    """What the threads that share one direction's hidden units share
    (:func:`_part_block`): the meeting point and the buffers of a step."""

    meeting: Sync
    spare: np.ndarray  # [rows, hidden]: Ht on every other step
    gz: np.ndarray  # [shares, rows, 3 * share]: rows' scratch, kept between phases
    rh: np.ndarray  # [rows, hidden]: r . Ht-1 (GRU, linear_before_reset = 0)
    common: np.ndarray  # what the parties' compiled units share (:func:`.node.shared_sizes`)
    first: int = 0  # the share this party claims first (:meth:`party`)

    def party(self, i: int) -> Shares:
        """What party ``i`` of the threads passes: the same buffers and meeting, its
        own share first (its core keeps that share's weights, step after step)."""
        return replace(self, first=i % self.shares)

    @property
    def shares(self) -> int:
        return self.meeting.shares

    @property
    def aborted(self) -> bool:
        return self.meeting.aborted

    def abort(self) -> None:
        """A party failed or was interrupted: the others return at their next claim."""
        self.meeting.abort()

    def final_state_into(self, states: tuple[np.ndarray, ...], steps: int) -> None:
        """After ``steps`` steps: the last ``Ht`` into ``states[0]`` (it alternates
        with ``spare``)."""
        if self.shares > 1 and steps % 2 == 1:
            states[0][...] = self.spare


_ALONE = Sync.make(1)  # one share: never claimed nor waited for


@functools.cache
def _alone(dt: np.dtype) -> Shares:
    """One thread's call without buffers to share (nothing in it is written)."""
    empty = np.empty((0, 0), dt)
    return Shares(_ALONE, empty, np.empty((1, 0, 0), dt), empty, _no_common(dt))


class NumbaBackend:
    name = "numba"
    calls_blas = False  # products of its own (packed.py)
    _prepared: ClassVar[set[np.dtype]] = set()  # the dtypes whose entries are compiled

    def supports(self, spec, dtype) -> str | None:
        if spec.cell.name not in plans.KIND:
            return f"no numba kernel for {spec.cell.name}"
        return None

    def prepare(self, spec, w, acts, dtype, shares=1) -> None:
        """Everything a call of one direction (weights ``w``, activations ``acts``) in
        ``dtype`` on ``shares`` shares will run, made and compiled now
        (:func:`~onnx_recurrent.threads.compiling`; never in a pool thread, nor on a
        later call's path)."""
        dt = np.dtype(dtype)
        if dt in self._prepared and plans.made(w, dt, shares):
            return  # made before (a large call's path: no thread started)

        def work() -> None:  # a fork waits for it (the child would hang in its locks)
            plans.get(spec, w, acts, dt, shares)
            if dt not in self._prepared:
                from .node import prepare_layer, prepare_unit

                for entry, signature in _entries(dt):
                    prepare(entry, signature)
                prepare_layer(dt)  # a small call's and a unit's compiled entries
                prepare_unit(dt)
                self._prepared.add(dt)

        threads.compiling(work)

    def shares(self, spec, rows, dtype, shares, input_size=None) -> Shares:
        """Buffers for ``shares`` shares of the hidden units of ``rows`` rows
        (:meth:`run_block` with ``shared``); with ``input_size``, for compiled units
        of those rows instead (:meth:`run_unit` with ``shared``)."""
        H = spec.hidden_size
        split = spec.split
        if input_size is not None and shares > 1:
            from .node import block_steps, shared_sizes

            G, lstm = spec.cell.n_gates, bool(spec.cell.n_peepholes)
            block = block_steps.py_func(G, rows, input_size, H, np.dtype(dtype).itemsize)
            size = sum(shared_sizes.py_func(rows, input_size, H, shares, lstm, split, block))
            none = _alone(dtype)
            common = np.empty(size, dtype)
            return Shares(Sync.make(shares), none.spare, none.gz, none.rh, common)
        if shares == 1 and not split:
            return _alone(dtype)
        most = -(-H // shares) + plans.SHARE_ALIGN  # the widest (plans.share_bounds)
        spare = np.empty((rows if shares > 1 else 0, H), dtype)
        gz = np.empty((shares, rows if split else 0, 3 * most), dtype)
        rh = np.empty((rows if split else 0, H), dtype)
        meeting = _ALONE if shares == 1 else Sync.make(shares)
        return Shares(meeting, spare, gz, rh, _no_common(dtype))

    def small_call(self, spec, directions, dtype) -> Callable:
        """A layer's small calls on this thread, in the layer's dtype (float32 or
        float64), as one compiled call each (:func:`.node.run_layer`), everything but
        the arrays worked out now: ``call(X, h0, c0, output_sequence, lens=None)`` with
        ``X`` in the caller's layout, the initial states checked (None: zeros) and the
        lengths checked, ``[batch_size]`` int64 (None: full length), returns ``(Y or
        None, Y_h[, Y_c])``."""
        from . import node

        dt = np.dtype(dtype)
        node.prepare_layer(dt)
        kept = [plans.get(spec, w, spec.activations[d], dt, 1) for d, w in enumerate(directions)]
        first, last = kept[0].address, kept[-1].address
        lstm = bool(spec.cell.n_peepholes)
        base = (
            (node.TWO_DIRECTIONS if len(kept) == 2 else 0)
            | (node.REVERSE if spec.direction == "reverse" else 0)
            | (node.LAYOUT if spec.layout else 0)
            | (node.LSTM if lstm else 0)
        )
        with_Y, with_h0, with_c0, with_lens = node.WRITE_Y, node.HAS_H0, node.HAS_C0, node.HAS_LENS
        empty, full = _no_Y(dt, 3), np.zeros(0, np.int64)
        run = node.run_layer

        def call(X, h0, c0, output_sequence, lens=None):
            flags = base | (with_Y if output_sequence else 0)
            if lens is None:
                lens = full
            else:
                flags |= with_lens
            if h0 is None:
                h0 = empty
            else:
                flags |= with_h0
            if c0 is None:
                c0 = empty
            else:
                flags |= with_c0
            try:
                Y, Y_h, Y_c = run(first, last, X, lens, h0, c0, flags)
            except SystemError as e:
                raise unboxed(e) from None
            if lstm:
                return (Y if output_sequence else None, Y_h, Y_c)
            return (Y if output_sequence else None, Y_h)

        call.plans = kept  # the plans whose addresses it passes live as long as it
        return call

    def run_unit(self, spec, w, acts, d, rows, x, Y_tm, finals_tm, abort, shared=None) -> bool:
        """Direction ``d`` (weights ``w``, activations ``acts``) of the batch ``rows``
        of the call ``x`` (computed in its own dtype), as one compiled call without
        the GIL (:func:`.node.run_unit`): each row's steps into ``Y_tm[:, d]`` (unless
        None; zeros past its length) and its final states into ``finals_tm[i][d]``, all
        time-major. ``abort``: a word read between blocks; False if it stopped the
        unit (the outputs are then incomplete). ``shared``: this thread's party of
        those that share the unit's hidden units (:meth:`shares` with ``block``)."""
        from . import node

        dt = x.compute_dtype
        shared = _alone(dt) if shared is None else shared
        plan = plans.get(spec, w, acts, dt, shared.shares)
        flags = node.HAS_LENS
        if spec.direction == "reverse" or d == 1:
            flags |= node.REVERSE
        empty = _no_Y(dt, 3)
        h0, c0 = (*x.initial_states, None)[:2]
        if h0 is not None:
            flags |= node.HAS_H0
        if c0 is not None:
            flags |= node.HAS_C0
        Y = _no_Y(dt, 4) if Y_tm is None else Y_tm[:, d : d + 1]
        if Y_tm is not None:
            flags |= node.WRITE_Y
        Yh = finals_tm[0][d : d + 1]
        Yc = finals_tm[1][d : d + 1] if len(finals_tm) > 1 else Yh
        result = node.run_unit(
            plan.address, flags, x.X, x.sequence_lens, rows,
            empty if h0 is None else h0[d : d + 1], empty if c0 is None else c0[d : d + 1],
            Y, Yh, Yc, shared.meeting.sync, shared.meeting.calls, abort, shared.first,
            shared.common,
        )  # fmt: skip
        if result == node.FAILED:
            raise MemoryError("onnx-recurrent: no memory for a unit's scratch")
        return result == node.DONE

    def run_block(self, spec, w, acts, xb, states, active, Yb, shared=None, step0=0) -> None:
        h = states[0]
        dt = h.dtype
        c = states[1] if len(states) > 1 else h
        shared = shared if shared is not None else self.shares(spec, len(h), dt, 1)
        plan = plans.get(spec, w, acts, dt, shared.shares)
        Y = Yb[:, None] if Yb is not None else _no_Y(dt, 4)  # [steps, 1, rows, H]
        project = len(h) < PROJECT_BELOW and shared.shares == 1
        meeting = shared.meeting
        _part_block(
            plan.address, meeting.sync, meeting.calls, shared.first,
            np.ascontiguousarray(xb, dt), h, shared.spare, c, shared.gz, shared.rh, active, Y,
            Yb is not None, step0, project,
        )  # fmt: skip


@functools.cache
def _no_common(dt: np.dtype) -> np.ndarray:
    """No buffers shared between compiled units (one party)."""
    return np.empty(0, dt)


@functools.cache
def _no_Y(dt: np.dtype, ndim: int) -> np.ndarray:
    """A placeholder for Y when none is written."""
    return np.zeros((1,) * (ndim - 2) + (0, 0), dt)


def unboxed(error: SystemError) -> BaseException:
    """The exception a signal's handler raised while numba boxed a kernel's result:
    boxing calls Python (a dtype unpickled), where the handler runs, and numba returns
    the result with it set, which Python reports as ``SystemError``s ("returned a
    result with an exception set") caused by it, so that ``except Exception`` took a
    Ctrl-C. ``error`` itself where it is not one of those."""
    root: BaseException = error
    while (
        isinstance(root, SystemError)
        and "returned a result with an exception set" in str(root)
        and root.__cause__ is not None
    ):
        root = root.__cause__
    return root


BACKEND = NumbaBackend()
