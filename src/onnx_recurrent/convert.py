"""Weights between PyTorch or Keras recurrent layers and the ONNX operators.

A framework's recurrent layer becomes one :class:`Layer` per layer of its stack: the
ONNX ``W``, ``R``, ``B`` and node attributes that :func:`~onnx_recurrent.gru`,
:func:`~onnx_recurrent.lstm` or :func:`~onnx_recurrent.rnn` take. What differs between
the frameworks is data: the order of the gates and where the biases live.

======  ===============  ============  ==============
ONNX    gates            PyTorch       Keras
======  ===============  ============  ==============
GRU     ``z r h``        ``r z n``     ``z r h``
LSTM    ``i o f c``      ``i f g o``   ``i f c o``
RNN     one              one           one
======  ===============  ============  ==============

PyTorch's GRU computes ``linear_before_reset=1``; Keras' GRU computes it when
``reset_after=True`` (its default). PyTorch keeps ``weight_ih`` ``(gates*hidden, input)``
like ONNX; Keras keeps the transposes, ``kernel`` ``(input, gates*hidden)``.

torch is an optional dependency, imported only by :func:`from_torch` and
:func:`to_torch` (``pip install 'onnx-recurrent[torch]'``). :func:`from_keras` and
:func:`to_keras` work on the plain NumPy arrays of ``keras_layer.get_weights()`` and
need no Keras.

Examples
--------
>>> import torch  # doctest: +SKIP
>>> from onnx_recurrent.convert import from_torch, run_layers
>>> gru = torch.nn.GRU(16, 32, num_layers=2, bidirectional=True)  # doctest: +SKIP
>>> layers = from_torch(gru)  # doctest: +SKIP
>>> Y, h_n = run_layers(layers, x.numpy())  # == gru(x), as NumPy  # doctest: +SKIP
>>> Y, Y_h = layers[0].run(x.numpy())  # one ONNX GRU node  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cells import CELLS
from .errors import RecurrentError, RecurrentTypeError, import_optional
from .layers import Layer
from .spec import as_float_array, check_bool, list_in_dtype

__all__ = ["Layer", "from_keras", "from_torch", "run_layers", "to_keras", "to_torch"]


@dataclass(frozen=True)
class _Kind:
    """What one ONNX operator is made of: its gates in each framework's order."""

    gates: int
    torch: tuple[int, ...]  # ONNX gate g is PyTorch's gate torch[g]
    keras: tuple[int, ...]  # ... and Keras' gate keras[g]
    activations: tuple[str, ...]  # the ONNX defaults of one direction
    attribute: str | None  # the op's own attribute, beyond the common ones


#: ONNX gate g is PyTorch's gate ``[g]`` and Keras' gate ``[g]`` (the frameworks' orders)
_ORDERS = {
    "GRU": ((1, 0, 2), (0, 1, 2)),
    "LSTM": ((0, 3, 1, 2), (0, 3, 1, 2)),
    "RNN": ((0,), (0,)),
}
_KINDS = {
    name: _Kind(
        cell.n_gates,
        *_ORDERS[name],
        tuple(a.lower() for a in cell.default_activations),
        cell.own_attributes[0] if cell.own_attributes else None,
    )
    for name, cell in CELLS.items()
}
#: ``torch.nn.RNNBase.mode`` -> (ONNX op, activation of every direction or None for default)
_TORCH_MODES = {
    "GRU": ("GRU", None),
    "LSTM": ("LSTM", None),
    "RNN_TANH": ("RNN", None),
    "RNN_RELU": ("RNN", "Relu"),
}
_DIRECTIONS = {1: "forward", 2: "bidirectional"}
_TORCH_EXTRA = "pip install 'onnx-recurrent[torch]'"


