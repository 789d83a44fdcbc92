"""What a fleet roll (and a one-replica restart) decides before it touches anything, and the process and state
helpers it stands on.

The roll itself, through real TorchServe replicas, HAProxy and Prometheus, is in tests/e2e/test_fleet.py;
here are the refusals and the selection, on a fleet object with no process (HAProxy's view given), the
order of a roll back across replicas, on a fleet whose restarts and HAProxy are stand-ins (its probe a
real HTTP server), and the helpers on real processes and files. Last, what `up` refuses and what a failed one leaves,
and the command line against a real HAProxy in front of a loopback server standing for a replica (no TorchServe).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import requests

from tests.deploy.manifests import archive_with_handler_options, fake_archive
from tests.support import answering_every_call, fleet_command, require_system_packages, serving_http, wait_until
from tooling.fleet import SURGE, Fleet, Replica, ended_processes, file_stamp, read_state, write_atomically
from tooling.fleet_config import FleetError, FleetSpec
from tooling.fleet_roll import check_current, only_roll, replicas_to_move, restart, roll
from tooling.latency_budget import admission, machine_throughput
from tooling.paths import REPO
from tooling.processes import process_record, same_process, wait_ended


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
    # r0 would be taken out with r1 still out. DOWN: HAProxy's checks find its TorchServe not answering, and only a
    # restart brings it back (`ready` would leave it DOWN); drained, `ready` does.
    down = r"r1: on new\.mar already, but not in rotation \(r1: DOWN, its TorchServe does not answer HAProxy's checks\)"
    with pytest.raises(FleetError, match=down + r".*bring them back first \(`restart r1`\)$"):
        replicas_to_move(fleet, "new.mar")
    fleet.servers = lambda: {"r0": {"status": "UP"}, "r1": {"status": "DRAIN"}}
    with pytest.raises(FleetError, match=r"r1: on new\.mar already, but not in rotation: .*first \(`ready r1`\)$"):
        replicas_to_move(fleet, "new.mar")


class StandInFleet(Fleet):
    """`fleet` with its replica restarts and HAProxy recorded, not run, its replicas probed at `probe_url`.
    A restart takes the archive, then raises what `failures` names for (replica, archive), as a replica
    whose load fails does; `on_restart` is called with each (replica, archive) restarted."""

    def __init__(
        self,
        fleet: Fleet,
        probe_url: str,
        failures: dict[tuple[str, str], BaseException] | None = None,
        on_restart: Callable[[str, str], None] = lambda name, archive: None,
        surge: bool = False,
    ) -> None:
        super().__init__(fleet.spec, fleet.root)
        self.replicas, self.response_timeout = fleet.replicas, fleet.response_timeout
        self.surge = Replica(SURGE, fleet.root / SURGE, {}, None, "") if surge else None
        self.failures, self.on_restart = failures or {}, on_restart
        self.restarts: list[tuple[str, str]] = []
        self.stops: list[str] = []  # never a real signal: the leaders here are made up
        self.states = {replica.name: "UP" for replica in self.replicas}
        self.seconds_in_state: dict[str, int] = {}  # HAProxy's lastchg per server, an hour unless set
        # Set drain or maint through the admin socket: kept while the server's checks fail (its status DOWN then).
        self.held = {name for name, state in self.states.items() if state == "MAINT"}
        if self.surge is not None:
            self.states[SURGE] = "MAINT"
        for replica in [*self.replicas, *([self.surge] if self.surge else [])]:
            replica.addresses = {f"{api}_address": probe_url for api in ("inference", "management", "metrics")}
        for replica in self.replicas:
            replica.leader = {"pid": 10, "create_time": 1.5}
        self.dir.mkdir(parents=True)
        write_atomically(self.processes_file, {"replicas": [replica.leader for replica in self.replicas]})

    def servers(self) -> dict[str, dict[str, str]]:
        row = {"scur": "0", "qcur": "0", "wretr": "0", "wredis": "0", "stot": "0"}
        return {
            name: {**row, "status": status, "lastchg": str(self.seconds_in_state.get(name, 3600))}
            for name, status in self.states.items()
        }

    def set_server_state(self, name: str, state: str) -> None:
        self.states[name] = {"drain": "DRAIN", "ready": "UP", "maint": "MAINT"}[state]
        (self.held.discard if state == "ready" else self.held.add)(name)

    def held_out(self) -> set[str]:
        return set(self.held)

    def _stop_replica(self, replica: Replica) -> None:
        if replica.leader is not None:
            self.stops.append(replica.name)
        replica.leader = None

    def restart(self, replica: Replica, timeout: float = 120.0, archive: str | None = None) -> Replica:
        self._stop_replica(replica)
        replica.archive = archive or replica.archive
        self.restarts.append((replica.name, replica.archive))
        replica.archive_stamp = file_stamp(self.spec.model_store / replica.archive)  # as a start stamps it
        if replica is self.surge:  # recorded once spawned, as a start records it (the replicas keep theirs)
            replica.leader = {"pid": 20, "create_time": 2.5}
        self.save_state()
        self.on_restart(replica.name, replica.archive)
        if (replica.name, replica.archive) in self.failures:
            raise self.failures[replica.name, replica.archive]
        return replica


@pytest.fixture(autouse=True)
def surge_ports_free(monkeypatch):
    """The stand-in surge's addresses are the probe server's: its ports are not a process in the way."""
    monkeypatch.setattr("tooling.fleet_roll.ports_taken", lambda replica: [])


@pytest.fixture
def probe_url():
    """A loopback HTTP server that answers every POST 200: the replicas' probe target."""
    with serving_http(answering_every_call()) as url:
        yield url


def test_a_replica_that_cannot_load_rolls_back_every_replica_already_moved_last_first(fleet, probe_url):
    """r0 moves onto new.mar, r1 cannot load it: r1, then r0, go back to old.mar, each probed and put back."""
    cannot = FleetError("r1's workers could not load new.mar")
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "new.mar"): cannot})
    said: list[str] = []
    with pytest.raises(FleetError, match=r"stopped at r1: r1's workers could not load new\.mar\. Rolled back"):
        roll(stand_in, "new.mar", b"probe", say=said.append, surge=False)
    assert stand_in.restarts == [("r0", "new.mar"), ("r1", "new.mar"), ("r1", "old.mar"), ("r0", "old.mar")]
    assert [r.archive for r in stand_in.replicas] == ["old.mar"] * 2
    assert [r.archive_stamp for r in stand_in.replicas] == [file_stamp(fleet.spec.model_store / "old.mar")] * 2
    assert stand_in.states == {"r0": "UP", "r1": "UP"}
    assert [line for line in said if line.startswith("==>")] == [
        "==> r0: drain, restart on new.mar, probe, back in rotation",
        "==> r1: drain, restart on new.mar, probe, back in rotation",
        "==> r1: back to old.mar",
        "==> r0: back to old.mar",
    ]


def test_a_stop_asked_mid_roll_finishes_the_replica_in_hand_and_the_same_roll_moves_the_rest(fleet, probe_url):
    """What the first Ctrl-C or SIGTERM of `scripts.fleet roll` does: r0 is finished and put back, r1 is not
    touched; the same roll again moves r1 alone."""
    stop = threading.Event()
    stand_in = StandInFleet(fleet, probe_url, on_restart=lambda name, archive: stop.set())
    said: list[str] = []
    steps = roll(stand_in, "new.mar", b"probe", say=said.append, stop=stop)
    assert [step.replica for step in steps] == ["r0"] and stand_in.restarts == [("r0", "new.mar")]
    assert stand_in.states == {"r0": "UP", "r1": "UP"}
    assert said[-1].startswith("==> stopped before r1, as asked"), said
    assert [step.replica for step in roll(stand_in, "new.mar", b"probe", say=said.append)] == ["r1"]
    assert [r.archive for r in stand_in.replicas] == ["new.mar"] * 2
    assert [r["archive"] for r in json.loads(stand_in.state_file.read_text())["replicas"]] == ["new.mar"] * 2


def test_an_abort_mid_replica_is_not_rolled_back_and_says_where_it_stood(fleet, probe_url, monkeypatch):
    """What a second Ctrl-C does while r1 loads: no roll back (it would take as long), r1 named. r1 is recorded
    on new.mar (a start records its archive once spawned), so the same roll refuses until `ready r1` puts it
    back, and then has nothing to do; stopped before its spawn, r1 would be on old.mar, and moved first."""
    monkeypatch.setattr("tooling.fleet_roll.ALL_UP_WAIT_S", 0.2)  # r1 stays DRAIN: no grace to wait out
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "new.mar"): KeyboardInterrupt()})
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        roll(stand_in, "new.mar", b"probe", say=said.append)
    assert stand_in.restarts == [("r0", "new.mar"), ("r1", "new.mar")], "nothing rolled back"
    assert said[-1].startswith("    aborted at r1: it may be stopped, or still loading"), said
    assert said[-1].endswith("`ready r1` puts it back; stopped, the same `roll` again moves it first"), said
    assert stand_in.states["r1"] == "DRAIN"
    with pytest.raises(FleetError, match=r"r1: on new\.mar already, but not in rotation.*`ready r1`"):
        replicas_to_move(stand_in, "new.mar")
    stand_in.set_server_state("r1", "ready")
    assert replicas_to_move(stand_in, "new.mar") == []
    stand_in.set_server_state("r1", "drain")
    stand_in.replicas[1].archive = "old.mar"
    stand_in.replicas[1].archive_stamp = file_stamp(fleet.spec.model_store / "old.mar")
    assert replicas_to_move(stand_in, "new.mar") == [1]


