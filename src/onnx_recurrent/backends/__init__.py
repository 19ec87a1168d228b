"""Step loops behind the skeleton: ``numpy`` (always there) and ``numba`` (compiled).

A backend runs one block of time steps of one direction (:meth:`Backend.run_block`);
the skeleton (:mod:`onnx_recurrent.scan`) does everything else. Optional: ``shares``
(threads that share a direction's hidden units, :mod:`.sync`), ``small_call`` (a
layer's small calls as one compiled call each, prepared once by
:meth:`onnx_recurrent.Layer.prepare`) and ``run_unit`` (a unit of gathered rows as one
compiled call).
``supports`` returns the reason a backend cannot run a call, or None. The automatic
choice (numba where it is installed, its compiler not turned off by
``NUMBA_DISABLE_JIT``, and supports the call, else numpy) can be
overridden with
:func:`use` or the environment variable ``ONNX_RECURRENT_BACKEND``; a backend asked for
by name that cannot run the call raises.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from .. import threads
from ..cells import Weights
from ..errors import RecurrentError
from ..spec import RecSpec

NAMES = ("numpy", "numba")
_chosen: contextvars.ContextVar[str | None] = contextvars.ContextVar("backend", default=None)


class Backend(Protocol):
    """What the skeleton (:mod:`onnx_recurrent.scan`) and :class:`onnx_recurrent.Layer`
    call. Required: ``name``, ``calls_blas``, :meth:`supports`, :meth:`run_block`.
    Optional, found with ``getattr`` where a backend has them:

    - ``prepare(spec, w, acts, dtype, shares=1)``: make (and compile) now, on the
      calling thread, everything a call of one direction will run (the numba backend:
      the direction's :class:`.plans.Plan`, its entries);
    - ``shares(spec, rows, dtype, shares, input_size=None)``: buffers for ``shares``
      threads that share one direction's hidden units, whose ``party(i)`` each thread
      ``i`` passes back as ``run_block``'s ``shared`` (with ``input_size``: as
      ``run_unit``'s, for units of gathered rows; None or absent: the skeleton splits
      rows instead);
    - ``small_call(spec, directions, dtype)``: a callable ``call(X, h0, c0,
      output_sequence, lens=None) -> (Y or None, Y_h[, Y_c])`` running a whole call
      as one compiled call (``lens``: checked int64 lengths, None: full length;
      :meth:`onnx_recurrent.Layer.prepare` makes it once);
    - ``run_unit(spec, w, acts, d, rows, x, Y_tm, finals_tm, abort, shared=None) ->
      bool``: direction ``d`` of the batch ``rows`` of a call computed in its own
      dtype, its gathers and scatters included, as one call without Python between
      its blocks, reading the int64 word ``abort`` between them (False: stopped); the
      skeleton uses it for units of gathered rows (``shared``: a party, as above).
    """

    name: str
    calls_blas: bool  # NumPy's BLAS, to keep on one thread while our threads split work

    def supports(self, spec: RecSpec, dtype: np.dtype) -> str | None:
        """Why this backend cannot run calls of ``spec`` computing in ``dtype``, or
        None if it can (the automatic choice takes the first that can)."""
        ...

    def run_block(
        self,
        spec: RecSpec,
        w: Weights,
        acts: tuple,
        xb: np.ndarray,
        states: tuple[np.ndarray, ...],
        active: np.ndarray,
        Yb: np.ndarray | None,
        shared: Any = None,
        step0: int = 0,
    ) -> None:
        """Advance ``states`` (compute dtype) over the steps of the inputs ``xb``
        ``[steps, rows, input_size]`` (X's dtype; projected by the backend).

        Step ``k`` updates the first ``active[k]`` rows; ``Yb[k, :active[k]]`` (if
        given) receives the hidden state after step ``k``. ``shared``: what threads
        that share the hidden units share (a backend's ``shares(spec, rows, dtype,
        shares)``, where it has one), ``step0``: the first step's index in the call.
        """
        ...


@functools.cache
def _load(name: str) -> Backend | str:
    """The backend, or why it cannot be loaded."""
    try:
        # an import stopped half-way fails again later; a fork waits for it to end
        module = threads.compiling(lambda: importlib.import_module(f".{name}_backend", __name__))
    except ImportError as e:
        return f"{name} cannot be imported ({e})"
    return module.BACKEND


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS on one thread inside the context (threadpoolctl), when our own threads
    split the work: two levels of threads on the same cores only get in each other's way."""
    controller = _blas_controller()
    with controller.limit(limits=1, user_api="blas"):
        yield


@contextlib.contextmanager
def use(name: str) -> Iterator[None]:
    """Run the calls in this context (this thread or task) on one backend.

    Parameters
    ----------
    name : {"numpy", "numba", "auto"}
        "auto" restores the automatic choice (numba where it is installed and
        supports the call, else numpy).

    Raises
    ------
    ValueError
        An unknown name; later, inside the context, a named backend that cannot be
        imported or cannot run a call.
    """
    if name not in (*NAMES, "auto"):
        raise RecurrentError(f"backend must be one of {[*NAMES, 'auto']}, got {name!r}")
    token = _chosen.set(None if name == "auto" else name)
    try:
        yield
    finally:
        _chosen.reset(token)


def environment_name() -> str:
    """``ONNX_RECURRENT_BACKEND``: a backend's name, or ``"auto"`` (also where unset or
    empty).

    Raises
    ------
    ValueError
        Another value (the message names the variable and the names it takes).
    """
    name = os.environ.get("ONNX_RECURRENT_BACKEND", "").strip() or "auto"
    if name != "auto" and name not in NAMES:
        raise RecurrentError(
            f"ONNX_RECURRENT_BACKEND must be one of {[*NAMES, 'auto']}, got {name!r}"
        )
    return name


def select(spec: RecSpec, dtype: np.dtype) -> Backend:
    """The backend for one call."""
    name = _chosen.get() or environment_name()
    if name == "auto":
        numba = _load("numba")
        if not isinstance(numba, str) and numba.supports(spec, dtype) is None:
            return numba
        return _load("numpy")  # type: ignore[return-value]
    backend = _load(name)
    if isinstance(backend, str):
        raise RecurrentError(f"backend {name!r} was asked for, but {backend}")
    reason = backend.supports(spec, dtype)
    if reason is not None:
        raise RecurrentError(f"backend {name!r} cannot run this call: {reason}")
    return backend
