"""Stateful streaming for any model: recurrent states as graph inputs and outputs.

A model exported with its recurrent state kept inside (PyTorch builds ``h0`` as zeros
with ``Expand`` or ``ConstantOfShape``) can only be run on a whole sequence at once.
:func:`expose_states` rewrites it so that each GRU, RNN and LSTM node takes its
``initial_h`` (``initial_c``) from a graph input and returns ``Y_h`` (``Y_c``) as a graph
output; :class:`StreamingSession` runs the rewritten model chunk by chunk, carrying the
states from one call to the next.

Recurrent nodes of the main graph and of ``If`` branches (at any depth) are exposed: a
branch that does not hold the node passes the state through unchanged. A node inside a
``Loop`` or ``Scan`` body is left as it is (its state belongs to one iteration).
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

from ..errors import RecurrentError
from .graph import RECURRENT_OPS, Namer, attributes, element_types, subgraphs, walk
from .session import InferenceSession, NodeArg, load_model

#: per operator: (input index, input name, output index, output name) of each state
STATE_SLOTS = {
    "GRU": ((5, "initial_h", 1, "Y_h"),),
    "RNN": ((5, "initial_h", 1, "Y_h"),),
    "LSTM": ((5, "initial_h", 1, "Y_h"), (6, "initial_c", 2, "Y_c")),
}

__all__ = ["StateInfo", "StreamingSession", "expose_states"]


@dataclass(frozen=True)
class StateInfo:
    """One exposed state of one recurrent node.

    ``input`` and ``output`` are the rewritten model's graph input and output names;
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


class _Rewriter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.name = Namer(model)
        self.types = element_types(model)
        self.skipped: list[str] = []

    def elem_type(self, node: onnx.NodeProto) -> int:
        for name in (*node.input[1:3], node.input[0]):
            if name in self.types:
                return self.types[name]
        return onnx.TensorProto.FLOAT

    def graph(self, graph: onnx.GraphProto, top: bool = True) -> list[_Pending]:
        found: list[_Pending] = []
        for index, node in enumerate(list(graph.node)):
            if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
                found += self.node(node, graph, index, top)
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
            state_input = self.name(f"{prefix}.{in_name}")
            node.input[in_index] = state_input
            if not node.output[out_index]:  # in a branch, leave "<node>.Y_h" to the graph
                suffix = "" if top else ".inner"
                node.output[out_index] = self.name(f"{prefix}.{out_name}{suffix}")
            info = StateInfo(node.name, node.op_type, state_input, "", shape, elem)
            pending.append(_Pending(info, node.output[out_index], out_name))
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
                pending.append(_Pending(p.info, out, p.output_name))
        return pending


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used = {o.name for o in graph.output}
    for _, node in walk(graph):
        used.update(node.input)
    return used


