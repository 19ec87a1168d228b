"""The runtimes: ours (the functions, a Layer, a session, a whole model under each host)
and the peers (onnxruntime, OpenVINO, onnx.reference); how each prepares one call of a
case, an operator's or a whole model's, and what it cannot run."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..check.peers import (
    onnxruntime_options,
    onnxruntime_session,
    openvino_model,
    reference_evaluator,
)
from .cases import Case, attributes, make_transposed_model, output_shapes
from .machine import blas_info, physical_cores
from .options import Options

Call = Callable[[], Sequence[np.ndarray]]


class Unavailable(Exception):
    """Raised by :meth:`Runtime.prepare` when the runtime cannot be had (its message,
    the reason it is skipped with, says why), as opposed to failing on the case."""


class Runtime:
    """A runtime. Subclasses say whether they are installed, what they cannot run, and
    how to prepare one call of a case (:meth:`prepare`: ``case``, its ONNX model, the
    feeds by input name)."""

    name = ""  # key, used in --runtimes and the JSON
    title = ""  # column title
    short = ""  # column title of its difference from ours
    module: str | None = None  # imported to see whether it is installed
    install = ""  # pip name
    main = False  # one of ours: the case fails when none of them runs
    peer: str | None = None  # a peer's name in check (check.peers.PEERS, its lint)

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def missing(self) -> str | None:
        """None if installed, else why not."""
        if self.module is None:
            return None
        try:
            importlib.import_module(self.module)
        except ImportError as e:
            if isinstance(e, ModuleNotFoundError) and e.name == self.module:
                return f"not installed ({e}; pip install {self.install})"
            return f"installed, but fails to import ({e})"
        return None

    def handles(self, case: Any) -> Collection[str]:
        """What it gets wrong in ``case`` but works around itself (``Finding.feature`` of
        check's lint): not a reason to skip it (:func:`known_wrong`)."""
        return ()

    def unsupported(self, case: Any) -> str | None:
        """None if it can run ``case``, else why not (what it gets wrong is probed:
        :func:`known_wrong`)."""
        return None

    def prepare(self, case: Any, model: Any, feeds: dict[str, np.ndarray]) -> Call:
        raise NotImplementedError

    def info(self) -> str:
        return ""


class Ours(Runtime):
    """Ours through the functions (:func:`onnx_recurrent.gru`...)."""

    name, title, short, main = "ours", "ours ms", "", True

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        fn = getattr(onnx_recurrent, case.op.lower())
        args = [feeds["X"], feeds["W"], feeds["R"], feeds["B"], feeds.get("sequence_lens")]
        kwargs = {**attributes(case), "output_sequence": True}
        return lambda: fn(*args, **kwargs)

    def info(self) -> str:
        import onnx_recurrent
        from onnx_recurrent.backends import tuning
        from onnx_recurrent.threads import num_threads

        parts = [f"onnx-recurrent {onnx_recurrent.__version__}", f"NumPy {np.__version__}"]
        parts.append(blas_info())
        if "numba" in sys.modules:
            parts.append(f"numba {sys.modules['numba'].__version__}")
        parts.append(f"own threads {num_threads()}")
        parts.append(f"plan for this CPU: {tuning.describe()}")
        return ", ".join(parts)


class OursLayer(Runtime):
    """Ours through a prepared :class:`onnx_recurrent.Layer`, made once per case outside
    the timing: the same kernels as the functions, without their per-call checks and
    preparation."""

    name, title, short = "layer", "Layer ms", "Δ layer"

    def missing(self) -> str | None:
        import onnx_recurrent

        return None if hasattr(onnx_recurrent, "Layer") else "this onnx-recurrent has no Layer"

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        layer = onnx_recurrent.Layer(case.op, feeds["W"], feeds["R"], feeds["B"], attributes(case))
        X, lengths = feeds["X"], feeds.get("sequence_lens")
        return lambda: layer(X, lengths, output_sequence=True)

    def info(self) -> str:
        return "ours through a prepared onnx_recurrent.Layer (made once, outside the timing)"


class OursSession(Runtime):
    name, title, short = "session", "session ms", "Δ session"

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        session = onnx_recurrent.InferenceSession(model)
        return lambda: session.run(None, feeds)

    def info(self) -> str:
        return "ours through onnx_recurrent.InferenceSession"


def _takes_host() -> bool:
    import onnx_recurrent

    try:
        parameters = inspect.signature(onnx_recurrent.InferenceSession).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: try it
    return "host" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class OursHost(Runtime):
    """Ours on a whole model: :class:`onnx_recurrent.InferenceSession` under ``host``
    ("onnxruntime": it runs the graph, the recurrent nodes are custom ops computed by
    onnx-recurrent; "reference": onnx.reference runs the graph), made once per case
    outside the timing."""

    main = True

    def __init__(self, host: str, threads: int | None = None) -> None:
        super().__init__(threads)
        self.host = host
        short = {"onnxruntime": "ort", "reference": "ref"}[host]
        self.name, self.face = f"ours-{host}", f"ours ({short} host)"
        self.title, self.short = f"{self.face} ms", f"Δ {short} host"
        if host == "onnxruntime":
            self.module = self.install = "onnxruntime"

    def missing(self) -> str | None:
        reason = super().missing()
        if reason is None and self.host == "onnxruntime" and not _takes_host():
            reason = (
                "unavailable: this onnx-recurrent's InferenceSession takes no host= "
                "(no onnxruntime host)"
            )
        return reason

    def prepare(self, case, model, feeds):
        import onnx_recurrent

        kwargs: dict[str, Any] = {"host": self.host}
        if self.threads and self.host == "onnxruntime":
            kwargs["sess_options"] = onnxruntime_options(self.threads)
        try:
            session = onnx_recurrent.InferenceSession(model, **kwargs)
        except TypeError as e:
            if "host" not in str(e):
                raise
            if self.host != "reference":
                raise Unavailable(
                    f"unavailable: this onnx-recurrent's InferenceSession takes no host= "
                    f"(host={self.host!r} not available)"
                ) from e
            session = onnx_recurrent.InferenceSession(model)  # before the hosts: reference
        got = getattr(session, "host", self.host)
        if got != self.host:
            raise Unavailable(
                f"unavailable: asked for host {self.host!r}, the session has {got!r}"
            )

        def call():
            return session.run(None, feeds)

        if not hasattr(session, "host"):
            call.note = (
                "an InferenceSession without host= (onnx.reference runs the graph, "
                "onnx-recurrent the recurrent nodes: the reference host)"
            )
        return call

    def info(self) -> str:
        if self.host == "reference":
            import onnx

            return (
                "ours (ref host): onnx_recurrent.InferenceSession(host='reference'): onnx "
                f"{onnx.__version__}'s onnx.reference runs the graph, onnx-recurrent its "
                "recurrent nodes"
            )
        import onnxruntime as ort

        threads = f"intra_op_num_threads {self.threads}" if self.threads else "default threads"
        return (
            "ours (ort host): onnx_recurrent.InferenceSession(host='onnxruntime'): "
            f"onnxruntime {ort.__version__} runs the graph ({threads}), its recurrent nodes "
            "as custom ops computed by onnx-recurrent; " + Ours(self.threads).info()
        )


class OnnxRuntime(Runtime):
    name, title, short = "onnxruntime", "onnxruntime ms", "Δ ort"
    module = install = peer = "onnxruntime"

    def prepare(self, case, model, feeds):
        session = onnxruntime_session(model, self.threads)
        return lambda: session.run(None, feeds)

    def info(self) -> str:
        import onnxruntime as ort

        n = onnxruntime_options(self.threads).intra_op_num_threads
        threads = (
            f"intra_op_num_threads {n}"
            if n
            else f"intra_op_num_threads default (0: one per physical core, {physical_cores()})"
        )
        if n and not self.threads:
            threads += (
                f" (the CPUs of this process: its default, one thread per physical core "
                f"of the machine ({physical_cores()}), would run threads outside them)"
            )
        return f"onnxruntime {ort.__version__} CPUExecutionProvider, {threads}"


def openvino_reason(error: BaseException) -> str:
    """The telling line of an OpenVINO error: the operators it could not convert, or the
    first line that is not a source location (its messages start with those)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("-- Conversion is failed for:"):
            return (
                "cannot convert the model: "
                + line.removeprefix("-- Conversion is failed for:").strip()
            )
    noise = ("Exception from ", "Check '")
    telling = [line for line in lines if not line.startswith(noise)]
    return (telling or lines or [type(error).__name__])[0]


class OpenVINO(Runtime):
    name, title, short = "openvino", "OpenVINO ms", "Δ ov"
    module = install = peer = "openvino"

    def __init__(self, threads: int | None = None) -> None:
        super().__init__(threads)
        self.threads_used: int | None = None

    def handles(self, case):
        # prepare() times an operator's equivalent time-major model
        return ("layout",) if isinstance(case, Case) else ()

    def compile(self, model: Any, feeds: dict[str, np.ndarray]) -> Call:
        """One reused infer request on ``model`` (f32 precision), fed ``feeds``."""
        try:
            compiled = openvino_model(model, self.threads)
        except RuntimeError as e:
            raise RuntimeError(openvino_reason(e)) from e
        with contextlib.suppress(Exception):
            self.threads_used = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        request = compiled.create_infer_request()
        count = len(compiled.outputs)

        def call():
            request.infer(feeds, share_inputs=True)
            return [request.get_output_tensor(i).data for i in range(count)]

        return call

    def prepare(self, case, model, feeds):
        call = self.compile(model, feeds)
        if isinstance(case, Case) and case.layout == 1:
            # OpenVINO may ignore layout=1 (2026.4 computes as if X were time-major):
            # if its outputs have the wrong shapes, time the equivalent model instead.
            got = [tuple(o.shape) for o in call()]
            if got != output_shapes(case):
                transposed = make_transposed_model(case, feeds, model.opset_import[0].version)
                call = self.compile(transposed, feeds)
                call.note = (
                    "ignores layout=1 (computes as if X were [T, N, I]; wrong output shapes):"
                    " timed instead on the equivalent model, Transposes around a layout=0 node"
                )
        return call

    def info(self) -> str:
        import openvino as ov

        version = ov.__version__.split("-")[0]
        threads = self.threads_used if self.threads_used is not None else "?"
        return (
            f"OpenVINO {version} CPU, INFERENCE_PRECISION_HINT f32, "
            f"INFERENCE_NUM_THREADS {threads}, one reused infer request"
        )


class Reference(Runtime):
    name, title, short = "reference", "onnx.reference ms", "Δ ref"
    module, install, peer = "onnx.reference", "onnx", "onnx.reference"
    alone = False  # on whole models: without onnx-recurrent's operators

    def __init__(self, threads: int | None = None, skip_shapes: Iterable[str] = ()) -> None:
        super().__init__(threads)
        self.skip_shapes = set(skip_shapes)

    def unsupported(self, case):
        if isinstance(case, Case) and case.shape.name in self.skip_shapes:
            return f"skipped at {case.shape.name} (--skip-reference)"
        return None

    def prepare(self, case, model, feeds):
        evaluator = reference_evaluator(model)
        return lambda: evaluator.run(None, feeds)

    def info(self) -> str:
        import onnx

        alone = " alone, without onnx-recurrent's operators" if self.alone else ""
        evaluator = "onnx.reference.ReferenceEvaluator, its Loop corrected"
        return f"onnx {onnx.__version__} ({evaluator}){alone}"


def known_wrong(
    model: Any,
    handled: Mapping[str, Collection[str]] | None = None,
    runtimes: Iterable[str] | None = None,
) -> dict[str, str]:
    """What each peer alone gets wrong in ``model``, as check's lint probes it
    (:func:`onnx_recurrent.tools.check.lint.lint`), by runtime name: the reason to skip it.

    ``handled``: runtime name -> the lint features (``Finding.feature``) that the
    runtime works around itself, not reasons to skip it. ``runtimes``: probe only
    these (default: every installed one).
    """
    wanted = None if runtimes is None else set(runtimes)
    names = {
        r.name: r.peer
        for r in (OnnxRuntime, OpenVINO, Reference)
        if wanted is None or r.name in wanted
    }
    if not names:
        return {}
    try:
        from ..check.lint import lint

        findings = lint(model, list(names.values()))
    except Exception:
        return {}
    handled = handled or {}
    reasons: dict[str, list[str]] = {}
    for name, peer in names.items():
        for f in findings:
            if f.peer != peer or f.feature in handled.get(name, ()):
                continue
            if f.message not in reasons.get(name, []):
                reasons.setdefault(name, []).append(f.message)
    return {name: "known wrong: " + "; ".join(m) for name, m in reasons.items()}


def make_runtimes(options: Options | None = None, **changes: Any) -> list[Runtime]:
    """The runtimes of a run (``options`` with ``changes``, see :class:`Options`), in
    the column order: ours first (the functions; on whole models, each host), then the
    named ones."""
    options = replace(options, **changes) if options else Options(**changes)
    threads, names = options.threads, options.runtime_names
    made: dict[str, Callable[[], Runtime]] = {
        "ours": lambda: Ours(threads),
        "ours-onnxruntime": lambda: OursHost("onnxruntime", threads),
        "ours-reference": lambda: OursHost("reference", threads),
        "layer": lambda: OursLayer(threads),
        "session": lambda: OursSession(threads),
        "onnxruntime": lambda: OnnxRuntime(threads),
        "openvino": lambda: OpenVINO(threads),
        "reference": lambda: Reference(threads, options.skip_reference),
    }
    order = options.runtime_names if options.models else ("ours", *names)
    runtimes = [made[n]() for n in made if n in order]
    for r in runtimes:
        if isinstance(r, Reference):
            r.alone = options.models
    return runtimes
