"""One call, described once: attributes parsed and checked, inputs normalised.

Everything here is shared by every operator; what differs between GRU, RNN and LSTM is
the cell (:class:`CellTraits`: gate count, activation count, states).
After :func:`check_weights` (the weights) and :func:`check_call` (a call's inputs)
the kernels never branch on layout, absent inputs or missing ``sequence_lens`` again.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .activations import Activation, resolve
from .errors import RecurrentError, RecurrentTypeError


class CellTraits(Protocol):
    """What the specification needs of an operator's cell: :class:`onnx_recurrent.cells.Cell`
    has it (cells import this module, never the reverse)."""

    name: str
    n_gates: int
    n_activations: int
    n_peepholes: int
    default_activations: tuple[str, ...]


DIRECTIONS = ("forward", "reverse", "bidirectional")
#: element types of T, and the type each is computed in (docs/semantics.md, "Element
#: types"); bfloat16, ml_dtypes', is told by :func:`compute_dtype` without importing
#: ml_dtypes (0.4 s a process with ml_dtypes 0.7: an array of it has loaded it already)
COMPUTE_DTYPE = {
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float64): np.dtype(np.float64),
}
#: the element types of T, as messages name them
T_TYPES = "float16, bfloat16, float32, float64"


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` is ``ml_dtypes.bfloat16`` (without importing ml_dtypes)."""
    ml_dtypes = sys.modules.get("ml_dtypes")
    return ml_dtypes is not None and dtype == ml_dtypes.bfloat16


def compute_dtype(dtype: Any) -> np.dtype | None:
    """The type an element type of T is computed in (:data:`COMPUTE_DTYPE`; bfloat16:
    float32), or None for any other type."""
    ct = COMPUTE_DTYPE.get(dtype)
    if ct is None and is_bfloat16(dtype):
        ct = COMPUTE_DTYPE[np.dtype(np.float32)]
    return ct


@dataclass(frozen=True)
class RecSpec:
    """The attributes of one recurrent call, validated."""

    cell: CellTraits
    hidden_size: int
    direction: str
    layout: int
    clip: float | None
    activations: tuple[tuple[Activation, ...], ...]  # one tuple per direction
    linear_before_reset: bool = False
    input_forget: bool = False

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def split(self) -> bool:
        """A GRU with ``linear_before_reset = 0``: its step in two phases (``rt`` is
        needed before ``ht``'s recurrent product, ``(rt . Ht-1) Rh^T``)."""
        return self.cell.name == "GRU" and not self.linear_before_reset


