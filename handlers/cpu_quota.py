"""How many CPUs this process can use at once: its CPU affinity, capped by its cgroup's CPU quota.

In a pod, the affinity is every core of the node unless the kubelet's static CPU manager pins the
pod (Guaranteed QoS with whole CPUs only; KServe pods are Burstable because of the storage
initializer). The CPU limit is a CFS quota instead: a 2-CPU pod on a 32-core node that starts 32
threads is throttled. Threads = floor(quota / period), at least 1, at most the affinity: never more
runnable threads than the quota lets run in parallel (as Go's automaxprocs rounds).

cgroup v2: `cpu.max` ("QUOTA PERIOD", or "max PERIOD") in the process's cgroup and its ancestors.
cgroup v1: `cpu.cfs_quota_us` (-1 = none) and `cpu.cfs_period_us` in the cpu controller's hierarchy.
The tightest limit on the way up to the visible root counts. Torch-free, so it is unit-tested alone.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(cgroup_root: Path | None = None, proc_self_cgroup: Path | None = None) -> int:
    """CPUs this process may run on at once: affinity, capped by the cgroup CPU quota."""
    cores = len(os.sched_getaffinity(0))
    limit = cpu_limit(cgroup_root, proc_self_cgroup)
    if limit is None:
        return cores
    return max(1, min(cores, math.floor(limit)))


def cpu_limit(cgroup_root: Path | None = None, proc_self_cgroup: Path | None = None) -> float | None:
    """The CPU quota in CPUs (quota / period) of this process's cgroup, or None if it has none."""
    cgroup_root = cgroup_root or CGROUP_ROOT
    proc_self_cgroup = proc_self_cgroup or PROC_SELF_CGROUP
    try:
        memberships = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in memberships:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:
            limits += [_v2_limit(d) for d in _ancestors(cgroup_root, path)]
        elif "cpu" in controllers.split(","):
            mounts = [cgroup_root / name for name in (controllers, "cpu,cpuacct", "cpu")]
            mount = next((m for m in mounts if m.is_dir()), None)
            if mount is not None:
                limits += [_v1_limit(d) for d in _ancestors(mount, path)]
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory under `mount` and its parents up to `mount`. Without a cgroup namespace
    the path names the host's hierarchy, which a container does not see: then its root is the cgroup."""
    directory = mount / path.strip("/")
    if not directory.is_dir():
        directory = mount
    chain = [directory]
    while directory != mount and mount in directory.parents:
        directory = directory.parent
        chain.append(directory)
    return chain


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_limit(directory: Path) -> float | None:
    fields = (_read(directory / "cpu.max") or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_limit(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
