"""Slow, obviously-correct float64 reference for the ONNX GRU, RNN and LSTM operators.

Written straight from the equations of the ONNX specification (GRU-22, RNN-22, LSTM-22)
and the decisions of ``docs/semantics.md``; independent of the library. Every batch entry and
every time step is a plain Python loop iteration; all arithmetic is in float64.

``computing_in(np.float32)`` runs the same transcription with float32 rounding (the
tests use the gap between the two to measure how much rounding a draw amplifies).
"""

import contextlib
import math

import numpy as np

__all__ = ["ACTIVATIONS", "computing_in", "gru_ref", "lstm_ref", "rnn_ref"]

_dtype = np.float64


@contextlib.contextmanager
def computing_in(dtype):
    """Run the references in ``dtype`` (float64 outside the context)."""
    global _dtype
    saved, _dtype = _dtype, dtype
    try:
        yield
    finally:
        _dtype = saved


def _sigmoid(x, alpha, beta):
    return 1.0 / (1.0 + np.exp(-x))


def _elu(x, alpha, beta):
    return np.where(x >= 0, x, alpha * (np.exp(x) - 1.0))


#: lower-case name -> (default alpha or None if unused, default beta or None, function)
ACTIVATIONS = {
    "relu": (None, None, lambda x, a, b: np.maximum(x, 0.0)),
    "tanh": (None, None, lambda x, a, b: np.tanh(x)),
    "sigmoid": (None, None, _sigmoid),
    "affine": (1.0, 0.0, lambda x, a, b: a * x + b),
    "leakyrelu": (0.01, None, lambda x, a, b: np.where(x >= 0, x, a * x)),
    # ">" as the ThresholdedRelu operator and onnxruntime have it (the recurrent
    # operators' text says ">="): docs/semantics.md settles it so
    "thresholdedrelu": (1.0, None, lambda x, a, b: np.where(x > a, x, 0.0)),
    "scaledtanh": (1.0, 1.0, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (0.2, 0.5, lambda x, a, b: np.minimum(np.maximum(a * x + b, 0.0), 1.0)),
    "elu": (1.0, None, _elu),
    "softsign": (None, None, lambda x, a, b: x / (1.0 + np.abs(x))),
    "softplus": (None, None, lambda x, a, b: np.logaddexp(0.0, x)),  # log(1 + e^x)
}


def _activation_functions(names, alphas, betas):
    """Bind each activation to its alpha/beta, consuming the lists in order.

    Each activation takes only the parameters it uses; when a list runs out, the
    default of the table applies.
    """
    alphas = list(alphas or [])
    betas = list(betas or [])
    funcs = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}")
        default_alpha, default_beta, fn = ACTIVATIONS[name.lower()]
        alpha = beta = None
        if default_alpha is not None:
            alpha = alphas.pop(0) if alphas else default_alpha
        if default_beta is not None:
            beta = betas.pop(0) if betas else default_beta
        funcs.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    return funcs


def _setup(
    X,
    W,
    R,
    B,
    initial_states,
    direction,
    activations,
    alpha,
    beta,
    clip,
    layout,
    gates,
    default_activations,
):
    """Common argument handling: float64 arrays, defaults, per-direction activations."""
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"unknown direction {direction!r}")
    n_dir = 2 if direction == "bidirectional" else 1
    X, W, R = (np.asarray(a, dtype=_dtype) for a in (X, W, R))
    if layout == 1:
        X = X.transpose(1, 0, 2)
    _, batch, _ = X.shape
    hidden = R.shape[-1]
    assert W.shape[:2] == R.shape[:2] == (n_dir, gates * hidden), (W.shape, R.shape)
    B = np.zeros((n_dir, 2 * gates * hidden), _dtype) if B is None else np.asarray(B, _dtype)
    states = []
    for s in initial_states:
        if s is None:
            states.append(np.zeros((n_dir, batch, hidden), _dtype))
        else:
            s = np.asarray(s, dtype=_dtype)
            states.append(s.transpose(1, 0, 2) if layout == 1 else s)
    names = default_activations * n_dir if activations is None else list(activations)
    k = len(default_activations)
    if len(names) != k * n_dir:
        raise ValueError(f"expected {k * n_dir} activations, got {len(names)}")
    funcs = _activation_functions(names, alpha, beta)
    acts = [funcs[d * k : (d + 1) * k] for d in range(n_dir)]
    if clip is None or math.isinf(clip):
        clip_fn = lambda x: x  # noqa: E731
    else:
        clip_fn = lambda x: np.clip(x, -clip, clip)  # noqa: E731
    return X, W, R, B, states, acts, clip_fn