def test_the_surge_replica_serves_the_archive_through_the_roll_and_is_retired_at_the_end(fleet, probe_url):
    """Brought in on the new archive before any replica is drained (the fleet keeps its capacity), put back
    in maintenance once every replica moved."""
    states_at_restart: list[dict[str, str]] = []
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.on_restart = lambda name, archive: states_at_restart.append(dict(stand_in.states))
    said: list[str] = []
    steps = roll(stand_in, "new.mar", b"probe", say=said.append)
    assert [step.replica for step in steps] == ["r0", "r1"]
    assert stand_in.restarts == [(SURGE, "new.mar"), ("r0", "new.mar"), ("r1", "new.mar")]
    assert states_at_restart[1] == {"r0": "DRAIN", "r1": "UP", SURGE: "UP"}, "r0 left with the surge in rotation"
    assert states_at_restart[2] == {"r0": "UP", "r1": "DRAIN", SURGE: "UP"}
    assert stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"} and stand_in.stops[-1] == SURGE
    assert said[0].startswith(f"==> {SURGE}: start on new.mar"), said
    assert said[-1].startswith(f"==> {SURGE}: drained and stopped; it answered"), said
    assert [r.archive for r in stand_in.replicas] == ["new.mar"] * 2 and stand_in.spec.archive == "new.mar"


def test_a_rolling_restart_restarts_every_replica_on_the_archive_it_runs_a_dead_one_first(
    fleet, probe_url, monkeypatch
):
    """`restart --all`: a roll onto the archive every replica runs that moves each one anyway, the surge in rotation
    meanwhile; a replica already DOWN goes first (a plain roll onto that archive moves none, and refuses a DOWN one)."""
    monkeypatch.setattr("tooling.fleet_roll.ALL_UP_WAIT_S", 0.2)  # r1 stays DOWN: no grace to wait out
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.states["r1"] = "DOWN"
    assert replicas_to_move(stand_in, "old.mar", every=True) == [1, 0]
    steps = roll(stand_in, "old.mar", b"probe", say=print, every=True)
    assert [step.replica for step in steps] == ["r1", "r0"]
    assert stand_in.restarts == [(SURGE, "old.mar"), ("r1", "old.mar"), ("r0", "old.mar")]
    assert stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"} and stand_in.stops[-1] == SURGE
    assert roll(stand_in, "old.mar", b"probe", say=print) == [], "without every, a roll onto what runs moves none"


def test_an_archive_the_surge_replica_cannot_serve_stops_the_roll_before_any_replica(fleet, probe_url):
    cannot = FleetError("surge's workers could not load new.mar")
    stand_in = StandInFleet(fleet, probe_url, surge=True, failures={(SURGE, "new.mar"): cannot})
    with pytest.raises(FleetError, match="stopped before any replica: the surge replica could not serve it"):
        roll(stand_in, "new.mar", b"probe", say=print)
    assert stand_in.restarts == [(SURGE, "new.mar")], "no replica touched"
    assert stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"}
    assert [r.archive for r in stand_in.replicas] == ["old.mar"] * 2


def test_a_replica_failing_mid_roll_is_rolled_back_with_the_surge_in_rotation_then_the_surge_retires(fleet, probe_url):
    cannot = FleetError("r1's workers could not load new.mar")
    stand_in = StandInFleet(fleet, probe_url, surge=True, failures={("r1", "new.mar"): cannot})
    with pytest.raises(FleetError, match="stopped at r1"):
        roll(stand_in, "new.mar", b"probe", say=print)
    assert stand_in.restarts == [(SURGE, "new.mar"), ("r0", "new.mar"), ("r1", "new.mar"), ("r1", "old.mar"),
                                 ("r0", "old.mar")]  # fmt: skip
    assert stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"}
    assert [r.archive for r in stand_in.replicas] == ["old.mar"] * 2


def test_a_stop_during_a_roll_with_the_surge_finishes_the_replica_in_hand_and_retires_the_surge(fleet, probe_url):
    stop = threading.Event()
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.on_restart = lambda name, archive: stop.set() if name == "r0" else None
    steps = roll(stand_in, "new.mar", b"probe", say=print, stop=stop)
    assert [step.replica for step in steps] == ["r0"]
    assert stand_in.restarts == [(SURGE, "new.mar"), ("r0", "new.mar")]
    assert stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"} and stand_in.surge.leader is None
    stand_in.restarts.clear()
    assert [step.replica for step in roll(stand_in, "new.mar", b"probe", say=print, stop=stop)] == []
    assert stand_in.restarts == [], "asked to stop before the roll began: neither the surge nor a replica started"


def test_after_an_abort_the_surge_left_in_rotation_is_kept_by_the_same_roll_and_retired_by_another(
    fleet, probe_url, monkeypatch
):
    """A second Ctrl-C while r1 loads leaves the surge serving new.mar in rotation: the same roll keeps it
    while it moves r1, then retires it; a roll onto another archive retires a surge it finds first."""
    monkeypatch.setattr("tooling.fleet_roll.ALL_UP_WAIT_S", 0.2)
    stand_in = StandInFleet(fleet, probe_url, surge=True, failures={("r1", "new.mar"): KeyboardInterrupt()})
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        roll(stand_in, "new.mar", b"probe", say=said.append)
    assert said[-1] == f"    {SURGE} still runs: the next `roll`, or `down`, stops it", said
    assert stand_in.states[SURGE] == "UP" and stand_in.surge.leader is not None
    stand_in.failures.clear()
    stand_in.replicas[1].archive = "old.mar"
    stand_in.replicas[1].archive_stamp = file_stamp(fleet.spec.model_store / "old.mar")
    stand_in.set_server_state("r1", "ready")  # as if stopped before its restart: the roll moves it
    stand_in.restarts.clear()
    said.clear()
    assert [step.replica for step in roll(stand_in, "new.mar", b"probe", say=said.append)] == ["r1"]
    assert stand_in.restarts == [("r1", "new.mar")], "the surge on new.mar kept, not restarted"
    assert said[0] == f"==> {SURGE}: serves new.mar already (a roll interrupted), kept in rotation", said
    assert stand_in.states[SURGE] == "MAINT" and stand_in.surge.leader is None

    stand_in.restart(stand_in.surge, archive="new.mar")  # left running again, on new.mar
    stand_in.set_server_state(SURGE, "ready")
    stand_in.restarts.clear()
    said.clear()
    roll(stand_in, "old.mar", b"probe", say=said.append)
    assert stand_in.restarts[:2] == [(SURGE, "old.mar"), ("r0", "old.mar")]
    assert said[0] == f"==> {SURGE}: drained and stopped", "the surge on new.mar retired before it came in on old.mar"


def test_a_surge_that_cannot_be_retired_is_stopped_and_the_roll_says_so(fleet, probe_url):
    """HAProxy's socket failing at the end: the surge's process is stopped anyway, every replica is on the
    archive and recorded so, and the roll fails with what is left to do."""
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    drain = stand_in.set_server_state

    def socket_gone(name: str, state: str) -> None:
        if name == SURGE and state in ("drain", "maint") and len(stand_in.restarts) == 3:  # once r1 moved
            raise ConnectionRefusedError("haproxy.sock")
        drain(name, state)

    stand_in.set_server_state = socket_gone
    with pytest.raises(FleetError, match=r"every replica it reached serves new\.mar, but the surge replica could not"):
        roll(stand_in, "new.mar", b"probe", say=print)
    assert stand_in.stops[-1] == SURGE, "the surge's process was left running"
    assert [r.archive for r in stand_in.replicas] == ["new.mar"] * 2 and stand_in.spec.archive == "new.mar"


def test_a_surge_left_running_that_cannot_be_retired_at_the_start_is_stopped_and_fails_the_roll(fleet, probe_url):
    """A roll with --no-surge finds the surge an aborted roll left: HAProxy's socket failing as it is drained,
    its process is stopped anyway, the replicas still move, and the roll fails saying so."""
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.restart(stand_in.surge, archive="new.mar")  # left running by an aborted roll
    stand_in.set_server_state(SURGE, "ready")
    set_state = stand_in.set_server_state

    def socket_gone(name: str, state: str) -> None:
        if name == SURGE and state == "drain":
            raise ConnectionRefusedError("haproxy.sock")
        set_state(name, state)

    stand_in.set_server_state = socket_gone
    with pytest.raises(FleetError, match=r"but the surge replica could not be drained: haproxy\.sock"):
        roll(stand_in, "new.mar", b"probe", say=print, surge=False)
    assert stand_in.stops[0] == SURGE and stand_in.surge.leader is None
    assert [r.archive for r in stand_in.replicas] == ["new.mar"] * 2


def test_a_surge_slot_whose_port_another_process_holds_stops_the_roll_before_anything(fleet, probe_url, monkeypatch):
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    monkeypatch.setattr("tooling.fleet_roll.ports_taken", lambda replica: [12345] if replica.name == SURGE else [])
    with pytest.raises(FleetError, match=r"ports \[12345\] \(chosen at `up`\) are taken by another process"):
        roll(stand_in, "new.mar", b"probe", say=print)
    assert stand_in.restarts == [] and stand_in.states == {"r0": "UP", "r1": "UP", SURGE: "MAINT"}


def test_down_from_another_process_stops_a_surge_replica_a_roll_left_running(tmp_path):
    from tooling.fleet import stop_fleet
    from tooling.processes import process_record

    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "fleet").mkdir()
        write_atomically(tmp_path / "fleet" / "processes.json", {"replicas": [], "surge": process_record(left.pid)})
        assert stop_fleet(tmp_path) == [f"replica {SURGE} (process group {left.pid})"]
        assert left.wait(timeout=30) is not None
    finally:
        left.kill()
        left.wait()


def test_a_port_another_process_listens_on_is_taken_and_a_free_one_is_not(tmp_path):
    import socket

    from tooling.fleet import ports_taken
    from tooling.torchserve import free_port

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy, free = listener.getsockname()[1], free_port()
        slot = Replica(
            SURGE,
            tmp_path,
            {"inference_address": f"http://127.0.0.1:{busy}", "grpc_inference_port": str(free)},
            None,
            "",
        )
        assert ports_taken(slot) == [busy]


def test_only_one_roll_at_a_time(tmp_path):
    with only_roll(tmp_path, "the roll onto new.mar"):
        refused = pytest.raises(FleetError, match=rf"^the roll onto new\.mar \(pid {os.getpid()}\) holds this fleet")
        with refused, only_roll(tmp_path):
            pass
    with only_roll(tmp_path):  # released with the first
        pass


