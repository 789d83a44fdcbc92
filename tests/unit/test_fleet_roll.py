"""What a fleet roll decides before it touches anything, and the process and state helpers it stands on.

The roll itself, through real TorchServe replicas, HAProxy and Prometheus, is in tests/e2e/test_fleet.py;
here are the refusals and the selection, on a fleet object with no process (HAProxy's view given), and
the helpers on real processes and files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from tests.deploy.manifests import fake_archive
from tooling.fleet import Fleet, Replica, file_stamp, write_atomically
from tooling.fleet_config import FleetError, FleetSpec
from tooling.fleet_roll import check_current, only_roll, replicas_to_move
from tooling.processes import wait_ended


@pytest.fixture
def fleet(tmp_path) -> Fleet:
    """Two replicas on old.mar, as loaded, both UP in HAProxy's view; new.mar beside it in the store."""
    store = tmp_path / "store"
    store.mkdir()
    for name in ("old.mar", "new.mar"):
        fake_archive(store / name)
    fleet = Fleet(FleetSpec(model_store=store, archive="old.mar"), root=tmp_path / "root")
    fleet.response_timeout = fleet.response_timeout_of("old.mar")
    fleet.replicas = [
        Replica(f"r{i}", tmp_path / f"r{i}", {}, None, "old.mar", file_stamp(store / "old.mar")) for i in range(2)
    ]
    fleet.servers = lambda: {r.name: {"status": "UP"} for r in fleet.replicas}  # HAProxy's view of a healthy fleet
    return fleet


def test_every_replica_moves_onto_a_new_archive(fleet):
    assert replicas_to_move(fleet, "new.mar") == [0, 1]


def test_a_replica_already_on_the_archive_as_loaded_stays_so_an_interrupted_roll_is_finished_by_rolling_again(fleet):
    on_new = ("new.mar", file_stamp(fleet.spec.model_store / "new.mar"))
    fleet.replicas[0].archive, fleet.replicas[0].archive_stamp = on_new
    assert replicas_to_move(fleet, "new.mar") == [1]
    fleet.replicas[1].archive, fleet.replicas[1].archive_stamp = on_new
    assert replicas_to_move(fleet, "new.mar") == []


def test_an_archive_rebuilt_in_place_is_refused_both_as_the_target_and_as_what_a_roll_back_would_load(fleet):
    os.utime(fleet.spec.model_store / "old.mar", ns=(1, 1))  # rebuilt since the replicas loaded it
    with pytest.raises(FleetError, match="changed since r0 loaded it: a roll onto it would leave"):
        replicas_to_move(fleet, "old.mar")
    with pytest.raises(FleetError, match="changed since r0 loaded it: a roll back would not restore"):
        replicas_to_move(fleet, "new.mar")


def test_a_fleet_started_before_archives_were_stamped_is_refused(fleet):
    fleet.replicas[1].archive_stamp = None  # a layout.json from an older checkout
    with pytest.raises(FleetError, match="r1 was started before archives were stamped"):
        replicas_to_move(fleet, "new.mar")


def test_a_replica_out_of_rotation_moves_first_or_is_refused_and_a_missing_archive_is_refused(fleet, monkeypatch):
    monkeypatch.setattr("tooling.fleet_roll.ALL_UP_WAIT_S", 0.2)  # the grace for a check that is late
    with pytest.raises(FleetError, match=r"no absent\.mar in the fleet's model store"):
        replicas_to_move(fleet, "absent.mar")
    fleet.servers = lambda: {"r0": {"status": "UP"}, "r1": {"status": "DOWN"}}
    assert replicas_to_move(fleet, "new.mar") == [1, 0], "the replica already out goes first: nothing more is out"
    fleet.replicas[1].archive = "new.mar"
    fleet.replicas[1].archive_stamp = file_stamp(fleet.spec.model_store / "new.mar")
    with pytest.raises(FleetError, match=r"r1: on new\.mar already, but not in rotation"):
        replicas_to_move(fleet, "new.mar")  # r0 would be taken out with r1 still out


def test_only_one_roll_at_a_time(tmp_path):
    with only_roll(tmp_path):
        refused = pytest.raises(FleetError, match="another roll of this fleet is running")
        with refused, only_roll(tmp_path):
            pass
    with only_roll(tmp_path):  # released with the first
        pass


def test_a_roll_refuses_to_work_from_a_stale_reading_of_the_fleet(fleet):
    leaders = [{"pid": 10 + i, "create_time": 1.5} for i in range(2)]
    for replica, leader in zip(fleet.replicas, leaders, strict=True):
        replica.leader = leader
    fleet.processes_file.parent.mkdir(parents=True)
    write_atomically(fleet.processes_file, {"replicas": leaders})
    check_current(fleet)
    write_atomically(fleet.processes_file, {"replicas": [leaders[0], {"pid": 99, "create_time": 2.5}]})
    with pytest.raises(FleetError, match="the fleet changed since it was read"):
        check_current(fleet)


def test_state_is_replaced_whole_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "fleet.json"
    write_atomically(path, {"replicas": [1]})
    write_atomically(path, {"replicas": [1, 2]})
    assert json.loads(path.read_text()) == {"replicas": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["fleet.json"]


def test_a_zombie_has_ended_and_a_running_process_has_not():
    exited = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped until wait(): a zombie meanwhile
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_ended([psutil.Process(exited.pid)], timeout=10)
        assert psutil.Process(exited.pid).status() == psutil.STATUS_ZOMBIE
        assert not wait_ended([psutil.Process(running.pid)], timeout=0.3)
    finally:
        running.kill()
        running.wait()
        exited.wait()