def _scan(X, states0, sequence_lens, direction, layout, step):
    """Run ``step`` over the valid time steps of each batch entry and direction.

    ``step(d, x_t, *states) -> states``; the first state is the hidden state written to Y.
    Returns ``(Y, *final_states)`` in the requested layout.
    """
    seq_length, batch, _ = X.shape
    n_dir, _, hidden = states0[0].shape
    lens = [seq_length] * batch if sequence_lens is None else [int(v) for v in sequence_lens]
    Y = np.zeros((seq_length, n_dir, batch, hidden), _dtype)
    finals = [np.zeros_like(s) for s in states0]
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        for b in range(batch):
            n = lens[b]
            assert 0 <= n <= seq_length, n
            state = tuple(s[d, b] for s in states0)
            for t in range(n - 1, -1, -1) if reverse else range(n):
                state = step(d, X[t, b], *state)
                Y[t, d, b] = state[0]
            if n > 0:  # sequence_lens == 0 leaves the final states at zero
                for final, s in zip(finals, state, strict=True):
                    final[d, b] = s
    if layout == 1:
        return (Y.transpose(2, 0, 1, 3), *(f.transpose(1, 0, 2) for f in finals))
    return (Y, *finals)


def gru_ref(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    layout=0,
    linear_before_reset=0,
):
    """Reference ONNX GRU in float64.

    Parameters
    ----------
    X : array_like
        ``[seq_length, batch, input_size]`` (``[batch, seq_length, input_size]`` if
        ``layout == 1``).
    W, R : array_like
        ``[num_directions, 3*hidden_size, input_size]`` and
        ``[num_directions, 3*hidden_size, hidden_size]``, gate order ``z r h``.
    B : array_like, optional
        ``[num_directions, 6*hidden_size]``: ``Wb[zrh]`` then ``Rb[zrh]``. Default zeros.
    sequence_lens : array_like of int, optional
        ``[batch]``, each in ``[0, seq_length]``. Default: all ``seq_length``.
    initial_h : array_like, optional
        ``[num_directions, batch, hidden_size]`` (batch first if ``layout == 1``).
    hidden_size : int, optional
        Checked against ``R`` when given.
    direction : {"forward", "reverse", "bidirectional"}
    activations : list of str, optional
        ``[f, g]`` per direction, default ``["Sigmoid", "Tanh"]``.
    activation_alpha, activation_beta : list of float, optional
        Consumed in order by the activations that use them.
    clip : float, optional
        Bound of every gate activation's input.
    layout : {0, 1}
    linear_before_reset : int

    Returns
    -------
    Y : ndarray
        ``[seq_length, num_directions, batch, hidden_size]`` (``[batch, seq_length,
        num_directions, hidden_size]`` if ``layout == 1``), float64.
    Y_h : ndarray
        ``[num_directions, batch, hidden_size]`` (batch first if ``layout == 1``), float64.
    """
    X, W, R, B, states, acts, clip_fn = _setup(
        X,
        W,
        R,
        B,
        [initial_h],
        direction,
        activations,
        activation_alpha,
        activation_beta,
        clip,
        layout,
        3,
        ["Sigmoid", "Tanh"],
    )
    assert hidden_size in (None, R.shape[-1])

    def step(d, x, h):
        Wz, Wr, Wh = np.split(W[d], 3)
        Rz, Rr, Rh = np.split(R[d], 3)
        Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = np.split(B[d], 6)
        f, g = acts[d]
        z = f(clip_fn(x @ Wz.T + h @ Rz.T + Wbz + Rbz))
        r = f(clip_fn(x @ Wr.T + h @ Rr.T + Wbr + Rbr))
        if linear_before_reset:
            hh = g(clip_fn(x @ Wh.T + r * (h @ Rh.T + Rbh) + Wbh))
        else:
            hh = g(clip_fn(x @ Wh.T + (r * h) @ Rh.T + Rbh + Wbh))
        return ((1.0 - z) * hh + z * h,)

    with np.errstate(over="ignore", invalid="ignore"):  # rejected by the tests
        return _scan(X, states, sequence_lens, direction, layout, step)