def _prune(graph: onnx.GraphProto, used_before: set[str]) -> None:
    """Drop what the rewrite made dead: nodes, graph inputs, initializers, value_info."""
    while True:
        used = _used_names(graph)
        dead = [n for n in graph.node if n.output and not any(o in used for o in n.output if o)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = _used_names(graph)
    orphaned = used_before - used
    for field in (graph.input, graph.initializer):
        for v in [v for v in field if v.name in orphaned]:
            field.remove(v)
    produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    for v in [v for v in graph.value_info if v.name not in produced]:
        graph.value_info.remove(v)


def expose(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[StateInfo]]:
    """:func:`expose_states`, returning the states' descriptions too."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, got {type(model).__name__}")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    used_before = _used_names(graph)
    rewriter = _Rewriter(copy)
    pending = rewriter.graph(graph)
    if not pending:
        where = f" (only inside {', '.join(rewriter.skipped)})" if rewriter.skipped else ""
        raise RecurrentError(
            f"model has no GRU, RNN or LSTM node whose state can be exposed{where}"
        )
    if rewriter.skipped:
        warnings.warn(
            "recurrent nodes inside Loop/Scan bodies keep their state: "
            + ", ".join(rewriter.skipped),
            stacklevel=3,
        )
    states = []
    for p in pending:
        info = p.info
        output = f"{info.node}.{p.output_name}"
        if output != p.tensor:  # not the node's own output, named by the rewrite
            output = rewriter.name(output)
            graph.node.append(helper.make_node("Identity", [p.tensor], [output]))
        graph.input.append(_value_info(info.input, info.elem_type, info.shape))
        graph.output.append(_value_info(output, info.elem_type, info.shape))
        states.append(replace(info, output=output))
    _prune(graph, used_before)
    return copy, states


def expose_states(model: onnx.ModelProto) -> onnx.ModelProto:
    """Make every recurrent node's state a graph input and a graph output.

    Each GRU, RNN and LSTM node (of the main graph, and of ``If`` branches) gets its
    ``initial_h`` from a new graph input ``<node name>.initial_h`` and its final state
    ``Y_h`` is returned as graph output ``<node name>.Y_h`` (LSTM: also
    ``.initial_c`` / ``.Y_c``), declared ``[num_directions, batch, hidden_size]``
    (``[batch, num_directions, hidden_size]`` for ``layout=1``). Whatever computed the
    old initial state in the graph (PyTorch's zeros from ``Expand`` or
    ``ConstantOfShape``) is removed once nothing else uses it. The original outputs
    come first, unchanged; the state inputs and outputs follow, in node order.

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
        The model has no recurrent node whose state can be exposed (none at all, or
        only inside ``Loop`` / ``Scan`` bodies).
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
    ValueError
        The model has no recurrent node whose state can be exposed.

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
        call gives for it.

    Notes
    -----
    The states start at zeros, with the batch size of what reaches each node in the
    first step; every later step must keep that batch size (call :meth:`reset` to
    change it). Not thread-safe: one stream per session.
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
        self._model, self._infos = expose(original)
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
        names = {s.input for s in self._infos}
        self._inputs = [i for i in self._session.get_inputs() if i.name not in names]
        self._states: dict[str, np.ndarray] = {}

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
        """One entry per exposed state, in the rewritten model's input order."""
        return list(self._infos)

    def get_inputs(self) -> list[NodeArg]:
        """The inputs a caller feeds to :meth:`step`: the original model's."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The outputs :meth:`step` returns: the original model's."""
        return list(self._outputs)

    @property
    def states(self) -> dict[str, np.ndarray | None]:
        """The current state of each exposed input (``<node>.initial_h``, ...).

        None means zeros not yet shaped: before the first step, after :meth:`reset`.
        """
        out: dict[str, np.ndarray | None] = {}
        for s in self._infos:
            value = self._states.get(s.input)
            out[s.input] = None if value is None or value.size == 0 else value.copy()
        return out

    @states.setter
    def states(self, values: Mapping[str, Any]) -> None:
        names = [s.input for s in self._infos]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise RecurrentError(f"unknown state name(s) {unknown}; the states are {names}")
        for s in self._infos:
            if s.input in values and values[s.input] is not None:
                self._states[s.input] = np.asarray(values[s.input])
            elif s.input in values:
                self._states.pop(s.input, None)

    def reset(self) -> None:
        """Forget the states: the next step starts from zeros."""
        self._states = {}

    def step(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one chunk and keep the final states for the next one.

        Parameters
        ----------
        feeds : dict of str to ndarray
            The original model's inputs for this chunk.

        Returns
        -------
        list of ndarray
            The original model's outputs, in graph order.

        Raises
        ------
        ValueError
            A missing or unknown input (a state input among them), or a chunk whose
            batch size differs from the states'.
        TypeError
            A feed of the wrong element type.
        """
        if not isinstance(feeds, Mapping):
            raise TypeError(
                f"feeds must be a dict of input name to array, got {type(feeds).__name__}"
            )
        clash = sorted(set(feeds) & {s.input for s in self._infos})
        if clash:
            raise RecurrentError(
                f"{clash}: states are fed by the session; set them with session.states"
            )
        full = dict(feeds)
        for s in self._infos:
            full[s.input] = self._states.get(s.input, s.empty())
        names = [o.name for o in self._outputs] + [s.output for s in self._infos]
        results = self._session.run(names, full)
        k = len(self._outputs)
        self._states = {s.input: r for s, r in zip(self._infos, results[k:], strict=True)}
        return results[:k]
