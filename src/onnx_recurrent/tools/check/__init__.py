"""``onnx-recurrent check``: one model on onnx-recurrent and on every installed peer.

The peers are onnxruntime, onnx.reference and OpenVINO (CPU, ``INFERENCE_PRECISION_HINT``
f32), each imported lazily and skipped when absent. Before running, each recurrent node
is linted: the probes its attributes call for (``probes``: tiny one-node models in the
node's form, run once per process) say what each peer gets wrong for it. The report is
a table of the largest absolute and relative difference per output and peer, or the
peer's error. With ``trace``, each main-graph recurrent node whose ``Y`` differs is
located: the first time step, direction and batch entry where the peer leaves the
tolerance, and the gate that explains it, recomputed in float64 from the node's inputs
(:func:`cell_step`). Modules: ``peers`` (running them), ``probes``, ``lint``, ``trace``
(comparing outputs, the float64 cell step, the trace), ``dims`` (the sizes of the
random inputs' free dims: those the weights and shapes fix, inferred; the others
guessed, and named with the ``--dim`` to pass when the run fails); here, the report
and the command line.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ...errors import RecurrentError, RecurrentTypeError, one_line
from ...runtime.session import InferenceSession, load_model
from ..arguments import (
    add_host,
    add_model_inputs,
    load_feeds,
    note_first_use,
    number,
    parse_dims,
    parse_pairs,
    random_feeds,
    recurrent_elements,
)
from .dims import Dims, solve_dims
from .lint import Finding, lint
from .peers import PEERS, installed_peers
from .trace import (
    Comparison,
    Divergence,
    cell_step,
    compare,
    low_precision_upstream,
    trace,
)

__all__ = [
    "PEERS",
    "Dims",
    "Report",
    "add_parser",
    "cell_step",
    "check",
    "installed_peers",
    "lint",
    "solve_dims",
    "trace",
]


@dataclass
class Report:
    """What :func:`check` found."""

    findings: list[Finding]
    comparisons: list[Comparison]
    divergences: list[Divergence] = field(default_factory=list)
    trace_errors: list[str] = field(default_factory=list)
    atol: float = 1e-4
    rtol: float = 1e-3

    @property
    def exceeds(self) -> bool:
        """Whether any peer's output leaves the tolerance."""
        return any(c.exceeds for c in self.comparisons)

    def table(self) -> list[str]:
        """The comparisons as aligned text lines, a header first."""
        numbers = {
            id(c): (f"{c.max_abs:.3g}", f"{c.max_rel:.3g}")
            for c in self.comparisons
            if c.error is None
        }
        w_out = max([len("output")] + [len(c.output) for c in self.comparisons])
        w_peer = max([len("peer")] + [len(c.peer) for c in self.comparisons])
        w_abs = max([len("max abs")] + [len(a) for a, _ in numbers.values()])
        w_rel = max([len("max rel")] + [len(r) for _, r in numbers.values()])
        lines = [f"  {'output':<{w_out}}  {'peer':<{w_peer}}  {'max abs':>{w_abs}}  max rel"]
        for c in self.comparisons:
            line = f"  {c.output:<{w_out}}  {c.peer:<{w_peer}}  "
            if c.error is not None:
                line += ("DIFFERS: " if c.exceeds else "error: ") + c.error
            else:
                a, r = numbers[id(c)]
                line += f"{a:>{w_abs}}  {r:>{w_rel}}  {'DIFFERS' if c.exceeds else 'ok'}"
            lines.append(line)
        return lines


def check(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    peers: Sequence[str] | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    trace_nodes: bool = False,
    host: str = "auto",
) -> Report:
    """Run ``model`` on onnx-recurrent and on each peer, and compare every output.

    Parameters
    ----------
    model : str, os.PathLike, bytes or onnx.ModelProto
    feeds : dict of str to ndarray
        Every graph input.
    peers : sequence of str, optional
        Names from :data:`PEERS`; default every installed one.
    atol, rtol : float
        A peer differs where ``|theirs - ours| > atol + rtol * |ours|``; for an output
        of float16 or bfloat16, or computed from a recurrent node of that type (a
        float32 output after a Cast), each at least two of its machine epsilons.
    trace_nodes : bool
        Also locate the first divergent step of each recurrent node (:func:`trace`).
    host : {"auto", "onnxruntime", "reference"}
        Who runs the graph on our side (:class:`~onnx_recurrent.InferenceSession`).

    Returns
    -------
    Report

    Raises
    ------
    ValueError
        Bad feeds, an unknown peer or one given twice, or a model onnx-recurrent
        rejects.
    """
    proto = load_model(model)
    peers = installed_peers() if peers is None else list(peers)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise RecurrentError(f"unknown peer(s) {unknown}; known: {list(PEERS)}")
    _once(peers, "peer")
    if atol < 0 or rtol < 0:
        raise RecurrentError(f"atol and rtol must be >= 0, got {atol}, {rtol}")
    session = InferenceSession(proto, host=host)
    names = [o.name for o in session.get_outputs()]
    ours = session.run(None, feeds)
    report = Report(lint(proto, peers), [], atol=atol, rtol=rtol)
    upstream = low_precision_upstream(proto)
    for peer in peers:
        try:
            theirs = PEERS[peer][1](proto, feeds, names)
        except Exception as e:
            report.comparisons.append(Comparison("(all)", peer, error=one_line(e, 140)))
            continue
        for name, a, b in zip(names, ours, theirs, strict=True):
            eps = upstream.get(name, 0.0)
            report.comparisons.append(compare(name, peer, a, b, atol, rtol, eps))
    if trace_nodes:
        differing = [p for p in peers if any(c.exceeds for c in report.comparisons if c.peer == p)]
        report.divergences, report.trace_errors = trace(
            proto, feeds, differing, atol=atol, rtol=rtol
        )
    return report