def rnn_ref(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    layout=0,
):
    """Reference ONNX RNN in float64: ``Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi)``.

    Parameters and returns as :func:`gru_ref`, with one gate (``W [D, H, I]``,
    ``R [D, H, H]``, ``B [D, 2H]``) and activations ``[f]`` per direction, default
    ``["Tanh"]``.
    """
    X, W, R, B, states, acts, clip_fn = _setup(
        X,
        W,
        R,
        B,
        [initial_h],
        direction,
        activations,
        activation_alpha,
        activation_beta,
        clip,
        layout,
        1,
        ["Tanh"],
    )
    assert hidden_size in (None, R.shape[-1])

    def step(d, x, h):
        Wb, Rb = np.split(B[d], 2)
        (f,) = acts[d]
        return (f(clip_fn(x @ W[d].T + h @ R[d].T + Wb + Rb)),)

    with np.errstate(over="ignore", invalid="ignore"):  # rejected by the tests
        return _scan(X, states, sequence_lens, direction, layout, step)


def lstm_ref(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    hidden_size=None,
    direction="forward",
    activations=None,
    activation_alpha=None,
    activation_beta=None,
    clip=None,
    input_forget=0,
    layout=0,
):
    """Reference ONNX LSTM in float64.

    Parameters
    ----------
    X, sequence_lens, initial_h, hidden_size, direction, activation_alpha, activation_beta, layout
        As in :func:`gru_ref`.
    W, R : array_like
        ``[num_directions, 4*hidden_size, input_size]`` and
        ``[num_directions, 4*hidden_size, hidden_size]``, gate order ``i o f c``.
    B : array_like, optional
        ``[num_directions, 8*hidden_size]``: ``Wb[iofc]`` then ``Rb[iofc]``.
    initial_c : array_like, optional
        Like ``initial_h``; default zeros.
    P : array_like, optional
        Peepholes ``[num_directions, 3*hidden_size]``, order ``i o f``; default zeros.
    activations : list of str, optional
        ``[f, g, h]`` per direction, default ``["Sigmoid", "Tanh", "Tanh"]``.
    clip : float, optional
        Bound of the gate activations' inputs; the cell state going into ``h`` is not
        clipped.
    input_forget : int
        If nonzero, ``ft = 1 - it``.

    Returns
    -------
    Y, Y_h : ndarray
        As in :func:`gru_ref`.
    Y_c : ndarray
        The last cell state, shaped like ``Y_h``.
    """
    X, W, R, B, states, acts, clip_fn = _setup(
        X,
        W,
        R,
        B,
        [initial_h, initial_c],
        direction,
        activations,
        activation_alpha,
        activation_beta,
        clip,
        layout,
        4,
        ["Sigmoid", "Tanh", "Tanh"],
    )
    assert hidden_size in (None, R.shape[-1])
    n_dir, hidden = W.shape[0], R.shape[-1]
    P = np.zeros((n_dir, 3 * hidden), _dtype) if P is None else np.asarray(P, dtype=_dtype)

    def step(d, x, h, c):
        Wi, Wo, Wf, Wc = np.split(W[d], 4)
        Ri, Ro, Rf, Rc = np.split(R[d], 4)
        Wbi, Wbo, Wbf, Wbc, Rbi, Rbo, Rbf, Rbc = np.split(B[d], 8)
        Pi, Po, Pf = np.split(P[d], 3)
        f, g, h_act = acts[d]
        i = f(clip_fn(x @ Wi.T + h @ Ri.T + Pi * c + Wbi + Rbi))
        if input_forget:
            ft = 1.0 - i
        else:
            ft = f(clip_fn(x @ Wf.T + h @ Rf.T + Pf * c + Wbf + Rbf))
        ct = g(clip_fn(x @ Wc.T + h @ Rc.T + Wbc + Rbc))
        C = ft * c + i * ct
        o = f(clip_fn(x @ Wo.T + h @ Ro.T + Po * C + Wbo + Rbo))
        return o * h_act(C), C

    with np.errstate(over="ignore", invalid="ignore"):  # rejected by the tests
        return _scan(X, states, sequence_lens, direction, layout, step)