def check_flag(name: str, value: Any) -> bool:
    """An int attribute read as a flag, nonzero true, as onnxruntime reads it
    (``linear_before_reset != 0``, SEMANTICS.md; ``input_forget``, ``output_sequence``).

    Raises
    ------
    ValueError
        (``RecurrentError``) ``value`` is not an integer (a string, a float, None).
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return value != 0
    raise RecurrentError(f"{name} must be an integer (nonzero: true), got {value!r}")


def check_bool(name: str, value: Any) -> bool:
    """A flag argument: a bool, NumPy bool or 0/1; anything else refused (a string
    too: ``bool("no")`` is true).

    Raises
    ------
    onnx_recurrent.errors.RecurrentTypeError
        ``value`` is none of those, naming ``name`` and what it got.
    """
    if isinstance(value, bool | np.bool_) or (
        isinstance(value, int | np.integer) and value in (0, 1)
    ):
        return bool(value)
    raise RecurrentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _real(name: str, value: Any) -> float:
    """A float attribute (an int is taken too, as a float; not a string or a bool)."""
    if isinstance(value, np.generic) and compute_dtype(value.dtype) is not None:
        return float(value)  # bfloat16 (ml_dtypes) is no np.number
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise RecurrentTypeError(f"{name} must be a float, got {value!r}")
    if isinstance(value, complex | np.complexfloating):
        raise RecurrentTypeError(f"{name} must be a real float, got {value!r}")
    return float(value)


def _listlike(values: Any) -> bool:
    """A sequence or 1-D array (not a string, nor a 0-d array, which cannot be iterated)."""
    if isinstance(values, np.ndarray):
        return values.ndim == 1
    return isinstance(values, Sequence) and not isinstance(values, str | bytes)


def _reals(name: str, values: Any) -> tuple[float, ...]:
    """A floats attribute: a sequence (or 1-D array) of numbers."""
    if not _listlike(values):
        raise RecurrentTypeError(f"{name} must be a list of floats, got {values!r}")
    return tuple(_real(f"{name}[{i}]", v) for i, v in enumerate(values))


def _strings(name: str, values: Any) -> list[str]:
    """A strings attribute: a sequence of str (or bytes, as ONNX stores them)."""
    if not _listlike(values):
        raise RecurrentTypeError(f"{name} must be a list of strings, got {values!r}")
    names = [v.decode() if isinstance(v, bytes) else v for v in values]
    for i, v in enumerate(names):
        if not isinstance(v, str):
            raise RecurrentTypeError(f"{name}[{i}] must be a string, got {v!r}")
    return names


def make_spec(cell: CellTraits, R: np.ndarray, **attributes: Any) -> RecSpec:
    """Parse and check the attributes of one call (R gives the hidden size).

    Calls repeat the same attributes: parsed ones are kept, by value and type
    (unhashable values, such as arrays of activation parameters, are parsed every time).
    """
    items = tuple(
        (k, v)
        if v is None
        # a list's items typed too: [True] is not [1] (a bool is refused where a number is
        # wanted), though they are equal
        else (k, type(v), tuple((type(e), e) for e in v), tuple(v))
        if type(v) in (list, tuple)
        else (k, type(v), v)
        for k, v in attributes.items()
    )
    try:
        hash(items)
    except TypeError:  # parsed outside this handler: its errors stand alone
        items = None
    if items is None:
        return _parse(cell, R.shape, **attributes)
    return _parsed(cell, R.shape, items)


@functools.lru_cache(maxsize=256)
def _parsed(cell: CellTraits, shape: tuple, items: tuple) -> RecSpec:
    return _parse(cell, shape, **{item[0]: item[-1] for item in items})


def _parse(
    cell: CellTraits,
    shape: tuple[int, ...],
    *,
    hidden_size: int | None = None,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    clip: float | None = None,
    layout: int = 0,
    linear_before_reset: Any = 0,
    input_forget: Any = 0,
) -> RecSpec:
    if isinstance(direction, bytes):
        direction = direction.decode()
    if not isinstance(direction, str):
        raise RecurrentTypeError(
            f"direction must be a string {list(DIRECTIONS)}, got {direction!r}"
        )
    if direction.lower() not in DIRECTIONS:
        raise RecurrentError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
    direction = direction.lower()
    if (
        isinstance(layout, bool)
        or not isinstance(layout, int | np.integer)
        or layout not in (0, 1)
    ):
        raise RecurrentError(f"layout must be 0 or 1 (an integer), got {layout!r}")
    if len(shape) != 3:
        raise RecurrentError(
            f"R must be 3-D [num_directions, {cell.n_gates}*hidden_size, hidden_size], "
            f"got shape {shape}"
        )
    inferred = shape[2]
    if hidden_size is None:
        hidden_size = inferred
    elif not isinstance(hidden_size, int | np.integer) or isinstance(hidden_size, bool):
        raise RecurrentTypeError(f"hidden_size must be an integer, got {hidden_size!r}")
    elif hidden_size != inferred:
        raise RecurrentError(
            f"hidden_size={hidden_size!r} disagrees with R of shape {shape} "
            f"(its last axis is hidden_size={inferred})"
        )
    if hidden_size < 1:
        raise RecurrentError(f"hidden_size must be positive, got R of shape {shape}")
    if clip is not None:
        clip = _real("clip", clip)
        if math.isnan(clip) or clip <= 0:
            raise RecurrentError(f"clip must be a positive number, got {clip!r}")
        if math.isinf(clip):
            clip = None
    num_directions = 2 if direction == "bidirectional" else 1
    if activations is None:
        names = list(cell.default_activations) * num_directions
    else:
        names = _strings("activations", activations)
        expected = cell.n_activations * num_directions
        if len(names) != expected and not _first_of_two(cell, expected, names):
            raise RecurrentError(
                f"activations must list {expected} functions for {cell.name} with "
                f"direction={direction!r} ({cell.n_activations} per direction), "
                f"got {len(names)}: {names}"
            )
    bound = _resolve(
        tuple(names),
        None if activation_alpha is None else _reals("activation_alpha", activation_alpha),
        None if activation_beta is None else _reals("activation_beta", activation_beta),
    )
    bound = bound[:expected] if activations is not None else bound
    n = cell.n_activations
    per_direction = tuple(bound[d * n : (d + 1) * n] for d in range(num_directions))
    return RecSpec(
        cell=cell,
        hidden_size=int(hidden_size),
        direction=direction,
        layout=int(layout),
        clip=clip,
        activations=per_direction,
        linear_before_reset=check_flag("linear_before_reset", linear_before_reset),
        input_forget=check_flag("input_forget", input_forget),
    )


def _first_of_two(cell: CellTraits, expected: int, names: list[str]) -> bool:
    """A one-direction RNN given two activations, the schema's default ``[Tanh, Tanh]``:
    onnxruntime takes the first (each consumes its alpha and beta as listed)."""
    return cell.name == "RNN" and expected == 1 and len(names) == 2


@functools.lru_cache(maxsize=256)
def _resolve(names: tuple, alpha: tuple | None, beta: tuple | None) -> tuple[Activation, ...]:
    return resolve(names, alpha, beta)


@dataclass(frozen=True)
class Inputs:
    """The inputs one call brings, time-major, absent ones filled in (the weights are
    the layer's: :class:`onnx_recurrent.Layer`).

    ``X`` is a (possibly strided) view of the caller's array; nothing here aliases an
    array that the kernels write to.
    """

    X: np.ndarray  # [seq_length, batch_size, input_size], X's own dtype
    sequence_lens: np.ndarray  # [batch_size] int64
    initial_states: tuple[np.ndarray | None, ...]  # each [num_directions, batch_size, hidden]
    dtype: np.dtype  # of X and of the outputs
    compute_dtype: np.dtype
    ragged: bool = False  # some sequence_lens below seq_length


def native_order(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy in the machine's byte order where it has the other one (as
    read from a big-endian file); onnxruntime would read its bytes as they lie."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def numpy_of(value: Any) -> np.ndarray:
    """``np.asarray(value)``; a torch bfloat16 tensor read bit for bit into
    ``ml_dtypes.bfloat16`` (NumPy cannot read one)."""
    if type(value) is np.ndarray:
        return value
    if type(value).__module__ == "torch" and str(value.dtype) == "torch.bfloat16":
        import ml_dtypes

        torch = sys.modules["torch"]
        return np.asarray(value.view(torch.int16)).view(ml_dtypes.bfloat16)
    return np.asarray(value)


def as_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a NumPy array, or a clear error naming it: a ragged nested list
    (ValueError), a masked array (its mask would be ignored), or what NumPy cannot read
    (TypeError: a tensor that needs grad...)."""
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ma.MaskedArray):
        raise RecurrentTypeError(
            f"{name} is a masked array, whose mask would be ignored: give an ndarray "
            f"(e.g. {name}.filled(0); for rows of other lengths, sequence_lens)"
        )
    try:
        return numpy_of(value)
    except ValueError as e:
        raise RecurrentError(f"{name} cannot be read as an array: {e}") from None
    except (TypeError, RuntimeError) as e:
        raise RecurrentTypeError(
            f"{name} cannot be read as an array ({type(value).__name__}): {e}"
        ) from None


