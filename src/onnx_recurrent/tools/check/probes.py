"""Probes: what a peer gets wrong, measured once per process on tiny one-node models.

A peer's quirks are not written down per version here: each one the lint knows of is a
probe, a model of one recurrent node (4 steps, batch 3, sizes 2 and 3) that isolates
it, run by the peer once per process (cached) and compared with onnx-recurrent's
result (which matches a float64 oracle, ``tests/oracle.py``). The probes:

- ``FORM``: the node's own form (operator version, element type, direction,
  ``linear_before_reset``) with nothing else set;
- ``SEQUENCE_LENS`` (ragged lengths), ``CLIP`` (gate inputs beyond it),
  ``INPUT_FORGET``, ``PEEPHOLES`` (LSTM's P), ``LAYOUT`` (``layout=1``, T != N),
  ``NO_HIDDEN_SIZE`` (the attribute left out), and :func:`activations` (the node's
  own activations, alpha and beta): the form plus that one feature.

A probe is built in the form of the node being linted (:class:`Form`): X's dims fixed
or symbolic, the weights initializers or graph inputs. That matters: OpenVINO ignores
``sequence_lens`` when X's dims are symbolic and the weights constant, and honours it
otherwise. A peer whose output differs from ours is compared with ours under each
hypothesis of the probe (lengths ignored, no clip, the default activations, ...) to
say what it does instead; a peer that raises refuses the probe, its error the reason.
:func:`loop_stops` probes ``Loop(M, "")`` with a body cond that turns false.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ... import cells, ops
from ...activations import TABLE
from ...errors import one_line
from ...runtime.graph import WEIGHTS, node_model
from .peers import PEERS

#: the probes' sizes: steps, batch (T != N, so that a layout mix-up shows), input, hidden
T, N, I, H = 4, 3, 2, 3
#: ragged lengths of the SEQUENCE_LENS probe (none 0, none past T)
LENGTHS = (4, 1, 2)
#: the clip of the CLIP probe; its inputs are scaled well past it
CLIP_VALUE = 0.5
CELLS = cells.CELLS
OUTPUTS = {name: cell.outputs for name, cell in CELLS.items()}
FUNCTIONS: dict[str, Callable[..., Any]] = {name: getattr(ops, name.lower()) for name in CELLS}

#: the features probed on top of a node's form, by name
FORM = ("form",)
SEQUENCE_LENS = ("sequence_lens",)
CLIP = ("clip",)
INPUT_FORGET = ("input_forget",)
PEEPHOLES = ("peepholes",)
LAYOUT = ("layout",)
NO_HIDDEN_SIZE = ("no_hidden_size",)


def activations(
    names: Sequence[str], alpha: Sequence[float] | None, beta: Sequence[float] | None
) -> tuple:
    """The feature of a node's activations as given (``alpha``/``beta`` None: absent)."""
    return (
        "activations",
        tuple(names),
        None if alpha is None else tuple(float(a) for a in alpha),
        None if beta is None else tuple(float(b) for b in beta),
    )


@dataclass(frozen=True)
class Form:
    """What a probe copies from the node it stands for.

    ``opset``: the version of the operator (the probe imports that opset). ``static``:
    X's dims are all fixed numbers (else symbolic). ``constant``: the weights (W, R and
    B) are constants (initializers), not graph inputs; ``constant_peepholes``: P is
    (None: as ``constant``; OpenVINO ignores a constant P and refuses a fed one).
    """

    op: str
    opset: int = 22
    elem: int = TensorProto.FLOAT
    direction: str = "forward"
    linear_before_reset: int = 0
    static: bool = True
    constant: bool = False
    constant_peepholes: bool | None = None

    @property
    def D(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem))

    def title(self) -> str:
        """E.g. ``LSTM-22 in double`` (``, linear_before_reset=1`` for such a GRU)."""
        name = TensorProto.DataType.Name(self.elem).lower()
        lbr = ", linear_before_reset=1" if self.linear_before_reset else ""
        return f"{self.op}-{self.opset} in {name}{lbr}"

    def conditions(self) -> str:
        """What the probe copied of how the node is fed, when it is not the plain case."""
        parts = []
        if not self.static:
            parts.append("X's dims symbolic")
        peepholes = self.constant if self.constant_peepholes is None else self.constant_peepholes
        if self.constant:
            parts.append("the weights constant" if peepholes else "W, R, B constant, P fed")
        elif peepholes:
            parts.append("P constant")
        return " and ".join(parts)


