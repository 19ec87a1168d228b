"""A direction's plan: the packed weights and activations the compiled step loop reads.

A :class:`Plan` is made once per layer direction and number of shares, with NumPy
(no compiler loaded), and handed to compiled code as one record: an int64 array of
:data:`WORDS` words, its address the only argument. The record holds the scalars
(``HEAD``) and, for each array of :data:`ARRAYS`, its address and up to three
dimensions; compiled code reads it into views (:func:`.numba_backend.load_plan`). The
:class:`Plan` object keeps the arrays alive: the record is valid while it lives.

The scalars: ``kind`` 0 RNN, 1 GRU, 2 LSTM; ``split``: GRU's reset gate before the
product (``linear_before_reset`` 0); ``input_forget``; ``fast``: float32 (tanh by
float32's formula); ``width``, ``width_h``, ``width_r``: the longest row a share's product
writes, of ``panels``, ``panels_h``, ``panels_r``; ``rows``, ``span``, ``depth``: the
products' tiles (:func:`.tuning.tiles`, measured on this CPU). The arrays:

============== ==============================================================
``codes``      the activations (:data:`CODES`), with ``alphas`` and ``betas``
``clip``       one value (infinite: none)
``bounds``     share ``s`` is hidden units ``bounds[s]..bounds[s+1]-1``
``panels``     the packed panels (:mod:`.layout`) of ``[W^T; R^T]`` (GRU: its ``z r``
               columns only), share after share, each share's columns gate after gate
``starts``     share ``s`` is ``panels[starts[s]:starts[s+1]]``
``bias``       the biases of ``panels``' columns, as they are packed
``panels_h``   GRU's ``h`` columns: of ``[W^T; R^T]`` (``split``), else of ``W^T``
``starts_h``   ``bias_h``: as ``starts`` and ``bias``, for ``panels_h``
``panels_r``   GRU's ``h`` columns of ``R^T`` (not ``split``: ``Rbh`` its biases)
``starts_r``   ``bias_r``: as ``starts`` and ``bias``, for ``panels_r``
``peepholes``  LSTM's ``[Pi, Po, Pf]`` (no columns when absent)
============== ==============================================================
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from ..activations import TABLE
from ..cells import CELLS
from ..threads import interrupts_held
from . import layout, tuning

#: activation name (lower case) -> its code, as the compiled ``_apply`` reads it
CODES = {name: int(kind.code) for name, kind in TABLE.items()}
#: operator -> the record's ``kind`` (the cell's)
KIND = {name: cell.kind for name, cell in CELLS.items()}

#: the record's scalar words
KIND_, SPLIT, INPUT_FORGET, FAST, WIDTH, WIDTH_H, WIDTH_R, ROWS, SPAN, DEPTH = range(10)
HEAD = 10
#: the record's arrays, each as four words from ``HEAD + 4 i``: address, dimensions
ARRAYS = (
    *("codes", "alphas", "betas", "clip", "bounds"),
    *("panels", "starts", "bias", "panels_h", "starts_h", "bias_h"),
    *("panels_r", "starts_r", "bias_r", "peepholes"),
)
WORDS = HEAD + 4 * len(ARRAYS)


def at(name: str) -> int:
    """The first word of array ``name`` in the record."""
    return HEAD + 4 * ARRAYS.index(name)


class Plan:
    """One direction's record (see the module): ``record`` (int64 words), its
    ``address``, and the arrays it points into, kept here."""

    __slots__ = ("address", "arrays", "nbytes", "record")

    def __init__(self, head: dict[int, int], arrays: dict[str, np.ndarray]) -> None:
        record = np.zeros(WORDS, np.int64)
        for word, value in head.items():
            record[word] = value
        for name in ARRAYS:
            a = arrays[name]
            if not a.flags.c_contiguous or a.ndim > 3:
                raise ValueError(f"plan: {name} must be C-ordered, at most 3-D")
            o = at(name)
            record[o] = a.ctypes.data
            record[o + 1 : o + 1 + a.ndim] = a.shape
        self.record = record
        self.address = int(record.ctypes.data)
        self.arrays = arrays
        held = ("panels", "bias", "panels_h", "bias_h", "panels_r", "bias_r", "peepholes")
        self.nbytes = sum(arrays[n].nbytes for n in held)


def made(w, dt: np.dtype, shares: int) -> bool:
    """Whether :func:`get` has made that plan already (nothing to compile or measure)."""
    return ("plan", np.dtype(dt), shares) in w.derived


def get(spec, w, acts: tuple, dt: np.dtype, shares: int) -> Plan:
    """The :class:`Plan` of one direction's prepared weights ``w`` (activations
    ``acts``) in ``dt`` cut into ``shares`` shares of hidden units, made once (kept
    in ``w.derived``, its bytes in ``w.derived_bytes``)."""
    dt = np.dtype(dt)
    key = ("plan", dt, shares)
    plan = w.derived.get(key)
    if plan is None:
        tile = tuning.tiles()  # measured on first use, before Ctrl-C is held off
        with interrupts_held():  # made whole or not at all
            plan = w.derived[key] = _make(spec, w, acts, dt, shares, tile)
            w.derived_bytes[key] = plan.nbytes
    return plan


#: the shares of hidden units start on multiples of this many units: the cell loops'
#: vector body and scalar tail then cover the same units whatever the split (a float64
#: LSTM's tail rounded otherwise, 1-3 ulp off one thread's: results bit for bit the same
#: for any thread count); a share is at most this many units wider than an even one
SHARE_ALIGN = 16


def share_bounds(H: int, shares: int) -> list[int]:
    """The first hidden unit of each of ``shares`` shares, and ``H``: as even as
    :data:`SHARE_ALIGN` allows (each within ``SHARE_ALIGN / 2`` of ``i * H / shares``);
    even where a share would have fewer than ``SHARE_ALIGN`` units (which the scan's
    ``MIN_SHARE`` rules out; an aligned bound could leave a share empty)."""
    if H < SHARE_ALIGN * shares:
        return [i * H // shares for i in range(shares + 1)]
    inner = [(i * H // shares + SHARE_ALIGN // 2) // SHARE_ALIGN * SHARE_ALIGN
             for i in range(1, shares)]  # fmt: skip
    return [0, *inner, H]


def _make(spec, w, acts: tuple, dt: np.dtype, shares: int, tile: tuple[int, int, int]) -> Plan:
    kind = KIND[spec.cell.name]
    split = spec.split
    H = spec.hidden_size
    bounds = np.array(share_bounds(H, shares), np.int64)
    L = layout.panel_width(dt)
    arrays: dict[str, np.ndarray] = {"bounds": bounds}
    widths = []
    parts = _share_panels(w, kind, split, spec.cell.n_gates)
    for suffix, (blocks, gates, b, b0) in zip(("", "_h", "_r"), parts, strict=True):
        cols = [_columns(gates, H, j0, j1) for j0, j1 in itertools.pairwise(bounds.tolist())]
        first = np.cumsum([0] + [-(-len(c) // L) for c in cols]).astype(np.int64)
        # one aligned array, the shares' panels one after another, each packed in place
        F = layout.empty_panels(int(first[-1]), sum(m.shape[0] for m in blocks), dt)
        bias = np.zeros(int(first[-1]) * L, dt)
        for c, p0, p1 in zip(cols, first[:-1].tolist(), first[1:].tolist(), strict=True):
            k0 = 0
            for m in blocks:
                layout.pack(m, c, F[p0:p1], k0)
                k0 += m.shape[0]
            bias[p0 * L : p0 * L + len(c)] = b[c - b0]
        arrays |= {"panels" + suffix: F, "starts" + suffix: first, "bias" + suffix: bias}
        widths.append(layout.columns(int(np.diff(first).max(initial=0)) * L, dt))
    P = np.zeros((3, 0), dt)  # no peepholes: no columns (no peephole term at all)
    if "Pi" in w.extra:
        P = np.stack([w.extra["Pi"], w.extra["Po"], w.extra["Pf"]]).astype(dt, copy=False)
    arrays["peepholes"] = np.ascontiguousarray(P)
    arrays["codes"], arrays["alphas"], arrays["betas"] = _table(acts, dt)
    with np.errstate(over="ignore"):  # beyond dt's range: inf, no clipping (as a cast)
        arrays["clip"] = np.array([np.inf if spec.clip is None else spec.clip], dt)
    head = {KIND_: kind, SPLIT: split, INPUT_FORGET: bool(spec.input_forget)}
    head |= {FAST: dt == np.float32, WIDTH: widths[0], WIDTH_H: widths[1], WIDTH_R: widths[2]}
    head |= {ROWS: tile[0], SPAN: tile[1], DEPTH: tile[2]}
    return Plan(head, arrays)


def _share_panels(w, kind: int, split: bool, n_gates: int) -> tuple:
    """What ``panels``, ``panels_h`` and ``panels_r`` of a plan of the weights ``w``
    are made of, each as ``(blocks, gates, bias, first)``: its matrix is the
    ``blocks`` (``W^T``, ``R^T`` or both, views) stacked, a share's columns are those
    of its hidden units in each of ``gates``, its biases are ``bias[c - first]`` for
    the column ``c`` (a row of ``W``)."""
    WT, RT = w.W.T, w.R.T
    none = ((RT,), (), w.bias, 0)
    if kind != 1:
        return ((WT, RT), range(n_gates), w.bias, 0), none, none
    zr = ((WT, RT), (0, 1), w.bias, 0)  # GRU: z r | h
    if split:
        return zr, ((WT, RT), (2,), w.bias, 0), none
    H = RT.shape[0]
    return zr, ((WT,), (2,), w.bias, 0), ((RT,), (2,), w.extra["Rbh"], 2 * H)


def _columns(gates, H: int, j0: int, j1: int) -> np.ndarray:
    """The rows of ``W`` (columns of ``W^T``) of hidden units ``j0..j1-1`` of each of
    ``gates``, gate after gate."""
    parts = [np.arange(g * H + j0, g * H + j1, dtype=np.int64) for g in gates]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@functools.lru_cache(maxsize=256)
def _table(acts: tuple, dt: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, alphas, betas) of a direction's activations, padded to 3, the
    parameters rounded to ``dt`` (beyond its range: inf, as ONNX's float32 attributes
    hold a Python float beyond float32's, docs/semantics.md)."""
    pad = 3 - len(acts)
    with np.errstate(over="ignore"):
        return (
            np.array([CODES[act.name.lower()] for act in acts] + [0] * pad, np.int64),
            np.array([act.alpha for act in acts] + [0.0] * pad, dt),
            np.array([act.beta for act in acts] + [0.0] * pad, dt),
        )
