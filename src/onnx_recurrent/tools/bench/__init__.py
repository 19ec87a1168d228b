"""``onnx-recurrent bench``: onnx-recurrent against onnxruntime, OpenVINO and onnx.reference.

Two kinds of case, one run loop, one report. ``bench``: every case is one recurrent node
(GRU, LSTM or RNN) at one shape (step: one time step of one sequence; S, M, L); the
peers run the same single-node ONNX model, ours runs through its functions and, as
runtimes of their own, through a prepared :class:`~onnx_recurrent.Layer` and through
:class:`~onnx_recurrent.InferenceSession`; the report judges ours against the targets and
gives our GMAC/s as a share of the machine's sgemm peak. ``bench models``: whole models
(Silero VAD, DTLN, GTCRN, the bundled example, single nodes onnxruntime gets wrong), ours
through :class:`~onnx_recurrent.InferenceSession` under each host against each peer
alone, with each host's ratio to onnxruntime alone.

After a warm-up, the runtimes are called in alternation, one call each per round, with
an untimed pause after each call until no thread spins; the median of the rounds is
reported with its quartiles and each runtime's largest difference from our outputs
(optionally beside busy processes: ``--background-load``).

Modules, in the order they import each other: ``cases`` (the operator cases: shapes,
variants, targets, inputs, models), ``models`` (the whole-model cases), ``options``
(:class:`Options`, one run's), ``runtimes`` (ours and the peers, which check's
``peers`` builds), ``timing`` (alternating calls; one case run, :func:`run_case`, and its
:class:`CaseResult`), ``report`` and ``plot`` (the output), ``driver`` (a whole run,
:func:`run_bench`), ``command`` (the command line); ``load`` (the busy processes) and
``machine`` (what the header says about the machine, the sgemm peak) beside them.
"""

from __future__ import annotations

from .cases import (
    OPS,
    SHAPES,
    TOLERANCE,
    YARDSTICKS,
    Case,
    Shape,
    make_cases,
    make_inputs,
    make_model,
    make_transposed_model,
    output_shapes,
)
from .command import add_parser, cmd_bench
from .driver import Bench, run_bench
from .load import BackgroundLoad
from .machine import sgemm_peak
from .models import (
    MODEL_CASES,
    MODELS_DIR_VARIABLE,
    ModelCase,
    ModelFile,
    dtln_feeds,
    gtcrn_feeds,
    make_model_cases,
    silero_feeds,
    voice,
    whisper_silero_feeds,
)
from .options import COMPETITORS, MODEL_OURS, MODEL_RUNTIMES, Options, budgets
from .plot import plot_ratios
from .report import format_double, format_notes, format_report, format_table
from .runtimes import (
    OnnxRuntime,
    OpenVINO,
    Ours,
    OursHost,
    OursLayer,
    OursSession,
    Reference,
    Runtime,
    Unavailable,
    known_wrong,
    make_runtimes,
)
from .timing import CaseResult, max_abs_diff, run_case, settle, time_alternating

__all__ = [
    "COMPETITORS",
    "MODELS_DIR_VARIABLE",
    "MODEL_CASES",
    "MODEL_OURS",
    "MODEL_RUNTIMES",
    "OPS",
    "SHAPES",
    "TOLERANCE",
    "YARDSTICKS",
    "BackgroundLoad",
    "Bench",
    "Case",
    "CaseResult",
    "ModelCase",
    "ModelFile",
    "OnnxRuntime",
    "OpenVINO",
    "Options",
    "Ours",
    "OursHost",
    "OursLayer",
    "OursSession",
    "Reference",
    "Runtime",
    "Shape",
    "Unavailable",
    "add_parser",
    "budgets",
    "cmd_bench",
    "dtln_feeds",
    "format_double",
    "format_notes",
    "format_report",
    "format_table",
    "gtcrn_feeds",
    "known_wrong",
    "make_cases",
    "make_inputs",
    "make_model",
    "make_model_cases",
    "make_runtimes",
    "make_transposed_model",
    "max_abs_diff",
    "output_shapes",
    "plot_ratios",
    "run_bench",
    "run_case",
    "settle",
    "sgemm_peak",
    "silero_feeds",
    "time_alternating",
    "voice",
    "whisper_silero_feeds",
]
