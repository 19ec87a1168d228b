"""Stateful streaming for any model: recurrent states as graph inputs and outputs.

A model exported with its recurrent state kept inside (PyTorch builds ``h0`` as zeros
with ``Expand`` or ``ConstantOfShape``) can only be run on a whole sequence at once.
:func:`expose_states` rewrites it so that each GRU, RNN and LSTM node takes its
``initial_h`` (``initial_c``) from a graph input and returns ``Y_h`` (``Y_c``) as a graph
output; :class:`StreamingSession` runs the rewritten model chunk by chunk, carrying the
states from one call to the next.

Recurrent nodes of the main graph and of ``If`` branches (at any depth) are exposed: a
branch that does not hold the node passes the state through unchanged. A node inside a
``Loop`` or ``Scan`` body is left as it is (its state belongs to one iteration), and
so is a node whose ``X`` no graph input reaches (computed from initializers only: a
context encoder that never sees the stream gives the same on every chunk).

A model that already takes a node's state as a graph input of its own (``h0`` fed
straight to ``initial_h``, used by nothing else) keeps that input as the state input.
Where a graph input reaches a state through other nodes (Silero VAD's ``state``, split
by ``Gather``), the rewrite cannot give that input's values back to the state: it is
reported (:class:`StreamingSession` warns) and the session carries the state itself.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.helper import tensor_dtype_to_np_dtype

from ..cells import CELLS
from ..errors import RecurrentError, RecurrentTypeError
from ..spec import native_order
from ..threads import ForkLock
from .bound import StateBatchError
from .folding import constant_values
from .graph import (
    RECURRENT_OPS,
    Namer,
    all_graphs,
    attributes,
    element_types,
    prune,
    subgraphs,
    walk,
    with_functions_inlined,
)
from .session import (
    InferenceSession,
    NodeArg,
    _as_reported,
    _not_picklable,
    check_feed_names,
    feed_array,
    load_model,
)

#: per operator: (input index, input name, output index, output name) of each state
STATE_SLOTS = {
    name: tuple(
        (cell.inputs.index(state), state, 1 + i, cell.outputs[1 + i])
        for i, state in enumerate(cell.state_names)
    )
    for name, cell in CELLS.items()
}

__all__ = ["StateInfo", "StreamingSession", "expose_states"]


@dataclass(frozen=True)
class StateInfo:
    """One exposed state of one recurrent node.

    ``input`` and ``output`` are the rewritten model's graph input and output names
    (``input`` is the model's own where it fed the state straight, else
    ``<node>.initial_h``...);
    ``shape`` is ``[num_directions, "batch", hidden_size]`` (``["batch",
    num_directions, hidden_size]`` for ``layout=1``), with None for an unknown
    hidden size; ``elem_type`` is the ONNX element type.
    """

    node: str
    op_type: str
    input: str
    output: str
    shape: tuple[int | str | None, ...]
    elem_type: int

    def empty(self) -> np.ndarray:
        """A zero-size array of this state's rank and type: "zeros, batch not yet known"."""
        dims = [d if isinstance(d, int) else 0 for d in self.shape]
        return np.zeros(dims, tensor_dtype_to_np_dtype(self.elem_type))


def _state_array(state: StateInfo, value: Any) -> np.ndarray:
    """A state set with ``StreamingSession.states``, as a step will feed it: a copy (the
    caller's array may change after), of the state's element type, rank and fixed dims
    (a list converted as a feed is), or a clear error naming it."""
    dtype = tensor_dtype_to_np_dtype(state.elem_type)
    array = native_order(feed_array(value, dtype, state.input))
    if array.dtype != dtype:
        raise RecurrentTypeError(
            f"state {state.input!r}: expected element type {dtype}, got {array.dtype}"
        )
    shape = [d if d is not None else "hidden_size" for d in state.shape]
    if array.ndim != len(shape) or any(
        isinstance(d, int) and n != d for n, d in zip(array.shape, shape, strict=True)
    ):
        raise RecurrentError(
            f"state {state.input!r}: expected shape {shape}, got {list(array.shape)}"
        )
    return np.array(array)