def test_a_roll_lock_names_its_holder_while_held_and_no_one_once_let_go(tmp_path):
    """`down` stops the process the lock names when it finds the lock held: a name left behind would be a process that
    no longer rolls (a `heal --every` loop, whose restarts take the lock, found holding it a moment by `down`)."""
    from tooling.fleet_roll import ROLL_LOCK, roll_running

    assert not roll_running(tmp_path)
    with only_roll(tmp_path, "the restart of r1"):
        record = json.loads((tmp_path / ROLL_LOCK).read_text())
        assert (record["pid"], record["doing"]) == (os.getpid(), "the restart of r1")
        assert roll_running(tmp_path)
    assert (tmp_path / ROLL_LOCK).read_text() == "" and not roll_running(tmp_path)
    with pytest.raises(RuntimeError), only_roll(tmp_path):
        raise RuntimeError("a roll that failed")
    assert (tmp_path / ROLL_LOCK).read_text() == ""


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
    fleet.surge = Replica(SURGE, fleet.root / SURGE, {}, None, "")  # a surge another roll started meanwhile
    write_atomically(fleet.processes_file, {"replicas": leaders, "surge": {"pid": 30, "create_time": 3.5}})
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


def test_the_command_line_names_a_fleet_it_cannot_reach_instead_of_a_traceback(tmp_path):
    """`drain` on a fleet whose HAProxy is gone (its socket removed): exit 1 with one line, no traceback."""
    write_atomically(tmp_path / "fleet.json", {"haproxy_socket": str(tmp_path / "gone.sock")})
    command = [sys.executable, "-m", "scripts.fleet", "--root", str(tmp_path), "drain", "r0"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "gone.sock" in done.stderr and "is the fleet up?" in done.stderr, done.stderr


@contextlib.contextmanager
def _stand_in_roll(fleet_dir, handlers: str) -> Iterator[subprocess.Popen]:
    """A process that holds the roll lock as `scripts.fleet roll` does, with `handlers` for its signals; it says
    `rolling` once it holds the lock. Killed, its pipe closed and reaped at the end of the block, however it ends
    (a pipe left open is a ResourceWarning in whichever later test collects it)."""
    code = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from tooling.fleet_roll import only_roll\n"
        f"{handlers}\n"
        "with only_roll(Path(sys.argv[1]), 'the restart of r1'):\n"
        "    print('rolling', flush=True)\n"
        "    time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(fleet_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as rolling:
        try:
            assert rolling.stdout.readline().strip() == "rolling"
            yield rolling
        finally:
            rolling.kill()  # what the test did not end; Popen's exit closes the pipe and reaps it


def test_down_stops_a_roll_in_progress_as_a_second_interrupt_does_and_holds_the_lock_meanwhile(tmp_path):
    """`down` (roll_stopped) aborts the roll's process through the roll's own signal handlers, then holds the
    lock: no roll starts while the fleet goes down."""
    from tooling.fleet_roll import holding, roll_stopped
    from tooling.processes import has_ended

    # It goes on for a while after it lets the lock go, as a roll's restart thread can: down waits for its end.
    lingers = "import atexit\natexit.register(time.sleep, 1.5)"
    handlers = f"from scripts.fleet import stop_on_signals\nstop_on_signals(threading.Event())\n{lingers}"
    with _stand_in_roll(tmp_path, handlers) as rolling:
        # A second roll, refused, names the one that holds the fleet and leaves its record whole.
        refused = pytest.raises(FleetError, match=rf"^the restart of r1 \(pid {rolling.pid}\) holds this fleet")
        with refused, only_roll(tmp_path):
            pass
        with roll_stopped(tmp_path, timeout=30) as holder:
            assert has_ended(psutil.Process(rolling.pid)), "down went on while the roll's process still ran"
            assert holder is not None and holding(holder) == f"the restart of r1 (pid {rolling.pid})"  # `down` says
            assert rolling.wait(timeout=5) == 128 + 15  # aborted by the second SIGTERM, as `roll` exits then
            assert "finishing the replica in hand" in rolling.stdout.read()  # the first was heard
            with (
                pytest.raises(FleetError, match=r"another roll, restart or `down` of this fleet holds"),
                only_roll(tmp_path),
            ):
                pass
    with roll_stopped(tmp_path) as holder:  # no roll now
        assert holder is None
    with roll_stopped(tmp_path / "no-fleet") as holder:  # no fleet: nothing to wait for, nothing created
        assert holder is None and not (tmp_path / "no-fleet").exists()


def test_down_kills_a_roll_that_does_not_stop_when_asked(tmp_path):
    from tooling.fleet_roll import roll_stopped

    ignoring = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"
    with _stand_in_roll(tmp_path, ignoring) as rolling, roll_stopped(tmp_path, timeout=3) as holder:
        assert holder is not None and holder["pid"] == rolling.pid
        assert rolling.wait(timeout=5) == -9


# ---- the roll's own refusals and roll backs ---------------------------------------------------------------------


def answering(post_status: int = 200, workers: list[dict] | None = None) -> type[http.server.BaseHTTPRequestHandler]:
    """A replica as the roll reaches it: every probe (POST) answered `post_status`; GET /models/NAME answered with
    `workers` as the management API describes them (None: 404, a replica that cannot say)."""

    class Replica(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(post_status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            body = json.dumps([{"workers": workers}]).encode() if workers is not None else b""
            self.send_response(200 if workers is not None else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Replica


def test_a_roll_of_a_fleet_gone_down_since_it_was_read_is_refused(fleet):
    fleet.dir.mkdir(parents=True)  # the fleet's directory is left, its records are not (`down` ran meanwhile)
    with pytest.raises(FleetError, match="the fleet is no longer up"):
        check_current(fleet)


def test_a_file_in_the_store_that_is_not_an_archive_is_refused_as_a_fleet_error(fleet):
    """The command line reports a FleetError in one line; anything else would be a traceback."""
    (fleet.spec.model_store / "notes.mar").write_text("not a zip")
    with pytest.raises(FleetError, match=r"notes\.mar"):
        replicas_to_move(fleet, "notes.mar")


@pytest.mark.parametrize(
    "workers, restarted_back",
    [
        # r1 answers READY on old.mar still: it is only put back in rotation, not restarted.
        ([{"status": "READY"}], [("r0", "old.mar")]),
        # r1 cannot say it is ready (404): it is restarted on old.mar, as after a failed restart.
        (None, [("r1", "old.mar"), ("r0", "old.mar")]),
    ],
)
def test_an_archive_changed_during_the_roll_stops_it_before_the_next_replica_and_rolls_back(
    fleet, workers, restarted_back
):
    """new.mar rebuilt in place while r0 moved onto it: r1 is refused before it is drained, r0 goes back."""
    with serving_http(answering(workers=workers)) as url:

        def rebuilt(name: str, archive: str) -> None:
            if (name, archive) == ("r0", "new.mar"):
                os.utime(fleet.spec.model_store / "new.mar", ns=(1, 1))

        stand_in = StandInFleet(fleet, url, on_restart=rebuilt)
        with pytest.raises(FleetError, match=r"stopped at r1: new\.mar changed during the roll, before r1's turn"):
            roll(stand_in, "new.mar", b"probe", say=print, surge=False)
    assert stand_in.restarts == [("r0", "new.mar"), *restarted_back]
    assert [r.archive for r in stand_in.replicas] == ["old.mar"] * 2
    assert stand_in.states == {"r0": "UP", "r1": "UP"}


def test_an_archive_changed_while_a_replica_drained_is_rolled_back_as_another_file_than_the_others(fleet, probe_url):
    stand_in = StandInFleet(fleet, probe_url)
    set_state = stand_in.set_server_state

    def rebuilt_during_drain(name: str, state: str) -> None:
        set_state(name, state)
        if (name, state) == ("r0", "drain") and stand_in.replicas[0].archive == "old.mar":
            os.utime(fleet.spec.model_store / "new.mar", ns=(1, 1))  # after the roll's check, before r0 loads it

    stand_in.set_server_state = rebuilt_during_drain
    with pytest.raises(FleetError, match=r"stopped at r0: new\.mar changed during the roll: r0 loaded another file"):
        roll(stand_in, "new.mar", b"probe", say=print, surge=False)
    assert stand_in.restarts == [("r0", "new.mar"), ("r0", "old.mar")]
    assert [r.archive for r in stand_in.replicas] == ["old.mar"] * 2 and stand_in.states == {"r0": "UP", "r1": "UP"}


def test_a_replica_that_fails_the_probe_and_then_the_roll_back_too_is_named_with_what_to_do(fleet):
    """Every probe answered 500: r0 fails on new.mar, and again back on old.mar; it is left out of rotation."""
    with serving_http(answering(post_status=500)) as url:
        stand_in = StandInFleet(fleet, url)
        with pytest.raises(FleetError) as refused:
            roll(stand_in, "new.mar", b"probe", say=print, surge=False)
    said = str(refused.value)
    assert "the roll failed, and r0 could not go back to old.mar either" in said, said
    assert "r0 answered the probe with HTTP 500" in said and "`down`, then `up`" in said, said
    assert stand_in.restarts == [("r0", "new.mar"), ("r0", "old.mar")], "r1 was touched"
    assert stand_in.states == {"r0": "DRAIN", "r1": "UP"}


def test_restart_starts_a_replica_whose_torchserve_died_again_on_the_archive_it_runs(fleet, probe_url):
    """What a roll cannot do (it leaves a replica on its archive as it is): r1, DOWN, is drained, restarted on
    old.mar, probed and put back; r0 is not touched."""
    stand_in = StandInFleet(fleet, probe_url)
    stand_in.states["r1"] = "DOWN"  # HAProxy's checks find its TorchServe gone
    said: list[str] = []
    step = restart(stand_in, "r1", b"probe", say=said.append)
    assert stand_in.restarts == [("r1", "old.mar")] and stand_in.stops == ["r1"]
    assert stand_in.states == {"r0": "UP", "r1": "UP"} and step.replica == "r1"
    assert said[0] == "==> r1: drain, restart on old.mar, probe, back in rotation", said
    assert said[1].startswith("    r1 serves old.mar again: out of rotation "), said
    assert [r["archive"] for r in json.loads(stand_in.state_file.read_text())["replicas"]] == ["old.mar"] * 2
    restart(stand_in, "r0", b"probe", say=said.append)  # a replica that is well, the other in rotation meanwhile
    assert stand_in.restarts == [("r1", "old.mar"), ("r0", "old.mar")] and stand_in.states == {"r0": "UP", "r1": "UP"}


def test_a_restart_aborted_says_where_it_stood(fleet, probe_url):
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "old.mar"): KeyboardInterrupt()})
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        restart(stand_in, "r1", b"probe", say=said.append)
    assert said[-1].startswith("    aborted at r1: it may be stopped, or still loading"), said
    assert said[-1].endswith("`ready r1` puts it back; stopped, `restart r1` again starts it"), said


def test_restart_refuses_what_it_cannot_do_safely_before_touching_anything(fleet, probe_url):
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.states["r1"] = "DOWN"
    with pytest.raises(FleetError, match="surge is the surge slot, the roll's alone"):
        restart(stand_in, SURGE, b"probe")
    with pytest.raises(FleetError, match=r"no replica r9 in this fleet \(it has r0, r1; `status` lists them\)"):
        restart(stand_in, "r9", b"probe")
    # r0 serves alone: restarting it would fail every request meanwhile (r1 first).
    with pytest.raises(FleetError, match="r0 is the only replica in rotation: restarting it would fail every"):
        restart(stand_in, "r0", b"probe")
    os.utime(fleet.spec.model_store / "old.mar", ns=(1, 1))  # rebuilt in place since r1 loaded it
    with pytest.raises(FleetError, match=r"r1 runs old\.mar, and that file changed since r1 loaded it: restarted"):
        restart(stand_in, "r1", b"probe")
    stand_in.replicas[1].archive_stamp = None  # a layout.json from an older checkout
    with pytest.raises(FleetError, match="r1 was started before archives were stamped"):
        restart(stand_in, "r1", b"probe")
    assert stand_in.restarts == [] and stand_in.states == {"r0": "UP", "r1": "DOWN", SURGE: "MAINT"}
    with only_roll(stand_in.dir), pytest.raises(FleetError, match=r"^a roll \(pid \d+\) holds this fleet"):
        restart(stand_in, "r1", b"probe")


def test_a_restart_that_cannot_load_leaves_the_replica_out_of_rotation_and_names_its_logs(fleet, probe_url):
    cannot = FleetError("replica r1 cannot load old.mar: OSError: No space left on device")
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "old.mar"): cannot})
    stand_in.states["r1"] = "DOWN"
    with pytest.raises(FleetError) as failed:
        restart(stand_in, "r1", b"probe", say=print)
    said = str(failed.value)
    assert said.startswith("r1 could not be restarted on old.mar: replica r1 cannot load old.mar: OSError"), said
    assert said.endswith(f"It is out of rotation; its logs are under {fleet.replicas[1].workdir / 'logs'}"), said
    assert stand_in.states == {"r0": "UP", "r1": "DRAIN"}