def run_layers(
    layers: Iterable[Layer],
    X: np.ndarray,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    *,
    sequence_lens: np.ndarray | None = None,
    output_sequence: bool = True,
) -> tuple[np.ndarray | None, ...]:
    """Run a stack of layers the way ``torch.nn.GRU/LSTM/RNN`` does (without dropout).

    Each layer's input is the previous layer's ``Y`` with its directions concatenated
    on the feature axis; the states use PyTorch's shapes, whatever the layout.

    Parameters
    ----------
    layers : iterable of Layer, or one Layer
        One op and one ``layout`` for the whole stack (the layout of ``X`` and of the
        returned sequence; every layer consumes its input in it).
    X : (seq_length, batch_size, input_size) ndarray
        ``(batch_size, seq_length, input_size)`` if ``layout=1`` (``batch_first``).
    initial_h, initial_c : (num_layers*num_directions, batch_size, hidden_size) ndarray, optional
        PyTorch's ``h_0`` and ``c_0`` (never batch-first); zeros if absent.
        ``initial_c`` for LSTM only.
    sequence_lens : (batch_size,) int32 ndarray, optional
        Valid lengths, as with a packed sequence: outputs past a length are zero and
        the final states are those at the last valid step.
    output_sequence : bool or {0, 1}
        If false, the last layer does not compute its sequence and ``Y`` is None.

    Returns
    -------
    Y : (seq_length, batch_size, num_directions*hidden_size) ndarray or None
        ``(batch_size, seq_length, num_directions*hidden_size)`` if ``layout=1``:
        PyTorch's ``output``.
    Y_h : (num_layers*num_directions, batch_size, hidden_size) ndarray
        PyTorch's ``h_n``.
    Y_c : (num_layers*num_directions, batch_size, hidden_size) ndarray
        PyTorch's ``c_n``; LSTM only.

    Raises
    ------
    ValueError
        No layers, layers of different ops, layouts or hidden sizes, a layer whose
        ``input_size`` is not the features the one below gives it, a state not of
        PyTorch's shape
        (the total number of directions, X's batch size, the hidden size),
        ``initial_c`` for a GRU or RNN; the layers' own errors.
    TypeError
        An entry of ``layers`` that is not a Layer; layers of different dtypes.
    """
    layers = _layer_list(layers, "run_layers")
    if not layers:
        raise RecurrentError("run_layers needs at least one layer")
    for k, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise RecurrentTypeError(f"layers[{k}] must be a Layer, got {type(layer).__name__}")
    op, layout = layers[0].op, layers[0].layout
    for k, layer in enumerate(layers):
        if (layer.op, layer.layout) != (op, layout):
            raise RecurrentError(
                f"layers[{k}] is a {layer.op} with layout={layer.layout}, layers[0] a {op} "
                f"with layout={layout}: a stack has one op and one layout"
            )
        if layer.dtype != layers[0].dtype:
            raise RecurrentTypeError(
                f"layers[{k}] is {layer.dtype}, layers[0] {layers[0].dtype}: a stack has "
                "one dtype (each layer's input is the one below's output)"
            )
    for k, (below, layer) in enumerate(itertools.pairwise(layers), start=1):
        if layer.hidden_size != layers[0].hidden_size:
            raise RecurrentError(
                f"layers[{k}] has hidden_size={layer.hidden_size}, layers[0] "
                f"{layers[0].hidden_size}: a stack has one hidden size (its final states "
                "are stacked as PyTorch's h_n)"
            )
        fed = below.num_directions * below.hidden_size
        if layer.input_size != fed:
            raise RecurrentError(
                f"layers[{k}] has input_size={layer.input_size} (W's last axis), but "
                f"layers[{k - 1}] gives it {fed} features a step (num_directions * "
                "hidden_size)"
            )
    ends = np.cumsum([0] + [layer.num_directions for layer in layers])
    like = layers[0].W  # states given as lists: in the layers' dtype
    initial = {"initial_h": list_in_dtype("initial_h", initial_h, like)}
    if op == "LSTM":
        initial["initial_c"] = list_in_dtype("initial_c", initial_c, like)
    elif initial_c is not None:
        raise RecurrentError(f"initial_c is for LSTM only, these layers are {op}")
    # PyTorch's shape, checked here: a layer would word it in its own (per-layer,
    # batch-first) terms
    N = np.shape(X)[1 - layout] if np.ndim(X) == 3 else "batch_size"
    H = layers[0].hidden_size
    for name, state in initial.items():
        if state is not None and (
            np.ndim(state) != 3 or np.shape(state)[0] != ends[-1] or np.shape(state)[2] != H
        ):
            raise RecurrentError(
                f"{name} must have shape [{ends[-1]}, {N}, {H}] "
                "[num_layers*num_directions, batch_size, hidden_size] (never batch-first), "
                f"got {list(np.shape(state))}"
            )
        if state is not None and isinstance(N, int) and np.shape(state)[1] != N:
            raise RecurrentError(
                f"{name} must have shape [{ends[-1]}, {N}, {H}] "
                "[num_layers*num_directions, batch_size, hidden_size] (never batch-first; "
                f"X's batch_size is {N}), got {list(np.shape(state))}"
            )
    finals = []
    Y = X
    for k, layer in enumerate(layers):
        states = {
            name: np.swapaxes(state[ends[k] : ends[k + 1]], 0, layout)
            for name, state in initial.items()
            if state is not None
        }
        last = k == len(layers) - 1
        Y, *final = layer.run(
            Y, sequence_lens, **states, output_sequence=output_sequence or not last
        )
        if Y is not None:  # [T, D, N, H] -> [T, N, D*H], or [N, T, D, H] -> [N, T, D*H]
            Y = Y if layout else Y.transpose(0, 2, 1, 3)
            Y = Y.reshape(*Y.shape[:2], layer.num_directions * layer.hidden_size)
        finals.append([np.swapaxes(state, 0, layout) for state in final])
    return (Y, *(np.concatenate(states) for states in zip(*finals, strict=True)))


