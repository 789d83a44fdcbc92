"""Processes recorded by pid and start time, and stopped by that record, never by name.

A record ({"pid", "create_time"}) outlives the object that started a process: another process
(`scripts.fleet down`, `roll`) reads it from a file and signals only the process it names, never one
that got the same pid later. With them, the two waits the fleet's operations share: for a condition
(`wait_for`) and for calls run side by side (`in_parallel`). Used by tooling/fleet.py and fleet_roll.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psutil
import requests

from tooling.fleet_config import FleetError


def process_record(pid: int) -> dict[str, float]:
    """A pid with its start time: enough to recognize the same process later."""
    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def same_process(record: Mapping[str, float]) -> psutil.Process | None:
    """The recorded process if it is still the one that was started, else None."""
    try:
        process = psutil.Process(int(record["pid"]))
        return process if process.create_time() == record["create_time"] else None
    except psutil.Error:
        return None


def still_running(record: Mapping[str, float]) -> bool:
    """Whether the recorded process runs: still the one started, and not a zombie (dead, its parent yet to reap it;
    a process orphaned to a container's init may stay one for ever where that init does not reap)."""
    process = same_process(record)
    return process is not None and not has_ended(process)


def stop_recorded(record: Mapping[str, float] | None, *, group: bool, timeout: float = 30.0) -> None:
    """SIGTERM the recorded process (its whole process group if `group`), SIGKILL if it outlives `timeout`."""
    process = same_process(record) if record else None
    if process is None:
        # The leader is gone, but its group may still hold workers. Linux does not hand out a pid that
        # is still some group's id, so if no process has that pid, the group is ours; if one has, the
        # pid was recycled after our group emptied, and that process is not ours to signal.
        if group and record and not psutil.pid_exists(int(record["pid"])):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pid"]), signal.SIGKILL)
        return
    pid = process.pid
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:  # it ended meanwhile
        members = [process]

    def signal_all(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)

    signal_all(signal.SIGCONT)  # a stopped process would hold SIGTERM pending forever
    signal_all(signal.SIGTERM)
    if not wait_ended(members, timeout):
        signal_all(signal.SIGKILL)
        wait_ended(members, 10)
    # Workers forked after the snapshot above are in the group too. The group id is still ours while its
    # leader is ours or no process has its pid (as above: Linux does not reuse a live group's id).
    if group and (same_process(record) or not psutil.pid_exists(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def has_ended(process: psutil.Process) -> bool:
    """Gone, or a zombie: its parent (another process, when a fleet is operated from two) reaps it when it will,
    and waiting for that would be in vain."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_ended(processes: Sequence[psutil.Process], timeout: float) -> bool:
    """Wait until every process has ended (has_ended); whether they all did."""
    deadline = time.monotonic() + timeout
    while not all(has_ended(process) for process in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def java_frontend(leader_pid: int, timeout: float = 30.0) -> psutil.Process:
    """The Java frontend that the `torchserve --foreground` process `leader_pid` started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(leader_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name() == "java":
                    return child
        time.sleep(0.2)
    raise FleetError(f"no Java frontend under torchserve pid {leader_pid} after {timeout}s")


def in_parallel(calls: Sequence[Callable[[], None]], daemon: bool = False) -> None:
    """Run the calls in threads (a TorchServe takes seconds to stop, as to start) and wait for all.

    `daemon`: an interrupted caller exits without waiting for them (a roll's restart, whose process is
    recorded as soon as it exists); otherwise it waits (stops, which must finish)."""
    threads = [threading.Thread(target=call, daemon=daemon) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> None:
    """Poll `check` until it returns True; FleetError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(requests.RequestException, OSError, ValueError, KeyError):
            if check():
                return
        if time.monotonic() > deadline:
            raise FleetError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
