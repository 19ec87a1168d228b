"""The public functions: ``gru``, ``rnn``, ``lstm`` (ONNX), ``gru_cell`` (OpenVINO GRUCell-3)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from . import cells, prepared
from .errors import RecurrentError, RecurrentTypeError
from .spec import as_float_array, check_dtype, check_flag, list_in_dtype

_COMMON_DOC = """
    X : (seq_length, batch_size, input_size) ndarray
        The input sequences; ``(batch_size, seq_length, input_size)`` if ``layout=1``.
        float16, float32, float64 or ``ml_dtypes.bfloat16``; every other float input
        must have the same dtype (a list or tuple takes ``W``'s). float16 and bfloat16
        are computed in float32 and rounded once at the end.
    sequence_lens : (batch_size,) integer ndarray, optional
        Valid length of each sequence, in ``[0, seq_length]``; full length if absent.
        ``Y`` is zero past each length; the final state is the state after the last
        valid step (zeros for a length of 0).
    hidden_size : int, optional
        Must agree with ``R``'s last axis; inferred from it if absent.
    direction : {"forward", "reverse", "bidirectional"}
        The reverse direction runs each sequence from its last valid step back to 0.
    activations : sequence of str, optional
        Activation names (case-insensitive; Relu, Tanh, Sigmoid, Affine, LeakyRelu,
        ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus), one list
        per direction, the forward direction's first (a one-direction RNN also takes
        two, the schema's default ``["Tanh", "Tanh"]``, and uses the first, as
        onnxruntime does).
    activation_alpha, activation_beta : sequence of float, optional
        Consumed in order by the activations that take them; ONNX defaults when the
        lists run out.
    clip : float, optional
        Bounds the input of every gate activation to ``[-clip, clip]``; must be > 0.
    layout : {0, 1}
        1 swaps the first two axes of X, the initial states, Y and the final states.
    output_sequence : bool or {0, 1}
        If false, ``Y`` is neither computed nor stored and ``None`` is returned for it.
"""

_RAISES_DOC = """
    Raises
    ------
    ValueError
        (``onnx_recurrent.RecurrentError``) a shape that disagrees with the others
        (the message gives expected and actual), an unknown direction or activation,
        ``layout`` other than 0 or 1, ``'1'`` and ``1.0`` included (GRU's
        ``linear_before_reset`` and LSTM's ``input_forget`` take any integer, nonzero
        true, as onnxruntime does; not a string or a float), an activation list of the
        wrong length,
        ``clip <= 0``, ``sequence_lens`` outside ``[0, seq_length]``, an input that is
        a ragged nested list; ``ONNX_RECURRENT_BACKEND`` set to an unknown backend.
    TypeError
        (``onnx_recurrent.RecurrentTypeError``) a non-float X, an input whose dtype
        differs from X's, ``sequence_lens`` not of an integer dtype, a masked array
        (its mask would be ignored), an object NumPy cannot read as an array;
        ``hidden_size`` not an integer (``6.0``, ``"6"``), ``direction`` not a string,
        ``clip`` or an activation parameter that is not a number (``"1"``, ``True``),
        ``activations``, ``activation_alpha`` or ``activation_beta`` not a list (a
        string, a number); ``output_sequence`` other than a bool, 0 or 1.
"""


#: the keywords that are attributes: every operator's, then GRU's and LSTM's own
_ATTRIBUTES = (*cells.COMMON_ATTRIBUTES, "linear_before_reset", "input_forget")


def _run(cell, arguments, X, W, R, B, sequence_lens, states, P=None):
    """The common body of the public functions: parse, check, the kept layer's call."""
    attributes = {k: arguments[k] for k in _ATTRIBUTES if k in arguments}
    X, layer = prepared.for_call(cell, attributes, X, W, R, B, P)
    try:
        return layer(X, sequence_lens, *states, output_sequence=arguments["output_sequence"])
    finally:
        prepared.evict_to_fit(layer)