def _layer_list(layers: Any, function: str) -> list:
    """``layers`` as a list: one :class:`Layer` is a stack of one (it was "'Layer'
    object is not iterable"), anything else not iterable a TypeError naming it."""
    if isinstance(layers, Layer):
        return [layers]
    try:
        return list(layers)
    except TypeError:
        raise RecurrentTypeError(
            f"{function}: layers must be a list of Layer, got {type(layers).__name__}"
        ) from None


def _reorder(array: np.ndarray, order: Iterable[int]) -> np.ndarray:
    """The gate blocks of ``array``'s first axis, taken in ``order``."""
    order = list(order)
    blocks = np.split(array, len(order))
    return np.concatenate([blocks[g] for g in order])


def _inverse(order: tuple[int, ...]) -> list[int]:
    return list(np.argsort(order))


def _torch_kind(torch: Any, module: Any) -> tuple[str, str | None]:
    mode = getattr(module, "mode", None)
    if not isinstance(module, torch.nn.RNNBase) or mode not in _TORCH_MODES:
        cls = type(module)
        raise RecurrentTypeError(
            f"expected a torch.nn.GRU, LSTM or RNN, got {cls.__module__}.{cls.__qualname__}"
        )
    if getattr(module, "proj_size", 0):
        raise RecurrentError(
            f"torch.nn.LSTM with proj_size={module.proj_size} is not supported: "
            "the ONNX LSTM has no projection"
        )
    return _TORCH_MODES[mode]


def _torch_forward(torch: Any, module: Any) -> None:
    """``module`` computes what torch's own class computes: a subclass's forward, one
    set on the module, or a forward hook (of the module, or a pre-hook other than the
    weights' reparametrizations that :func:`_torch_weight` reads) may compute anything
    from the weights."""
    from torch.nn.utils import prune
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    classes = (torch.nn.GRU, torch.nn.LSTM, torch.nn.RNN, torch.nn.RNNBase)
    base = next(c for c in classes if isinstance(module, c))
    cls = type(module)
    own = None
    if cls.forward is not base.forward:
        own = "has its own forward"
    elif "forward" in vars(module):
        own = "has a forward set on it"
    elif getattr(module, "_forward_hooks", None):
        own = f"has {len(module._forward_hooks)} forward hook(s)"
    else:
        weights = (WeightNorm, SpectralNorm, prune.BasePruningMethod)
        pre = [h for h in module._forward_pre_hooks.values() if not isinstance(h, weights)]
        if pre:
            own = f"has {len(pre)} forward pre-hook(s)"
    if own is not None:
        raise RecurrentTypeError(
            f"{cls.__module__}.{cls.__qualname__} {own}: its weights alone do not tell "
            f"what it computes (expected torch.nn.{base.__name__}'s forward; remove the "
            "hooks, or run the module itself)"
        )


def _check_layer(layer: Layer, where: str, op: str, D: int, H: int, I: int | None) -> None:
    """``layer`` is an ``op`` with ``D`` directions, hidden size H and input size I (as
    the layer computes them: its parsed attributes, not the dict it was given)."""
    if not isinstance(layer, Layer):
        raise RecurrentTypeError(f"{where} must be a Layer, got {type(layer).__name__}")
    if layer.op != op:
        raise RecurrentError(f"{where} is a {layer.op}, expected a {op}")
    spec = layer.spec
    if spec.direction != _DIRECTIONS[D]:
        raise RecurrentError(
            f"{where} has direction={spec.direction!r}, expected {_DIRECTIONS[D]!r}"
        )
    if spec.hidden_size != H:
        raise RecurrentError(f"{where} has hidden_size={spec.hidden_size}, expected {H}")
    G = _KINDS[op].gates
    I = layer.input_size if I is None else I
    expected = {"W": (D, G * H, I), "R": (D, G * H, H), "B": (D, 2 * G * H)}
    for name, shape in expected.items():
        array = getattr(layer, name)
        if array is not None and array.shape != shape:
            raise RecurrentError(
                f"{where}.{name} must have shape {list(shape)} (num_directions={D}, "
                f"hidden_size={H}, input_size={I}), got {list(array.shape)}"
            )


def _check_computable(layer: Layer, where: str, target: str, activations: list | None) -> None:
    """Reject what ``target`` cannot compute (``activations=None``: any activations),
    read from what the layer computes (its parsed attributes and weights)."""
    spec = layer.spec
    problems = []
    if spec.clip is not None and spec.clip != float("inf"):
        problems.append(f"clip={spec.clip}")
    if spec.input_forget:
        problems.append("input_forget=1")
    if layer.P is not None and np.any(layer.P):
        problems.append("peepholes (a non-zero P)")
    if activations is not None:
        given = [a for direction in spec.activations for a in direction]
        if [a.name.lower() for a in given] != [s.lower() for s in activations]:
            problems.append(f"activations={[a.name for a in given]} (needs {activations})")
    if problems:
        raise RecurrentError(f"{where} cannot be computed by {target}: {', '.join(problems)}")


