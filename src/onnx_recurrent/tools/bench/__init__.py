"""``onnx-recurrent bench``: onnx-recurrent against onnxruntime, OpenVINO and onnx.reference.

Every case is one recurrent node (GRU, LSTM or RNN) at one shape (step: one time step of
one sequence; S, M, L). The competitors run the same single-node ONNX model;
onnx-recurrent runs through its functional API and, as runtimes of their own, through a
prepared :class:`~onnx_recurrent.Layer` and through
:class:`~onnx_recurrent.InferenceSession`. After a warm-up, the runtimes are called in
alternation, one call each per round, with an untimed pause after each call until no
thread spins, and the median of the rounds is reported with its quartiles, with the ratio
of ours to the fastest peer (onnxruntime or OpenVINO) and to onnx.reference, each against
its target, and the largest absolute difference of each competitor's outputs from ours.
Also: our GMAC/s at M and L as a share of the machine's sgemm peak, and with background
load (busy processes) each runtime's contended over quiet time.

The pure parts (:func:`make_cases`, :func:`time_alternating`, :func:`format_report`) are
separate from the runtimes so that the tests can exercise them on the hidden ``tiny``
shape without timing anything. Modules: ``cases`` (shapes, variants, targets, inputs,
models), ``runtimes`` (the competitors), ``timing`` (alternating calls, one case's
result), ``load`` (the busy processes), ``report`` and ``plot`` (the output), ``machine``
(what the header says about the machine, the sgemm peak), ``driver`` (a whole run),
``command`` (the command line).

``onnx-recurrent bench --models`` (module ``models``) times whole models instead: Silero
VAD v6, public streaming models bundled under ``tests/data/models`` (Silero VAD as
faster-whisper ships it, DTLN, GTCRN), the bundled example and single nodes that
onnxruntime cannot run right by itself, ours through
:class:`~onnx_recurrent.InferenceSession` under each host against onnxruntime, OpenVINO
and onnx.reference alone, with the same timing, and reports each host's ratio to
onnxruntime alone.
"""

from __future__ import annotations

from .cases import (
    CONTENDED_BOUND,
    CONTENDED_LOAD,
    DEFAULT_BUDGET,
    DOUBLE_ACCURACY,
    GATES,
    MAX_REPEATS,
    MIN_REPEATS,
    OPS,
    OTHERS_WARNING,
    OUTPUTS,
    PEERS,
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
from .driver import Bench, CpuMeter, RunRecord, ThreadLimit, budgets, run_bench
from .load import BackgroundLoad
from .machine import cpu_model, git_commit, machine_info, physical_cores, sgemm_peak
from .models import (
    MODEL_CASES,
    MODEL_OURS,
    MODEL_RUNTIMES,
    MODELS_DIR_VARIABLE,
    ModelBench,
    ModelCase,
    ModelFile,
    ModelResult,
    OursOnnxRuntimeHost,
    OursReferenceHost,
    dtln_feeds,
    format_model_report,
    format_model_table,
    gtcrn_feeds,
    known_wrong,
    make_model_cases,
    make_model_runtimes,
    model_dirs,
    run_model_case,
    run_models,
    silero_feeds,
    voice,
    whisper_silero_feeds,
)
from .plot import check_plot_support, plot_ratios
from .report import (
    LEGEND,
    SHORT_NAMES,
    format_contention,
    format_double,
    format_header,
    format_notes,
    format_peak,
    format_report,
    format_table,
    markdown_table,
    table_columns,
)
from .runtimes import (
    COMPETITORS,
    RUNTIMES,
    Call,
    OnnxRuntime,
    OpenVINO,
    Ours,
    OursLayer,
    OursSession,
    Reference,
    Runtime,
    Unavailable,
    make_runtimes,
)
from .timing import (
    CaseResult,
    max_abs_diff,
    prepare_calls,
    run_case,
    settle,
    time_alternating,
    time_calls,
)

__all__ = [
    "COMPETITORS",
    "CONTENDED_BOUND",
    "CONTENDED_LOAD",
    "DEFAULT_BUDGET",
    "DOUBLE_ACCURACY",
    "GATES",
    "LEGEND",
    "MAX_REPEATS",
    "MIN_REPEATS",
    "MODELS_DIR_VARIABLE",
    "MODEL_CASES",
    "MODEL_OURS",
    "MODEL_RUNTIMES",
    "OPS",
    "OTHERS_WARNING",
    "OUTPUTS",
    "PEERS",
    "PUBLIC_SHAPES",
    "RUNTIMES",
    "SHAPES",
    "SHORT_NAMES",
    "TOLERANCE",
    "VARIANT_SHAPES",
    "BackgroundLoad",
    "Bench",
    "Call",
    "Case",
    "CaseResult",
    "CpuMeter",
    "ModelBench",
    "ModelCase",
    "ModelFile",
    "ModelResult",
    "OnnxRuntime",
    "OpenVINO",
    "Ours",
    "OursLayer",
    "OursOnnxRuntimeHost",
    "OursReferenceHost",
    "OursSession",
    "Reference",
    "RunRecord",
    "Runtime",
    "Shape",
    "Target",
    "ThreadLimit",
    "Unavailable",
    "add_parser",
    "attributes",
    "budgets",
    "check_plot_support",
    "cmd_bench",
    "cpu_model",
    "dtln_feeds",
    "format_contention",
    "format_double",
    "format_header",
    "format_model_report",
    "format_model_table",
    "format_notes",
    "format_peak",
    "format_report",
    "format_table",
    "git_commit",
    "gtcrn_feeds",
    "known_wrong",
    "machine_info",
    "make_cases",
    "make_inputs",
    "make_model",
    "make_model_cases",
    "make_model_runtimes",
    "make_runtimes",
    "make_transposed_model",
    "markdown_table",
    "max_abs_diff",
    "model_dirs",
    "output_shapes",
    "parse_list",
    "physical_cores",
    "plot_ratios",
    "prepare_calls",
    "run_bench",
    "run_case",
    "run_model_case",
    "run_models",
    "settle",
    "sgemm_peak",
    "silero_feeds",
    "table_columns",
    "time_alternating",
    "time_calls",
    "voice",
    "whisper_silero_feeds",
]
