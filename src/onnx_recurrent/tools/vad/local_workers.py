"""Preloaded into each worker process of ``vad --workers`` (Dask's ``preload``).

A terminal's Ctrl-C reaches the whole process group: the command stops the cluster
itself, and each worker's own KeyboardInterrupt only printed Dask's tracebacks and
held the exit up. A worker takes SIGINT's default action instead: it ends at once,
quietly.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def _end_on_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)


_end_on_sigint()  # at import: before the worker starts


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: SIGINT's default action (again, where the worker set a
    handler since)."""
    _end_on_sigint()