def _to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    if tensor.is_meta:  # a module made on the "meta" device: shapes, no values
        raise RecurrentError(
            "from_torch: the module's parameters are on the 'meta' device (no values): "
            "load its weights first (e.g. module.to_empty(device='cpu') and "
            "load_state_dict)"
        )
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()  # lazy views: numpy() refuses
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def _torch_weight(torch: Any, module: Any, name: str) -> Any:
    """``module``'s parameter ``name`` as its forward computes it: torch's older
    ``weight_norm`` and its pruning set the attribute only in a forward pre-hook, so
    after ``load_state_dict`` and before a forward it holds stale values."""
    from torch.nn.utils import prune
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm) and hook.name == name:
            return hook.compute_weight(module)
        if isinstance(hook, SpectralNorm) and hook.name == name:  # as in eval mode
            return hook.compute_weight(module, do_power_iteration=False)
        if isinstance(hook, prune.BasePruningMethod) and hook._tensor_name == name:
            return hook.apply_mask(module)
    weight = getattr(module, name, None)
    if not isinstance(weight, torch.Tensor):
        got = "missing" if weight is None else f"a {type(weight).__name__}"
        raise RecurrentError(
            f"from_torch: module.{name} is {got}, expected a tensor: torch.nn."
            f"{type(module).__name__}(num_layers={module.num_layers}, "
            f"bidirectional={module.bidirectional}, bias={module.bias}) has one (deleted or "
            "renamed since?)"
        )
    return weight


@contextmanager
def _evaluating(torch: Any, module: Any) -> Iterator[None]:
    """``module`` in eval mode, without autograd, inside the block (a parametrization
    such as ``spectral_norm`` updates its buffers when read in training mode); each
    submodule's mode is back after it."""
    modes = [(m, m.training) for m in module.modules()]
    module.train(False)
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def from_torch(module: Any) -> list[Layer]:
    """Convert a ``torch.nn.GRU``, ``LSTM`` or ``RNN`` to one :class:`Layer` per layer.

    Every ``num_layers``, ``bidirectional``, ``batch_first``, ``bias`` and RNN
    ``nonlinearity`` is supported. :func:`run_layers` then computes ``module(x)``
    (in eval mode: dropout between layers is not applied).

    Parameters
    ----------
    module : torch.nn.GRU, torch.nn.LSTM or torch.nn.RNN
        On any device; its parameters are copied, as its forward computes them in
        eval mode (through torch's parametrizations, older ``weight_norm``,
        ``spectral_norm`` or pruning). The module is left as it was: its mode, and the
        buffers a parametrization updates when read in training mode.

    Returns
    -------
    list of Layer
        Layer ``k`` has ``W (D, G*H, I_k)``, ``R (D, G*H, H)`` and ``B (D, 2*G*H)``
        (None if ``bias=False``) in the module's dtype (float16, float32, float64,
        bfloat16 as ``ml_dtypes.bfloat16``), with ``D`` 1 or 2 directions, ``G`` gates,
        ``I_0 = input_size`` and ``I_k = D*H`` after. Attributes: ``hidden_size``,
        ``direction`` (``forward`` or ``bidirectional``), ``layout`` (1 if
        ``batch_first``: every layer of the stack then takes batch-first input),
        ``linear_before_reset=1`` (GRU), ``activations=["Relu"]*D`` (RNN relu).

    Raises
    ------
    ImportError
        torch is not installed.
    TypeError
        ``module`` is not a GRU, LSTM or RNN, or computes otherwise: a subclass with its
        own forward, a forward set on it, forward hooks, forward pre-hooks other than
        ``weight_norm``'s, ``spectral_norm``'s and pruning's; parameters of different
        dtypes (the message names two).
    ValueError
        An LSTM with ``proj_size > 0``; parameters on the ``meta`` device (no values);
        a parameter missing (deleted, renamed) or of another shape than the module's
        attributes give (the message names it and the expected shape).
    """
    torch = import_optional("torch", "from_torch", _TORCH_EXTRA)
    op, activation = _torch_kind(torch, module)
    _torch_forward(torch, module)
    kind = _KINDS[op]
    D = 2 if module.bidirectional else 1
    attributes = {
        "hidden_size": module.hidden_size,
        "direction": _DIRECTIONS[D],
        "layout": int(module.batch_first),
    }
    if op == "GRU":
        attributes["linear_before_reset"] = 1

    H = module.hidden_size
    inputs = [module.input_size] + [D * H] * (module.num_layers - 1)

    first: list[tuple[str, Any]] = []  # the first parameter read, and its dtype

    def stacked(k: int, *names: str) -> np.ndarray:  # [D, ...]: the names' gates, concatenated
        def onnx(name: str, d: int) -> np.ndarray:
            full = f"{name}_l{k}{'_reverse' * d}"
            weight = _torch_weight(torch, module, full)
            first.extend([] if first else [(full, weight.dtype)])
            if weight.dtype != first[0][1]:
                raise RecurrentTypeError(
                    f"from_torch: module.{full} is {weight.dtype}, module.{first[0][0]} "
                    f"{first[0][1]}: the layers need one dtype (module.to(dtype))"
                )
            width = {"weight_ih": (inputs[k],), "weight_hh": (H,)}.get(name, ())
            if tuple(weight.shape) != (kind.gates * H, *width):
                raise RecurrentError(
                    f"from_torch: module.{full} has shape {list(weight.shape)}, expected "
                    f"{[kind.gates * H, *width]} (hidden_size={H}, "
                    f"input_size={inputs[k]}, {kind.gates} gates)"
                )
            return _reorder(_to_numpy(torch, weight), kind.torch)

        return np.stack([np.concatenate([onnx(name, d) for name in names]) for d in range(D)])

    with _evaluating(torch, module):
        weights = [
            (
                stacked(k, "weight_ih"),
                stacked(k, "weight_hh"),
                stacked(k, "bias_ih", "bias_hh") if module.bias else None,
            )
            for k in range(module.num_layers)
        ]
    extra = {"activations": [activation] * D} if activation else {}
    return [Layer(op, W, R, B, {**attributes, **extra}) for W, R, B in weights]


