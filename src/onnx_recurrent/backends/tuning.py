"""Choices measured on the CPU the kernels run on (the FFTW and ATLAS way), kept per CPU.

A *plan* here is a few numbers that change speed, never results: the rows of a product
tile (:data:`.packed.ROWS`), the rows of ``B`` every tile reads in one pass
(:data:`.packed.DEPTHS`), the panels a one- or two-row tile spans
(:data:`.packed.SPANS`), how the threads of a call split one direction (share its
hidden units or deal its rows, :mod:`..scan`), per size class of its weights (and
for ragged rows, per class and phases of a step), and from
how many multiply-adds a call runs on threads at all (``parallel``). Each is timed
once, the first time it is needed, among its candidates on the running CPU (a few
seconds: :func:`measure_tiles`, and the scan's own for the threads), and kept in a
small JSON file named by the CPU's name and features and numba's version, beside the
compiled kernels (``onnx-recurrent/tuning`` in the user cache directory,
:mod:`.cache_dirs`): later processes read it and measure nothing. A CPU nobody has seen
gets a measured choice, not a table entry.

``ONNX_RECURRENT_PLAN``: unset, the kept choices; ``measure``, measure again (once in
the process) and keep the new ones; ``rows=8,span=4,share=0``, those values, neither
measured nor kept (for experiments; a name not given is planned as usual; ``share``:
every size class's split, ``share21=1`` one class's; ``ragged``: every class's split of
ragged rows, both kinds of step).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import llvmlite
import llvmlite.binding as ll

from .. import threads
from ..errors import RecurrentError
from .cache_dirs import (
    CompileCacheWarning,
    first_usable,
    read_regular,
    readable_roots,
    write_atomic,
)

#: the environment variable (see the module)
ENV = "ONNX_RECURRENT_PLAN"
#: names a plan may hold, with the values each may take
FIELDS = {
    "rows": (1, 2, 4, 6, 8, 12),
    "span": (1, 2, 4),
    "depth": (0, 128, 256, 512),
    "share": (0, 1),  # given: every size class's (below); not measured itself
    "ragged": (0, 1),  # given: every class's of ragged rows (below); likewise
    "parallel": (22, 23, 24, 25, 26, 27),  # 2**k multiply-adds of a call for threads
}
#: size classes of the threads' split of a direction: ``share<k>`` for ``2**k`` bytes of
#: weights a step, the nearest power of two (64 KiB to 64 MiB)
SHARE_CLASSES = tuple(range(16, 27))
NAMES = tuple(FIELDS)  # the names without the classes
FIELDS |= {f"share{k}": (0, 1) for k in SHARE_CLASSES}
#: the same for ragged rows (sharing the hidden units or buckets of rows): ``ragged<k>``
#: for steps of one phase, ``raggedsplit<k>`` for two (GRU, linear_before_reset = 0),
#: whose extra meeting a step tips the balance on some CPUs (a lent Intel Xeon, M ragged,
#: sharing over buckets: LSTM 0.94-0.99 of the time, GRU 1.06)
RAGGED_KINDS = ("ragged", "raggedsplit")
FIELDS |= {f"{kind}{k}": (0, 1) for kind in RAGGED_KINDS for k in SHARE_CLASSES}
#: a ragged bucket's step product, ``[rows, K] x [K, columns]`` (:data:`..scan.BUCKET_ROWS`
#: rows, an LSTM's at H=256), among the shapes the tiles are timed on: a tile of 6 rows
#: cuts it 6 + 2 (AMD EPYC: M ragged LSTM 3% slower than with 8, which the batch's and the
#: large layer's steps alone had chosen as often as not)
BUCKET_STEP = (8, 384, 1024)
#: bump when the candidates or what a name means change: earlier files are ignored
VERSION = 3

_log = logging.getLogger("onnx_recurrent")
_lock = threading.RLock()
_kept: dict[str, int] | None = None  # the file's choices, read once
_unkept_said = False  # a plan that could not be written, said
_measured: set[str] = set()  # names measured in this process (ONNX_RECURRENT_PLAN=measure)


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: a lock another thread held while it
    measured would never be released there (a fresh one; the kept choices stay)."""
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def planned(names: tuple[str, ...], measure: Callable[[], dict[str, int]]) -> dict[str, int]:
    """The values of ``names``: given by ``ONNX_RECURRENT_PLAN``, else kept for this
    CPU, else ``measure()`` (which returns them all), then kept.

    Raises
    ------
    ValueError
        (``RecurrentError``) ``ONNX_RECURRENT_PLAN`` is malformed: the message names the
        variable, the value and what it accepts.
    """
    given, again = _environment()
    if all(n in given for n in names):
        return {n: given[n] for n in names}

    def due(kept: dict[str, int]) -> bool:
        return (again and not _measured.issuperset(names)) or not all(n in kept for n in names)

    def plan() -> dict[str, int]:
        with _lock:  # measured by one thread: the lock taken where it measures
            kept = _read()
            if due(kept):
                started = time.perf_counter()
                values = measure()
                _measured.update(names)
                kept |= {n: int(values[n]) for n in names}
                _write(kept)
                _log.info(
                    "onnx-recurrent: planned %s for this CPU in %.1f s",
                    ", ".join(f"{n}={values[n]}" for n in names),
                    time.perf_counter() - started,
                )
            return {n: given.get(n, kept[n]) for n in names}

    with _lock:
        kept = _read()
        if not due(kept):
            return {n: given.get(n, kept[n]) for n in names}
    # measuring compiles and runs kernels: out of Ctrl-C's reach, as a compile
    return threads.compiling(plan)


