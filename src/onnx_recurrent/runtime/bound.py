"""A model's recurrent nodes bound to prepared layers, once per session.

Both hosts compute a recurrent node through its :class:`BoundNode`: the weights that
are initializers, or computed from initializers only, are checked and prepared into a
:class:`~onnx_recurrent.Layer` when the session is made; only X, the lengths and the
states (and weights the graph computes at run time) come per call. Errors name the node
(``LSTM node 'rnn': sequence_lens ...``) and are the same under either host.
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import prepared
from ..cells import CELLS, check_arity
from ..errors import RecurrentError, RecurrentTypeError
from ..layers import Layer
from .folding import constant_values
from .graph import (
    INPUTS,
    WEIGHTS,
    RecurrentNode,
    check_element_type,
    check_required_outputs,
    node_attributes,
    recurrent_nodes,
)


def _named(label: str, error: RecurrentError | RecurrentTypeError) -> Exception:
    return type(error)(f"{label}: {error}")


class StateBatchError(RecurrentError):
    """A stream's state whose batch size is not X's (streaming only: a node bound with
    ``zero_size_states``); :class:`~.streaming.StreamingSession` says it in its words.

    ``node`` is the node's name, ``label`` how errors name it, ``state_batch`` the
    state's batch size and ``batch`` X's.
    """

    def __init__(
        self, message: str, node: str = "", label: str = "", state_batch: int = 0, batch: int = 0
    ) -> None:
        super().__init__(message)
        self.node, self.label = node, label
        self.state_batch, self.batch = state_batch, batch


class BoundNode:
    """One recurrent node of a model, ready to run.

    Parameters
    ----------
    node : RecurrentNode
        The node and its version.
    constants : dict of str to ndarray
        Values of the model's constant tensors (:func:`.folding.constant_values`).

    Raises
    ------
    ValueError, TypeError
        A bad attribute, a required input (X, W, R) not given, more inputs or outputs
        than the operator has, or constant weights that disagree with the attributes
        or each other; the message names the node.
    """

    def __init__(
        self,
        node: RecurrentNode,
        constants: dict[str, np.ndarray],
    ) -> None:
        self.node = node
        self.op = node.op
        self.label = node.label
        self.want_Y = node.output(0) != ""
        self.n_outputs = 3 if self.op == "LSTM" else 2
        try:
            self.attributes = node_attributes(node.op, node.version, node.node)
            check_required_outputs(node.op, node.version, node.node)
        except RecurrentError as e:
            raise _named(self.label, e) from None
        inputs, outputs = node.node.input, node.node.output
        for position, name in enumerate(("X", "W", "R")):
            if position >= len(inputs) or not inputs[position]:
                given = "''" if position < len(inputs) else f"absent ({len(inputs)} inputs)"
                raise RecurrentError(
                    f"{self.label}: input {position} ({name}) is required, got {given}"
                )
        try:
            check_arity(self.op, len(inputs), len(outputs))
        except RecurrentError as e:
            raise _named(self.label, e) from None
        #: weight name -> tensor name, for the weights that cross per call: all the
        #: node's weights, where one of them is not constant (the graph computes it, or
        #: it is an initializer a caller may replace)
        present = {w: node.input(w) for w in WEIGHTS if w in INPUTS[node.op] and node.input(w)}
        dynamic = any(name not in constants for name in present.values())
        self.dynamic = present if dynamic else {}
        self.layer: Layer | None = None
        #: X's dtype in the model, where the node computes on X cast to another
        #: a state of size 0 means zeros (a stream's first step)
        self.zero_size_states = False
        if not self.dynamic:
            W, R, B, P = (
                constants.get(node.input(w)) if w in INPUTS[node.op] else None for w in WEIGHTS
            )
            try:
                # prepared on its first call: a native node never calls it
                self.layer = Layer(self.op, W, R, B, self.attributes, P, prepare=False)
            except (RecurrentError, RecurrentTypeError) as e:
                raise _named(self.label, e) from None

    def __repr__(self) -> str:
        how = "bound" if self.layer is not None else f"dynamic {sorted(self.dynamic)}"
        return f"<BoundNode {self.label} v{self.node.version}, {how}>"

    def _check_stream_batch(self, X, initial_h, initial_c) -> None:
        """Raises :class:`StateBatchError`: a stream's state of another batch than X."""
        axis = 0 if self.attributes.get("layout", 0) else 1
        for state in (initial_h, initial_c):
            if state is None or np.ndim(state) != 3 or np.ndim(X) != 3:
                continue  # no state, or one the usual checks name
            if state.shape[axis] != X.shape[axis]:
                n, m = int(state.shape[axis]), int(X.shape[axis])
                raise StateBatchError(
                    f"{self.label}: the state has batch size {n}, X batch size {m}",
                    self.node.node.name,
                    self.label,
                    n,
                    m,
                )

    def _carry(self, results, X, sequence_lens, initial_h, initial_c) -> None:
        """A stream's rows that took no step (an empty chunk, or a length of 0) keep the
        states they came with in ``results``, not the operator's zeros: the next chunk
        goes on from them (the native node sends such calls here)."""
        layout = self.attributes.get("layout", 0)
        if X.shape[1 if layout else 0] == 0:
            rows = np.ones(X.shape[0 if layout else 1], bool)
        elif sequence_lens is None:
            return
        else:
            rows = np.asarray(sequence_lens) == 0
            if not rows.any():
                return
        for final, state in zip(results[1:], (initial_h, initial_c), strict=False):
            if final is not None and state is not None:
                if layout:
                    final[rows] = state[rows]
                else:
                    final[:, rows] = state[:, rows]

    def __call__(self, *args, **keywords) -> tuple[np.ndarray | None, ...]:
        """:meth:`run`'s outputs alone."""
        return self.run(*args, **keywords)[0]

    def run(
        self,
        X: np.ndarray,
        sequence_lens: np.ndarray | None = None,
        initial_h: np.ndarray | None = None,
        initial_c: np.ndarray | None = None,
        weights: dict[str, np.ndarray | None] | None = None,
    ) -> tuple[tuple[np.ndarray | None, ...], Layer]:
        """The node's outputs ``(Y, Y_h[, Y_c])`` (``Y`` None when the node does not
        name it), and the layer that computed them: the bound one, or for dynamic
        weights (``weights``, by spec name: ``W``, ``R``, ...) the layer kept for
        weights equal to these (:func:`onnx_recurrent.prepared.for_call`, as the
        functions do).

        Raises
        ------
        ValueError, TypeError
            As :meth:`Layer.__call <onnx_recurrent.Layer.__call__>` and the functions
            do, with the node named first.
        """
        if self.zero_size_states:
            initial_h = None if initial_h is not None and initial_h.size == 0 else initial_h
            initial_c = None if initial_c is not None and initial_c.size == 0 else initial_c
            self._check_stream_batch(X, initial_h, initial_c)
        try:
            dtype = X.dtype
            check_element_type(self.op, self.node.version, dtype)
            layer = self.layer
            if layer is None:
                given = {w: (weights or {}).get(w) for w in WEIGHTS}
                X, layer = prepared.for_call(
                    CELLS[self.op], self.attributes, X, given["W"], given["R"], given["B"],
                    given["P"],
                )  # fmt: skip
            try:
                results = layer(
                    X, sequence_lens, initial_h, initial_c, output_sequence=self.want_Y
                )
            finally:
                if layer is not self.layer:
                    prepared.evict_to_fit(layer)
            if self.zero_size_states:
                self._carry(results, X, sequence_lens, initial_h, initial_c)
            return results, layer
        except (RecurrentError, RecurrentTypeError) as e:
            raise _named(self.label, e) from None


def bind(
    model: onnx.ModelProto, *, zero_size_states: bool = False
) -> dict[tuple[str, ...], BoundNode]:
    """Every recurrent node of ``model`` bound, keyed by :func:`node_key`;
    ``zero_size_states``: a state of size 0 means zeros (streaming's first step).

    Raises
    ------
    ValueError, TypeError
        A node with a bad attribute or bad constant weights (the message names it).
    """
    nodes = recurrent_nodes(model)
    names = [n.input(w) for n in nodes for w in WEIGHTS if w in INPUTS[n.op]]
    constants = constant_values(model, names)
    bound = {node_key(n.node): BoundNode(n, constants) for n in nodes}
    for b in bound.values():
        b.zero_size_states = zero_size_states
    return bound


def node_key(node: onnx.NodeProto) -> tuple[str, ...]:
    """A node's identity within a model: its name, inputs and outputs."""
    return (node.op_type, node.name, *node.input, "->", *node.output)