@dataclass(frozen=True)
class Probed:
    """What one peer did with one probe.

    ``wrong``: it refused the probe or its outputs differ from ours. ``refused``: its
    error on one line. ``max_abs``: the largest difference from ours (inf where a NaN is
    in one only); ``shapes``: its output shapes where they differ from ours.
    ``explained``: the name of the first hypothesis its outputs match (see the
    builders), None if none does.
    """

    peer: str
    feature: tuple
    form: Form
    wrong: bool
    refused: str | None = None
    max_abs: float | None = None
    shapes: str | None = None
    explained: str | None = None

    def evidence(self) -> str:
        """``refused: ...`` or ``probed: max |diff| ...`` (with the form's conditions)."""
        if self.refused is not None:
            return f"refused: {self.refused}"
        how = self.form.conditions()
        what = self.shapes if self.shapes is not None else f"max |diff| {self.max_abs:.2g}"
        return f"probed{' with ' + how if how else ''}: {what}"


@dataclass
class _Case:
    attrs: dict[str, Any]
    inputs: dict[str, np.ndarray]  # node inputs by name: X, W, R, B[, sequence_lens][, P]
    hypotheses: dict[str, Callable[[], list[np.ndarray]]]


def _ours(form: Form, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any]) -> list:
    return [np.asarray(a) for a in FUNCTIONS[form.op](**inputs, **attrs)]


def _base_attrs(form: Form) -> dict[str, Any]:
    attrs: dict[str, Any] = {"hidden_size": H}
    if form.direction != "forward":
        attrs["direction"] = form.direction
    if form.linear_before_reset:
        attrs["linear_before_reset"] = 1
    return attrs


def _inputs(form: Form, x_scale: float = 1.0, layout: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261124)
    G, D = CELLS[form.op].n_gates, form.D

    def r(*shape: int, scale: float) -> np.ndarray:
        return (rng.uniform(-1.0, 1.0, shape) * scale).astype(form.dtype)

    x = r(T, N, I, scale=x_scale)
    return {
        "X": np.ascontiguousarray(x.swapaxes(0, 1)) if layout else x,
        "W": r(D, G * H, I, scale=0.9),
        "R": r(D, G * H, H, scale=0.9),
        "B": r(D, 2 * G * H, scale=0.4),
    }


def _activation_hypotheses(form: Form, feature: tuple, ours: Callable) -> dict[str, Callable]:
    """The defaults; the forward direction's activations for both; 0 for unset alpha/beta."""
    _, names, alpha, beta = feature
    n = CELLS[form.op].n_activations
    out: dict[str, Callable] = {}
    kinds = [TABLE.get(str(name).lower()) for name in names]
    if any(k is None for k in kinds):
        return {"defaults": lambda: ours({})}
    # which alpha/beta each activation consumes, in order (absent: its default)
    given_a, given_b, per = list(alpha or ()), list(beta or ()), []
    ia = ib = 0
    for kind in kinds:
        a = b = None
        if kind.alpha is not None:
            a, ia = (given_a[ia] if ia < len(given_a) else None), ia + 1
        if kind.beta is not None:
            b, ib = (given_b[ib] if ib < len(given_b) else None), ib + 1
        per.append((kind, a, b))

    def lists(chosen: list, unset: float | None) -> dict[str, Any]:
        """The activations with explicit alpha/beta lists (``unset`` None: the default)."""
        return {
            "activations": [k.name for k, _, _ in chosen],
            "activation_alpha": [
                (k.alpha if unset is None else unset) if a is None else a
                for k, a, _ in chosen
                if k.alpha is not None
            ],
            "activation_beta": [
                (k.beta if unset is None else unset) if b is None else b
                for k, _, b in chosen
                if k.beta is not None
            ],
        }

    if form.D == 2 and len(names) == 2 * n and list(names[:n]) != list(names[n:]):
        out["forward_both"] = lambda: ours(lists(per[:n] * 2, None))
    if any((k.alpha and a is None) or (k.beta and b is None) for k, a, b in per):
        out["zero_defaults"] = lambda: ours(lists(per, 0.0))  # an unset default is not 0
    out["defaults"] = lambda: ours({})
    return out


