"""The CPU quota of the process's control group: how much CPU time a container allows.

A container limited to 2 CPUs' worth of time on a 16-core host still lets its processes
run on all 16 CPUs (the affinity), so a pool sized from the affinity alone starts 16
threads that share 2 CPUs' time and wait for each other at every step. Linux only;
elsewhere, and wherever the files cannot be read or make no sense, there is no quota.

The quota is read from the cgroup files under a root directory (``/``, or a fake tree
in the tests): the process's cgroups from ``proc/self/cgroup``, where they are mounted
from ``proc/self/mountinfo`` (else the usual places under ``sys/fs/cgroup``), then

- cgroup v2 (the ``0::/path`` line): ``cpu.max``, ``"$QUOTA $PERIOD"`` in µs, ``max``
  for no limit;
- cgroup v1 (the line whose controllers include ``cpu``): ``cpu.cfs_quota_us`` (-1 for
  no limit) over ``cpu.cfs_period_us``,

in the process's cgroup and each of its parents up to the mount's root (a parent's
quota bounds its children's): the smallest is the quota.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from functools import cache
from pathlib import Path

#: where cgroup v1's ``cpu`` controller is usually mounted when ``mountinfo`` says nothing
V1_MOUNTS = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpuacct,cpu", "sys/fs/cgroup/cpu")
#: where the cgroup v2 hierarchy is usually mounted when ``mountinfo`` says nothing
V2_MOUNTS = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
_ESCAPE = re.compile(r"\\([0-7]{3})")


def read(root: str | os.PathLike = "/") -> float | None:
    """The CPUs' worth of time the process's cgroups allow, e.g. 1.5: the smallest
    quota over period of its cgroup and of each parent, v2 and v1 alike.

    Parameters
    ----------
    root : str or os.PathLike
        The directory that holds ``proc/self/cgroup``, ``proc/self/mountinfo`` and
        ``sys/fs/cgroup`` (``/``; a fake tree in tests). Mount points found in
        ``mountinfo`` are taken under it.

    Returns
    -------
    float or None
        The quota in CPUs, > 0; None where there is none (no cgroup file, ``max``,
        ``-1``), or where no file could be read and understood: a file unreadable or
        malformed counts as no quota, and nothing is raised.
    """
    root = Path(root)
    groups = _groups(root)
    if not groups:
        return None
    mounts = _mounts(root)
    found: list[float] = []
    for version, path in groups:
        for directory in _directories(root, version, path, mounts):
            found.extend(_quota(version, directory))
    return min(found, default=None)


@cache
def cpus(root: str | os.PathLike = "/") -> int | None:
    """The quota as a number of threads: :func:`read`, rounded up, at least 1.

    Read once per process and ``root``, on first use (every call of the library asks
    for it); a child made with ``os.fork`` keeps the value, as it starts in its
    parent's cgroup.

    Returns
    -------
    int or None
        None where there is no quota (or none that could be read).
    """
    quota = read(root)
    return None if quota is None else max(1, math.ceil(quota))


def _text(path: Path) -> str | None:
    """The file's text, or None where it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="strict")
    except (OSError, ValueError):  # ValueError: undecodable, or a NUL in the path
        return None


def _groups(root: Path) -> list[tuple[int, str]]:
    """``(version, path)`` of the process's cgroups that can hold a CPU quota:
    ``(2, path)`` from the ``0::`` line, ``(1, path)`` from the line naming ``cpu``."""
    text = _text(root / "proc" / "self" / "cgroup")
    groups = []
    for line in (text or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, colon, path = rest.partition(":")
        if not colon or not path.startswith("/"):
            continue
        if number == "0" and not controllers:
            groups.append((2, path))
        elif "cpu" in controllers.split(","):
            groups.append((1, path))
    return groups


def _mounts(root: Path) -> list[tuple[int, str, str]]:
    """``(version, mount point, root of the mount)`` of the cgroup file systems that
    ``proc/self/mountinfo`` lists: cgroup2, and cgroup (v1) with the ``cpu`` controller."""
    text = _text(root / "proc" / "self" / "mountinfo")
    mounts = []
    for line in (text or "").splitlines():
        mine, dash, theirs = line.partition(" - ")
        fields, other = mine.split(), theirs.split()
        if not dash or len(fields) < 5 or len(other) < 3:
            continue
        source_root, point = _unescape(fields[3]), _unescape(fields[4])
        if other[0] == "cgroup2":
            mounts.append((2, point, source_root))
        elif other[0] == "cgroup" and "cpu" in other[2].split(","):
            mounts.append((1, point, source_root))
    return mounts


def _unescape(field: str) -> str:
    r"""mountinfo's octal escapes (``\040`` for a space) undone."""
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), field)


def _directories(
    root: Path, version: int, path: str, mounts: list[tuple[int, str, str]]
) -> list[Path]:
    """The directories of the cgroup ``path`` and of its parents, up to the root of
    its mount, in each place its hierarchy may be mounted."""
    places = [(point, source) for v, point, source in mounts if v == version]
    if not places:
        places = [("/" + p, "/") for p in (V2_MOUNTS if version == 2 else V1_MOUNTS)]
    directories = []
    for point, source in places:
        # the path within the mount: the cgroup's path less the mount's own root (a
        # container's v1 mounts are often its cgroup, e.g. /docker/<id>, seen as /)
        relative = path
        if source != "/":
            if path == source or path.startswith(source.rstrip("/") + "/"):
                relative = path[len(source.rstrip("/")) :]
            else:
                relative = "/"  # outside the mount: its root is all that can be read
        parts = [p for p in posixpath.normpath("/" + relative).split("/") if p]
        base = root / point.lstrip("/")
        directories.extend(base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1))
    return directories


def _quota(version: int, directory: Path) -> list[float]:
    """The quota in ``directory`` in CPUs, as a list of none or one."""
    if version == 2:
        fields = (_text(directory / "cpu.max") or "").split()
        if len(fields) != 2 or fields[0] == "max":
            return []
        quota, period = fields
    else:
        quota = (_text(directory / "cpu.cfs_quota_us") or "").strip()
        period = (_text(directory / "cpu.cfs_period_us") or "").strip()
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # absent, empty or malformed
        return []
    if quota_us <= 0 or period_us <= 0:  # v1's -1: no limit
        return []
    return [quota_us / period_us]
