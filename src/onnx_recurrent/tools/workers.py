"""What the Dask tools keep in each worker process: sessions made once, and Dask itself.

:func:`check_client` refuses a client whose workers could not run our tasks;
:func:`kept_session` holds a few sessions per process, keyed by what made them
(:func:`onnx_recurrent.tools.dask.run`: the model's hash, host and options; the VAD on
a cluster, :mod:`onnx_recurrent.tools.vad.cluster`: its model); :func:`options_record`
and :func:`session_options` carry onnxruntime ``SessionOptions`` (which do not pickle)
to the workers; :data:`INSTALL_HINT` is what the tools say to install Dask.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import RecurrentError, one_line
from ..runtime.hosts.session_options import (
    PROVIDERS_HELD,
    check_session_options,
    holds_providers,
    readable_settings,
)
from ..threads import ForkLock

#: what the Dask tools say to run where Dask is missing
INSTALL_HINT = "pip install dask distributed"
#: the distribution whose version the workers must have
_DISTRIBUTION = "onnx-recurrent"

#: sessions kept per worker process, least recently used dropped first
MAX_SESSIONS = 4
#: the sessions kept in this process, by key
SESSIONS: OrderedDict[tuple, Any] = OrderedDict()
_sessions_lock = ForkLock()


def options_record(sess_options: Any) -> tuple | None:
    """The picklable part of onnxruntime ``SessionOptions``: what onnxruntime lets one
    read back (:func:`onnx_recurrent.runtime.hosts.session_options.readable_settings`:
    the attributes, the configuration entries set), as the onnxruntime host copies it.

    Raises
    ------
    onnx_recurrent.errors.RecurrentTypeError
        ``sess_options`` is not an ``onnxruntime.SessionOptions`` or None.
    onnx_recurrent.errors.RecurrentError
        They hold execution providers, which onnxruntime gives no way to read.
    """
    check_session_options(sess_options)
    if sess_options is None:
        return None
    if holds_providers(sess_options):
        raise RecurrentError(f"{PROVIDERS_HELD}, which cannot be carried to the workers")
    return readable_settings(sess_options)


def session_options(record: tuple | None) -> Any:
    """onnxruntime ``SessionOptions`` made from :func:`options_record`'s record."""
    if record is None:
        return None
    import onnxruntime

    attributes, entries = record
    options = onnxruntime.SessionOptions()
    for name, value in attributes:
        setattr(options, name, value)
    for entry, value in entries:
        options.add_session_config_entry(entry, value)
    return options


def kept_session(key: tuple, make: Callable[[], Any]) -> Any:
    """The session kept in this process under ``key``, made by ``make()`` the first
    time; the least recently used beyond :data:`MAX_SESSIONS` are dropped."""
    with _sessions_lock:
        session = SESSIONS.get(key)
        if session is None:
            session = SESSIONS[key] = make()
            while len(SESSIONS) > MAX_SESSIONS:
                SESSIONS.popitem(last=False)
        else:
            SESSIONS.move_to_end(key)
    return session


def check_client(client: Any) -> None:
    """Refuse a closed ``distributed.Client``, and one whose workers cannot import
    onnx_recurrent or have another version of it (a task of ours would not run there:
    the client would wait for it forever).

    Only the standard library runs on the workers (``importlib``), so this works where
    they lack the package. :func:`onnx_recurrent.tools.vad.cluster.detect` and
    :func:`onnx_recurrent.tools.dask.run`
    (under a client) call it. A worker without the distribution's metadata (the package
    on its ``PYTHONPATH``) is taken as it is.

    Raises
    ------
    onnx_recurrent.errors.RecurrentError
        (a ``ValueError``) The client is closed, or workers lack the package or have
        another version (named, with what each has).
    """
    status = getattr(client, "status", None)
    if status in ("closing", "closed"):
        raise RecurrentError(
            f"the client is {status}: give an open distributed.Client, not one "
            "closed (client.close() ends it for good)"
        )
    found = client.run(importlib.util.find_spec, "onnx_recurrent", on_error="return")
    lacking = {
        w: "not installed" if spec is None else f"not importable ({one_line(spec)})"
        for w, spec in found.items()
        if spec is None or isinstance(spec, BaseException)
    }
    try:
        here = importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        here = None
    if here is not None and len(lacking) < len(found):
        versions = client.run(
            importlib.metadata.version,
            _DISTRIBUTION,
            workers=[w for w in found if w not in lacking],
            on_error="return",
        )
        lacking.update(
            (w, f"version {v}") for w, v in versions.items() if isinstance(v, str) and v != here
        )
    if lacking:
        listed = "; ".join(f"{w}: {why}" for w, why in sorted(lacking.items()))
        raise RecurrentError(
            f"{len(lacking)} of the client's {len(found)} workers lack onnx_recurrent "
            f"{here or ''}".rstrip()
            + f" ({listed}): install it there (the same version) or restart them with it"
        )