def _hidden_size(node: onnx.NodeProto, graph: onnx.GraphProto) -> int | None:
    attrs = attributes(node)
    if "hidden_size" in attrs:
        return int(attrs["hidden_size"])
    R = node.input[2] if len(node.input) > 2 else ""
    for t in graph.initializer:
        if t.name == R and len(t.dims) == 3:
            return int(t.dims[2])
    return None


def _state_shape(node: onnx.NodeProto, hidden: int | None) -> tuple[int | str | None, ...]:
    attrs = attributes(node)
    D = 2 if str(attrs.get("direction", "forward")).lower() == "bidirectional" else 1
    return ("batch", D, hidden) if attrs.get("layout", 0) else (D, "batch", hidden)


def _value_info(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


# -- the rewrite -----------------------------------------------------------------------------


@dataclass
class _Pending:
    """A state found in some graph: its info and the tensor holding it in that graph."""

    info: StateInfo
    tensor: str
    output_name: str  # "Y_h" or "Y_c"
    kept: bool = False  # the model's own graph input, kept as the state input


class _Rewriter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.name = Namer(model)
        self.types = element_types(model)
        self.skipped: list[str] = []
        #: recurrent nodes whose X no graph input reaches (the same on every chunk)
        self.unstreamed: list[str] = []
        #: the main graph's inputs fed straight to one state slot and used nowhere else
        self.own = _own_state_inputs(model)
        #: the tensors that fed the replaced states, before the rewrite
        self.replaced: list[str] = []
        #: state input -> the tensor that gave its initial value in the model
        self.initial: dict[str, str] = {}

    def elem_type(self, node: onnx.NodeProto) -> int:
        for name in (*node.input[1:3], node.input[0]):
            if name in self.types:
                return self.types[name]
        return onnx.TensorProto.FLOAT

    def graph(self, graph: onnx.GraphProto, top: bool = True) -> list[_Pending]:
        found: list[_Pending] = []
        for index, node in enumerate(list(graph.node)):
            if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
                if _inputs_reaching(self.model, node.input[:1]):
                    found += self.node(node, graph, index, top)
                else:
                    self.unstreamed.append(f"{node.op_type} node {node.name!r}")
            elif node.op_type == "If":
                found += self.if_node(node)
            else:
                for g in subgraphs(node):
                    if any(n.op_type in RECURRENT_OPS for _, n in walk(g)):
                        self.skipped.append(f"{node.op_type} node {node.name!r}")
        return found

    def node(
        self, node: onnx.NodeProto, graph: onnx.GraphProto, index: int, top: bool
    ) -> list[_Pending]:
        if not node.name:
            node.name = self.name(f"{node.op_type}_{index}")
        prefix = node.name
        hidden = _hidden_size(node, graph) or _hidden_size(node, self.model.graph)
        shape = _state_shape(node, hidden)
        elem = self.elem_type(node)
        pending = []
        for in_index, in_name, out_index, out_name in STATE_SLOTS[node.op_type]:
            while len(node.input) <= in_index:
                node.input.append("")
            while len(node.output) <= out_index:
                node.output.append("")
            given = node.input[in_index]
            kept = given in self.own
            if kept:
                state_input = given
            else:
                state_input = self.name(f"{prefix}.{in_name}")
                if given:
                    self.replaced.append(given)
                    self.initial[state_input] = given
                node.input[in_index] = state_input
            if not node.output[out_index]:  # in a branch, leave "<node>.Y_h" to the graph
                suffix = "" if top else ".inner"
                node.output[out_index] = self.name(f"{prefix}.{out_name}{suffix}")
            info = StateInfo(node.name, node.op_type, state_input, "", shape, elem)
            pending.append(_Pending(info, node.output[out_index], out_name, kept))
        return pending

    def if_node(self, node: onnx.NodeProto) -> list[_Pending]:
        graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        branches = {k: graphs[k] for k in ("then_branch", "else_branch") if k in graphs}
        found = {name: self.graph(g, top=False) for name, g in branches.items()}
        pending = []
        for owner, states in found.items():
            for p in states:
                for name, g in branches.items():
                    tensor = p.tensor
                    if name != owner:  # the other branch leaves the state as it was
                        tensor = self.name(f"{p.info.input}.unchanged")
                        g.node.append(helper.make_node("Identity", [p.info.input], [tensor]))
                    g.output.append(_value_info(tensor, p.info.elem_type, p.info.shape))
                out = self.name(f"{node.name or 'If'}.{p.info.input}.out")
                node.output.append(out)
                pending.append(_Pending(p.info, out, p.output_name, p.kept))
        return pending


def _own_state_inputs(model: onnx.ModelProto) -> set[str]:
    """The main graph's inputs (initializers excepted) that a recurrent node takes
    straight as ``initial_h`` or ``initial_c``, and that nothing else uses."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {i.name for i in graph.input if i.name not in initializers}
    uses: dict[str, int] = {}
    for g in all_graphs(graph):
        for name in [o.name for o in g.output] + [i for n in g.node for i in n.input]:
            uses[name] = uses.get(name, 0) + 1
    slots = {
        node.input[index]
        for _, node in walk(graph)
        if node.op_type in STATE_SLOTS and node.domain in ("", "ai.onnx")
        for index, *_ in STATE_SLOTS[node.op_type]
        if index < len(node.input)
    }
    return {name for name in inputs & slots if uses.get(name) == 1}


#: operators whose output carries no value of an input, only its shape
_SHAPE_ONLY = frozenset({"Shape", "Size", "ConstantOfShape", "EyeLike"})


def _inputs_reaching(model: onnx.ModelProto, tensors: list[str]) -> list[str]:
    """The main graph's inputs (initializers excepted) whose values reach ``tensors``.

    Values, not shapes: a path through ``Shape`` or ``Size`` does not count, nor an
    ``If``'s condition (it chooses a branch, the branch gives the values).
    """
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    producers: dict[str, onnx.NodeProto] = {}
    for _, node in walk(graph):
        for name in node.output:
            if name:
                producers.setdefault(name, node)
    seen: set[str] = set()
    stack = [t for t in tensors if t]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is None or node.op_type in _SHAPE_ONLY:
            continue
        if node.op_type == "If":
            k = list(node.output).index(name)
            for g in subgraphs(node):
                if k < len(g.output):
                    stack.append(g.output[k].name)
            continue
        stack.extend(i for i in node.input if i)
        for g in subgraphs(node):  # Loop, Scan: whatever the body reads
            stack.extend(i for _, n in walk(g) for i in n.input if i)
    return [name for name in inputs if name in seen]


#: operators that keep zeros zeros (their first input's), whatever their other inputs
_ZEROS_KEPT = frozenset(
    {"Expand", "Tile", "Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Transpose"}
    | {"Slice", "Gather", "GatherElements", "Split", "Flatten"}
)


def _initial_states(
    model: onnx.ModelProto, initial: Mapping[str, str]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """What the model gave each replaced state (``initial``: state input -> tensor) at
    the start: its value where constant and not zeros (a learned initial state), and
    the state inputs whose start is neither zeros nor a constant nor reached by a graph
    input's values (a learned state broadcast over the batch)."""
    values = constant_values(model, list(initial.values()))
    producers = {o: n for _, n in walk(model.graph) for o in n.output if o}

    def zeros(name: str) -> bool:
        value = values[name] if name in values else constant_values(model, [name]).get(name)
        if value is not None:
            return not np.any(value)
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "ConstantOfShape":
            value = attributes(node).get("value")
            return value is None or not np.any(onnx.numpy_helper.to_array(value))
        if node.op_type == "Concat":
            return all(zeros(i) for i in node.input if i)
        return node.op_type in _ZEROS_KEPT and bool(node.input) and zeros(node.input[0])

    defaults, unknown = {}, []
    for state, tensor in initial.items():
        if zeros(tensor):
            continue
        if tensor in values:
            defaults[state] = values[tensor]
        elif not _inputs_reaching(model, [tensor]):  # from inputs: said apart (``fed``)
            unknown.append(state)
    return defaults, unknown


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used = {o.name for o in graph.output}
    for _, node in walk(graph):
        used.update(node.input)
    return used


def _drop_dead(graph: onnx.GraphProto, used_before: set[str]) -> None:
    """Drop what the rewrite made dead: :func:`prune`'s nodes and initializers, then
    the graph inputs it left unread and the value_info of names no longer made."""
    orphaned = used_before - prune(graph)
    for field in (graph.input, graph.initializer):
        for v in [v for v in field if v.name in orphaned]:
            field.remove(v)
    produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    for v in [v for v in graph.value_info if v.name not in produced]:
        graph.value_info.remove(v)


def expose(
    model: onnx.ModelProto,
) -> tuple[onnx.ModelProto, list[StateInfo], list[str], dict[str, np.ndarray], list[str]]:
    """:func:`expose_states`, returning the states' descriptions too (in node order),
    the model's graph inputs whose values reached a state the rewrite replaced
    (through other nodes: they no longer set it), the replaced states' constant
    initial values that are not zeros (by state input), and the state inputs whose
    initial value the model computed otherwise than as zeros or a constant."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, got {type(model).__name__}")
    model = with_functions_inlined(model)  # else a function's node restarted each chunk
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    used_before = _used_names(graph)
    rewriter = _Rewriter(copy)
    pending = rewriter.graph(graph)
    if not pending:
        where = f" (only inside {', '.join(rewriter.skipped)})" if rewriter.skipped else ""
        if rewriter.unstreamed:
            where += f" ({', '.join(rewriter.unstreamed)}: X computed from initializers only)"
        raise RecurrentError(
            f"model has no GRU, RNN or LSTM node whose state can be exposed{where}"
        )
    if rewriter.skipped:
        warnings.warn(
            "recurrent nodes inside Loop/Scan bodies keep their state: "
            + ", ".join(rewriter.skipped),
            stacklevel=3,
        )
    fed = _inputs_reaching(model, rewriter.replaced)
    defaults, unknown = _initial_states(model, rewriter.initial)
    states = []
    for p in pending:
        info = p.info
        output = f"{info.node}.{p.output_name}"
        if output != p.tensor:  # not the node's own output, named by the rewrite
            output = rewriter.name(output)
            graph.node.append(helper.make_node("Identity", [p.tensor], [output]))
        declared = _value_info(info.input, info.elem_type, info.shape)
        if p.kept:  # the model's own input, where it is, declared as the others
            next(i for i in graph.input if i.name == info.input).CopyFrom(declared)
        else:
            graph.input.append(declared)
        graph.output.append(_value_info(output, info.elem_type, info.shape))
        states.append(replace(info, output=output))
    _drop_dead(graph, used_before)
    return copy, states, fed, defaults, unknown


def expose_states(model: onnx.ModelProto) -> onnx.ModelProto:
    """Make every recurrent node's state a graph input and a graph output.

    Each GRU, RNN and LSTM node whose ``X`` a graph input reaches (of the main graph,
    of ``If`` branches, and of model-local functions, which are inlined) gets its
    ``initial_h`` from a new graph input ``<node name>.initial_h`` and its final state
    ``Y_h`` is returned as graph output ``<node name>.Y_h`` (LSTM: also
    ``.initial_c`` / ``.Y_c``), declared ``[num_directions, batch, hidden_size]``
    (``[batch, num_directions, hidden_size]`` for ``layout=1``). Whatever computed the
    old initial state in the graph (PyTorch's zeros from ``Expand`` or
    ``ConstantOfShape``) is removed once nothing else uses it. A node whose
    ``initial_h`` (``initial_c``) is a graph input of the model that nothing else uses
    (``h0``) keeps it: that input, where it stands and declared as above, is the state
    input. The original outputs come first, unchanged; the state outputs follow, in
    node order, and the new state inputs after the model's own.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified: the rewrite works on a copy.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    ValueError
        The model has no recurrent node whose state can be exposed (none at all,
        only inside ``Loop`` / ``Scan`` bodies, or only over constant ``X``).
    TypeError
        ``model`` is not an ``onnx.ModelProto``.
    """
    return expose(model)[0]


# -- the session ----------------------------------------------------------------------------


class StreamingSession:
    """Run a model chunk by chunk, its recurrent states carried between calls.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
        Any model with at least one recurrent node; its states need not be inputs
        and outputs (:func:`expose_states` is applied to a copy).
    sess_options, providers, host
        As :class:`~onnx_recurrent.InferenceSession`'s: who runs the graph.

    Raises
    ------
    FileNotFoundError
        ``model`` is a path that does not exist.
    ValueError
        The model has no recurrent node whose state can be exposed; a model that
        cannot be read (as :class:`InferenceSession` says).
    TypeError
        ``model`` is not a path, bytes or ``onnx.ModelProto``; a ``host``,
        ``sess_options`` or ``providers`` of the wrong type (as
        :class:`InferenceSession` says).

    Examples
    --------
    >>> session = StreamingSession("model.onnx")  # doctest: +SKIP
    >>> for chunk in chunks:  # doctest: +SKIP
    ...     (y, h_n) = session.step({"x": chunk})
    >>> session.reset()  # doctest: +SKIP

    Warns
    -----
    UserWarning
        A node runs in the reverse or both directions: chunks cannot give what one
        call gives for it. A graph input of the model reaches a recurrent state
        through other nodes (Silero VAD's ``state``): the session carries that state
        itself, so the input's values no longer set it (the message names the input;
        set the state with :attr:`states`). The model computes a node's initial state
        otherwise than as zeros or a constant (a learned state broadcast over the
        batch): the session starts from zeros there (set :attr:`states`).

    Notes
    -----
    The states start at zeros, with the batch size of what reaches each node in the
    first step (or at the model's constant initial state, where it gives a node one:
    a learned ``initial_h``); every later step must keep that batch size (call
    :meth:`reset` to change it). A row that takes no step in a chunk (an empty chunk, or a
    ``sequence_lens`` of 0) keeps the state it came with, where one call of the
    operator would give zeros. One stream per session: a step while another thread's
    step of the same session runs is refused (RuntimeError).

    Each recurrent node carries its own state, those of ``If`` branches included: a
    stream that switches branches mid-way (Silero VAD's 16 kHz and 8 kHz branches,
    which share the model's one ``state``) starts the other branch's node from that
    node's own last state, not from the one the first branch left; keep one branch
    per stream, or set :attr:`states` when switching.

    A model's own state input, a graph input fed straight to a node's ``initial_h``
    or ``initial_c`` (``h0``, ``c0``), stays an input of :meth:`step`, optional: fed,
    it sets that state for the step (the first step's initial state, or a new one
    mid-stream, e.g. to start the next utterance from a known state); left out, the
    previous step's final state is carried on (zeros on the first step and after
    :meth:`reset`). :attr:`states` names it as the model does.

    Like :class:`~onnx_recurrent.InferenceSession`, it cannot be pickled: make one
    in each process.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto,
        sess_options: Any = None,
        providers: Any = None,
        *,
        host: str = "auto",
    ) -> None:
        original = load_model(model)
        self._outputs = [NodeArg.of(o) for o in original.graph.output]
        self._model, self._infos, fed, self._defaults, unknown = expose(original)
        backward = [
            f"{n.op_type} {n.name or '(unnamed)'!r}"
            for _, n in walk(original.graph)
            if n.op_type in RECURRENT_OPS
            and str(attributes(n).get("direction", "forward")).lower() != "forward"
        ]
        if backward:
            warnings.warn(
                f"{', '.join(backward)} also run backwards in time: that direction sees "
                "one chunk at a time, so chunked outputs differ from one call",
                stacklevel=2,
            )
        # a zero-size state (a stream's first step) means zeros of the batch that
        # reaches the node, however the graph computes it
        self._session = InferenceSession(
            self._model, sess_options, providers, host=host, _zero_size_states=True
        )
        originals = {i.name for i in original.graph.input}
        #: the state inputs the rewrite made (the model's own ones are fed as inputs)
        self._made = {s.input for s in self._infos if s.input not in originals}
        self._own = [s.input for s in self._infos if s.input in originals]
        self._inputs = [i for i in self._session.get_inputs() if i.name not in self._made]
        names = {i.name for i in self._inputs}
        #: the model's inputs that only fed replaced states: no longer inputs
        self._dropped = [name for name in fed if name not in names]
        if fed:
            still = [name for name in fed if name in names]
            what = " and ".join(
                [f"{still} stay inputs, but their values no longer set them"] * bool(still)
                + [f"{self._dropped} are no longer inputs"] * bool(self._dropped)
            )
            warnings.warn(
                f"input(s) {fed} of the model set recurrent states through other nodes; "
                f"StreamingSession carries those states from chunk to chunk, so {what}; "
                "set a state with session.states (see session.state_info)",
                stacklevel=2,
            )
        if unknown:
            warnings.warn(
                f"the model computes the initial value of state(s) {unknown} otherwise "
                "than as zeros or a constant; StreamingSession starts a stream from zeros "
                "there: set session.states before the first chunk to start elsewhere",
                stacklevel=2,
            )
        self._states: dict[str, np.ndarray] = {}
        #: the states set with :attr:`states` since the last step (for the wording)
        self._set: set[str] = set()
        #: held by the step under way: a second one at once (another thread) is refused
        self._stepping = ForkLock()

    def __reduce__(self):
        raise TypeError(_not_picklable(type(self)))

    def __copy__(self) -> StreamingSession:
        """A second stream over the same session, from this one's states: each goes on
        alone from there (a step of one leaves the other's states), as a stream forked
        (``copy.copy``; it said it could not pickle)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._states, twin._set = dict(self._states), set(self._set)
        twin._stepping = ForkLock()
        return twin

    @property
    def model(self) -> onnx.ModelProto:
        """The rewritten model, states as inputs and outputs."""
        return self._model

    @property
    def host(self) -> str:
        """Who runs the graph: ``"onnxruntime"`` or ``"reference"``."""
        return self._session.host

    @property
    def state_info(self) -> list[StateInfo]:
        """One entry per exposed state, in node order."""
        return list(self._infos)

    def get_inputs(self) -> list[NodeArg]:
        """The inputs a caller feeds to :meth:`step`: the original model's, in its
        order; its own state inputs among them are optional (declared as
        :attr:`state_info` has them); those that only fed replaced states are left
        out."""
        return _as_reported(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The outputs :meth:`step` returns: the original model's."""
        return _as_reported(self._outputs)

    @property
    def states(self) -> dict[str, np.ndarray | None]:
        """The current state of each exposed input (``<node>.initial_h``, ... or the
        model's own ``h0``).

        None means zeros not yet shaped: before the first step, after :meth:`reset`.
        """
        out: dict[str, np.ndarray | None] = {}
        for s in self._infos:
            value = self._states.get(s.input, self._defaults.get(s.input))
            out[s.input] = None if value is None or value.size == 0 else value.copy()
        return out

    @states.setter
    def states(self, values: Mapping[str, Any]) -> None:
        if not isinstance(values, Mapping):
            raise TypeError(
                f"states must be a dict of state name to array, got {type(values).__name__}"
            )
        names = [s.input for s in self._infos]
        unknown = [name for name in values if name not in names]
        if unknown:
            raise RecurrentError(f"unknown state name(s) {unknown}; the states are {names}")
        checked = {
            s.input: _state_array(s, values[s.input])
            for s in self._infos
            if values.get(s.input) is not None
        }  # all checked before any is set
        for s in self._infos:
            if s.input in checked:
                self._states[s.input] = checked[s.input]
                self._set.add(s.input)
            elif s.input in values:
                self._states.pop(s.input, None)
                self._set.discard(s.input)

    def reset(self) -> None:
        """Forget the states: the next step starts from the model's initial states
        (zeros, or the constant the model gives a state: a learned initial state)."""
        self._states = {}
        self._set = set()

    def _check_names(self, feeds: Mapping[str, Any]) -> None:
        made = sorted(set(feeds) & self._made)
        if made:
            raise RecurrentError(
                f"{made}: states are fed by the session; set them with session.states"
            )
        dropped = [name for name in self._dropped if name in feeds]
        if dropped:
            raise RecurrentError(
                f"input(s) {dropped}: the model used them only to set recurrent states, "
                "which this session carries itself, so they are no longer inputs; set "
                f"a state with session.states (the states are {[s.input for s in self._infos]})"
            )
        note = f" ({self._own} optional: the states)" if self._own else ""
        check_feed_names(feeds, [i.name for i in self._inputs], self._own, note=note)

    def step(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one chunk and keep the final states for the next one.

        Parameters
        ----------
        feeds : dict of str to ndarray
            The original model's inputs for this chunk (:meth:`get_inputs`); its own
            state inputs (``h0``) optional: fed, they set the state for this chunk,
            else the previous chunk's final state is carried on.

        Returns
        -------
        list of ndarray
            The original model's outputs, in graph order.

        Raises
        ------
        ValueError
            A missing or unknown input (a state input the session made among them,
            or one the model used only to set a state), or a chunk whose batch size
            differs from the states' ("the batch changed from 3 to 2"; call
            :meth:`reset` to start a stream of another batch).
        TypeError
            A feed of the wrong element type.
        RuntimeError
            Another thread's step of this stream is under way (a stream is one
            sequence of chunks: make a session per stream).
        """
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError(
                "StreamingSession.step called while another thread's step of this stream "
                "runs: a stream is one sequence of chunks, and steps from two threads "
                "would mix their states; make one StreamingSession per stream"
            )
        try:
            return self._step(feeds)
        finally:
            self._stepping.release()

    def _step(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise RecurrentTypeError(
                f"feeds must be a dict of input name to array, got {type(feeds).__name__}"
            )
        self._check_names(feeds)
        full = dict(feeds)
        for s in self._infos:
            if s.input not in feeds:
                start = self._defaults.get(s.input)
                full[s.input] = self._states.get(s.input, s.empty() if start is None else start)
        names = [o.name for o in self._outputs] + [s.output for s in self._infos]
        try:
            results = self._session.run(names, full)
        except StateBatchError as e:
            raise self._batch_error(e, feeds) from None
        k = len(self._outputs)
        for s, r in zip(self._infos, results[k:], strict=True):
            given = feeds.get(s.input, self._states.get(s.input) if s.input in self._set else None)
            if given is not None and np.size(given) == 0 and r.size != 0:
                # a caller's state of batch 0: the session's own empty state means
                # "zeros", so the node took it for zeros of another batch
                axis = s.shape.index("batch") if "batch" in s.shape else 1
                how = "input" if s.input in feeds else "state set with session.states"
                raise RecurrentError(
                    f"{how} {s.input!r}: expected the batch size of what reaches node "
                    f"{s.node!r} ({r.shape[axis]}), got shape {list(np.shape(given))}"
                )
        self._states = {s.input: r for s, r in zip(self._infos, results[k:], strict=True)}
        self._set = set()
        return results[:k]

    def _batch_error(self, error: StateBatchError, feeds: Mapping[str, Any]) -> RecurrentError:
        """A state's batch size is not X's: in the stream's words."""
        fed = [s.input for s in self._infos if s.node == error.node and s.input in feeds]
        if fed:
            return RecurrentError(
                f"input {fed[0]!r}: expected the batch size of what reaches "
                f"{error.label} ({error.batch}), got {error.state_batch}"
            )
        given = [s.input for s in self._infos if s.node == error.node and s.input in self._set]
        if given:
            return RecurrentError(
                f"state {given[0]!r} set with session.states has batch size "
                f"{error.state_batch}; what reaches {error.label} has {error.batch}"
            )
        learned = [
            s.input
            for s in self._infos
            if s.node == error.node and s.input not in self._states and s.input in self._defaults
        ]
        if learned:  # the first chunk: nothing changed, and reset() would not help
            return RecurrentError(
                f"the model's constant initial state {learned[0]!r} has batch size "
                f"{error.state_batch}; what reaches {error.label} has {error.batch}: set "
                "session.states to a state of that batch size (e.g. the constant repeated "
                "along the batch axis)"
            )
        return RecurrentError(
            f"the batch changed from {error.state_batch} to {error.batch} "
            f"(at {error.label}): a stream keeps the batch size of its first chunk; "
            "call reset() to start a stream of another batch"
        )