def _with_doc(doc: str):
    def decorate(fn):
        fn.__doc__ = doc.replace("{common}", _COMMON_DOC).replace("{raises}", _RAISES_DOC)
        return fn

    return decorate


@_with_doc(
    """Compute an ONNX GRU (operator GRU, versions 1 to 22, latest semantics).

    ``zt = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz)``, ``rt`` likewise,
    ``ht = g(Xt Wh^T + (rt . Ht-1) Rh^T + Rbh + Wbh)`` or, with
    ``linear_before_reset``, ``ht = g(Xt Wh^T + rt . (Ht-1 Rh^T + Rbh) + Wbh)``,
    ``Ht = (1 - zt) . ht + zt . Ht-1``. Default activations ``f=Sigmoid, g=Tanh``.

    Parameters
    ----------{common}
    W : (num_directions, 3*hidden_size, input_size) ndarray
        ``W[zrh]``, then the backward direction's.
    R : (num_directions, 3*hidden_size, hidden_size) ndarray
        ``R[zrh]``, then the backward direction's.
    B : (num_directions, 6*hidden_size) ndarray, optional
        ``[Wb[zrh], Rb[zrh]]``; zeros if absent.
    initial_h : (num_directions, batch_size, hidden_size) ndarray, optional
        ``(batch_size, num_directions, hidden_size)`` if ``layout=1``; zeros if absent.
    linear_before_reset : {0, 1}
        1: apply the reset gate after the linear transformation (PyTorch's GRU).

    Returns
    -------
    Y : (seq_length, num_directions, batch_size, hidden_size) ndarray or None
        Every hidden state; ``(batch_size, seq_length, num_directions, hidden_size)``
        if ``layout=1``. X's dtype.
    Y_h : (num_directions, batch_size, hidden_size) ndarray
        The last hidden state; ``(batch_size, num_directions, hidden_size)`` if
        ``layout=1``.
{raises}"""
)
def gru(
    X: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    layout: int = 0,
    linear_before_reset: int = 0,
    output_sequence: bool = True,
) -> tuple[np.ndarray | None, np.ndarray]:
    Y, Y_h = _run(cells.GRU, locals(), X, W, R, B, sequence_lens, [initial_h])
    return Y, Y_h


@_with_doc(
    """Compute an ONNX RNN (operator RNN, versions 1 to 22, latest semantics).

    ``Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi)``, default ``f=Tanh``.

    Parameters
    ----------{common}
    W : (num_directions, hidden_size, input_size) ndarray
    R : (num_directions, hidden_size, hidden_size) ndarray
    B : (num_directions, 2*hidden_size) ndarray, optional
        ``[Wbi, Rbi]``; zeros if absent.
    initial_h : (num_directions, batch_size, hidden_size) ndarray, optional
        ``(batch_size, num_directions, hidden_size)`` if ``layout=1``; zeros if absent.

    Returns
    -------
    Y : (seq_length, num_directions, batch_size, hidden_size) ndarray or None
        ``(batch_size, seq_length, num_directions, hidden_size)`` if ``layout=1``.
        X's dtype.
    Y_h : (num_directions, batch_size, hidden_size) ndarray
        ``(batch_size, num_directions, hidden_size)`` if ``layout=1``.
{raises}"""
)
def rnn(
    X: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    layout: int = 0,
    output_sequence: bool = True,
) -> tuple[np.ndarray | None, np.ndarray]:
    Y, Y_h = _run(cells.RNN, locals(), X, W, R, B, sequence_lens, [initial_h])
    return Y, Y_h


