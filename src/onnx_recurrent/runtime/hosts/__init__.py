"""Who runs a model's graph: onnxruntime (custom nodes) or onnx.reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from ... import threads
from ..bound import BoundNode

HOSTS = ("auto", "onnxruntime", "reference")


def make_host(
    host: str,
    model: onnx.ModelProto,
    bound: Mapping[tuple[str, ...], BoundNode],
    sess_options: Any = None,
    providers: Sequence[Any] | None = None,
    provider_options: Sequence[dict] | None = None,
    session_kwargs: Mapping[str, Any] | None = None,
):
    """The host object, and why ``"auto"`` fell back to the reference host ('' if not).

    Raises
    ------
    RuntimeError
        ``host="onnxruntime"`` and that host cannot run the model here; onnx.reference
        cannot load it (the reference host, the message naming the node).
    ValueError
        The reference host (``"reference"``, or ``"auto"`` falling back to it): a
        tensor whose data cannot be read, or a model that ``onnx.checker.check_model``
        refuses (its message).
    """
    if host == "reference":
        # a fork waits for the import (the child would hang); a Ctrl-C for its end (half
        # imported, onnx.reference failed for the process)
        with threads.COMPILING, threads.interrupts_held():
            from .reference import ReferenceHost

        return ReferenceHost(model, bound), ""
    with threads.COMPILING, threads.interrupts_held():
        from .onnxruntime import HostUnavailable, OnnxruntimeHost

    try:
        host_ = OnnxruntimeHost(
            model, bound, sess_options, providers, provider_options, session_kwargs
        )
        return host_, ""
    except HostUnavailable as e:
        if host == "onnxruntime":
            error = RuntimeError(f"host='onnxruntime' cannot run this model: {e}")
            error.onnxruntime_type = e.onnxruntime_type  # type: ignore[attr-defined]
            raise error from None
        with threads.COMPILING, threads.interrupts_held():
            from .reference import ReferenceHost

        return ReferenceHost(model, bound), str(e)
