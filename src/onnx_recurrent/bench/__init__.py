"""``onnx-recurrent bench``: onnx-recurrent against onnxruntime, OpenVINO and onnx.reference.

Every case is one recurrent node (GRU, LSTM or RNN) at one shape. The competitors run the
same single-node ONNX model; onnx-recurrent runs through its functional API (and, in a
separate column, through :class:`~onnx_recurrent.InferenceSession`). After a warm-up, the
runtimes are called in alternation, one call each per round, and the median of the rounds
is reported with the ratio to the baseline (onnxruntime; OpenVINO where onnxruntime has no
kernel) and to onnx.reference, each against its target, and the largest absolute
difference of each competitor's outputs from ours.

The pure parts (:func:`make_cases`, :func:`time_alternating`, :func:`format_report`) are
separate from the runtimes so that the tests can exercise them on the hidden ``tiny``
shape without timing anything. Modules: ``cases`` (shapes, variants, inputs, models),
``runtimes`` (the competitors), ``timing`` (alternating calls, one case's result),
``report`` and ``plot`` (the output), ``machine`` (what the header says about the
machine), ``driver`` (a whole run), ``command`` (the command line).
"""

from __future__ import annotations

from .cases import (
    DEFAULT_BUDGET,
    DOUBLE_ACCURACY,
    GATES,
    MAX_REPEATS,
    MIN_REPEATS,
    OPS,
    OTHERS_WARNING,
    OUTPUTS,
    PUBLIC_SHAPES,
    SHAPES,
    TOLERANCE,
    VARIANT_SHAPES,
    Case,
    Shape,
    Target,
    attributes,
    make_cases,
    make_inputs,
    make_model,
    make_transposed_model,
    output_shapes,
    parse_list,
)
from .command import add_parser, cmd_bench
from .driver import Bench, CpuMeter, ThreadLimit, budgets, run_bench
from .machine import cpu_model, git_commit, machine_info, physical_cores
from .plot import check_plot_support, plot_ratios
from .report import (
    LEGEND,
    SHORT_NAMES,
    format_header,
    format_notes,
    format_report,
    format_table,
    table_columns,
)
from .runtimes import (
    COMPETITORS,
    RUNTIMES,
    Call,
    OnnxRuntime,
    OpenVINO,
    Ours,
    OursSession,
    Reference,
    Runtime,
    make_runtimes,
)
from .timing import CaseResult, max_abs_diff, run_case, settle, time_alternating

__all__ = [
    "COMPETITORS",
    "DEFAULT_BUDGET",
    "DOUBLE_ACCURACY",
    "GATES",
    "LEGEND",
    "MAX_REPEATS",
    "MIN_REPEATS",
    "OPS",
    "OTHERS_WARNING",
    "OUTPUTS",
    "PUBLIC_SHAPES",
    "RUNTIMES",
    "SHAPES",
    "SHORT_NAMES",
    "TOLERANCE",
    "VARIANT_SHAPES",
    "Bench",
    "Call",
    "Case",
    "CaseResult",
    "CpuMeter",
    "OnnxRuntime",
    "OpenVINO",
    "Ours",
    "OursSession",
    "Reference",
    "Runtime",
    "Shape",
    "Target",
    "ThreadLimit",
    "add_parser",
    "attributes",
    "budgets",
    "check_plot_support",
    "cmd_bench",
    "cpu_model",
    "format_header",
    "format_notes",
    "format_report",
    "format_table",
    "git_commit",
    "machine_info",
    "make_cases",
    "make_inputs",
    "make_model",
    "make_runtimes",
    "make_transposed_model",
    "max_abs_diff",
    "output_shapes",
    "parse_list",
    "physical_cores",
    "plot_ratios",
    "run_bench",
    "run_case",
    "settle",
    "table_columns",
    "time_alternating",
]