def cmd_check(args: argparse.Namespace) -> int:
    """``onnx-recurrent check``: print the lint, the table and the trace; 1 if a peer
    differs, :data:`NOTHING_COMPARED` if none ran (a bad file or argument raises: the
    command line prints it, status 2)."""
    _once(args.peer or [], "--peer")  # before the work
    model = load_model(args.model)
    note_first_use(elements=recurrent_elements(model))  # a session compiles its kernels
    session = InferenceSession(model, host=args.host)
    inputs = session.get_inputs()
    overridable = session.get_overridable_initializers()  # -i may replace them
    feeds = load_feeds(parse_pairs(args.input, "-i"), inputs, overridable)
    dims = solve_dims(model, inputs, parse_dims(args.dim, inputs), feeds)
    missing = [i for i in inputs if i.name not in feeds]
    drawn = random_feeds(missing, dims.values, seed=args.seed)
    feeds |= drawn
    opset = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = " ".join(filter(None, (model.producer_name, model.producer_version)))
    print(f"model: {args.model} (producer {producer or 'unknown'}; opset {opset})")
    if not session.recurrent_nodes:
        print("note: the model has no GRU, RNN or LSTM node: onnx-recurrent computes nothing")
    for name, value in feeds.items():
        how = f"random (seed {args.seed})" if name in drawn else "given"
        print(f"input {name}: {list(value.shape)} {value.dtype}, {how}")
    for line in dims.lines():
        print(line)
    peers = args.peer or installed_peers()
    print(f"peers: {', '.join(peers) if peers else 'none installed'}")
    try:
        report = check(
            model,
            feeds,
            peers=peers,
            atol=args.atol,
            rtol=args.rtol,
            trace_nodes=args.trace,
            host=args.host,
        )
    except Exception as e:  # a bad dtype is not a dim's fault
        advice = None if isinstance(e, RecurrentTypeError) else dims.advice(e, model)
        if advice is None:
            raise
        raise RecurrentError(f"{advice}; the error: {one_line(e)}") from None
    print("\nlint:" if report.findings else "\nlint: nothing known to go wrong for these nodes")
    for f in report.findings:
        print(f"  {f}")
    low = any(c.widened for c in report.comparisons)
    wider = "; outputs of or through float16, bfloat16: 2 eps at least" if low else ""
    print(f"\ndifferences from onnx-recurrent (atol {args.atol:g}, rtol {args.rtol:g}{wider}):")
    for line in report.table():
        print(line)
    if args.trace:
        print("\ntrace:")
        if not report.divergences and not report.trace_errors:
            print("  no recurrent node's outputs differ")
        for div in report.divergences:
            for line in div.lines():
                print(f"  {line}")
        for err in report.trace_errors:
            print(f"  {err}")
    failing = list(dict.fromkeys(c.peer for c in report.comparisons if c.exceeds))
    failed = [c.peer for c in report.comparisons if c.error is not None and not c.exceeds]
    note = f" ({', '.join(failed)} could not run it)" if failed else ""
    if failing:
        print(f"\nresult: {', '.join(failing)} beyond the tolerance{note}")
        return 1
    if not any(c.error is None for c in report.comparisons):
        why = note.strip(" ()") or "no peer installed"
        print(f"\nresult: nothing compared: no peer ran the model ({why})")
        return NOTHING_COMPARED
    print(f"\nresult: every peer that ran agrees within the tolerance{note}")
    return 0


def _once(peers: Sequence[str], what: str) -> None:
    """Refuse a peer named twice: it would be run, and reported, twice."""
    twice = next((p for i, p in enumerate(peers) if p in peers[:i]), None)
    if twice is not None:
        raise RecurrentError(f"{what} {twice!r} given twice")


_tolerance = number(float, 0, "a tolerance")
#: the exit status where no peer ran the model: nothing was verified
NOTHING_COMPARED = 3


def add_parser(subparsers: Any) -> None:
    """Register the ``check`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "check",
        help="compare a model's outputs on onnx-recurrent and every installed peer",
        description=(
            "Run MODEL on onnx-recurrent and on onnxruntime, onnx.reference and OpenVINO "
            "(those installed), lint its recurrent nodes for what each peer is probed to "
            "get wrong, and print the largest differences. Exit status 1 when a peer "
            "differs beyond --atol/--rtol, 2 for a usage error, 3 when no peer could run "
            "the model (nothing compared)."
        ),
    )
    p.add_argument("model", help="path to an .onnx model")
    add_model_inputs(p)
    p.add_argument(
        "--atol",
        type=_tolerance,
        default=1e-4,
        help="absolute tolerance of float outputs (1e-4; integers and bools must be equal)",
    )
    p.add_argument("--rtol", type=_tolerance, default=1e-3, help="relative tolerance (1e-3)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="for each recurrent node that differs, the first step and the gate",
    )
    p.add_argument(
        "--peer",
        action="append",
        choices=list(PEERS),
        help="compare with this peer only (repeatable; default every installed one)",
    )
    add_host(p)
    p.set_defaults(handler=cmd_check)