@contextlib.contextmanager
def _lock_held_unrecorded(fleet_dir) -> Iterator[subprocess.Popen]:
    """A process that holds the roll lock without naming itself in it (as a child that inherited a roll's lock
    would), for the block; killed, its pipe closed and reaped at its end."""
    code = (
        "import fcntl, sys, time\n"
        "lock = open(sys.argv[1], 'a+')\n"
        "fcntl.flock(lock, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(fleet_dir / "roll.lock")], stdout=subprocess.PIPE, text=True
    ) as holding:
        try:
            assert holding.stdout.readline().strip() == "held"
            yield holding
        finally:
            holding.kill()


def test_down_gives_up_on_a_roll_lock_it_cannot_free_and_stops_nothing(tmp_path):
    from tooling.fleet_roll import roll_stopped

    with _lock_held_unrecorded(tmp_path) as holding:
        with pytest.raises(FleetError, match=r"did not stop within 1s: nothing stopped"), roll_stopped(tmp_path, 1):
            pytest.fail("down went on while the lock was held")
        assert holding.poll() is None, "a process the lock does not name was signalled"


def test_a_roll_cannot_stop_itself_as_down_would(tmp_path):
    from tooling.fleet_roll import roll_stopped

    refused = pytest.raises(FleetError, match="this process holds the roll lock")
    with only_roll(tmp_path), refused, roll_stopped(tmp_path, 5):
        pass


# ---- the fleet's start, its command line and HAProxy, without TorchServe ------------------------------------------

needs_system_packages = pytest.mark.usefixtures("system_packages")


@pytest.fixture
def system_packages() -> None:
    require_system_packages()


