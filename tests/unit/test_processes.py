"""tooling/processes.py: a recorded process is known by its pid and its start time, so a pid the system has since
handed to another process is never signalled (the fleet's `down` and its rolls stop processes from such records)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tooling.fleet_config import FleetError
from tooling.processes import java_frontend, process_record, same_process, stop_recorded


@pytest.fixture
def sleeper():
    """A process of this test's own, leading its own process group, as a fleet's replicas do."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def reused(record: dict) -> dict:
    """The record of an earlier process that held the same pid: same pid, another start time."""
    return {**record, "create_time": record["create_time"] - 1.0}


def test_a_pid_now_held_by_another_process_is_not_the_recorded_one(sleeper):
    record = process_record(sleeper.pid)
    found = same_process(record)
    assert found is not None and found.pid == sleeper.pid
    assert same_process(reused(record)) is None


@pytest.mark.parametrize("group", [False, True], ids=["process", "group"])
def test_stopping_a_record_whose_pid_was_reused_leaves_the_new_owner_alone(sleeper, group):
    """Also the group: the recorded leader is gone, and a process with its pid means the pid was recycled after the
    recorded group emptied, so the group of that id is not the recorded one."""
    stop_recorded(reused(process_record(sleeper.pid)), group=group, timeout=1)
    with pytest.raises(subprocess.TimeoutExpired):  # a signal is delivered in its own time: still there a second on
        sleeper.wait(timeout=1)


def test_the_recorded_group_is_stopped(sleeper):
    stop_recorded(process_record(sleeper.pid), group=True, timeout=5)
    assert sleeper.wait(timeout=5) is not None


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout():
    """A frontend stuck in its shutdown hooks must not outlive `down`. A lone process, not a group: the group's final
    SIGKILL would end it whatever came before."""
    program = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "ready\n"  # SIGTERM ignored from here
        stop_recorded(process_record(process.pid), group=False, timeout=1)
        assert process.wait(timeout=5) == -9
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def test_a_torchserve_without_a_java_frontend_is_named_after_the_wait(sleeper):
    with pytest.raises(FleetError, match=f"^no Java frontend under torchserve pid {sleeper.pid} after 0.5s$"):
        java_frontend(sleeper.pid, timeout=0.5)