def to_torch(layers: Iterable[Layer], module: Any) -> Any:
    """Load ONNX weights into a ``torch.nn.GRU``, ``LSTM`` or ``RNN``, in place.

    Every layer is checked before any parameter is written. The ``layout`` attribute
    describes the data, not the weights: it is not compared with ``batch_first``.

    Parameters
    ----------
    layers : iterable of Layer, or one Layer
        One per layer of ``module``, as :func:`from_torch` returns them: the same op,
        ``W (D, G*H, I_k)``, ``R (D, G*H, H)``, ``B (D, 2*G*H)`` or None (zeros).
    module : torch.nn.GRU, torch.nn.LSTM or torch.nn.RNN
        Its parameters are overwritten (cast to their dtype, on their device).

    Returns
    -------
    module
        The same module.

    Raises
    ------
    ImportError
        torch is not installed.
    TypeError
        ``module`` is not a GRU, LSTM or RNN; an entry of ``layers`` is not a Layer.
    ValueError
        An LSTM with ``proj_size > 0``; a number of layers, op, direction or shape that
        disagrees with the module (the message names the layer and expected shape); a
        layer PyTorch cannot compute: a GRU with ``linear_before_reset=0``, activations
        other than the module's, ``clip``, ``input_forget``, peepholes (a non-zero
        ``P``), or a non-zero ``B`` for a module without bias; a module whose weights
        are computed from others (``weight_norm``, a parametrization, pruning) or on
        the ``meta`` device, where nothing could be written; a parameter missing or
        of another shape, two parameters that are one tensor, or a value that
        overflows the module's dtype (float16: above 65504).
    """
    torch = import_optional("torch", "to_torch", _TORCH_EXTRA)
    op, activation = _torch_kind(torch, module)
    kind = _KINDS[op]
    layers = _layer_list(layers, "to_torch")
    if len(layers) != module.num_layers:
        raise RecurrentError(
            f"expected {module.num_layers} layers (num_layers), got {len(layers)}"
        )
    D, H, G = 1 + module.bidirectional, module.hidden_size, kind.gates
    activations = [activation] * D if activation else list(kind.activations) * D
    inverse = _inverse(kind.torch)
    parameters = {}
    for k, layer in enumerate(layers):
        where = f"layers[{k}]"
        _check_layer(layer, where, op, D, H, module.input_size if k == 0 else D * H)
        _check_computable(layer, where, f"torch.nn.{type(module).__name__}", activations)
        if op == "GRU" and not layer.spec.linear_before_reset:
            raise RecurrentError(
                f"{where} has linear_before_reset=0; torch.nn.GRU computes only "
                "linear_before_reset=1"
            )
        if not module.bias and layer.B is not None and np.any(layer.B != 0):
            raise RecurrentError(f"{where} has a non-zero B; the module has bias=False")
        B = np.zeros((D, 2 * G * H), layer.W.dtype) if layer.B is None else layer.B
        for d in range(D):
            suffix = f"_l{k}{'_reverse' * d}"
            parameters["weight_ih" + suffix] = _reorder(layer.W[d], inverse)
            parameters["weight_hh" + suffix] = _reorder(layer.R[d], inverse)
            if module.bias:
                parameters["bias_ih" + suffix] = _reorder(B[d, : G * H], inverse)
                parameters["bias_hh" + suffix] = _reorder(B[d, G * H :], inverse)
    values = _torch_values(torch, module, parameters)
    inference = any(own.is_inference() for own, _ in values.values())
    with torch.inference_mode() if inference else torch.no_grad():  # made under inference_mode
        for own, value in values.values():
            own.copy_(value)
    return module


