"""What the report says about the machine: CPU, cores, BLAS, commit."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Described(Protocol):
    """What :func:`machine_info` reads of a runtime (``bench.runtimes.Runtime`` is one;
    a protocol, so that this module does not import that one, which imports it)."""

    name: str

    def missing(self) -> str | None: ...

    def info(self) -> str: ...


def blas_info() -> str:
    from threadpoolctl import threadpool_info

    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if pools:
        p = pools[0]
        return f"BLAS {p.get('internal_api')} threads {p.get('num_threads')}"
    name = "?"
    with contextlib.suppress(Exception):
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        name = f"{blas['name']} {blas.get('version', '')}".strip()
    names = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
    env = [f"{v}={os.environ[v]}" for v in names if v in os.environ]
    return f"BLAS {name} threads " + (", ".join(env) if env else "default (one per core)")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def physical_cores() -> int:
    cores = set()
    with contextlib.suppress(OSError):
        physical = core = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                physical = value.strip()
            elif key == "core id":
                core = value.strip()
                cores.add((physical, core))
    return len(cores) or (os.cpu_count() or 1)


def git_commit() -> str | None:
    """The short commit of the git checkout this package's source is tracked in (with
    '+ uncommitted changes' if the tree is dirty); None for an installed package (even
    in a virtual environment inside a checkout), or without git."""
    source = Path(__file__).resolve()
    root = next((d for d in source.parents if (d / ".git").exists()), None)
    if root is None:  # installed: no checkout to name
        return None

    def git(*args: str, check: bool = False) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=check
        )
        return done.stdout.strip()

    try:
        git("ls-files", "--error-unmatch", str(source), check=True)  # tracked here?
        head = git("rev-parse", "--short", "HEAD", check=True)
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} + uncommitted changes" if dirty else head


def machine_info(runtimes: Sequence[Described]) -> dict[str, Any]:
    affinity = usable_cpus()
    info = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "physical_cores": physical_cores(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": git_commit(),
        "runtimes": {},
    }
    for r in runtimes:
        if r.missing() is None:
            with contextlib.suppress(Exception):
                info["runtimes"][r.name] = r.info()
    return info


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


#: the side of the square float32 product that measures the sgemm peak
SGEMM_SIZE = 1024


def sgemm_call(size: int = SGEMM_SIZE) -> Callable[[], None]:
    """One square float32 product of ``size`` (``size**3`` multiply-adds) through NumPy's
    BLAS, on whatever threads BLAS has at the call: the operands made now."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty_like(a)

    def call() -> None:
        np.matmul(a, b, out=out)

    return call


def sgemm_gmacs(seconds, size: int = SGEMM_SIZE):
    """GMAC/s of a :func:`sgemm_call` of ``size`` that took ``seconds`` (a number or an
    array of them)."""
    return size**3 / seconds / 1e9


def sgemm_peak(size: int = SGEMM_SIZE, calls: int = 10) -> dict[str, float]:
    """The machine's float32 matrix-product peak, GMAC/s: NumPy's BLAS on a square
    ``size`` product (:func:`sgemm_call`), best of ``calls``, on every usable CPU
    ("all") and on one thread ("1"); "all" only, on BLAS's default threads, without
    threadpoolctl."""
    import time

    product = sgemm_call(size)

    def best() -> float:
        fastest = float("inf")
        for _ in range(calls + 1):  # the first: warm-up
            t0 = time.perf_counter()
            product()
            fastest = min(fastest, time.perf_counter() - t0)
        return sgemm_gmacs(fastest, size)

    from threadpoolctl import threadpool_limits

    with threadpool_limits(usable_cpus(), user_api="blas"):
        peaks = {"all": best()}
    with threadpool_limits(1, user_api="blas"):
        peaks["1"] = best()
    return peaks
