"""One time step per operator: no time axis, no layout, no directions.

A cell turns one direction's ONNX weights into :class:`Weights` (``prepare``) and
advances its states by one step for the ``n`` active rows (``step``), in place:

- ``xw``: ``[n, gates*hidden + pad]``, the input projection ``Xt W^T`` plus the biases the
  cell folded into it (computed for a whole block of steps by the scan);
- ``states``: ``(H,)`` or ``(H, C)``, each ``[n, hidden]``, updated in place.

Gate letters follow the spec: GRU ``z r h``, LSTM ``i o f c``, RNN ``i``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from .activations import Activation
from .errors import RecurrentError
from .spec import RecSpec


def activate(act: Activation, x: np.ndarray, clip: float | None) -> None:
    """Clip the gate input to ``[-clip, clip]`` (if set), then apply ``act`` in place."""
    if clip is not None:
        np.clip(x, -clip, clip, out=x)
    act(x)


@dataclass
class Probe:
    """Watches one step: each gate's input and output, by gate letter.

    ``overrides`` replaces a gate's ``(activation, clip)`` (``"h(C)"``: LSTM's output
    activation), to ask what a runtime that computes that gate differently would get.
    """

    overrides: dict[str, tuple[Activation, float | None]] = field(default_factory=dict)
    gates: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def gate(
    letter: str, act: Activation, x: np.ndarray, clip: float | None, probe: Probe | None
) -> None:
    """:func:`activate` one gate, seen by ``probe`` when there is one."""
    if probe is None:
        activate(act, x, clip)
        return
    act, clip = probe.overrides.get(letter, (act, clip))
    pre = x.copy()
    activate(act, x, clip)
    probe.gates[letter] = (pre, x.copy())


@dataclass
class Weights:
    """One direction's weights, arranged for the step.

    ``W``: ``[gates*hidden, input]`` and ``R``: ``[gates*hidden, hidden]`` in the
    cell's internal gate order, as given: a layer's are views of its weight copies, in
    its dtype, which may be narrower than the compute type (:attr:`dtype`; ``WT``,
    ``RT`` and the backends' arrangements are in it); ``bias``: ``[gates*hidden]``,
    added to ``X W^T``, in the compute type; ``extra``: per-cell vectors (GRU's
    ``Rbh``, LSTM's peepholes), in the compute type.
    """

    W: np.ndarray
    R: np.ndarray
    bias: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    #: made from these weights once (a backend's arrangements), and their bytes
    derived: dict = field(default_factory=dict, repr=False)
    derived_bytes: dict = field(default_factory=dict, repr=False)

    @property
    def dtype(self) -> np.dtype:
        """The compute type: the biases' (``W`` and ``R`` may be narrower)."""
        return self.bias.dtype

    def project(self, xb: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``X W^T + bias`` for a block of inputs ``[steps, rows, input]``: one matrix
        product, in ``dtype``, in a C-contiguous ``[steps, rows, gates*hidden + pad]``
        (:func:`padded`; the pad columns are not meaningful)."""
        steps, rows, size = xb.shape
        G = self.W.shape[0]
        xw = padded((steps * rows, G), dtype)
        np.matmul(xb.reshape(steps * rows, size).astype(dtype, copy=False), self.WT, out=xw[:, :G])
        xw[:, :G] += self.bias
        return xw.reshape(steps, rows, -1)

    def memory(self, besides: tuple[np.ndarray, ...] = ()) -> int:
        """Bytes held: the arrays, ``W^T`` and ``R^T`` once made, and the backends'
        arrangements; an array within one of ``besides`` (a layer's weight copies, which
        ``W`` and ``R`` are views of) is counted there, not here."""
        arrays = [self.W, self.R, self.bias, *self.extra.values()]
        arrays += [self.__dict__[k] for k in ("WT", "RT") if k in self.__dict__]  # made
        held = [a for a in arrays if not any(np.may_share_memory(a, b) for b in besides)]
        return sum(a.nbytes for a in held) + sum(self.derived_bytes.values())

    @cached_property
    def WT(self) -> np.ndarray:
        """``W^T`` in the compute type with unit column stride, rows :func:`padded`:
        BLAS is much faster on it than on a transposed view."""
        return padded(self.W.T, self.dtype)[:, : self.W.shape[0]]

    @cached_property
    def RT(self) -> np.ndarray:
        """``R^T`` ``[hidden, gates*hidden]`` in the compute type, rows :func:`padded`;
        a gate's columns are a slice."""
        return padded(self.R.T, self.dtype)[:, : self.R.shape[0]]


#: bytes added to each row of a matrix that a product reads or writes
ROW_PAD = 64


def padded(a: np.ndarray | tuple[int, int], dtype: np.dtype | None = None) -> np.ndarray:
    """A C-contiguous 2-D array whose rows are one cache line longer than ``a``'s (a
    copy of ``a`` in its first columns, or empty for a shape): a row stride that is a
    multiple of 1-4 KiB makes a matrix product's loads collide in the cache (measured:
    1.2-1.9x slower products). Slice ``[:, :columns]`` for the matrix itself."""
    shape = a if isinstance(a, tuple) else a.shape
    dtype = np.dtype(dtype or a.dtype)
    out = np.empty((shape[0], shape[1] + ROW_PAD // dtype.itemsize), dtype)
    if not isinstance(a, tuple):
        out[:, : shape[1]] = a
    return out


class Cell:
    """What one operator adds to the shared skeleton: its numbers and its step."""

    name: ClassVar[str]
    n_gates: ClassVar[int]
    #: gate letters in ``W``'s order (the spec's), each with its activation slot
    #: (0: f, 1: g, 2: h)
    gates: ClassVar[Mapping[str, int]]
    n_activations: ClassVar[int]
    default_activations: ClassVar[tuple[str, ...]]
    state_names: ClassVar[tuple[str, ...]] = ("initial_h",)
    #: the operator's inputs by position, and its outputs, as the spec names them
    inputs: ClassVar[tuple[str, ...]] = ("X", "W", "R", "B", "sequence_lens", "initial_h")
    outputs: ClassVar[tuple[str, ...]] = ("Y", "Y_h")
    #: the operator's versions in the default domain
    versions: ClassVar[tuple[int, ...]] = (1, 7, 14, 22)
    n_peepholes: ClassVar[int] = 0
    #: the compiled step's code for this cell (``numba_backend._share``; a plan's ``kind``)
    kind: ClassVar[int]
    #: attributes beyond the ones every operator has
    own_attributes: ClassVar[tuple[str, ...]] = ()

    def prepare(
        self, spec: RecSpec, W: np.ndarray, R: np.ndarray, B: np.ndarray, P: np.ndarray | None
    ) -> Weights:
        """Default: W and R as given, both biases folded into the input projection."""
        G = self.n_gates * spec.hidden_size
        return Weights(W, R, B[:G] + B[G:])

    def workspace(self, spec: RecSpec, batch: int, dtype: np.dtype) -> dict[str, np.ndarray]:
        """Buffers the step reuses, ``[batch, ...]``; the step slices ``[:n]``."""
        return {"g": np.empty((batch, self.n_gates * spec.hidden_size), dtype)}

    def step(
        self,
        spec: RecSpec,
        w: Weights,
        acts: tuple[Activation, ...],
        xw: np.ndarray,
        states: tuple[np.ndarray, ...],
        work: dict[str, np.ndarray],
        probe: Probe | None = None,
    ) -> None:
        """One time step of the NumPy backend, in place: ``states`` (``Ht-1`` and, for
        an LSTM, ``Ct-1``; each ``[rows, hidden_size]`` in the compute dtype) become
        ``Ht`` (and ``Ct``) of ``rows`` running rows, from ``xw`` ``[rows, gates *
        hidden_size + pad]``, the step's ``Xt W^T + b`` (biases as :meth:`prepare`
        arranged them), the weights ``w`` and the activations ``acts`` (``spec``'s of
        this direction). ``work``: :meth:`workspace` buffers, sliced to ``rows``;
        ``probe``: each gate's values, for ``onnx-recurrent check --trace``.
        The specification's equations of the operator (docs/semantics.md settles
        what it leaves open)."""
        raise NotImplementedError


class RNNCell(Cell):
    """``Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi)``."""

    name = "RNN"
    n_gates = 1
    gates = MappingProxyType({"i": 0})
    kind = 0
    n_activations = 1
    default_activations = ("Tanh",)

    def step(self, spec, w, acts, xw, states, work, probe=None):
        (h,) = states
        a = work["g"][: len(h)]
        np.matmul(h, w.RT, out=a)
        a += xw
        gate("i", acts[0], a, spec.clip, probe)
        h[...] = a


class GRUCell(Cell):
    """``z r h`` gates; ``linear_before_reset`` chooses where ``r`` applies."""

    name = "GRU"
    n_gates = 3
    gates = MappingProxyType({"z": 0, "r": 0, "h": 1})
    kind = 1
    versions = (1, 3, 7, 14, 22)
    n_activations = 2
    default_activations = ("Sigmoid", "Tanh")
    own_attributes = ("linear_before_reset",)

    def prepare(self, spec, W, R, B, P):
        H = spec.hidden_size
        Wb, Rb = B[: 3 * H], B[3 * H :]
        bias = Wb.copy()
        bias[: 2 * H] += Rb[: 2 * H]
        extra = {}
        if spec.linear_before_reset:
            extra["Rbh"] = Rb[2 * H :].copy()  # inside r * (Ht-1 Rh^T + Rbh)
        else:
            bias[2 * H :] += Rb[2 * H :]
        return Weights(W, R, bias, extra)

    @staticmethod
    def _zr(f: Activation, zr: np.ndarray, clip: float | None, probe: Probe | None) -> None:
        if probe is None:  # z and r share f: one pass
            activate(f, zr, clip)
            return
        H = zr.shape[1] // 2
        gate("z", f, zr[:, :H], clip, probe)
        gate("r", f, zr[:, H:], clip, probe)

    def workspace(self, spec, batch, dtype):
        H = spec.hidden_size
        return {
            "g": np.empty((batch, 3 * H), dtype),
            "rh": np.empty((batch, H), dtype),
        }

    def step(self, spec, w, acts, xw, states, work, probe=None):
        (h,) = states
        n, H = h.shape
        f, g = acts
        gates = work["g"][:n]
        zr, hh = gates[:, : 2 * H], gates[:, 2 * H :]
        if spec.linear_before_reset:
            np.matmul(h, w.RT, out=gates)
            zr += xw[:, : 2 * H]
            self._zr(f, zr, spec.clip, probe)
            hh += w.extra["Rbh"]
            hh *= zr[:, H:]
        else:
            np.matmul(h, w.RT[:, : 2 * H], out=zr)
            zr += xw[:, : 2 * H]
            self._zr(f, zr, spec.clip, probe)
            rh = work["rh"][:n]
            np.multiply(zr[:, H:], h, out=rh)
            np.matmul(rh, w.RT[:, 2 * H :], out=hh)
        hh += xw[:, 2 * H :]
        gate("h", g, hh, spec.clip, probe)
        # Ht = (1 - z) h + z Ht-1, as the spec writes it (h + z (Ht-1 - h) loses Ht-1
        # where |h| is far larger, and makes NaN of an infinite h)
        z, rest = zr[:, :H], work["rh"][:n]
        np.subtract(1, z, out=rest)
        hh *= rest
        h *= z
        h += hh


class LSTMCell(Cell):
    """``i o f c`` gates, peepholes ``P = [Pi, Po, Pf]``, ``input_forget``."""

    name = "LSTM"
    n_gates = 4
    gates = MappingProxyType({"i": 0, "o": 0, "f": 0, "c": 1})
    kind = 2
    n_activations = 3
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    state_names = ("initial_h", "initial_c")
    inputs = (*Cell.inputs, "initial_c", "P")
    outputs = ("Y", "Y_h", "Y_c")
    n_peepholes = 3
    own_attributes = ("input_forget",)

    def prepare(self, spec, W, R, B, P):
        w = super().prepare(spec, W, R, B, P)
        if P is not None:
            H = spec.hidden_size
            w.extra = {"Pi": P[:H], "Po": P[H : 2 * H], "Pf": P[2 * H :]}
        return w

    def workspace(self, spec, batch, dtype):
        H = spec.hidden_size
        return {"g": np.empty((batch, 4 * H), dtype), "t": np.empty((batch, H), dtype)}

    def step(self, spec, w, acts, xw, states, work, probe=None):
        h, c = states
        n, H = h.shape
        f, g, hact = acts
        clip = spec.clip
        gates = work["g"][:n]
        tmp = work["t"][:n]
        np.matmul(h, w.RT, out=gates)
        gates += xw
        i, o, fg, cg = (gates[:, k * H : (k + 1) * H] for k in range(4))
        peep = w.extra
        if peep:
            i += np.multiply(peep["Pi"], c, out=tmp)
            fg += np.multiply(peep["Pf"], c, out=tmp)
        gate("i", f, i, clip, probe)
        if spec.input_forget:
            pre_f = fg.copy() if probe else None
            np.subtract(1, i, out=fg)
            if probe:
                probe.gates["f"] = (pre_f, fg.copy())
        else:
            gate("f", f, fg, clip, probe)
        gate("c", g, cg, clip, probe)
        c *= fg
        c += np.multiply(i, cg, out=tmp)
        if peep:
            o += np.multiply(peep["Po"], c, out=tmp)
        gate("o", f, o, clip, probe)
        np.copyto(tmp, c)
        gate("h(C)", hact, tmp, None, probe)  # the cell state itself is not clipped
        np.multiply(o, tmp, out=h)


RNN = RNNCell()
GRU = GRUCell()
LSTM = LSTMCell()
#: the cells by ONNX operator name
CELLS: dict[str, Cell] = {cell.name: cell for cell in (GRU, LSTM, RNN)}


def check_arity(op: str, n_inputs: int, n_outputs: int) -> None:
    """A node of operator ``op`` names no more inputs and outputs than the spec has.

    Raises
    ------
    ValueError
        Too many (``"7 inputs, GRU has at most 6 (X, W, R, ...)"``).
    """
    cell = CELLS[op]
    for what, names, count in (
        ("inputs", cell.inputs, n_inputs),
        ("outputs", cell.outputs, n_outputs),
    ):
        if count > len(names):
            raise RecurrentError(
                f"{count} {what}, {op} has at most {len(names)} ({', '.join(names)})"
            )


#: the attributes every operator has
COMMON_ATTRIBUTES = (
    "hidden_size",
    "direction",
    "activations",
    "activation_alpha",
    "activation_beta",
    "clip",
    "layout",
)