def _torch_values(torch: Any, module: Any, parameters: dict[str, np.ndarray]) -> dict:
    """Each of ``module``'s parameters named in ``parameters``, with the value to write
    into it as a tensor of its dtype: every one checked before any is written (a
    parameter that is missing, computed from others, on the meta device, of another
    shape, shared with another, or a value that overflows its dtype: ValueError)."""
    from torch.nn.utils import parametrize

    values, seen = {}, {}
    held = dict(module.named_parameters(recurse=False, remove_duplicate=False))  # tied too
    for name, value in parameters.items():
        own = held.get(name)
        if own is None:
            hooked = any(
                getattr(h, "name", getattr(h, "_tensor_name", None)) == name
                for h in module._forward_pre_hooks.values()
            )
            if hooked or parametrize.is_parametrized(module, name):
                raise RecurrentError(
                    f"module.{name} is not a parameter of the module but computed from "
                    "others (weight_norm, a parametrization or pruning): remove that "
                    "first (torch.nn.utils.parametrize.remove_parametrizations, "
                    "torch.nn.utils.prune.remove) or load into a module without it"
                )
            got = getattr(module, name, None)
            raise RecurrentError(
                f"module.{name} is "
                + ("missing" if got is None else f"a {type(got).__name__}, not a Parameter")
                + f": torch.nn.{type(module).__name__} has it as a parameter (deleted or "
                "replaced since?)"
            )
        if own.is_meta:
            raise RecurrentError(
                f"module.{name} is on the 'meta' device (no storage to write): "
                "module.to_empty(device='cpu') first"
            )
        if tuple(own.shape) != value.shape:
            raise RecurrentError(
                f"module.{name} has shape {list(own.shape)}, expected {list(value.shape)} "
                "(from the module's attributes and the layers)"
            )
        if own.numel():
            _check_own_memory(own, name, seen)
        if value.dtype.kind != "f":  # bfloat16: torch.from_numpy does not know it
            value = value.astype(np.float32)
        cast = torch.from_numpy(np.ascontiguousarray(value)).to(own.dtype)
        overflows = np.isfinite(value) & ~torch.isfinite(cast).numpy()
        if overflows.any():
            raise RecurrentError(
                f"module.{name}: {int(overflows.sum())} values overflow the module's "
                f"dtype {str(own.dtype).removeprefix('torch.')} (largest magnitude "
                f"{float(np.abs(value[overflows]).max()):g})"
            )
        values[name] = own, cast
    return values


def _check_own_memory(own: Any, name: str, seen: dict[tuple[int, int], tuple]) -> None:
    """That writing ``own`` writes each of its elements once and no other parameter's
    (``seen``: the byte spans of those checked before, their names and tensors)."""
    extent = 1  # strides by size: each must step past the elements of those before it
    for stride, size in sorted(
        (st, n) for st, n in zip(own.stride(), own.shape, strict=True) if n > 1
    ):
        if stride < extent:
            raise RecurrentError(
                f"module.{name} holds elements that share memory (strides "
                f"{list(own.stride())} for shape {list(own.shape)}: expanded or "
                "as_strided): writing it would write one place for several; give it its "
                f"own memory first (module.{name}.data = module.{name}.data.clone())"
            )
        extent += (size - 1) * stride
    start = own.data_ptr()
    end = start + extent * own.element_size()
    for (a, b), (other, tensor) in seen.items():
        if a == start and b == end and tensor.stride() == own.stride():
            raise RecurrentError(
                f"module.{name} is the same tensor as module.{other}: writing one would "
                "write the other"
            )
        if a < end and start < b and _share_bytes(own, tensor):
            raise RecurrentError(
                f"module.{name} overlaps module.{other} in memory (views of one "
                "tensor): writing one would write part of the other"
            )
    seen[(start, end)] = name, own


def _share_bytes(one: Any, other: Any) -> bool:
    """Whether two tensors whose spans meet hold a byte in common (interleaved views,
    such as two column blocks of one matrix, do not)."""
    if one.is_contiguous() and other.is_contiguous():
        return True

    def places(t: Any) -> np.ndarray:  # each byte's address
        offsets = np.zeros((), np.int64)
        for stride, size in zip(t.stride(), t.shape, strict=True):
            offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
        first = t.data_ptr() + offsets.ravel() * t.element_size()
        return np.add.outer(first, np.arange(t.element_size())).ravel()

    return np.intersect1d(places(one), places(other)).size > 0