def _answers(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except OSError:  # HAProxy's socket not there yet
        return False


@pytest.fixture
def fronted(fleet, system_packages):
    """`fleet` with one replica, r0, on old.mar, whose addresses are a loopback server answering as a READY replica,
    behind a real HAProxy started as `up` starts it; its state files written as `up` writes them."""
    fleet.replicas = fleet.replicas[:1]
    del fleet.servers  # HAProxy's own view from now on
    with serving_http(answering(workers=[{"status": "READY"}])) as url:
        fleet.replicas[0].addresses = {f"{api}_address": url for api in ("inference", "management", "metrics")}
        fleet.dir.mkdir(parents=True)
        try:
            fleet._start_haproxy()
            wait_until(lambda: _answers(fleet.all_servers_up), 30, "HAProxy to have r0 UP")
            yield fleet
        finally:
            fleet.down()  # HAProxy, by its pid


def kill_leaving_a_zombie(process: subprocess.Popen) -> None:
    """SIGKILL a process this test started and return once it is a zombie, not reaped: as a process orphaned to a
    container's init can stay, which the fleet must take for ended."""
    process.kill()
    wait_until(lambda: psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")


@contextlib.contextmanager
def restarted(fleet: Fleet, *names: str, command: str = "restart") -> Iterator[subprocess.CompletedProcess]:
    """`restart NAMES` (or `command` NAMES) on the command line. The process it says it started is stopped after the
    block, by that pid while it runs this fleet's configuration: the fixture's `down` stops only what the fleet
    recorded."""
    started = fleet_command(fleet.root, command, *names)
    try:
        yield started
    finally:
        said = re.search(r"\(pid (\d+)\)", started.stdout)
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(int(said[1])) if said else None
            if process is not None and any(str(fleet.dir) in arg for arg in process.cmdline()):
                process.kill()


def test_restart_haproxy_starts_a_killed_front_again_on_its_ports_and_refuses_one_that_runs(fronted):
    """The command line's `restart haproxy`: refused while the recorded HAProxy runs; once it is killed (every request
    to the front fails), started again on the same configuration, recorded, r0 back UP and the front answering."""
    with restarted(fronted, "haproxy") as refused:  # what a wrong start would leave running is stopped too
        assert refused.returncode == 1, refused
        assert f"fleet: haproxy (pid {fronted.haproxy.pid}) is running: nothing to restart" in refused.stderr, refused
    # Named with a replica: refused before anything is touched, as a name the fleet has not is.
    with restarted(fronted, "r0", "haproxy") as refused:
        said = f"fleet: haproxy (pid {fronted.haproxy.pid}) is running: nothing to restart"
        assert (refused.returncode, refused.stderr.strip()) == (1, said), refused
    kill_leaving_a_zombie(fronted.haproxy)  # reaped only after the restart
    with pytest.raises(requests.ConnectionError):
        requests.post(f"{fronted.front_url}/predictions/bert", data=b"a text", timeout=10)
    with restarted(fronted, "haproxy") as started:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"==> HAProxy runs again on {fronted.front_url}" in started.stdout, started.stdout
        record = json.loads(fronted.processes_file.read_text())["haproxy"]
        assert record["pid"] != fronted.haproxy.pid and same_process(record) is not None
        wait_until(lambda: _answers(fronted.all_servers_up), 30, "the new HAProxy to have r0 UP")
        answer = requests.post(f"{fronted.front_url}/predictions/bert", data=b"a text", timeout=10)
        assert (answer.status_code, answer.headers.get("X-Replica")) == (200, "r0"), answer.text
        assert "haproxy" not in ended_processes(fronted.root)  # what `status` reads
    fronted.haproxy.wait()


def test_heal_starts_a_killed_front_again_and_leaves_a_whole_fleet_as_it_is(fronted):
    """`heal`, what a timer runs: with everything running it touches nothing; with HAProxy killed (every request to the
    front fails) it starts it again as `restart haproxy` does, and the front answers."""
    with restarted(fronted, command="heal") as whole:
        assert whole.returncode == 0, whole.stdout + whole.stderr
        assert "nothing to start again" in whole.stdout and whole.stderr == "", whole
    kill_leaving_a_zombie(fronted.haproxy)
    with restarted(fronted, command="heal") as healed:
        assert healed.returncode == 0, healed.stdout + healed.stderr
        assert f"==> HAProxy runs again on {fronted.front_url}" in healed.stdout, healed.stdout
        wait_until(lambda: _answers(fronted.all_servers_up), 30, "the new HAProxy to have r0 UP")
        answer = requests.post(f"{fronted.front_url}/predictions/bert", data=b"a text", timeout=10)
        assert (answer.status_code, answer.headers.get("X-Replica")) == (200, "r0"), answer.text
        assert ended_processes(fronted.root) == {}
    fronted.haproxy.wait()


def test_heal_every_few_seconds_brings_a_killed_front_back_says_only_that_and_ends_with_the_fleet(fronted):
    """`heal --every`, for a terminal or a service: HAProxy killed, the loop starts it again within a round or two, says
    so once (no line for the rounds with nothing to do), and ends, exit 0, once `down` has stopped the fleet."""
    command = [sys.executable, "-m", "scripts.fleet", "--root", str(fronted.root), "heal", "--every", "0.5"]
    healer = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(healer.stdout), daemon=True)  # its lines as they come
    reader.start()
    try:
        time.sleep(1.5)  # rounds with nothing to do
        kill_leaving_a_zombie(fronted.haproxy)
        # Said once HAProxy is back and r0 UP in it; a `down` before then would stop the heal mid-restart, as it stops
        # a roll (the heal's restart holds the fleet's roll lock).
        wait_until(lambda: any("==> HAProxy runs again" in line for line in said), 30, "heal to start HAProxy again")
        answer = requests.post(f"{fronted.front_url}/predictions/bert", data=b"a text", timeout=10)
        assert (answer.status_code, answer.headers.get("X-Replica")) == (200, "r0"), answer.text
        stopped = fleet_command(fronted.root, "down")
        assert stopped.returncode == 0 and "haproxy (pid" in stopped.stdout, stopped
        assert "as it stood" not in stopped.stdout, stopped.stdout  # the heal holds nothing between rounds
        healer.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if healer.poll() is None:
            healer.kill()
            healer.wait()
    out, err = "".join(said), healer.stderr.read()
    assert healer.returncode == 0, (out, err)
    assert out.count("==> HAProxy runs again") == 1 and "nothing to start again" not in out, out
    assert out.rstrip().endswith(f"==> no fleet under {fronted.root} any more: heal ends"), out
    fronted.haproxy.wait()


def test_a_replica_drained_before_haproxy_died_stays_drained_after_its_restart_and_a_new_fleet_starts_from_none(
    fronted,
):
    """`drain r0`, then HAProxy killed: the HAProxy `restart haproxy` starts has r0 DRAIN still, through its checks,
    and the front answers 503 (no replica in rotation); it had r0 back in rotation, knowing only its configuration.
    `ready r0` is kept the same way. A new fleet's HAProxy (as `up` starts it) starts from no saved state."""
    first = fronted.haproxy

    def r0_status() -> str:
        return fronted.servers()["r0"]["status"]

    def front() -> int:
        return requests.post(f"{fronted.front_url}/predictions/bert", data=b"a text", timeout=10).status_code

    def restarted_pid(started: subprocess.CompletedProcess) -> int:
        return int(re.search(r"\(pid (\d+)\)", started.stdout)[1])

    assert fleet_command(fronted.root, "drain", "r0").returncode == 0
    kill_leaving_a_zombie(first)
    with restarted(fronted, "haproxy") as started:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "(drained stays drained)" in started.stdout, started.stdout
        wait_until(lambda: _answers(lambda: "r0" in fronted.servers()), 30, "the new HAProxy's socket")
        time.sleep(3)  # three health checks (every 1 s, up after 2): r0 answers them, READY
        assert (r0_status(), front()) == ("DRAIN", 503)
        assert fleet_command(fronted.root, "ready", "r0").returncode == 0
        assert front() == 200
        psutil.Process(restarted_pid(started)).kill()
        wait_until(lambda: "haproxy" in ended_processes(fronted.root), 10, "HAProxy killed again")
    with restarted(fronted, "haproxy") as started:
        assert started.returncode == 0, started.stdout + started.stderr
        wait_until(lambda: _answers(lambda: r0_status() == "UP"), 30, "r0 UP, as `ready` left it")
        assert front() == 200
        fronted.set_server_state("r0", "drain")  # saved, as an earlier fleet under this root may have left it
        psutil.Process(restarted_pid(started)).kill()
        wait_until(lambda: "haproxy" in ended_processes(fronted.root), 10, "HAProxy killed again")
    fronted._start_haproxy()  # as `up` starts it
    wait_until(lambda: _answers(lambda: r0_status() == "UP"), 30, "a new fleet's r0 UP")
    assert front() == 200
    first.wait()


@needs_system_packages
def test_a_surge_replica_a_roll_put_in_rotation_stays_in_after_an_haproxy_restart(fleet):
    """The surge slot starts in maintenance (HAProxy's configuration); a roll puts it in rotation through the socket.
    Killed and started again, HAProxy went back to its configuration and took the running surge replica out."""
    fleet.replicas = fleet.replicas[:1]
    del fleet.servers  # HAProxy's own view
    with serving_http(answering(workers=[{"status": "READY"}])) as url:
        fleet.replicas[0].addresses = {f"{api}_address": url for api in ("inference", "management", "metrics")}
        fleet.surge = Replica(SURGE, fleet.root / "fleet" / SURGE, dict(fleet.replicas[0].addresses), None, "old.mar")
        fleet.dir.mkdir(parents=True)
        try:
            fleet._start_haproxy()
            first = fleet.haproxy
            wait_until(lambda: _answers(lambda: fleet.servers()[SURGE]["status"] == "MAINT"), 30, "the surge MAINT")
            fleet.set_server_state(SURGE, "ready")  # what a roll does once the surge answers
            kill_leaving_a_zombie(first)
            with restarted(fleet, "haproxy") as started:
                assert started.returncode == 0, started.stdout + started.stderr
                wait_until(lambda: _answers(lambda: fleet.servers()[SURGE]["status"] == "UP"), 30, "the surge UP")
            first.wait()
        finally:
            fleet.down()


def test_restart_prometheus_starts_a_killed_one_again_on_its_port_and_data(fronted):
    """`restart prometheus`: refused while the recorded Prometheus runs; once it is killed (left a zombie), started
    again on the configuration, port and data folder it had, recorded, ready and scraping HAProxy again (the replica
    here is a stand-in with no metrics)."""

    def front_scraped() -> list[str]:
        return [sample["value"][1] for sample in fronted.api("query", query='up{job="haproxy"}')["result"]]

    fronted._start_prometheus()
    wait_until(lambda: _answers(lambda: front_scraped() == ["1"]), 60, "Prometheus to scrape HAProxy")
    with restarted(fronted, "prometheus") as refused:
        assert refused.returncode == 1, refused
        assert f"fleet: prometheus (pid {fronted.prometheus.pid}) is running: nothing to restart" in refused.stderr
    kill_leaving_a_zombie(fronted.prometheus)
    with restarted(fronted, "prometheus") as started:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"==> Prometheus runs again on {fronted.prometheus_url}" in started.stdout, started.stdout
        record = json.loads(fronted.processes_file.read_text())["prometheus"]
        assert record["pid"] != fronted.prometheus.pid and same_process(record) is not None
        wait_until(lambda: _answers(lambda: front_scraped() == ["1"]), 60, "the new Prometheus to scrape HAProxy")
    fronted.prometheus.wait()


def test_up_refuses_to_start_without_haproxy_and_prometheus_and_writes_nothing(fleet, monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(FleetError, match=r"missing haproxy, prometheus: install them with scripts/install_system"):
        fleet.up()
    assert not fleet.root.exists()


@needs_system_packages
def test_up_refuses_a_second_fleet_on_the_same_root_and_an_archive_the_store_has_not(tmp_path):
    """`--archive` a file name: looked for in --model-store, and the refusal names that path."""
    store = tmp_path / "store"
    store.mkdir()
    up = ("up", "--model-store", str(store), "--archive", "absent.mar", "--alert-for", "BertReplicaDown=5s")
    refused = fleet_command(tmp_path / "root", *up)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"fleet: no archive {store.resolve() / 'absent.mar'} (scripts/setup.sh builds" in refused.stderr, refused
    assert not (tmp_path / "root" / "fleet.json").exists()
    (tmp_path / "root").mkdir()
    write_atomically(tmp_path / "root" / "fleet.json", {})
    refused = fleet_command(tmp_path / "root", *up)
    assert refused.returncode == 1 and "fleet.json exists: a fleet is already up" in refused.stderr, refused
    assert "starting" not in refused.stdout, refused.stdout  # refused before it says it starts


@needs_system_packages
def test_an_up_that_fails_leaves_no_state_behind_so_the_next_up_is_not_refused(fleet):
    """The replica does not answer within the second allowed: what was started is stopped, the records removed."""
    fleet.spec = FleetSpec(replicas=1, model_store=fleet.spec.model_store, archive="old.mar", pin_cores=False)
    fleet.replicas = []
    with pytest.raises(TimeoutError):
        fleet.up(timeout=1)
    try:
        assert not fleet.state_file.exists() and not fleet.processes_file.exists()
        assert not fleet.layout_file.exists()
    finally:
        from tooling.fleet import stop_fleet

        stop_fleet(fleet.root)  # what the records name, had up() left it


@pytest.mark.parametrize(("threads", "replicas", "workers"), [(1, 1, 4), (1, 2, 2), (2, 1, 2), (0, 1, 1), (1, 8, 1)])
def test_each_replica_runs_as_many_workers_as_its_part_of_the_cpus_holds_at_the_archives_threads(
    tmp_path, monkeypatch, threads, replicas, workers
):
    """On 4 CPUs. It ran one, whatever its part: a replica of 8 cores used one of them with the demo archive's one
    thread."""
    monkeypatch.setattr("tooling.fleet.usable_cpus", lambda: 4)
    archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": threads})
    fleet = Fleet(FleetSpec(replicas=replicas, model_store=tmp_path, archive="mine.mar"), root=tmp_path / "root")
    assert fleet.replica_layout("mine.mar").workers == workers
    properties = fleet._base_properties("mine.mar")  # what each replica starts with
    [entry] = json.loads(properties["model_snapshot"])["models"]["bert"].values()
    assert (entry["minWorkers"], entry["maxWorkers"]) == (workers, workers)
    # Its queue holds what the CPUs its workers keep busy serve in the budget: all of its part for cpu_threads 0.
    part = max(1, 4 // replicas)
    busy = min(part, workers * (threads or part))
    queue = admission(fleet.spec.latency_budget_ms, machine_throughput("cpu", busy), workers, 8).job_queue_size
    assert properties["job_queue_size"] == str(queue)
    given = Fleet(FleetSpec(model_store=tmp_path, archive="mine.mar", workers=3), root=tmp_path / "given")
    assert given.replica_layout("mine.mar").workers == 3


@pytest.mark.parametrize(
    ("threads", "replicas", "note", "warning"),
    [
        (1, 2, "", ""),  # the demo archive: a one-thread worker per CPU of each part, nothing to say
        (0, 2, "each replica's 2 CPU(s): mine.mar's workers run 2 threads each (its cpu_threads 0: every CPU)", ""),
        (2, 4, "", "fleet: warning: each replica's 1 CPU(s): 1 worker(s) of 2 threads each on 1 CPUs: more "
                   "threads than CPUs, which cost a PyTorch archive 6-9x its requests/s; archive it with cpu_threads "
                   "1 or less"),
    ],
    ids=["one-thread", "every-cpu", "more-threads-than-its-part"],
)  # fmt: skip
def test_up_and_roll_say_why_a_replica_runs_fewer_workers_than_cpus_and_warn_of_more_threads(
    tmp_path, monkeypatch, capsys, threads, replicas, note, warning
):
    """On 4 CPUs, as `up` and `roll` print it before they start anything."""
    from scripts.fleet import say_layout

    monkeypatch.setattr("tooling.fleet.usable_cpus", lambda: 4)
    archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": threads})
    fleet = Fleet(FleetSpec(replicas=replicas, model_store=tmp_path, archive="mine.mar"), root=tmp_path / "root")
    assert say_layout(fleet, "mine.mar") == fleet.replica_layout("mine.mar")
    printed = capsys.readouterr()
    assert printed.out.strip().startswith(note) and bool(printed.out) == bool(note), printed.out
    assert printed.err.strip().startswith(warning) and bool(printed.err) == bool(warning), printed.err


def test_an_archive_whose_handler_options_every_worker_would_refuse_is_refused_before_anything(fleet, tmp_path):
    """A roll onto it, a restart on it, an `up` of it: refused with the option's fault, as the workers would say it,
    where a roll started a surge replica to find out (the e2e test's unloadable archive fails in the worker)."""
    archive_with_handler_options(fleet.spec.model_store / "bad.mar", {"max_length": "long"})
    with pytest.raises(FleetError, match=r"bad\.mar: its model-config\.yaml: handler option 'max_length' must be int"):
        replicas_to_move(fleet, "bad.mar")
    with pytest.raises(FleetError, match="handler option 'max_length' must be int"):
        Fleet(FleetSpec(model_store=fleet.spec.model_store, archive="bad.mar"), root=tmp_path / "up")._base_properties(
            "bad.mar"
        )


def test_a_fleet_spec_job_queue_size_is_every_replicas_queue(tmp_path):
    fleet = Fleet(FleetSpec(job_queue_size=7), root=tmp_path)
    assert fleet._base_properties("bert.mar")["job_queue_size"] == "7"


@needs_system_packages
def test_a_configuration_haproxy_rejects_fails_the_start_and_runs_no_haproxy(fronted):
    fronted.down()
    started = fronted.records["haproxy"]
    fronted.spec = FleetSpec(model_store=fronted.spec.model_store, archive="old.mar", model_name="two words")
    with pytest.raises(FleetError, match="haproxy rejects") as rejected:
        fronted._start_haproxy()
    assert "[ALERT]" in str(rejected.value) and "haproxy.cfg:" in str(rejected.value), "without HAProxy's reason"
    assert fronted.haproxy is None and fronted.records["haproxy"] == started, "a second HAProxy was started"


@needs_system_packages
def test_drain_and_ready_on_the_command_line_and_a_replica_haproxy_does_not_know_refused(fronted):
    drained = fleet_command(fronted.root, "drain", "r0")
    assert drained.returncode == 0 and drained.stdout.strip() == "==> r0: drain", drained
    assert fronted.servers()["r0"]["status"].startswith("DRAIN")
    assert fronted.held_out() == {"r0"}  # as `heal` reads an operator's drain
    ready = fleet_command(fronted.root, "ready", "r0")
    assert ready.returncode == 0 and ready.stdout.strip() == "==> r0: ready", ready
    assert not fronted.servers()["r0"]["status"].startswith("DRAIN")
    assert fronted.held_out() == set()
    fronted.set_server_state("r0", "maint")
    assert fronted.held_out() == {"r0"}
    fronted.set_server_state("r0", "ready")
    unknown = fleet_command(fronted.root, "drain", "r9")
    assert unknown.returncode == 1 and "fleet: haproxy refused to set r9 drain: No such server" in unknown.stderr
    # The surge slot is HAProxy's too, but only a roll moves it: by hand it would show DOWN between rolls.
    surge = fleet_command(fronted.root, "ready", "surge")
    assert surge.returncode == 1 and "the surge slot is the roll's alone" in surge.stderr, surge
    with pytest.raises(FleetError, match="haproxy refused to set r9 drain: No such server"):
        fronted.set_server_state("r9", "drain")


@needs_system_packages
def test_ready_of_a_replica_whose_torchserve_is_gone_says_it_stays_down(fleet):
    """`ready` said `==> r1: ready`, exit 0, for a replica whose TorchServe had died: HAProxy's checks kept it DOWN."""
    from tooling.torchserve import free_port

    fleet.replicas = fleet.replicas[:1]
    del fleet.servers  # HAProxy's own view
    nothing = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the replica's TorchServe is gone
    fleet.replicas[0].addresses = {f"{api}_address": nothing for api in ("inference", "management", "metrics")}
    fleet.dir.mkdir(parents=True)
    try:
        fleet._start_haproxy()
        wait_until(lambda: _answers(lambda: fleet.servers()["r0"]["status"].startswith("DOWN")), 30, "r0 DOWN")
        readied = fleet_command(fleet.root, "ready", "r0")
        assert readied.returncode == 1, readied
        assert "HAProxy's health checks find r0 DOWN" in readied.stderr, readied.stderr
        assert f"scripts.fleet --root {fleet.root} restart r0 starts it again" in readied.stderr, readied.stderr
    finally:
        fleet.down()


@needs_system_packages
def test_status_names_each_replica_down_with_what_starts_it_again_and_exits_1(fleet):
    """r0's TorchServe gone, and the surge too (left in rotation by an aborted roll): `status` exits 1 naming each,
    r0 with its `restart`, the surge with the roll (`restart` refuses the slot); Prometheus's targets by replica.
    A real HAProxy; Prometheus a stand-in answering its targets API."""
    from tooling.torchserve import free_port

    fleet.replicas = fleet.replicas[:1]
    del fleet.servers  # HAProxy's own view
    nothing = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the replica's TorchServe is gone
    fleet.replicas[0].addresses = {f"{api}_address": nothing for api in ("inference", "management", "metrics")}
    fleet.surge = Replica(SURGE, fleet.root / "fleet" / SURGE, dict(fleet.replicas[0].addresses), None, "old.mar")
    target = {"labels": {"job": "torchserve", "replica": "r0"}, "scrapeUrl": f"{nothing}/metrics", "health": "down"}
    targets = json.dumps({"status": "success", "data": {"activeTargets": [target]}}).encode()
    fleet.dir.mkdir(parents=True)
    with serving_http(answering_every_call(body=targets)) as prometheus:
        fleet.prometheus_port = int(prometheus.rsplit(":", 1)[1])
        try:
            fleet._start_haproxy()
            wait_until(lambda: _answers(lambda: SURGE in fleet.servers()), 30, "HAProxy's admin socket")
            fleet.set_server_state(SURGE, "ready")  # what a roll does once the surge answers
            down = lambda: all(fleet.servers()[name]["status"].startswith("DOWN") for name in ("r0", SURGE))  # noqa: E731
            wait_until(lambda: _answers(down), 30, "r0 and the surge DOWN")
            shown = fleet_command(fleet.root, "status")
            as_json, state = fleet_command(fleet.root, "status", "--json"), read_state(fleet.root)
        finally:
            fleet.down()
    assert shown.returncode == 1, shown
    assert f"prometheus: torchserve r0 {nothing}/metrics down" in shown.stdout, shown.stdout
    said = shown.stderr.splitlines()
    assert said[0].startswith(f"fleet: r0 is DOWN: its TorchServe does not answer (logs under {fleet.root}/fleet/r0)")
    assert said[0].endswith(f"scripts.fleet --root {fleet.root} restart r0 starts it again"), said
    assert said[1].startswith(f"fleet: {SURGE} is DOWN") and said[1].endswith("the next `roll`, or `down`, stops it")
    assert said[2:] == [f"fleet: Prometheus cannot scrape {nothing}/metrics"], said
    # The same, as one document for a script: each view by name, each problem as the text says it.
    assert as_json.returncode == 1 and as_json.stderr == "", as_json
    report = json.loads(as_json.stdout)
    assert report["fleet"] == state, report
    assert report["haproxy"].keys() == {"r0", SURGE}, report
    assert report["haproxy"]["r0"]["status"].startswith("DOWN") and report["haproxy"]["r0"]["in_flight"] == 0
    target = {"job": "torchserve", "replica": "r0", "url": f"{nothing}/metrics", "health": "down"}
    assert report["prometheus"] == [target], report
    assert report["problems"] == [line.removeprefix("fleet: ") for line in said], report


@needs_system_packages
def test_a_roll_onto_what_every_replica_serves_succeeds_and_one_from_outside_the_store_is_refused(fronted, tmp_path):
    outside = fake_archive(tmp_path / "elsewhere.mar")
    refused = fleet_command(fronted.root, "roll", str(outside))
    assert refused.returncode == 1, refused
    assert f"elsewhere.mar is not in the fleet's model store {fronted.spec.model_store}" in refused.stderr, refused
    done = fleet_command(fronted.root, "roll", "old.mar")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "==> every replica already serves old.mar" in done.stdout, done.stdout
    assert "out of rotation" not in done.stdout, done.stdout  # none was


def test_status_and_roll_of_no_fleet_and_status_of_a_fleet_it_cannot_reach_exit_1(tmp_path):
    nothing = fleet_command(tmp_path, "status")
    assert nothing.returncode == 1 and nothing.stderr.strip() == f"fleet: no fleet is up under {tmp_path}", nothing
    assert nothing.stdout == "", nothing.stdout
    nothing = fleet_command(tmp_path, "status", "--json")
    assert nothing.returncode == 1 and nothing.stderr == "", nothing
    problems = [f"no fleet is up under {tmp_path}"]
    assert json.loads(nothing.stdout) == {"fleet": None, "haproxy": None, "prometheus": None, "problems": problems}
    nothing = fleet_command(tmp_path, "roll", "new.mar")
    assert nothing.returncode == 1 and f"fleet: no fleet is up under {tmp_path}" in nothing.stderr, nothing
    write_atomically(tmp_path / "fleet.json", {"haproxy_socket": str(tmp_path / "gone.sock")})
    gone = fleet_command(tmp_path, "status")
    assert gone.returncode == 1 and "fleet: could not reach the fleet" in gone.stderr, gone
    assert "Traceback" not in gone.stderr and "no longer running" not in gone.stderr, gone.stderr
    # Its records name an HAProxy that has ended (killed) and a Prometheus that runs (here this process): said so.
    ended = subprocess.Popen(["sleep", "60"])
    record = process_record(ended.pid)
    kill_leaving_a_zombie(ended)
    records = {"replicas": [], "surge": None, "haproxy": record, "prometheus": process_record(os.getpid())}
    (tmp_path / "fleet").mkdir()
    write_atomically(tmp_path / "fleet" / "processes.json", records)
    gone = fleet_command(tmp_path, "status")
    assert gone.returncode == 1, gone
    said = gone.stderr.splitlines()
    assert said[0].startswith("fleet: could not reach the fleet: ") and str(tmp_path / "gone.sock") in said[0], said
    ended_line = (
        f"haproxy (pid {record['pid']}) no longer running: .venv/bin/python -m scripts.fleet --root {tmp_path} "
        "restart haproxy starts it again as it ran"
    )
    assert said[1:] == [f"fleet: {ended_line}"], said
    shown = fleet_command(tmp_path, "status", "--json")
    assert shown.returncode == 1 and shown.stderr == "", shown
    report = json.loads(shown.stdout)
    assert report["fleet"] == {"haproxy_socket": str(tmp_path / "gone.sock")}, report
    assert (report["haproxy"], report["prometheus"]) == (None, None), report  # neither view reached
    assert report["problems"] == [line.removeprefix("fleet: ") for line in said], report
    ended.wait()  # reaped: gone altogether
    records["haproxy"], records["prometheus"] = process_record(os.getpid()), record  # Prometheus ended instead
    write_atomically(tmp_path / "fleet" / "processes.json", records)
    gone = fleet_command(tmp_path, "status")
    assert gone.stderr.splitlines()[1:] == [
        f"fleet: prometheus (pid {record['pid']}) no longer running: .venv/bin/python -m scripts.fleet --root "
        f"{tmp_path} restart prometheus starts it again as it ran"
    ], gone.stderr


def test_down_clears_a_fleet_json_whose_processes_are_not_recorded_so_up_is_not_refused(tmp_path):
    """What an `up` killed before it recorded a process leaves."""
    write_atomically(tmp_path / "fleet.json", {"front": "http://127.0.0.1:1"})
    stopped = fleet_command(tmp_path, "down")
    assert stopped.returncode == 0 and f"stopped nothing (no fleet was running under {tmp_path})" in stopped.stdout
    assert not (tmp_path / "fleet.json").exists()


def test_a_surge_stop_does_not_wait_on_a_prometheus_it_cannot_ask(fleet):
    """Prometheus gone (nothing on its port): the surge is stopped at once, not after the 15 s wait to be unscraped."""
    from tooling.torchserve import free_port

    fleet.prometheus_port, fleet.replicas = free_port(), []
    addresses = {f"{api}_address": "http://127.0.0.1:1" for api in ("inference", "management", "metrics")}
    fleet.surge = Replica(SURGE, fleet.root / SURGE, addresses, None, "new.mar")
    fleet.surge.java_pid = 1  # it answered: Prometheus scraped it
    started = time.monotonic()
    fleet.stop_surge()
    assert time.monotonic() - started < 5
    assert json.loads(fleet.surge_targets_file.read_text()) == []


def test_a_prometheus_answer_that_is_not_a_success_is_a_fleet_error(fleet):
    failing = answering_every_call(body=json.dumps({"status": "error", "error": "bad query"}).encode())
    with serving_http(failing) as url:
        fleet.prometheus_port = int(url.rsplit(":", 1)[1])
        with pytest.raises(FleetError, match=r"prometheus query: .*bad query"):
            fleet.query("up")


def test_a_second_ctrl_c_aborts_a_roll_and_the_command_line_exits_130_without_a_traceback(tmp_path):
    """The first Ctrl-C asks the roll to finish the replica in hand, the second aborts it (KeyboardInterrupt); the
    command line, interrupted, exits 130 quietly (here `down`, waiting on a roll lock it cannot free)."""
    with _stand_in_roll(
        tmp_path, "from scripts.fleet import stop_on_signals\nstop_on_signals(threading.Event())"
    ) as rolling:
        rolling.send_signal(signal.SIGINT)
        assert "finishing the replica in hand" in rolling.stdout.readline()
        rolling.send_signal(signal.SIGINT)
        assert rolling.wait(timeout=10) == -signal.SIGINT  # died of an uncaught KeyboardInterrupt

    (tmp_path / "fleet").mkdir()
    # `down` as a terminal's foreground job runs it, Ctrl-C raising KeyboardInterrupt: a suite started in the
    # background of a non-interactive shell has SIGINT ignored, and Python leaves it ignored in what it starts.
    interruptible = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('scripts.fleet', run_name='__main__', alter_sys=True)"
    )
    command = [sys.executable, "-c", interruptible, "--root", str(tmp_path), "down"]
    with (
        _lock_held_unrecorded(tmp_path / "fleet"),
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as down,
    ):
        try:
            lock = str(tmp_path / "fleet" / "roll.lock")
            wait_until(lambda: any(f.path == lock for f in psutil.Process(down.pid).open_files()), 30, "down at lock")
            down.send_signal(signal.SIGINT)
            # Past `down`'s own 30 s wait for the lock: an interrupt it missed shows as that refusal (exit 1, its
            # message), not as a time-out of this test.
            out, err = down.communicate(timeout=60)
        finally:
            down.kill()  # what the test did not end; Popen's exit closes the pipes and reaps it
    assert down.returncode == 130 and "Traceback" not in err, (down.returncode, out, err)


def test_restart_on_the_command_line_takes_names_or_all_and_all_refuses_a_fleet_half_rolled(fleet, probe_url):
    for wrong in (("restart",), ("restart", "r0", "--all")):
        refused = fleet_command(fleet.root, *wrong)
        assert refused.returncode == 1, refused
        assert "fleet: restart takes replicas (r0, r1, ...), haproxy or prometheus, or --all" in refused.stderr, (
            refused.stderr
        )
    refused = fleet_command(fleet.root, "restart", "r1", "r0", "r1")
    assert refused.returncode == 1 and "fleet: restart names r1 more than once" in refused.stderr, refused
    stand_in = StandInFleet(fleet, probe_url)
    stand_in.replicas[1].archive = "new.mar"  # a roll stopped halfway
    stand_in.save_state()  # the records `restart --all` reads, as `up` and the roll wrote them
    refused = fleet_command(fleet.root, "restart", "--all")
    assert refused.returncode == 1, refused
    assert "run different archives (r0 old.mar, r1 new.mar): finish the roll first" in refused.stderr, refused.stderr
    # A name the fleet has not, after one it has: refused before r0 is touched (its restart would fail otherwise:
    # no HAProxy answers for these records).
    refused = fleet_command(fleet.root, "restart", "r0", "r9")
    assert refused.returncode == 1, refused
    assert refused.stderr.strip() == "fleet: no replica r9 in this fleet (it has r0, r1; `status` lists them)", refused


def restart_command(stand_in: StandInFleet, probe: Path, *names: str) -> int:
    """`scripts.fleet restart NAMES` (its own function), the fleet it attaches `stand_in`."""
    import argparse

    from scripts.fleet import restart_replica

    args = argparse.Namespace(root=stand_in.root, replica=list(names), all=False, probe=probe, no_surge=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fleet, "attach", classmethod(lambda cls, root: stand_in))
        return restart_replica(args)


def test_restart_of_several_names_restarts_each_in_turn_haproxy_first_and_a_failure_says_what_was_done(
    fleet, probe_url, tmp_path, monkeypatch
):
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    stand_in = StandInFleet(fleet, probe_url)
    stand_in.states["r1"] = "DOWN"
    watched: list[str] = []
    monkeypatch.setattr(  # HAProxy and Prometheus started again: tested above with real ones
        "scripts.fleet.restart_watcher", lambda fleet, name: watched.append(f"{name} {len(stand_in.restarts)}")
    )
    assert restart_command(stand_in, probe, "r1", "prometheus", "r0", "haproxy") == 0
    assert watched == ["haproxy 0", "prometheus 0"]  # before any replica
    assert stand_in.restarts == [("r1", "old.mar"), ("r0", "old.mar")] and stand_in.states == {"r0": "UP", "r1": "UP"}


@pytest.mark.parametrize(
    ("names", "where"),
    [
        (("r0", "r1"), "restarted before it: none; not tried: r1"),
        (("r1", "r0"), "restarted before it: r1; not tried: none"),
    ],
)
def test_a_restart_of_several_that_fails_says_which_were_restarted_and_which_not_tried(
    fleet, probe_url, tmp_path, names, where
):
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    cannot = FleetError("replica r0 cannot load old.mar: OSError: No space left on device")
    stand_in = StandInFleet(fleet, probe_url, failures={("r0", "old.mar"): cannot})
    with pytest.raises(FleetError) as failed:
        restart_command(stand_in, probe, *names)
    said = str(failed.value)
    assert said.startswith("r0 could not be restarted on old.mar: replica r0 cannot load"), said
    assert said.endswith(f"its logs are under {fleet.replicas[0].workdir / 'logs'} ({where})"), said
    assert stand_in.restarts == [(name, "old.mar") for name in names[: names.index("r0") + 1]]


def heal_command(stand_in: StandInFleet, probe: Path, down_for: float = 30.0) -> int:
    """`scripts.fleet heal` (its own function), the fleet it attaches `stand_in`."""
    import argparse

    from scripts.fleet import heal

    args = argparse.Namespace(root=stand_in.root, down_for=down_for, probe=probe, every=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fleet, "attach", classmethod(lambda cls, root: stand_in))
        return heal(args)


def test_heal_restarts_each_replica_down_long_enough_after_the_watchers_and_nothing_an_operator_set(
    fleet, probe_url, tmp_path, monkeypatch, capsys
):
    """r0 DOWN for 40 s and r2 for 5 (a worker TorchServe is replacing, say), r1 drained by an operator, r3 in
    maintenance, r4 drained by an operator and then stopped (DOWN to HAProxy's checks, drained still), the surge slot
    DOWN (a roll's): only r0 is restarted, once HAProxy and Prometheus, which had ended, run again; r2 and r4 are said
    to be left."""
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    fleet.replicas += [Replica(f"r{i}", tmp_path / f"r{i}", {}, None, "old.mar", fleet.replicas[0].archive_stamp)
                       for i in (2, 3, 4)]  # fmt: skip
    stand_in = StandInFleet(fleet, probe_url, surge=True)
    stand_in.states.update(r0="DOWN", r1="DRAIN", r2="DOWN", r3="MAINT", r4="DOWN", surge="DOWN")
    stand_in.held |= {"r1", "r3", "r4"}
    stand_in.seconds_in_state.update(r0=40, r2=5)
    watched: list[str] = []
    monkeypatch.setattr("scripts.fleet.ended_processes", lambda root: {"prometheus": 7, "haproxy": 6})
    monkeypatch.setattr(
        "scripts.fleet.restart_watcher", lambda fleet, name: watched.append(f"{name} {len(stand_in.restarts)}")
    )
    assert heal_command(stand_in, probe) == 0
    assert watched == ["haproxy 0", "prometheus 0"]  # HAProxy first, both before any replica
    assert stand_in.restarts == [("r0", "old.mar")]
    assert stand_in.states == {"r0": "UP", "r1": "DRAIN", "r2": "DOWN", "r3": "MAINT", "r4": "DOWN", "surge": "DOWN"}
    said = capsys.readouterr().out
    assert "r2: DOWN for 5 s, heal waits 30 s: left as it is for now" in said, said
    assert "r4: DOWN and set drain or maint by hand: left as it is (`restart r4` brings it back)" in said, said


def test_heal_says_what_it_could_not_start_again_and_exits_1(fleet, probe_url, tmp_path, monkeypatch, capsys):
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    cannot = FleetError("replica r1 cannot load old.mar: OSError: No space left on device")
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "old.mar"): cannot})
    stand_in.states.update(r1="DOWN")
    monkeypatch.setattr("scripts.fleet.ended_processes", lambda root: {})
    assert heal_command(stand_in, probe) == 1
    printed = capsys.readouterr()
    said = printed.err
    assert "nothing to start again" not in printed.out, printed.out
    assert said.startswith("fleet: r1 could not be restarted on old.mar: replica r1 cannot load old.mar"), said