@_with_doc(
    """Compute an ONNX LSTM (operator LSTM, versions 1 to 22, latest semantics).

    ``it = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)``,
    ``ft = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)`` (``1 - it`` with
    ``input_forget``), ``ct = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)``,
    ``Ct = ft . Ct-1 + it . ct``, ``ot = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)``,
    ``Ht = ot . h(Ct)``. Default activations ``f=Sigmoid, g=Tanh, h=Tanh``. ``clip``
    bounds the gate inputs, not the cell state that goes into ``h(Ct)``.

    Parameters
    ----------{common}
    W : (num_directions, 4*hidden_size, input_size) ndarray
        ``W[iofc]``, then the backward direction's.
    R : (num_directions, 4*hidden_size, hidden_size) ndarray
        ``R[iofc]``, then the backward direction's.
    B : (num_directions, 8*hidden_size) ndarray, optional
        ``[Wb[iofc], Rb[iofc]]``; zeros if absent.
    initial_h, initial_c : (num_directions, batch_size, hidden_size) ndarray, optional
        ``(batch_size, num_directions, hidden_size)`` if ``layout=1``; zeros if absent.
    P : (num_directions, 3*hidden_size) ndarray, optional
        Peepholes ``[Pi, Po, Pf]``; zeros if absent.
    input_forget : {0, 1}
        1 couples the input and forget gates: ``ft = 1 - it``.

    Returns
    -------
    Y : (seq_length, num_directions, batch_size, hidden_size) ndarray or None
        ``(batch_size, seq_length, num_directions, hidden_size)`` if ``layout=1``.
        X's dtype.
    Y_h, Y_c : (num_directions, batch_size, hidden_size) ndarray
        Last hidden and cell state; ``(batch_size, num_directions, hidden_size)`` if
        ``layout=1``.
{raises}"""
)
def lstm(
    X: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    P: np.ndarray | None = None,
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    input_forget: int = 0,
    layout: int = 0,
    output_sequence: bool = True,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    states = [initial_h, initial_c]
    Y, Y_h, Y_c = _run(cells.LSTM, locals(), X, W, R, B, sequence_lens, states, P)
    return Y, Y_h, Y_c


def gru_cell(
    X: np.ndarray,
    initial_hidden_state: np.ndarray,
    W: np.ndarray,
    R: np.ndarray,
    B: np.ndarray | None = None,
    *,
    hidden_size: int,
    activations: Sequence[str] | None = ("sigmoid", "tanh"),
    activations_alpha: Sequence[float] | None = None,
    activations_beta: Sequence[float] | None = None,
    clip: float | None = None,
    linear_before_reset: bool = False,
) -> np.ndarray:
    """Compute one GRU step with OpenVINO GRUCell-3's interface.

    The equations are those of :func:`gru` (gates ``z r h``); this is one time step of
    it, forward, with OpenVINO's input shapes and bias layout.

    Parameters
    ----------
    X : (batch_size, input_size) ndarray
        float16, float32, float64 or bfloat16; the other inputs share its dtype.
    initial_hidden_state : (batch_size, hidden_size) ndarray
    W : (3*hidden_size, input_size) ndarray
    R : (3*hidden_size, hidden_size) ndarray
    B : (3*hidden_size,) ndarray, or (4*hidden_size,) with ``linear_before_reset``, optional
        The sums ``Wb + Rb`` of each gate; with ``linear_before_reset``
        ``[Wbz+Rbz, Wbr+Rbr, Wbh, Rbh]`` (the reset gate multiplies ``Rbh`` alone, so
        ``Wbh`` and ``Rbh`` cannot be summed). Zeros if absent.
    hidden_size : int
        Must agree with R's last axis.
    activations : sequence of str, optional
        ``f`` and ``g``; any of the eleven ONNX activations (OpenVINO: relu,
        sigmoid, tanh). None: the defaults, sigmoid and tanh.
    activations_alpha, activations_beta : sequence of float, optional
        Consumed in order, as the ONNX operators' ``activation_alpha/beta``.
    clip : float, optional
        Bounds each activation's input to ``[-clip, clip]``; None, 0 (OpenVINO's
        serialised default) or infinity means no clipping.
    linear_before_reset : bool or {0, 1}

    Returns
    -------
    Ho : (batch_size, hidden_size) ndarray
        The next hidden state, in X's dtype.

    Raises
    ------
    ValueError
        A shape that disagrees (expected and actual in the message), a bias whose
        length is not ``3*hidden_size`` (with ``linear_before_reset``,
        ``4*hidden_size``: GRUCell-3's shapes), an unknown activation, ``clip < 0``,
        ``linear_before_reset`` not an integer (nonzero: true).
    TypeError
        A non-float X or an input (``B`` included) whose dtype differs from X's; a
        ``clip`` or activation parameter that is not a number; ``hidden_size`` not an
        integer; ``activations`` a string (not a list of names).
    """
    X = as_float_array("X", list_in_dtype("X", X, W))
    W, R = list_in_dtype("W", W, X), list_in_dtype("R", R, X)  # lists: in X's dtype
    R = as_float_array("R", R)
    H = hidden_size
    if isinstance(H, bool) or not isinstance(H, int | np.integer):
        raise RecurrentTypeError(f"hidden_size must be an integer, got {H!r}")
    if H < 1:
        raise RecurrentError(f"hidden_size must be positive, got {H}")
    if isinstance(activations, str | bytes):
        raise RecurrentTypeError(
            f"activations must be a list of two names (f, g), got the string {activations!r}"
        )
    linear_before_reset = check_flag("linear_before_reset", linear_before_reset)
    if X.ndim != 2:
        raise RecurrentError(f"X must be 2-D [batch_size, input_size], got shape {list(X.shape)}")
    N, I = X.shape
    expected = {
        "initial_hidden_state": ((N, H), "[batch_size, hidden_size]"),
        "W": ((3 * H, I), "[3*hidden_size, input_size]"),
        "R": ((3 * H, H), "[3*hidden_size, hidden_size]"),
    }
    state = check_dtype("initial_hidden_state", initial_hidden_state, X.dtype, "X's")
    given = {"initial_hidden_state": state, "W": as_float_array("W", W), "R": R}
    for name, (shape, dims) in expected.items():
        if given[name].shape != shape:
            message = (
                f"{name} must have shape {list(shape)} {dims} (hidden_size={H}), "
                f"got {list(given[name].shape)}"
            )
            if name == "W" and given[name].shape[:1] == (3 * H,) and given[name].ndim == 2:
                message = (
                    f"X and W disagree on input_size: X's last axis is {I}, W's is "
                    f"{given[name].shape[1]} ({message})"
                )
            raise RecurrentError(message)
    Wb = np.zeros(3 * H, X.dtype)
    Rb = np.zeros(3 * H, X.dtype)
    if B is not None:
        B = check_dtype("B", B, X.dtype, "X's")
        length = (4 if linear_before_reset else 3) * H
        if B.shape != (length,):
            raise RecurrentError(
                f"B must have shape [{length}] (linear_before_reset={bool(linear_before_reset)}, "
                f"hidden_size={H}), got {list(B.shape)}"
            )
        Wb = B[: 3 * H]
        if linear_before_reset:
            Rb = np.concatenate([np.zeros(2 * H, B.dtype), B[3 * H :]])
    number = isinstance(clip, int | float | np.integer | np.floating)
    if number and not isinstance(clip, bool) and clip == 0:  # a bad clip: gru says so
        clip = None
    elif number and not isinstance(clip, bool) and clip < 0:  # gru's says "positive"
        raise RecurrentError(
            f"clip must be a positive number, or 0 for none (GRUCell-3's default), got {clip}"
        )
    try:
        _, Y_h = gru(
            X[None],
            given["W"][None],
            R[None],
            np.concatenate([Wb, Rb])[None],
            None,
            given["initial_hidden_state"][None],
            hidden_size=H,
            activations=activations,
            activation_alpha=activations_alpha,
            activation_beta=activations_beta,
            clip=clip,
            linear_before_reset=int(bool(linear_before_reset)),
            output_sequence=False,
        )
    except (RecurrentError, RecurrentTypeError) as e:  # named as gru_cell names them
        message = re.sub(r"\bactivation_(alpha|beta)\b", r"activations_\1", str(e))
        raise type(e)(message) from None
    return Y_h[0]