def _keras_op(kind: str) -> str:
    op = str(kind).upper()
    if op not in _KINDS:
        raise RecurrentError(f"kind must be one of 'gru', 'lstm', 'rnn', got {kind!r}")
    return op


def _reset_after(op: str, reset_after: bool | None) -> bool:
    if reset_after is not None:
        reset_after = check_bool("reset_after", reset_after)  # "False" is true
    if op == "GRU":
        return True if reset_after is None else bool(reset_after)
    if reset_after is not None:
        raise RecurrentError(f"reset_after is for kind='gru' only, got it for {op.lower()!r}")
    return False


def from_keras(
    kernel: np.ndarray,
    recurrent_kernel: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    kind: str,
    reset_after: bool | None = None,
) -> Layer:
    """Convert the weights of a Keras ``GRU``, ``LSTM`` or ``SimpleRNN`` to a :class:`Layer`.

    The arrays are those of ``keras_layer.get_weights()``:
    ``from_keras(*keras_layer.get_weights(), kind="gru")``.

    Parameters
    ----------
    kernel : (input_size, gates*hidden_size) ndarray
        Gates in Keras' order: GRU ``z r h``, LSTM ``i f c o``.
    recurrent_kernel : (hidden_size, gates*hidden_size) ndarray
    bias : ndarray, optional
        ``(2, 3*hidden_size)`` (input and recurrent biases) for a GRU with
        ``reset_after``, else ``(gates*hidden_size,)``; None for ``use_bias=False``.
    kind : {"gru", "lstm", "rnn"}
        Case-insensitive; ``"rnn"`` is ``SimpleRNN``.
    reset_after : bool or {0, 1}, optional
        GRU only; True (Keras' default) if absent. Becomes ``linear_before_reset``.

    Returns
    -------
    Layer
        ``W (1, G*H, input_size)``, ``R (1, G*H, H)``, ``B (1, 2*G*H)`` (Keras' bias as
        ``Wb``, zeros as ``Rb``, except a ``reset_after`` GRU's own two rows) or None,
        in the arrays' dtype. Attributes ``hidden_size``, ``direction="forward"``,
        ``layout=1`` (Keras is batch-first), ``linear_before_reset`` (GRU). The
        activations are ONNX's defaults, which are Keras' (``recurrent_activation``
        sigmoid, ``activation`` tanh); for others, ``layer.replace(attributes=...)``
        with ONNX's names and parameters: Keras 3's ``hard_sigmoid`` is
        ``HardSigmoid`` with ``activation_alpha`` 1/6 and ``activation_beta`` 0.5 (ONNX's
        defaults, 0.2 and 0.5, are Keras 2's), ``linear`` is ``Affine`` (1, 0),
        ``relu`` ``Relu``.

    Notes
    -----
    A ``Bidirectional`` layer's ``get_weights()`` holds both directions' arrays: convert
    each (``weights[:3]``, ``weights[3:]``, the second with
    ``replace(attributes={"direction": "reverse"})``).

    Raises
    ------
    ValueError
        An unknown ``kind``, ``reset_after`` for an LSTM or RNN, arrays whose shapes
        disagree (the message gives the expected shape).
    TypeError
        A non-float array, or arrays of different dtypes; ``reset_after`` other than a
        bool, 0 or 1; a Keras layer or the list of its weights given for ``kernel``
        (the message says how to call it).
    """
    if (
        recurrent_kernel is None
        or isinstance(kernel, list | tuple)
        or hasattr(kernel, "get_weights")
    ):
        what = (
            "a Keras layer" if hasattr(kernel, "get_weights")
            else f"a {type(kernel).__name__} of {len(kernel)}" if isinstance(kernel, list | tuple)
            else "no recurrent_kernel"
        )  # fmt: skip
        raise RecurrentTypeError(
            f"from_keras takes the arrays of keras_layer.get_weights() unpacked, got {what}: "
            f"from_keras(*keras_layer.get_weights(), kind={kind!r}) (a Bidirectional "
            "layer's six: each direction's three apart)"
        )
    op = _keras_op(kind)
    reset_after = _reset_after(op, reset_after)
    G, order = _KINDS[op].gates, _KINDS[op].keras
    kernel = as_float_array("kernel", kernel)
    recurrent_kernel = as_float_array("recurrent_kernel", recurrent_kernel)
    H = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else -1
    for name, array, rows in (("recurrent_kernel", recurrent_kernel, H), ("kernel", kernel, None)):
        if array.ndim != 2 or array.shape[1] != G * H or rows not in (None, array.shape[0]):
            dims = "hidden_size" if rows is not None else "input_size"
            raise RecurrentError(
                f"{name} must have shape [{dims}, {G}*hidden_size] for kind={kind!r}"
                + (f" (hidden_size={H} from recurrent_kernel)" if rows is None else "")
                + f", got {list(array.shape)}"
            )
    arrays = {"kernel": kernel, "recurrent_kernel": recurrent_kernel}
    if bias is not None:
        arrays["bias"] = bias = as_float_array("bias", bias)
    if len({a.dtype for a in arrays.values()}) > 1:
        dtypes = ", ".join(f"{name} {a.dtype}" for name, a in arrays.items())
        raise RecurrentTypeError(f"the arrays must have one dtype, got {dtypes}")
    B = None
    if bias is not None:
        shape = (2, G * H) if reset_after else (G * H,)
        if bias.shape != shape:
            raise RecurrentError(
                f"bias must have shape {list(shape)} for kind={kind!r}"
                + (f", reset_after={reset_after}" if op == "GRU" else "")
                + f" (hidden_size={H}), got {list(bias.shape)}"
            )
        Wb, Rb = bias if reset_after else (bias, np.zeros_like(bias))
        B = np.concatenate([_reorder(Wb, order), _reorder(Rb, order)])[None]
    attributes = {"hidden_size": H, "direction": "forward", "layout": 1}
    if op == "GRU":
        attributes["linear_before_reset"] = int(reset_after)
    W = _reorder(kernel.T, order)[None]
    return Layer(op, W, _reorder(recurrent_kernel.T, order)[None], B, attributes)


