"""The activation table of the ONNX recurrent operators.

Each activation is applied in place to a float array. ``activation_alpha`` and
``activation_beta`` are consumed in order, each activation taking only the
parameters it uses, with the defaults of the corresponding ONNX operators
(docs/semantics.md, "Activations and their parameters").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import RecurrentError

Kernel = Callable[[np.ndarray, float, float], None]


class ActivationCode(enum.IntEnum):
    """One number per activation: what a compiled loop branches on (the numba backend
    compares with these members, constants in its code). Compiled code is cached on
    disk by the source file that uses the numbers, not this one: never renumber a
    member, add new ones at the end."""

    RELU = 0
    TANH = 1
    SIGMOID = 2
    AFFINE = 3
    LEAKY_RELU = 4
    THRESHOLDED_RELU = 5
    SCALED_TANH = 6
    HARD_SIGMOID = 7
    ELU = 8
    SOFTSIGN = 9
    SOFTPLUS = 10


def _relu(x: np.ndarray, alpha: float, beta: float) -> None:
    np.maximum(x, 0, out=x)


def _tanh(x: np.ndarray, alpha: float, beta: float) -> None:
    np.tanh(x, out=x)


def _sigmoid(x: np.ndarray, alpha: float, beta: float) -> None:
    # 1 / (1 + e^-x) == (1 + tanh(x / 2)) / 2, without overflow for large |x|.
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5


def _affine(x: np.ndarray, alpha: float, beta: float) -> None:
    x *= alpha
    x += beta


def _leaky_relu(x: np.ndarray, alpha: float, beta: float) -> None:
    np.multiply(x, alpha, out=x, where=x < 0)


def _thresholded_relu(x: np.ndarray, alpha: float, beta: float) -> None:
    # ONNX: x for x > alpha, 0 otherwise: 0 at alpha itself and at NaN
    np.copyto(x, 0, where=~(x > alpha))


def _scaled_tanh(x: np.ndarray, alpha: float, beta: float) -> None:
    x *= beta
    np.tanh(x, out=x)
    x *= alpha


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> None:
    x *= alpha
    x += beta
    np.clip(x, 0, 1, out=x)


def _elu(x: np.ndarray, alpha: float, beta: float) -> None:
    negative = x < 0
    np.expm1(x, out=x, where=negative)
    np.multiply(x, alpha, out=x, where=negative)


def _softsign(x: np.ndarray, alpha: float, beta: float) -> None:
    np.divide(x, np.abs(x) + 1, out=x)


def _softplus(x: np.ndarray, alpha: float, beta: float) -> None:
    np.logaddexp(0, x, out=x)


@dataclass(frozen=True)
class ActivationKind:
    """One entry of the table: its ONNX name, code, kernel and parameter defaults."""

    name: str
    code: ActivationCode
    kernel: Kernel
    alpha: float | None = None  # default alpha, or None if it takes no alpha
    beta: float | None = None  # default beta, or None if it takes no beta


TABLE: dict[str, ActivationKind] = {
    kind.name.lower(): kind
    for kind in (
        ActivationKind("Relu", ActivationCode.RELU, _relu),
        ActivationKind("Tanh", ActivationCode.TANH, _tanh),
        ActivationKind("Sigmoid", ActivationCode.SIGMOID, _sigmoid),
        ActivationKind("Affine", ActivationCode.AFFINE, _affine, 1.0, 0.0),
        ActivationKind("LeakyRelu", ActivationCode.LEAKY_RELU, _leaky_relu, 0.01),
        ActivationKind("ThresholdedRelu", ActivationCode.THRESHOLDED_RELU, _thresholded_relu, 1.0),
        ActivationKind("ScaledTanh", ActivationCode.SCALED_TANH, _scaled_tanh, 1.0, 1.0),
        ActivationKind("HardSigmoid", ActivationCode.HARD_SIGMOID, _hard_sigmoid, 0.2, 0.5),
        ActivationKind("Elu", ActivationCode.ELU, _elu, 1.0),
        ActivationKind("Softsign", ActivationCode.SOFTSIGN, _softsign),
        ActivationKind("Softplus", ActivationCode.SOFTPLUS, _softplus),
    )
}


@dataclass(frozen=True)
class Activation:
    """An activation with its parameters bound: ``act(x)`` transforms ``x`` in place."""

    kind: ActivationKind
    alpha: float = 0.0
    beta: float = 0.0

    @property
    def name(self) -> str:
        return self.kind.name

    def __call__(self, x: np.ndarray) -> None:
        self.kind.kernel(x, self.alpha, self.beta)


def resolve(
    names: Sequence[str],
    alpha: Sequence[float] | None,
    beta: Sequence[float] | None,
) -> tuple[Activation, ...]:
    """Bind names and the flat alpha/beta lists into activations.

    Names are matched case-insensitively. Each activation consumes the next alpha
    (beta) only if it uses one; missing values take the ONNX defaults.

    Raises
    ------
    RecurrentError
        An unknown name, or alpha/beta values left over that no activation uses.
    """
    alphas = [float(a) for a in (alpha if alpha is not None else ())]
    betas = [float(b) for b in (beta if beta is not None else ())]
    bound = []
    ia = ib = 0
    for name in names:
        key = name.decode() if isinstance(name, bytes) else str(name)
        kind = TABLE.get(key.lower())
        if kind is None:
            known = ", ".join(k.name for k in TABLE.values())
            raise RecurrentError(
                f"activations: unknown activation {key!r}; expected one of {known}"
            )
        a = b = 0.0
        if kind.alpha is not None:
            a = alphas[ia] if ia < len(alphas) else kind.alpha
            ia += 1
        if kind.beta is not None:
            b = betas[ib] if ib < len(betas) else kind.beta
            ib += 1
        bound.append(Activation(kind, a, b))
    for given, used, attr in ((alphas, ia, "activation_alpha"), (betas, ib, "activation_beta")):
        if len(given) > used:
            raise RecurrentError(
                f"{attr} has {len(given)} values but activations "
                f"{[act.name for act in bound]} use only {used}"
            )
    return tuple(bound)
