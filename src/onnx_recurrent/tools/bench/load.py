"""Background load: busy processes beside the benchmark, as on a machine that is not idle."""

from __future__ import annotations

import atexit
import subprocess
import sys
import time

#: seconds the busy processes run before timing starts (the scheduler spreads them)
RAMP = 0.2
#: a busy process: ``while True: pass``, leaving every 10**6 turns (some 20 ms) once its
#: parent is gone (killed, so that nothing stopped it)
BUSY = (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(10**6): pass\n"
)


class BackgroundLoad:
    """``count`` processes that spin (``while True: pass``) while the context is open.

    They are killed and reaped on exit, on an error or Ctrl-C, and at interpreter exit
    should the context never close; should this process be killed, they end by
    themselves within some 20 ms.
    """

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"--background-load must be 0 or more, got {count}")
        self.count = count
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> BackgroundLoad:
        atexit.register(self.stop)
        try:
            for _ in range(self.count):
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BUSY],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(RAMP if self.count else 0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill and reap every busy process (idempotent)."""
        while self.processes:
            process = self.processes.pop()
            process.kill()
            process.wait()
        atexit.unregister(self.stop)
