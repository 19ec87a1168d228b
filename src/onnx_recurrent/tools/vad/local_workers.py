"""Preloaded into each worker process of ``vad --workers`` (Dask's ``preload``).

A terminal's Ctrl-C reaches the whole process group: the command stops the cluster
itself, and each worker's own KeyboardInterrupt only printed Dask's tracebacks and
held the exit up. A worker takes SIGINT's default action instead: it ends at once,
quietly. Its ``distributed`` log says only what is critical: the command reports
each file's error itself, and a cluster closed under a worker (the command ended by a
signal, or by ``| head``) had it print heartbeat tracebacks and "ended with
CancelledError" warnings after the command's own line.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any


def _end_on_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


_end_on_sigint()  # at import: before the worker starts


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: SIGINT's default action and a quiet log (again, where the
    worker set a handler or a level since)."""
    _end_on_sigint()