def state() -> tuple[bool, str | None]:
    """Whether a plan is kept for this CPU (any of its names), and the file (None: no
    writable cache directory)."""
    path = _path()
    return bool(_read()), None if path is None else str(path)


def describe() -> str:
    """The plan in use, e.g. ``rows=12 span=4 depth=0 share20=0 share21=1``: the names
    kept for this CPU or given by ``ONNX_RECURRENT_PLAN`` (given: marked so), without
    measuring."""
    given, _ = _environment()
    with _lock:
        kept = dict(_read())
    parts = [
        f"{n}={given[n]} (given)" if n in given else f"{n}={kept[n]}"
        for n in FIELDS
        if (n in given or n in kept)
        and (n in NAMES or not any(n.startswith(k) for k in ("share", "ragged") if k in given))
    ]
    return " ".join(parts) or "not measured yet"


def tiles() -> tuple[int, int, int]:
    """``(rows, span, depth)`` of the product tiles on this CPU (:func:`planned`)."""
    plan = planned(("rows", "span", "depth"), measure_tiles)
    return plan["rows"], plan["span"], plan["depth"]


def measure_tiles() -> dict[str, int]:
    """Time :func:`.packed.mm` for every candidate tile on the shapes that matter: the
    per-step products of a batch (``[32, 384] x [384, 768]``, a GRU's ``[Xt, Ht-1]
    [W^T; R^T]`` at H=256), of a large layer (``[64, 1024] x [1024, 1536]``) and of a
    ragged bucket (``[8, 384] x [384, 1024]``, :data:`..scan.BUCKET_ROWS` rows) for the
    rows and depth (every pair); one row against ``R^T`` (``[1, 256] x [256,
    1024]``) for the span. Each candidate's median of interleaved rounds; the least
    total time relative to each shape's best wins."""
    import itertools

    import numpy as np
    from numba import types

    from . import layout, packed
    from .jit_cache import prepare

    rng = np.random.default_rng(0)
    dt = np.dtype(np.float32)
    # compiled (or loaded) as the kernels are: a cache that cannot be written (a full
    # disk) failed the first call, from inside numba, in every process
    f32 = types.float32
    arrays = (types.Array(f32, 2, "C"), types.Array(f32, 3, "C"), types.Array(f32, 2, "C"))
    prepare(packed.time_mm, (*arrays, *(types.int64,) * 4))
    pairs = list(itertools.product(packed.ROWS, packed.DEPTHS))
    steps = [(32, 384, 768), (64, 1024, 1536), BUCKET_STEP]
    searches = (  # (names, candidates (rows, span, depth), shapes)
        (("rows", "depth"), [(r, 1, d) for r, d in pairs], steps),
        (("span",), [(max(packed.ROWS), s, 0) for s in packed.SPANS], [(1, 256, 1024)]),
    )
    chosen = {}
    for names, candidates, shapes in searches:
        scores = dict.fromkeys(candidates, 0.0)
        for n, K, N in shapes:
            A = rng.standard_normal((n, K)).astype(dt)
            Bp = layout.panels(rng.standard_normal((K, N)).astype(dt), dt)
            C = np.empty((n, layout.columns(N, dt)), dt)
            times: dict[tuple, list[float]] = {c: [] for c in candidates}
            repeat = max(1, int(2e6 // (n * K * N)))  # calls of a timed round: ~1 ms and more
            for _ in range(5):
                for c in candidates:
                    times[c].append(_time(packed.time_mm, A, Bp, C, *c, repeat))
            medians = {c: sorted(t)[len(t) // 2] for c, t in times.items()}
            _log.debug(
                "onnx-recurrent: %s at [%d, %d] x [%d, %d]: %s", "/".join(names), n, K, K, N,
                ", ".join(f"{c}: {1e6 * t / repeat:.1f} us" for c, t in medians.items()),
            )  # fmt: skip
            best = min(medians.values())
            for c, t in medians.items():
                scores[c] += t / best
        rows, span, depth = min(scores, key=lambda c: (scores[c], c))
        tile = {"rows": rows, "span": span, "depth": depth}
        chosen |= {n: tile[n] for n in names}
    return chosen


def _time(kernel, A, Bp, C, rows: int, span: int, depth: int, repeat: int) -> float:
    started = time.perf_counter()
    kernel(A, Bp, C, rows, span, depth, repeat)
    return time.perf_counter() - started


def _environment() -> tuple[dict[str, int], bool]:
    """``ONNX_RECURRENT_PLAN`` read: the values it gives, and whether to measure again."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return {}, False
    if value == "measure":
        return {}, True
    given = {}
    for item in value.split(","):
        name, _, number = item.strip().partition("=")
        name, number = name.strip(), number.strip()
        ascii_digits = re.fullmatch(r"[0-9]+", number) is not None  # not '²', '٨'
        if name in given:
            raise RecurrentError(f"{ENV}={value!r}: {name!r} given twice")
        if name not in FIELDS or not ascii_digits or int(number) not in FIELDS[name]:
            low, high = SHARE_CLASSES[0], SHARE_CLASSES[-1]
            accepted = "; ".join(f"{n} in {list(v)}" for n, v in FIELDS.items() if n in NAMES)
            accepted += f"; share{low} .. share{high} in [0, 1]"
            accepted += f"; ragged{low}, raggedsplit{low} .. in [0, 1]"
            raise RecurrentError(
                f"{ENV}={value!r}: expected 'measure' or name=value pairs separated by "
                f"commas ({accepted}), e.g. 'rows=8,span=4'; got {item.strip()!r}"
            )
        given[name] = int(number)
    if "share" in given:  # every size class's
        given = {f"share{k}": given["share"] for k in SHARE_CLASSES} | given
    if "ragged" in given:
        kinds = {f"{kind}{k}": given["ragged"] for kind in RAGGED_KINDS for k in SHARE_CLASSES}
        given = kinds | given
    return given, False


def _read() -> dict[str, int]:
    """The choices kept for this CPU (read once; a file that does not check out counts
    as none, and is replaced when a plan is made)."""
    global _kept
    if _kept is None:
        _kept = {}
        # each of our cache directories that is there, written to or not (a warm cache
        # shipped read-only), the first file that checks out
        for root in readable_roots("tuning"):
            try:
                text = read_regular(Path(root) / _file_name(), 1 << 16)
                data = json.loads(text) if text is not None else {}
            except (OSError, ValueError, RecursionError):  # nested past Python's stack
                data = {}
            if isinstance(data, dict) and data.get("key") == _identity():
                for name, values in FIELDS.items():
                    # an int, as written: 27.0 or true compare equal to 27 and 1, and
                    # broke every large call (a shift by a float)
                    if type(data.get(name)) is int and data[name] in values:
                        _kept[name] = data[name]
                if _kept:
                    break
    return _kept


def _write(kept: dict[str, int]) -> None:
    """Keep ``kept`` (:func:`.cache_dirs.write_atomic`); no writable cache: kept for
    this process only (the kernels' caches say so); a write that fails (a directory
    in its place, a full disk): said once, as a cache that cannot be written."""
    global _unkept_said
    path = _path()
    if path is None:
        return
    if not write_atomic(path, json.dumps({"key": _identity(), **kept}).encode()):
        if not _unkept_said:
            _unkept_said = True
            warnings.warn(
                f"onnx-recurrent could not keep its plan for this CPU at {path}: it is "
                "measured again in each process (about a second)",
                CompileCacheWarning,
                stacklevel=2,
            )


def _identity() -> str:
    """What a plan depends on: this CPU, numba's and llvmlite's versions, VERSION."""
    from .native_code import _version

    parts = (VERSION, ll.get_host_cpu_name(), _version("numba"), llvmlite.__version__)
    return repr((parts, ll.get_host_cpu_features().flatten()))


def _path() -> Path | None:
    root, _ = first_usable("tuning")
    return None if root is None else Path(root) / _file_name()


def _file_name() -> str:
    digest = hashlib.sha256(_identity().encode()).hexdigest()[:16]
    return f"plan-{ll.get_host_cpu_name()}-{digest}.json"


def forget() -> None:
    """Read the kept file again on the next :func:`planned` (tests)."""
    global _kept
    with _lock:
        _kept = None
        _measured.clear()
