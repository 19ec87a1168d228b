"""Prepared layers: one recurrent node's weights, checked and arranged once, run many times.

A :class:`Layer` owns read-only copies of its weights, parses its attributes once
(:func:`~onnx_recurrent.spec.make_spec`) and prepares each direction once per compute
type (the cell's arrangement, then the backend's packed panels and shares); a call
checks only what it brings (X, lengths, states). The functions
(:func:`~onnx_recurrent.gru`, ...), the sessions and the converters all run through
it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import backends, threads
from .cells import CELLS, COMMON_ATTRIBUTES, Weights
from .errors import RecurrentError, RecurrentTypeError
from .scan import scan, threaded
from .spec import (
    Inputs,
    RecSpec,
    as_float_array,
    check_bool,
    check_call,
    check_lengths,
    check_state,
    check_weights,
    check_X,
    compute_dtype,
    list_in_dtype,
    make_spec,
)

#: multiply-adds and row steps (``seq_length * batch_size``) of a call at most for a
#: layer's small path: one compiled call, which no Ctrl-C stops (about 5 ms at 25
#: GMAC/s, or 20-50 ms of the smallest cells; larger calls go block by block)
ONE_CALL_MACS = 1 << 27
ONE_CALL_STEPS = 1 << 20


def _remade(cls: type, op: str, W, R, B, attributes: dict, P, prepared: bool) -> Layer:
    """A pickled :class:`Layer` made anew."""
    return cls(op, W, R, B, attributes, P, prepare=prepared)


def _copied(value: Any) -> Any:
    """An attribute's value, a list or array copied (its items are numbers or names)."""
    if isinstance(value, list | tuple):
        return list(value) if isinstance(value, list) else tuple(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def _frozen(a: np.ndarray | None, name: str) -> np.ndarray | None:
    """A read-only C-ordered copy (nothing the caller holds aliases it), as a view
    that cannot be made writable again (``setflags(write=True)`` on the copy itself
    would let its panels and its pickled copies part ways); ``name``: the input's, for
    the MemoryError."""
    if a is None:
        return None
    try:
        copy = np.array(a, order="C", copy=True)
    except MemoryError:  # NumPy's names the shape only
        raise MemoryError(
            f"onnx-recurrent: no memory to copy {name} (shape {list(a.shape)}, {a.dtype}: "
            f"{a.nbytes / 2**30:.3g} GiB)"
        ) from None
    copy.setflags(write=False)
    view = copy.view()
    view.setflags(write=False)
    return view


class Layer:
    """One ONNX recurrent node (GRU, LSTM or RNN) with its weights, ready to run.

    Parameters
    ----------
    op : {"GRU", "LSTM", "RNN"}
        The ONNX operator.
    W : (num_directions, gates*hidden_size, input_size) ndarray
        Input weights, gates in ONNX order (GRU ``z r h``, LSTM ``i o f c``, RNN ``i``);
        float16, float32, float64 or bfloat16: the layer's dtype.
    R : (num_directions, gates*hidden_size, hidden_size) ndarray
        Recurrent weights, same gate order and dtype.
    B : (num_directions, 2*gates*hidden_size) ndarray, optional
        ``[Wb, Rb]``; zeros if absent.
    attributes : mapping, optional
        The node's attributes, named as in the specification and as the keywords of
        :func:`~onnx_recurrent.gru`, :func:`~onnx_recurrent.lstm`,
        :func:`~onnx_recurrent.rnn`: ``hidden_size``, ``direction``, ``activations``,
        ``activation_alpha``, ``activation_beta``, ``clip``, ``layout``, and
        ``linear_before_reset`` (GRU) or ``input_forget`` (LSTM).
    P : (num_directions, 3*hidden_size) ndarray, optional
        LSTM peepholes ``[Pi, Po, Pf]``; zeros if absent.
    prepare : bool, keyword-only
        Compile (or load) the kernels now (the default: no call compiles), or on the
        first call (a session's layers whose nodes run as native nodes: :meth:`prepare`).

    Raises
    ------
    ValueError
        (``onnx_recurrent.RecurrentError``) an unknown ``op`` or attribute, a bad
        attribute value of the right type (an unknown direction or activation,
        ``clip <= 0``...; ``layout`` other than 0 or 1, whatever its type;
        ``linear_before_reset`` or ``input_forget`` not an integer, whose nonzero
        values are true), weights whose shapes disagree (expected and
        actual in the message), P for a GRU or RNN;
        ``ONNX_RECURRENT_NUM_THREADS`` set to what it does not take (checked here,
        although only large calls read it).
    TypeError
        (``onnx_recurrent.RecurrentTypeError``) weights without a float dtype, or of
        different dtypes; ``attributes`` not a mapping; an attribute of another type
        than the specification's (``hidden_size=5.0``, ``activations`` a string...: as
        :func:`~onnx_recurrent.gru` lists them).

    Notes
    -----
    The weights are copied (read-only) and prepared once: changing the arrays passed
    afterwards does not change the layer, and its ``op``, ``spec``, ``W``, ``R``, ``B``,
    ``P``, ``dtype`` and ``addresses`` cannot be set again (AttributeError; a layer of
    other weights: :meth:`replace`). Calls may come from several threads at once.

    Examples
    --------
    >>> layer = Layer("LSTM", W, R, B, attributes={"hidden_size": 128})  # doctest: +SKIP
    >>> Y, Y_h, Y_c = layer(X, initial_h=h0, initial_c=c0)  # doctest: +SKIP
    """

    def __init__(
        self,
        op: str,
        W: np.ndarray,
        R: np.ndarray,
        B: np.ndarray | None = None,
        attributes: Mapping[str, Any] | None = None,
        P: np.ndarray | None = None,
        *,
        prepare: bool = True,
    ) -> None:
        cell = CELLS.get(op) if isinstance(op, str) else None
        if cell is None:
            raise RecurrentError(f"Layer.op must be one of {sorted(CELLS)}, got {op!r}")
        if attributes is not None and not isinstance(attributes, Mapping):
            raise RecurrentTypeError(
                "attributes must be a mapping (a dict) of attribute names to values, "
                f"got {type(attributes).__name__}"
            )
        # the caller's lists and arrays copied: a later change to them is not the layer's
        attributes = {k: _copied(v) for k, v in (attributes or {}).items()}
        allowed = set(COMMON_ATTRIBUTES) | set(cell.own_attributes)
        unknown = set(attributes) - allowed
        if unknown:
            raise RecurrentError(
                f"{op} has no attribute(s) {sorted(unknown)}; its attributes: {sorted(allowed)}"
            )
        # one of them a list: in the other's dtype (a list has none of its own)
        W, R = list_in_dtype("W", W, R), list_in_dtype("R", R, W)
        W, R = as_float_array("W", W), as_float_array("R", R)
        for name, value in (("W", W), ("R", R)):
            if value.ndim != 3:
                raise RecurrentError(
                    f"{name} must be 3-D [num_directions, gates*hidden_size, ...], "
                    f"got shape {list(value.shape)}"
                )
        spec = make_spec(cell, R, **attributes)
        W, R, B, P = check_weights(
            spec, W, R, B, P, dtype=W.dtype, input_size=W.shape[2], owner="W's"
        )
        self._set(spec, attributes, W, R, B, P, prepare)

    #: what the layer was made of: set once (it computes with what it prepared from them)
    _FIXED = frozenset({"op", "spec", "W", "R", "B", "P", "dtype", "addresses"})
    #: every attribute :meth:`_set` sets (others are the caller's or a subclass's)
    _OWN = _FIXED | {
        "_attributes", "_directions", "_preparing", "_counted", "_small", "_step_macs",
        "_prepared",
    }  # fmt: skip

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Layer._FIXED and name in self.__dict__:
            other = (
                f"layer.replace({name}=...)"
                if name in ("op", "W", "R", "B", "P")
                else "Layer(...)"
            )
            raise AttributeError(
                f"Layer.{name} is fixed when the layer is made (it computes with what it "
                f"prepared from it): make another layer, {other}"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in Layer._FIXED:
            raise AttributeError(f"Layer.{name} is fixed when the layer is made")
        object.__delattr__(self, name)

    def _set(self, spec: RecSpec, attributes: dict, W, R, B, P, prepare: bool = True) -> None:
        threads.num_threads()  # a bad variable named here, not at a first large call
        self.op = spec.cell.name
        self.spec = spec
        self._attributes = attributes
        self.W, self.R, self.B, self.P = (
            _frozen(a, n) for a, n in zip((W, R, B, P), "WRBP", strict=True)
        )
        self.dtype = self.W.dtype
        #: where the weight copies are (compared by :mod:`.prepared`)
        self.addresses = tuple(
            0 if a is None else a.ctypes.data for a in (self.W, self.R, self.B, self.P)
        )
        self._directions: tuple[Weights, ...] | None = None
        # a first call from several threads at once: one prepares, the others wait
        #: the first call's lock (and :meth:`prepare`'s), made anew in a forked child
        self._preparing = threads.ForkLock(reentrant=True)
        self._counted = False  # prepared.evict_to_fit: its memory counted after a first call
        # small calls of full-length sequences: one compiled call, prepared with the
        # layer (the backend's small_call), with the backend it belongs to
        self._small: tuple[Any, Any] | None = None
        #: multiply-adds of one step of one row, every direction (as the scan counts)
        self._step_macs = (
            spec.num_directions * spec.cell.n_gates * spec.hidden_size
            * (spec.hidden_size + W.shape[2])
        )  # fmt: skip
        self._prepared = False
        if prepare:
            self.prepare()

    @classmethod
    def from_spec(
        cls,
        spec: RecSpec,
        attributes: Mapping[str, Any],
        W: np.ndarray,
        R: np.ndarray,
        B: np.ndarray | None = None,
        P: np.ndarray | None = None,
    ) -> Layer:
        """A layer of weights already checked against ``spec``, neither checked nor
        copied again: the functions' path (:mod:`onnx_recurrent.prepared`), which has
        made ``spec`` (:func:`~onnx_recurrent.spec.make_spec`) and run
        :func:`~onnx_recurrent.spec.check_weights` on copies of the caller's weights
        (``W`` ``[num_directions, gates*hidden_size, input_size]``, ``R``
        ``[num_directions, gates*hidden_size, hidden_size]``, ``B``
        ``[num_directions, 2*gates*hidden_size]``, ``P`` ``[num_directions,
        3*hidden_size]``, all of ``spec``'s dtype). Unchecked weights give wrong
        results or errors from deep inside: use :class:`Layer` itself."""
        layer = cls.__new__(cls)
        layer._set(spec, {k: _copied(v) for k, v in attributes.items()}, W, R, B, P, True)
        return layer

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its op, weights and attributes, made anew (and prepared, if it
        was) where it is unpickled: the prepared form holds compiled code of this
        process (for ``multiprocessing``, Dask...). Attributes of the caller's or a
        subclass's own go with it (set after its constructor)."""
        made = (type(self), self.op, self.W, self.R, self.B, self._attributes, self.P)
        own = {k: v for k, v in self.__dict__.items() if k not in Layer._OWN}
        return (_remade, (*made, self._prepared), own or None)

    @property
    def attributes(self) -> dict[str, Any]:
        """The layer's attributes, as given (a copy: changing it changes nothing)."""
        return {k: _copied(v) for k, v in self._attributes.items()}

    def __repr__(self) -> str:
        B = None if self.B is None else list(self.B.shape)
        P = "" if self.P is None else f", P={list(self.P.shape)}"  # an LSTM's peepholes
        return (
            f"Layer({self.op!r}, W={list(self.W.shape)}, R={list(self.R.shape)}, B={B}, "
            f"dtype={self.W.dtype}, attributes={self.attributes!r}{P})"
        )

    @property
    def num_directions(self) -> int:
        """``W.shape[0]``: 1, or 2 for a bidirectional layer."""
        return self.W.shape[0]

    @property
    def hidden_size(self) -> int:
        """``R.shape[-1]``."""
        return self.R.shape[-1]

    @property
    def input_size(self) -> int:
        """``W.shape[-1]``."""
        return self.W.shape[-1]

    @property
    def layout(self) -> int:
        """The ``layout`` attribute: 1 for batch-first inputs and outputs, else 0."""
        return self.spec.layout

    @property
    def nbytes(self) -> int:
        """Bytes of the weight copies (see :meth:`memory` for all the layer holds)."""
        return sum(a.nbytes for a in (self.W, self.R, self.B, self.P) if a is not None)

    def memory(self) -> int:
        """Bytes the layer holds now: the weight copies and what has been prepared from
        them so far (each direction's biases, a backend's packed panels; the cell's
        ``W`` and ``R`` are views of the copies)."""
        copies = tuple(a for a in (self.W, self.R, self.B, self.P) if a is not None)
        return self.nbytes + sum(w.memory(copies) for w in self._directions or ())

    def directions(self) -> tuple[Weights, ...]:
        """Each direction's weights as the cell arranged them (made once; the backends
        keep their own arrangements in ``derived``): ``W`` and ``R`` are views of the
        layer's copies, in its dtype, the biases in the compute type; nothing the size
        of the weights is copied."""
        if self._directions is not None:
            return self._directions
        with self._preparing:  # made once: a second tuple would free the first's plans
            if self._directions is None:
                spec, ct = self.spec, compute_dtype(self.dtype)
                D, G = self.num_directions, spec.cell.n_gates * spec.hidden_size
                B = np.zeros((D, 2 * G), ct) if self.B is None else self.B.astype(ct, copy=False)
                P = None if self.P is None else self.P.astype(ct, copy=False)
                self._directions = tuple(
                    spec.cell.prepare(
                        spec, self.W[d], self.R[d], B[d], None if P is None else P[d]
                    )
                    for d in range(D)
                )
        return self._directions

    def prepare(self) -> None:
        """Arrange each direction's weights and compile (or load) the kernels a call
        will run, now, on this thread, with Ctrl-C held off while numba compiles and
        delivered right after. A layer does this when it is made, so that no call
        compiles, and no pool thread does; a call under another backend
        (:func:`onnx_recurrent.backends.use`) prepares what it lacks before it starts
        any thread. A layer made with ``prepare=False`` does it on its first call (one
        thread does, others making a first call meanwhile wait for it)."""
        with self._preparing:
            self._prepare()

    def _prepare_once(self) -> None:
        with self._preparing:
            if not self._prepared:  # another thread's first call may have done it
                self._prepare()

    def _prepare(self) -> None:
        spec, ct = self.spec, compute_dtype(self.dtype)
        directions = self.directions()
        try:
            backend = backends.select(spec, ct)
        except RecurrentError:  # a backend named that cannot run it: the call says so
            self._prepared = True
            return
        prepare = getattr(backend, "prepare", None)
        try:
            for d, w in enumerate(directions if prepare is not None else ()):
                prepare(spec, w, spec.activations[d], ct, 1)
        except MemoryError as e:  # NumPy's names an internal array's shape only
            raise MemoryError(
                f"onnx-recurrent: no memory to prepare a {self.op} layer (hidden_size="
                f"{self.hidden_size}, input_size={self.input_size}, {self.dtype}, "
                f"{self.num_directions} direction(s)): its packed weights take about "
                f"{self._packed_bytes(ct) / 2**30:.3g} GiB more ({e})"
            ) from None
        small = getattr(backend, "small_call", None)
        if small is not None and self.dtype == ct:  # computed in its own dtype
            self._small = (small(spec, directions, ct), backend)
        self._prepared = True

    def _packed_bytes(self, ct: np.dtype) -> int:
        from .backends.layout import packed_bytes

        each = packed_bytes(self.spec.cell.n_gates, self.hidden_size, self.input_size, ct)
        return each * self.num_directions

    def __call__(
        self,
        X: np.ndarray,
        sequence_lens: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
        initial_c: np.ndarray | None = None,
        *,
        output_sequence: bool = True,
    ) -> tuple[np.ndarray | None, ...]:
        """Compute the node on one input (ONNX GRU/LSTM/RNN, latest version's semantics).

        Parameters
        ----------
        X : (seq_length, batch_size, input_size) ndarray
            ``(batch_size, seq_length, input_size)`` if ``layout=1``; the layer's dtype (a
            list or tuple of numbers is taken in it).
        sequence_lens : (batch_size,) integer ndarray, optional
            Valid length of each sequence, in ``[0, seq_length]``; full length if absent.
        initial_h, initial_c : (num_directions, batch_size, hidden_size) ndarray, optional
            ``(batch_size, num_directions, hidden_size)`` if ``layout=1``; zeros if
            absent; ``initial_c`` for LSTM only.
        output_sequence : bool or {0, 1}
            If false, ``Y`` is neither computed nor stored and None is returned for it.

        Returns
        -------
        tuple
            ``(Y, Y_h)``, or ``(Y, Y_h, Y_c)`` for LSTM, as :func:`~onnx_recurrent.gru`
            and the other functions return them.

        Raises
        ------
        ValueError
            A shape that disagrees with the layer (X's input size, the states' shapes,
            ``sequence_lens`` outside ``[0, seq_length]``), ``initial_c`` for a GRU or RNN.
        TypeError
            X or a state of another dtype than the layer's, non-integer lengths,
            ``output_sequence`` other than a bool, 0 or 1.
        """
        if output_sequence is not True and output_sequence is not False:
            output_sequence = check_bool("output_sequence", output_sequence)
        if not self._prepared:
            self._prepare_once()
        small = self._small
        if (
            small is not None
            and type(X) is np.ndarray
            and X.dtype == self.dtype
            and X.ndim == 3
            and X.shape[2] == self.W.shape[2]
            and 0 < X.shape[0] * X.shape[1] <= ONE_CALL_STEPS
            and (macs := X.shape[0] * X.shape[1] * self._step_macs) < ONE_CALL_MACS
            and not threaded(macs)
            and backends.select(self.spec, X.dtype) is small[1]  # not another, by `use`
        ):
            N, T = X.shape[:2] if self.spec.layout else X.shape[1::-1]
            lens = None if sequence_lens is None else check_lengths(sequence_lens, N, T)
            if initial_h is None and initial_c is None:
                return small[0](X, None, None, output_sequence, lens)
            states = self._states(N, initial_h, initial_c)
            return small[0](X, *states, *(None,) * (2 - len(states)), output_sequence, lens)
        spec = self.spec
        states = [("initial_h", initial_h)]
        if spec.cell.n_peepholes:
            states.append(("initial_c", initial_c))
        elif initial_c is not None:
            raise RecurrentError(f"initial_c is for LSTM only, this layer is a {self.op}")
        X = check_X(spec, list_in_dtype("X", X, self))  # a list: the layer's dtype
        x = check_call(
            spec, X, sequence_lens, states, dtype=self.dtype, input_size=self.input_size
        )
        return self.compute(x, output_sequence)

    def _states(self, N: int, initial_h, initial_c) -> tuple[np.ndarray | None, ...]:
        """The initial states of a call of batch size ``N``, checked (in the layout)."""
        states = [initial_h]
        if self.spec.cell.n_peepholes:
            states.append(initial_c)
        elif initial_c is not None:
            raise RecurrentError(f"initial_c is for LSTM only, this layer is a {self.op}")
        D, H, layout = self.spec.num_directions, self.hidden_size, self.spec.layout
        shape = (N, D, H) if layout else (D, N, H)
        names = ("initial_h", "initial_c")[: len(states)]
        return tuple(
            None if value is None else check_state(name, value, shape, self.dtype, layout=layout)
            for name, value in zip(names, states, strict=True)
        )

    def compute(self, x: Inputs, output_sequence: bool = True) -> tuple[np.ndarray | None, ...]:
        """The node on inputs already checked (:func:`~onnx_recurrent.spec.check_call`)."""
        if not self._prepared:
            self._prepare_once()
        return scan(self.spec, self.directions(), x, output_sequence=output_sequence)

    def replace(self, **changes: Any) -> Layer:
        """A new layer with some of ``op, W, R, B, attributes, P`` changed (as
        ``dataclasses.replace``); the others are this layer's."""
        fields = {"op": self.op, "W": self.W, "R": self.R, "B": self.B}
        fields |= {"attributes": self.attributes, "P": self.P}
        unknown = set(changes) - set(fields)
        if unknown:
            raise RecurrentError(
                f"Layer has no field(s) {sorted(unknown)}; its fields: {list(fields)}"
            )
        return Layer(**(fields | changes))

    def run(
        self,
        X: np.ndarray,
        sequence_lens: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
        initial_c: np.ndarray | None = None,
        **keywords: Any,
    ) -> tuple[np.ndarray | None, ...]:
        """:meth:`__call__`, with attributes overridden by ``keywords`` (a layer with
        those attributes is made for the call) or ``output_sequence``."""
        output_sequence = keywords.pop("output_sequence", True)
        layer = self
        if keywords:
            attributes = {**self.attributes, **keywords}
            layer = Layer(self.op, self.W, self.R, self.B, attributes, self.P)
        return layer(X, sequence_lens, initial_h, initial_c, output_sequence=output_sequence)