def to_keras(
    layer: Layer, *, kind: str | None = None, reset_after: bool | None = None
) -> list[np.ndarray]:
    """Convert a forward :class:`Layer` to the weights of a Keras layer.

    The result goes to ``keras_layer.set_weights(...)``. The arrays carry weights only:
    a layer with other than the default activations needs them set on the Keras layer.

    Parameters
    ----------
    layer : Layer
        One direction (``direction="forward"``), ``W (1, G*H, I)``, ``R (1, G*H, H)``.
    kind : {"gru", "lstm", "rnn"}, optional
        If given, must be ``layer.op``.
    reset_after : bool or {0, 1}, optional
        GRU only; must be ``layer``'s ``linear_before_reset``, which it follows if
        absent.

    Returns
    -------
    list of ndarray
        ``[kernel (I, G*H), recurrent_kernel (H, G*H), bias]`` in Keras' gate order and
        ``layer``'s dtype; bias is ``(2, 3*H)`` for a ``reset_after`` GRU, else
        ``(G*H,)`` (``Wb + Rb``, these biases being only ever added, rounded once to
        the dtype). Without bias when ``layer.B`` is None (``use_bias=False``).

    Raises
    ------
    ValueError
        ``kind`` not ``layer.op``; ``reset_after`` for an LSTM or RNN or not matching
        ``linear_before_reset``; two directions or ``direction="reverse"`` (Keras'
        ``go_backwards`` returns a reversed sequence); ``clip``, ``input_forget`` or
        peepholes (a non-zero ``P``); shapes that disagree; ``Wb + Rb`` past the
        dtype's range.
    TypeError
        ``layer`` is not a Layer; ``reset_after`` other than a bool, 0 or 1.
    """
    if not isinstance(layer, Layer):
        raise RecurrentTypeError(f"layer must be a Layer, got {type(layer).__name__}")
    op = layer.op if kind is None else _keras_op(kind)
    _check_layer(layer, "layer", op, 1, layer.hidden_size, None)
    _check_computable(layer, "layer", "Keras", None)
    lbr = layer.spec.linear_before_reset
    if reset_after is None and op == "GRU":
        reset_after = lbr
    reset_after = _reset_after(op, reset_after)
    if reset_after != lbr:
        raise RecurrentError(
            f"reset_after={reset_after} computes linear_before_reset={int(reset_after)}; "
            f"the layer has linear_before_reset={int(lbr)}"
        )
    inverse = _inverse(_KINDS[op].keras)
    weights = [np.ascontiguousarray(_reorder(a[0], inverse).T) for a in (layer.W, layer.R)]
    if layer.B is not None:
        Wb, Rb = (_reorder(b, inverse) for b in np.split(layer.B[0], 2))
        if reset_after:
            weights.append(np.stack([Wb, Rb]))
        else:
            folded = Wb.astype(np.float64) + Rb.astype(np.float64)
            with np.errstate(over="ignore"):  # said below
                bias = folded.astype(Wb.dtype)
            if not np.all(np.isfinite(bias) | ~np.isfinite(folded)):
                raise RecurrentError(
                    f"the bias Keras keeps, Wb + Rb, overflows {Wb.dtype} (up to "
                    f"{np.abs(folded).max():.6g}): convert the layer to a wider dtype first"
                )
            weights.append(bias)
    return weights