@pytest.mark.parametrize(("cannot", "restarts"), [("prometheus", [("r1", "old.mar")]), ("haproxy", [])])
def test_heal_without_haproxy_leaves_the_replicas_and_without_prometheus_goes_on(
    fleet, probe_url, tmp_path, monkeypatch, capsys, cannot, restarts
):
    """A watcher that cannot be started again is said, exit 1; without HAProxy there is no view of the replicas (and
    their restarts go through it), without Prometheus the replicas are healed all the same."""
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    stand_in = StandInFleet(fleet, probe_url)
    stand_in.states.update(r1="DOWN")
    monkeypatch.setattr("scripts.fleet.ended_processes", lambda root: {"haproxy": 6, "prometheus": 7})

    def restart_watcher(fleet: Fleet, name: str) -> None:
        if name == cannot:
            raise FleetError(f"port 9 is taken: {name} not started")

    monkeypatch.setattr("scripts.fleet.restart_watcher", restart_watcher)
    assert heal_command(stand_in, probe) == 1
    assert stand_in.restarts == restarts
    said = capsys.readouterr().err
    assert said == f"fleet: {cannot} could not be started again: port 9 is taken: {cannot} not started\n", said


def test_heal_every_round_backs_off_a_replica_that_fails_to_restart_and_forgets_once_it_serves(
    fleet, probe_url, tmp_path, monkeypatch
):
    """A replica that cannot load its archive, under `heal --every`: each failed restart doubles how long it must have
    been DOWN before the next try (30, 60, 120 s ...), so its JVM start and model load are not every round's."""
    import argparse

    from scripts.fleet import heal_once

    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    cannot = FleetError("replica r1 cannot load old.mar: OSError: No space left on device")
    stand_in = StandInFleet(fleet, probe_url, failures={("r1", "old.mar"): cannot})
    monkeypatch.setattr("scripts.fleet.ended_processes", lambda root: {})
    monkeypatch.setattr(Fleet, "attach", classmethod(lambda cls, root: stand_in))
    args = argparse.Namespace(root=stand_in.root, down_for=30.0, probe=probe, every=5.0)
    failures: dict[str, int] = {}

    def round_at(seconds_down: int) -> int:
        stand_in.states["r1"] = "DOWN"  # where a failed restart leaves it: its new TorchServe does not answer
        stand_in.seconds_in_state["r1"] = seconds_down
        heal_once(args, quiet=True, failures=failures)
        return len(stand_in.restarts)

    assert [round_at(40), round_at(40), round_at(59), round_at(60)] == [1, 1, 1, 2]  # 30 s, then 60
    assert (round_at(119), round_at(120), failures) == (2, 3, {"r1": 3})  # then 120
    del stand_in.failures["r1", "old.mar"]  # its archive loads again (disk freed, say)
    assert (round_at(240), failures) == (4, {})
    failures["r1"] = 20  # twenty failures in a row: an hour at the most, not 30 s x 2^20
    assert (round_at(3599), round_at(3600), failures) == (4, 5, {})
    failures["r1"] = 5
    stand_in.states["r1"] = "UP"  # back by other means: forgotten
    heal_once(args, quiet=True, failures=failures)
    assert failures == {}