def allocate(
    what: str,
    shape: tuple[int, ...],
    dtype: Any,
    make: Callable[..., np.ndarray] = np.empty,
    hint: str = "",
) -> np.ndarray:
    """``make(shape, dtype)``, or a MemoryError naming ``what`` with its size (NumPy's
    names a shape only) and ``hint``, what the caller can do about it."""
    try:
        return make(shape, dtype)
    except MemoryError:
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize / 2**30
        raise MemoryError(
            f"onnx-recurrent: no memory for {what} of shape {list(shape)} ({dtype}: "
            f"{size:.3g} GiB){hint}"
        ) from None


def list_in_dtype(name: str, value: Any, like: Any) -> Any:
    """``value`` given as a list or tuple: an array in ``like``'s float dtype (a list has
    no dtype of its own), or a TypeError where it holds anything but numbers (strings,
    None, complex, bools); any other ``value``, or a ``like`` of no float dtype, as
    given."""
    if not isinstance(value, list | tuple) or compute_dtype(getattr(like, "dtype", None)) is None:
        return value
    return _list_as(name, value, like.dtype)


def _list_as(name: str, value: list | tuple, dtype: np.dtype) -> np.ndarray:
    array = as_array(name, value)
    if array.dtype.kind not in "iuf":
        raise RecurrentTypeError(f"{name} as a list must hold numbers, got {array.dtype} values")
    return array.astype(dtype)