def _case(form: Form, feature: tuple) -> _Case:
    attrs = _base_attrs(form)
    kind = feature[0]
    inputs = _inputs(form, x_scale=4.0 if feature == CLIP else 1.0, layout=feature == LAYOUT)

    def ours_with(changes: Mapping[str, Any], drop: Sequence[str] = ()) -> Callable[[], list]:
        def run() -> list:
            a = {k: v for k, v in {**attrs, **changes}.items() if v is not None}
            fed = {k: v for k, v in inputs.items() if k not in drop}
            return _ours(form, fed, a)

        return run

    hypotheses: dict[str, Callable[[], list]] = {}  # FORM: none
    if feature == SEQUENCE_LENS:
        inputs["sequence_lens"] = np.array(LENGTHS, np.int32)
        hypotheses["ignored"] = ours_with({}, drop=("sequence_lens",))
    elif feature == CLIP:
        attrs["clip"] = CLIP_VALUE
        hypotheses["ignored"] = ours_with({"clip": None})
    elif feature == PEEPHOLES:
        peepholes = np.random.default_rng(7).uniform(-1.0, 1.0, (form.D, 3 * H))
        inputs["P"] = peepholes.astype(form.dtype)
        hypotheses["ignored"] = ours_with({}, drop=("P",))
    elif feature == INPUT_FORGET:
        attrs["input_forget"] = 1
        hypotheses["ignored"] = ours_with({"input_forget": None})
    elif feature == LAYOUT:
        attrs["layout"] = 1
        hypotheses["time_major"] = ours_with({"layout": None})
    elif feature == NO_HIDDEN_SIZE:
        del attrs["hidden_size"]
    elif kind == "activations":
        _, names, alpha, beta = feature
        attrs["activations"] = list(names)
        if alpha is not None:
            attrs["activation_alpha"] = list(alpha)
        if beta is not None:
            attrs["activation_beta"] = list(beta)

        def ours(changes: Mapping[str, Any]) -> list:
            base = {k: v for k, v in attrs.items() if not k.startswith("activation")}
            return _ours(form, inputs, {**base, **changes})  # {}: the default activations

        hypotheses = _activation_hypotheses(form, feature, ours)
    elif feature != FORM:
        raise ValueError(f"unknown probe feature {feature!r}")
    return _Case(attrs, inputs, hypotheses)


