"""cpu_threads: 0 honours the cgroup CPU quota (a pod's CPU limit) as well as the affinity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from handlers import cpu_quota
from handlers.cpu_quota import cpu_limit, usable_cpus
from handlers.options import HandlerOptions

CORES = len(os.sched_getaffinity(0))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(tmp_path: Path, cpu_max: str, path: str = "/kubepods/pod1/ctr", parent: str | None = None):
    root = tmp_path / "cgroup"
    write(root / path.strip("/") / "cpu.max", cpu_max + "\n")
    if parent is not None:
        write(root / Path(path.strip("/")).parent / "cpu.max", parent + "\n")
    proc = tmp_path / "proc-self-cgroup"
    write(proc, f"0::{path}\n")
    return root, proc


def v1_tree(tmp_path: Path, quota: str, period: str = "100000", path: str = "/kubepods/pod1/ctr", visible: bool = True):
    root = tmp_path / "cgroup"
    directory = root / "cpu,cpuacct" / (path.strip("/") if visible else "")
    write(directory / "cpu.cfs_quota_us", quota + "\n")
    write(directory / "cpu.cfs_period_us", period + "\n")
    proc = tmp_path / "proc-self-cgroup"
    write(proc, f"12:memory:{path}\n4:cpu,cpuacct:{path}\n0::/\n")
    return root, proc


def test_v2_quota_of_two_cpus(tmp_path):
    root, proc = v2_tree(tmp_path, "200000 100000")
    assert cpu_limit(root, proc) == 2.0
    assert usable_cpus(root, proc) == min(2, CORES)


def test_v2_no_quota_leaves_the_affinity(tmp_path):
    root, proc = v2_tree(tmp_path, "max 100000")
    assert cpu_limit(root, proc) is None
    assert usable_cpus(root, proc) == CORES


def test_v2_tightest_ancestor_counts(tmp_path):
    root, proc = v2_tree(tmp_path, "max 100000", parent="150000 100000")
    assert cpu_limit(root, proc) == 1.5
    assert usable_cpus(root, proc) == 1  # never more runnable threads than the quota runs at once


def test_v1_quota_and_container_view(tmp_path):
    root, proc = v1_tree(tmp_path, "100000")
    assert usable_cpus(root, proc) == 1
    # Without a cgroup namespace the host path is not visible: the mount's root is the container's cgroup.
    root, proc = v1_tree(tmp_path / "ns", "50000", visible=False)
    assert cpu_limit(root, proc) == 0.5
    assert usable_cpus(root, proc) == 1


def test_v1_unlimited_and_missing_files(tmp_path):
    root, proc = v1_tree(tmp_path, "-1")
    assert cpu_limit(root, proc) is None
    assert cpu_limit(tmp_path / "nothing", tmp_path / "no-proc-file") is None


def test_quota_files_that_hold_no_numbers_are_no_limit_not_a_failed_load(tmp_path):
    # Read at every worker's load (cpu_threads: 0): a file no kernel writes is no limit rather than a worker
    # that cannot start.
    assert cpu_limit(*v2_tree(tmp_path / "v2", "lots 100000")) is None
    assert cpu_limit(*v1_tree(tmp_path / "v1", "100000", period="often")) is None


@pytest.mark.skipif(CORES < 2, reason="needs an affinity of 2 cores or more to show the cap")
def test_handler_options_resolve_cpu_threads_to_the_quota(tmp_path, monkeypatch):
    """The handler's own resolution (options.for_device) reads the quota: 1 CPU -> 1 thread on any node."""
    root, proc = v2_tree(tmp_path, "100000 100000")
    monkeypatch.setattr(cpu_quota, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpu_quota, "PROC_SELF_CGROUP", proc)
    assert HandlerOptions().for_device("cpu").cpu_threads == 1
    assert HandlerOptions(cpu_threads=3).for_device("cpu").cpu_threads == 3