def as_float_array(name: str, value: Any) -> np.ndarray:
    """``value`` as an array of one of the T types (:func:`native_order`), or a clear
    TypeError (:func:`as_array`)."""
    array = native_order(as_array(name, value))
    if compute_dtype(array.dtype) is None:
        raise RecurrentTypeError(f"{name} must have a float dtype ({T_TYPES}), got {array.dtype}")
    return array


def _shape_error(
    name: str, array: np.ndarray, expected: tuple[int, ...], meaning: str
) -> str | None:
    """What :func:`_check_shape` says of ``array``, or None where its shape is right."""
    if array.shape == expected:
        return None
    return f"{name} must have shape {list(expected)} {meaning}, got {list(array.shape)}"


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...], meaning: str) -> None:
    message = _shape_error(name, array, expected, meaning)
    if message is not None:
        raise RecurrentError(message)


def check_dtype(name: str, value: Any, dtype: np.dtype, owner: str) -> np.ndarray:
    """``value`` as an array of ``dtype`` (``owner`` says whose in the message); a list
    or tuple of numbers is taken in ``dtype`` (it has none of its own)."""
    if isinstance(value, list | tuple) and compute_dtype(dtype) is not None:
        value = _list_as(name, value, dtype)
    array = as_float_array(name, value)
    if array.dtype != dtype:
        raise RecurrentTypeError(f"{name} must have {owner} dtype {dtype}, got {array.dtype}")
    return array


def check_X(spec: RecSpec, X: Any) -> np.ndarray:
    """X as a 3-D float array (the caller's layout), or a clear error."""
    X = as_float_array("X", X)
    if X.ndim != 3:
        dims = (
            "[batch_size, seq_length, input_size]"
            if spec.layout
            else "[seq_length, batch_size, input_size]"
        )
        raise RecurrentError(
            f"X must be 3-D {dims} (layout={spec.layout}), got shape {list(X.shape)}"
        )
    return X


