"""Child Python processes for the fault tests: one set up, then sent Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time


def interrupted(
    code: str, delay: float = 0.5, timeout: float = 300, signum: int = signal.SIGINT
) -> tuple[int, str, str]:
    """Run ``code`` (dedented) in a child Python with tests/ on its path; once it prints
    ``ready``, wait ``delay`` s and send it ``signum`` (SIGINT). Its exit status, stdout
    and stderr."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)},
        # a shell's background job inherits SIGINT ignored, nohup SIGHUP: the child
        # gets the default action of the signal it is sent
        preexec_fn=None
        if signum == signal.SIGKILL
        else lambda: signal.signal(signum, signal.SIG_DFL),
    )
    line = child.stdout.readline().strip()
    if line != "ready":
        child.kill()
        out, err = child.communicate()
        return child.returncode, line + out, err
    time.sleep(delay)
    child.send_signal(signum)
    out, err = child.communicate(timeout=timeout)
    return child.returncode, out, err