def test_heal_leaves_a_fleet_a_roll_holds_to_the_roll(fleet, probe_url, tmp_path, monkeypatch, capsys):
    """A roll (or a restart, or `down`) holds the roll lock: its replicas are DOWN on purpose, mid-restart."""
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    stand_in = StandInFleet(fleet, probe_url)
    stand_in.states.update(r1="DOWN")
    monkeypatch.setattr("scripts.fleet.ended_processes", lambda root: {"haproxy": 6})
    with _lock_held_unrecorded(stand_in.dir):
        assert heal_command(stand_in, probe) == 0
    assert stand_in.restarts == [] and "holds the fleet now: nothing started again" in capsys.readouterr().out


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """This process's SIGINT and SIGTERM handlers as they were, after a test that runs the command line's
    (scripts.fleet installs its own for a roll)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_restart_all_on_the_command_line_restarts_every_replica_on_the_archive_it_runs(
    fleet, probe_url, tmp_path, own_signal_handlers
):
    """`scripts.fleet restart --all` (its own function, the fleet it attaches a stand-in): a roll with `every`, each
    replica restarted on old.mar, which a plain roll onto old.mar would leave as they are. The roll's moves through
    real TorchServe replicas and HAProxy: tests/e2e/test_fleet.py (the roll and the one-replica restart)."""
    import argparse

    from scripts.fleet import restart_replica

    stand_in = StandInFleet(fleet, probe_url)
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    args = argparse.Namespace(root=fleet.root, replica=[], all=True, probe=probe, no_surge=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fleet, "attach", classmethod(lambda cls, root: stand_in))
        exit_status = restart_replica(args)
    assert exit_status == 0
    assert stand_in.restarts == [("r0", "old.mar"), ("r1", "old.mar")] and stand_in.states == {"r0": "UP", "r1": "UP"}


@pytest.mark.parametrize("interrupted_at, status", [("r0", 1), ("r1", 0)])
def test_a_rolling_restart_interrupted_ends_between_replicas_and_exits_1_unless_at_the_last(
    fleet, probe_url, tmp_path, interrupted_at, status, own_signal_handlers
):
    """The first Ctrl-C of `restart --all` (scripts.fleet.rolled, its signal handlers) finishes the replica in hand
    and ends before the next: exit 1 while a replica is left, 0 when the last one was in hand."""
    import argparse

    from scripts.fleet import rolled

    def ctrl_c(name: str, archive: str) -> None:
        if name == interrupted_at:
            os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this thread: the handler sets the roll's stop

    stand_in = StandInFleet(fleet, probe_url, on_restart=ctrl_c)
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    exit_status = rolled(stand_in, "old.mar", argparse.Namespace(probe=probe, no_surge=True), every=True)
    assert exit_status == status
    assert stand_in.restarts == [("r0", "old.mar"), ("r1", "old.mar")][: 1 if interrupted_at == "r0" else 2]
    assert stand_in.states == {"r0": "UP", "r1": "UP"}


def test_the_commands_a_fleet_prints_name_its_root_where_it_is_not_the_default(tmp_path):
    """`up --root X` printed `... scripts.fleet down` without it: run as printed, `down` looked under logs/, said it
    stopped nothing, and left the fleet running."""
    import argparse

    from scripts.fleet import fleet_command as printed
    from tooling.fleet import DEFAULT_ROOT

    assert (
        printed(argparse.Namespace(root=tmp_path), "down")
        == f".venv/bin/python -m scripts.fleet --root {tmp_path} down"
    )
    assert printed(argparse.Namespace(root=DEFAULT_ROOT), "drain r0") == ".venv/bin/python -m scripts.fleet drain r0"
    drained = fleet_command(tmp_path, "drain", "r0")  # no fleet there: said, with where it looked
    assert drained.returncode == 1 and f"fleet: no fleet is up under {tmp_path}" in drained.stderr, drained
    stopped = fleet_command(tmp_path, "down")
    assert f"stopped nothing (no fleet was running under {tmp_path})" in stopped.stdout, stopped