def _model(form: Form, case: _Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inputs = {n: case.inputs[n] for n in CELLS[form.op].inputs if n in case.inputs}
    peepholes = form.constant if form.constant_peepholes is None else form.constant_peepholes
    constants = [n for n in WEIGHTS if n in inputs and (peepholes if n == "P" else form.constant)]
    shapes = {}
    if not form.static:
        shapes = {"X": ["N", "T", I] if case.attrs.get("layout", 0) else ["T", "N", I]}
        shapes["sequence_lens"] = ["N"]
    model = node_model(
        form.op,
        inputs,
        case.attrs,
        shapes=shapes,
        constants=constants,
        opset=form.opset,
        name="probe",
    )
    return model, {n: v for n, v in inputs.items() if n not in constants}


def _tolerance(dtype: np.dtype) -> float:
    """A difference that is another computation, not rounding: 1e-4 for float32 and
    float64 (a peer that computes double in float32 is not flagged), 8 ulp of 1 for
    float16 and bfloat16."""
    if dtype.itemsize >= 4:
        return 1e-4
    return 8 * (2.0**-10 if dtype == np.float16 else 2.0**-7)


def _difference(ours: Sequence[np.ndarray], theirs: Sequence[Any]) -> tuple[float, str | None]:
    """The largest |difference| over the outputs, or their shapes where they differ."""
    theirs = [np.asarray(t) for t in theirs]
    if [a.shape for a in ours] != [b.shape for b in theirs]:
        got = ", ".join(str(list(b.shape)) for b in theirs)
        want = ", ".join(str(list(a.shape)) for a in ours)
        return float("inf"), f"output shapes {got}, ours {want}"
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        with np.errstate(invalid="ignore"):
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))  # the same inf too
            d = np.where(same, 0.0, np.abs(a64 - b64))
        d = np.where(np.isnan(d), np.inf, d)
        worst = max(worst, float(d.max()) if d.size else 0.0)
    return worst, None


@functools.cache
def probe(peer: str, form: Form, feature: tuple) -> Probed:
    """Run the probe of ``feature`` in ``form`` on ``peer`` (once per process).

    Parameters
    ----------
    peer : str
        A name from :data:`~onnx_recurrent.tools.check.peers.PEERS`; its package must be
        importable.
    form : Form
    feature : tuple
        :data:`FORM`, :data:`SEQUENCE_LENS`, :data:`CLIP`, :data:`INPUT_FORGET`,
        :data:`PEEPHOLES`, :data:`LAYOUT`, :data:`NO_HIDDEN_SIZE` or
        :func:`activations`.

    Returns
    -------
    Probed
    """
    case = _case(form, feature)
    model, feeds = _model(form, case)
    ours = _ours(form, case.inputs, case.attrs)
    try:
        theirs = PEERS[peer][1](model, feeds, list(OUTPUTS[form.op]))
    except Exception as e:  # a refusal of any kind: the peer does not support it
        return Probed(peer, feature, form, True, refused=one_line(e, 140))
    tol = _tolerance(form.dtype)
    worst, shapes = _difference(ours, theirs)
    if worst <= tol:
        return Probed(peer, feature, form, False, max_abs=worst)
    explained = None
    for name, hypothesis in case.hypotheses.items():
        try:
            alternative = hypothesis()
        except Exception:  # a hypothesis we cannot compute explains nothing
            continue
        if _difference(alternative, theirs)[0] <= tol:
            explained = name
            break
    return Probed(peer, feature, form, True, max_abs=worst, shapes=shapes, explained=explained)


def _loop_model() -> onnx.ModelProto:
    """``Loop(M=3, "")`` adding 1 to v per iteration; the body's cond is a constant false."""
    tensor = helper.make_tensor_value_info
    false = helper.make_tensor("false", TensorProto.BOOL, [], [False])
    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["cond_out"], value=false),
            helper.make_node("Add", ["v", "one"], ["v_out"]),
        ],
        "body",
        [
            tensor("i", TensorProto.INT64, []),
            tensor("cond_in", TensorProto.BOOL, []),
            tensor("v", TensorProto.FLOAT, [1]),
        ],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("v_out", TensorProto.FLOAT, [1])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
        "loop_probe",
        [tensor("v0", TensorProto.FLOAT, [1])],
        [tensor("v", TensorProto.FLOAT, [1])],
        [
            helper.make_tensor("M", TensorProto.INT64, [], [3]),
            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


@functools.cache
def loop_stops(peer: str) -> bool | None:
    """Whether ``peer`` stops a ``Loop(M, "")`` when the body's cond turns false (the
    spec runs M iterations); None if it refuses the probe or gives something else."""
    try:
        (v,) = PEERS[peer][1](_loop_model(), {"v0": np.zeros(1, np.float32)}, ["v"])
    except Exception:
        return None
    value = float(np.asarray(v).reshape(-1)[0])
    return True if value == 1.0 else False if value == 3.0 else None