def check_weights(
    spec: RecSpec,
    W: Any,
    R: Any,
    B: Any,
    P: Any,
    *,
    dtype: np.dtype,
    input_size: int,
    owner: str = "X's",
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """W, R, B, P checked against the spec, ``dtype`` and ``input_size`` (``owner``
    names where those come from in messages); the arrays themselves, not copies."""
    D, H, G = spec.num_directions, spec.hidden_size, spec.cell.n_gates
    W = check_dtype("W", W, dtype, owner)
    R = check_dtype("R", R, dtype, owner)
    w = _shape_error(
        "W", W, (D, G * H, input_size), f"[num_directions, {G}*hidden_size, input_size]"
    )
    if w and owner == "X's" and W.ndim == 3 and W.shape[:2] == (D, G * H):  # both named
        w = (
            f"X and W disagree on input_size: X's last axis is {input_size}, W's is "
            f"{W.shape[2]} ({w})"
        )
    r = _shape_error("R", R, (D, G * H, H), f"[num_directions, {G}*hidden_size, hidden_size]")
    # R alone where it is at odds with itself (hidden_size is its last axis, so W is not
    # to blame); else each of W and R that is wrong, in the specification's order
    if r and R.shape[1] != G * H:
        raise RecurrentError(r)
    if w or r:
        raise RecurrentError("; ".join(m for m in (w, r) if m))
    if B is not None:
        B = check_dtype("B", B, dtype, owner)
        _check_shape("B", B, (D, 2 * G * H), f"[num_directions, {2 * G}*hidden_size]")
    if P is not None:
        npeep = spec.cell.n_peepholes
        if not npeep:
            raise RecurrentError(f"P (peepholes) is for LSTM only, not {spec.cell.name}")
        P = check_dtype("P", P, dtype, owner)
        _check_shape("P", P, (D, npeep * H), f"[num_directions, {npeep}*hidden_size]")
    return W, R, B, P


def check_state(
    name: str, value: Any, shape: tuple[int, int, int], dtype: np.dtype, layout: int = 0
) -> np.ndarray:
    """An initial state of ``shape`` and X's ``dtype``, or a clear error."""
    value = check_dtype(name, value, dtype, "X's")
    dims = (
        "[batch_size, num_directions, hidden_size]"
        if layout
        else "[num_directions, batch_size, hidden_size]"
    )
    _check_shape(name, value, shape, dims)
    return value


def check_lengths(sequence_lens: Any, N: int, T: int) -> np.ndarray:
    """``sequence_lens`` checked for a batch of ``N`` sequences of ``seq_length`` T: a
    copy as int64 (the caller's array is never touched).

    Raises
    ------
    TypeError
        (``RecurrentTypeError``) not integers.
    ValueError
        (``RecurrentError``) not of shape ``[batch_size]``, or a length outside
        ``[0, seq_length]`` (the message names the first).
    """
    given = as_array("sequence_lens", sequence_lens)
    if given.dtype.kind not in "iu":
        raise RecurrentTypeError(
            f"sequence_lens must have an integer dtype (int32 in ONNX), got {given.dtype}"
        )
    _check_shape("sequence_lens", given, (N,), "[batch_size]")
    lens = allocate("sequence_lens as int64", given.shape, np.int64)
    lens[...] = given
    low, high = (int(lens.min()), int(lens.max())) if N else (T, T)
    if low < 0 or high > T:  # (uint64 past int64's range wraps to negative)
        b = int(np.argmax((given < 0) | (given > T)))
        raise RecurrentError(
            f"sequence_lens must lie in [0, seq_length={T}], got sequence_lens[{b}]={given[b]}"
        )
    return lens


def check_call(
    spec: RecSpec,
    X: np.ndarray,
    sequence_lens: Any = None,
    initial_states: Sequence[tuple[str, Any]] = (),
    *,
    dtype: np.dtype | None = None,
    input_size: int | None = None,
) -> Inputs:
    """Check what one call brings (X from :func:`check_X`, lengths, initial states)
    and normalise it: time-major, missing lengths as full length. Absent initial
    states stay None (zeros). ``dtype`` and ``input_size``: the layer's, if known."""
    if dtype is not None and X.dtype != dtype:
        raise RecurrentTypeError(f"X must have the layer's dtype {dtype} (W's), got {X.dtype}")
    dtype = X.dtype
    ct = compute_dtype(dtype)
    D, H = spec.num_directions, spec.hidden_size
    X_tm = X.transpose(1, 0, 2) if spec.layout else X
    T, N, I = X_tm.shape
    if input_size is not None and I != input_size:
        raise RecurrentError(
            f"X must have input_size={input_size} (W's last axis) on its last axis, "
            f"got shape {list(X.shape)}"
        )

    if sequence_lens is None:
        lens, ragged = allocate(f"the lengths of {N} rows", (N,), np.int64), False
        lens[:] = T
    else:
        lens = check_lengths(sequence_lens, N, T)
        ragged = bool(N) and int(lens.min()) < T

    states = []
    for name, value in initial_states:
        if value is None:
            states.append(None)
            continue
        if spec.layout:
            value = check_state(name, value, (N, D, H), dtype, layout=1).transpose(1, 0, 2)
        else:
            value = check_state(name, value, (D, N, H), dtype)
        states.append(value)
    return Inputs(
        X=X_tm,
        sequence_lens=lens,
        initial_states=tuple(states),
        dtype=dtype,
        compute_dtype=ct,
        ragged=ragged,
    )
