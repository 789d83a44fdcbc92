"""Roll a running fleet onto another archive, one replica at a time, without failing a request.

For each replica in turn:

1. drain it in HAProxy (it gets no new request) and wait until HAProxy counts nothing in flight on
   it. Unlike a TorchServe version (tooling/model_update.py, which has to wait a whole response
   timeout), the load balancer knows exactly what a replica holds, so the wait is what it holds;
2. restart it on the new archive, on the same ports and cores, and wait until every worker is READY
   (a load failure is read from its workers' log at once, not waited out);
3. send it one probe request directly, past HAProxy: it must answer 200;
4. put it back in rotation and wait until HAProxy has it UP.

The other replicas serve meanwhile. So that the fleet keeps its capacity, the roll first brings in
the surge replica (a spare slot HAProxy knows, in maintenance until then) on the new archive, the same
way: it must load and answer the probe before any replica is touched, so an archive that cannot serve
stops the roll with nothing changed. It serves beside the others during every step, unpinned (it shares
the fleet's cores, the restarting replica's among them), and is drained and stopped at the end; after an
abort it stays in rotation, kept by the same roll run again, stopped by any other or by `down`.
Without it (`surge=False`, or a fleet started before the slot existed) the fleet runs one replica
short during each step. Until the last step both archives answer (each answer's `X-Replica` says which
replica gave it).

If a replica cannot load or answer the new archive, it is restarted on the archive it ran and put
back, and every replica already rolled is rolled back the same way: the fleet ends on the archive it
began with (a roll resumed ends as it was resumed), and the error says why. That needs every archive as
its replica loaded it: a roll whose files changed since (an archive rebuilt in place) is refused, and a
replica that loaded the target after it changed during the roll is rolled back with the rest. A
replica that already runs the archive, as loaded, is left as it is, so a roll that was interrupted is
finished by the same command again.
One roll at a time (a lock in the fleet's directory, which names the roll's process); `down` stops a
roll in progress before it stops the fleet (`roll_stopped`).

`restart` is the same step for one replica onto the archive it runs, under the same lock: what starts
again a replica whose TorchServe died, which a roll leaves as it is.
`scripts/fleet.py roll` and `restart` are the command line; docs/fleet.md the guide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
import requests

from tooling.fleet import FRONT, Fleet, Replica, file_stamp, ports_taken
from tooling.fleet_config import FleetError
from tooling.haproxy_admin import is_down
from tooling.model_archive import NotAnArchive
from tooling.processes import has_ended, process_record, same_process, wait_for

UP_TIMEOUT_S = 30.0  # HAProxy marks a server UP after two passing checks, one a second
ALL_UP_WAIT_S = 10.0  # on a loaded host one slow health check shows a replica "UP 1/2" for a moment


ROLL_LOCK = "roll.lock"  # in the fleet's directory: held by the roll running, and by `down`


@dataclass(frozen=True)
class Step:
    """One replica moved: how long it was out of rotation, what it held when drained, and how
    many requests HAProxy had to send again because they failed on it meanwhile (0 when the drain held)."""

    replica: str
    in_flight_at_drain: int
    seconds: float
    retried: int


@contextlib.contextmanager
def only_roll(fleet_dir: Path, doing: str = "a roll") -> Iterator[None]:
    """Hold the fleet's roll lock: a second roll at once would take a second replica out of rotation.
    `doing` names the work for whoever finds the lock held ("the restart of r1"): `down`, a refused command."""
    # "a+", not "w": opening must not empty the record of a roll that holds the lock.
    with open(fleet_dir / ROLL_LOCK, "a+") as lock:
        if not _locked(lock):
            raise FleetError(f"{holding(_lock_record(lock))} holds this fleet: wait for it to end")
        # Who rolls, for `down` (roll_stopped): it stops a roll before it stops the fleet.
        lock.truncate(0)
        lock.write(json.dumps({**process_record(os.getpid()), "doing": doing}))
        lock.flush()
        try:
            yield
        finally:
            # Cleared as the lock is let go: a record left behind would name a process that no longer rolls, and a
            # `down` that found the lock held a moment later (heal --every looking) would stop that process.
            lock.truncate(0)
            lock.flush()


@contextlib.contextmanager
def roll_stopped(fleet_dir: Path, timeout: float = 30.0) -> Iterator[dict | None]:
    """Hold the roll lock while the fleet goes down; a roll in progress is stopped first, so that it cannot
    start a replica, or write the fleet's records again, after `down` stopped everything. The roll's process
    gets SIGTERM twice, which aborts it as a second Ctrl-C does (scripts/fleet.py: nothing rolled back, what it
    started recorded for `down`); SIGKILL past two thirds of `timeout`. The process must have ended, not only
    let the lock go: a restart thread of its own could still start a replica while it unwinds. Yields the
    stopped roll's record, or None."""
    if not fleet_dir.is_dir():
        yield None
        return
    with open(fleet_dir / ROLL_LOCK, "a+") as lock:
        holder: dict | None = None
        deadline = time.monotonic() + timeout
        sent = 0  # SIGTERMs: a third would interrupt the abort's own unwinding (what it says of where it stood)
        signalled = 0.0

        def holder_running() -> psutil.Process | None:
            process = same_process(holder) if holder is not None else None
            return process if process is not None and not has_ended(process) else None

        while not _locked(lock) or holder_running() is not None:
            if holder is None:
                holder = _lock_record(lock)
            now = time.monotonic()
            if now > deadline:
                raise FleetError(f"{holding(holder)} did not stop within {timeout:.0f}s: nothing stopped")
            if holder is not None and int(holder["pid"]) == os.getpid():
                raise FleetError("this process holds the roll lock: it cannot stop its own roll")
            process = holder_running()
            if process is not None and now - signalled >= 0.5:
                kill = now > deadline - timeout / 3
                if kill or sent < 2:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                    sent += 1
                    signalled = now
            time.sleep(0.05)
        yield holder


def roll_running(fleet_dir: Path) -> bool:
    """Whether a roll, a restart or `down` holds the fleet's roll lock at this moment."""
    with open(fleet_dir / ROLL_LOCK, "a+") as lock:
        return not _locked(lock)  # taken here, it is let go as the file closes


def holding(record: dict | None) -> str:
    """What the lock's holder does, from its record: "the restart of r1 (pid 4729)"."""
    if not record:  # `down` writes none; a record is empty the moment a roll takes the lock
        return "another roll, restart or `down` of this fleet"
    return f"{record.get('doing', 'a roll')} (pid {record['pid']})"


def _lock_record(lock: IO[str]) -> dict | None:
    """The record the lock's holder wrote (only_roll), or None: `down` writes none, and it is empty, or half written,
    the moment a roll takes the lock."""
    lock.seek(0)
    try:
        record = json.loads(lock.read())
    except ValueError:
        return None
    return record if isinstance(record, dict) and "pid" in record else None


def _locked(lock: IO[str]) -> bool:
    """Take `lock` (flock, exclusive) if no other open file holds it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def check_current(fleet: Fleet) -> None:
    """Refuse to work from a stale reading: the replicas this object knows must be the ones recorded now."""
    try:
        records = json.loads(fleet.processes_file.read_text())
    except FileNotFoundError:
        raise FleetError("the fleet is no longer up") from None
    surge = fleet.surge.leader if fleet.surge is not None else None
    if records["replicas"] != [replica.leader for replica in fleet.replicas] or records.get("surge") != surge:
        raise FleetError("the fleet changed since it was read (another roll ended meanwhile?): run the roll again")


def replicas_to_move(fleet: Fleet, archive: str, every: bool = False) -> list[int]:
    """The replicas a roll onto `archive` moves, in order (`every`: all of them, those already on it too); FleetError
    for a roll that could fail a request or could not be rolled back, before anything is touched."""
    path = fleet.spec.model_store / archive
    if not path.is_file():
        raise FleetError(f"no {archive} in the fleet's model store {fleet.spec.model_store}: copy it there")
    for replica in fleet.replicas:
        refuse_unless_as_loaded(
            fleet,
            replica,
            "a roll",
            (
                "a roll onto it would leave replicas on different models under one name"
                if replica.archive == archive
                else "a roll back would not restore what it runs"
            )
            + ". Give a new archive a file name of its own (`scripts.archive_model --name`), put the old file "
            "back, or start the fleet anew (`down`, then `up --archive`)",
        )
    try:
        timeout = fleet.response_timeout_of(archive)
    except NotAnArchive as error:
        raise FleetError(str(error)) from None
    if timeout > fleet.response_timeout:
        raise FleetError(
            f"{archive}'s response timeout ({timeout} s) is longer than the fleet's ({fleet.response_timeout} s), "
            f"from which HAProxy's `timeout server` ({fleet.timeout_server} s) is set: HAProxy would cut its "
            "slow batches short. Serve it on a new fleet (`down`, then `up --archive`)"
        )
    moving = [index for index, replica in enumerate(fleet.replicas) if every or replica.archive != archive]
    names = [replica.name for replica in fleet.replicas]
    with contextlib.suppress(FleetError):
        wait_for(lambda: all(fleet.servers()[name]["status"] == "UP" for name in names), ALL_UP_WAIT_S, "all UP")
    servers = fleet.servers()
    out = [index for index, replica in enumerate(fleet.replicas) if servers[replica.name]["status"] != "UP"]
    staying_out = sorted(fleet.replicas[index].name for index in out if index not in moving)
    if staying_out:
        # A replica HAProxy's checks find DOWN does not answer: `ready` cannot bring it back, a restart does.
        dead = [name for name in staying_out if is_down(servers[name]["status"])]
        drained = [name for name in staying_out if name not in dead]
        then = [f"`restart {name}`" for name in dead] + [f"`ready {name}`" for name in drained]
        raise FleetError(
            f"{', '.join(staying_out)}: on {archive} already, but not in rotation"
            + (f" ({', '.join(dead)}: DOWN, its TorchServe does not answer HAProxy's checks)" if dead else "")
            + f": a roll takes one replica out at a time, and would leave too few; bring them back first "
            f"({', '.join(then)})"
        )
    # A replica out of rotation that the roll moves (one an aborted roll left stopped) goes first: taking it
    # out again costs nothing.
    return sorted(moving, key=lambda index: index not in out)


def refuse_unless_as_loaded(fleet: Fleet, replica: Replica, what: str, because: str) -> None:
    """FleetError unless `replica`'s archive file is still the one it loaded (its size and modification time,
    recorded at each start): else `what` ("a roll", "a restart") would load another file, which `because` says
    the harm of."""
    if replica.archive_stamp is None:
        raise FleetError(
            f"{replica.name} was started before archives were stamped (an older checkout): {what} could not tell "
            "whether its archive is the one it loaded. Start the fleet anew (`down`, then `up`)"
        )
    loaded = fleet.spec.model_store / replica.archive
    if not loaded.is_file() or file_stamp(loaded) != replica.archive_stamp:
        raise FleetError(
            f"{replica.name} runs {replica.archive}, and that file changed since {replica.name} loaded it: {because}"
        )


def in_flight(fleet: Fleet, name: str) -> int:
    """Requests HAProxy has on replica `name`: being answered, or queued for it."""
    row = fleet.servers()[name]
    return int(row["scur"] or 0) + int(row["qcur"] or 0)


def sent_again(fleet: Fleet, name: str) -> int:
    """HAProxy's count of requests it retried or redispatched after they failed on replica `name`."""
    row = fleet.servers()[name]
    return int(row["wretr"] or 0) + int(row["wredis"] or 0)


def move_replica(
    fleet: Fleet, replica: Replica, archive: str, stamp: list[int] | None, probe: bytes, load_timeout: float
) -> Step:
    """Drain `replica`, restart it on `archive`, probe it, and put it back in rotation (the surge replica:
    bring it in). `stamp`: the archive file as the roll found it; a replica that loaded another file is
    refused (None: not checked)."""
    target = fleet.spec.model_store / archive
    if stamp is not None and (not target.is_file() or file_stamp(target) != stamp):
        raise FleetError(f"{archive} changed during the roll, before {replica.name}'s turn: others run the old file")
    started, retried = time.monotonic(), sent_again(fleet, replica.name)
    fleet.set_server_state(replica.name, "drain")
    held = in_flight(fleet, replica.name)
    # Nothing outlives HAProxy's `timeout server` on a replica: by then HAProxy has retried it elsewhere.
    wait_for(
        lambda: in_flight(fleet, replica.name) == 0,
        fleet.timeout_server + 5,
        f"the requests in flight on {replica.name} to finish",
    )
    fleet.restart(replica, timeout=load_timeout, archive=archive)
    if stamp is not None and replica.archive_stamp != stamp:
        raise FleetError(f"{archive} changed during the roll: {replica.name} loaded another file than the others")
    answer = requests.post(
        f"{replica.inference_url}/predictions/{fleet.spec.model_name}",
        data=probe,
        headers={"Content-Type": "text/plain"},
        timeout=fleet.response_timeout + 5,
    )
    if answer.status_code != 200:
        raise FleetError(f"{replica.name} answered the probe with HTTP {answer.status_code}: {answer.text[:300]}")
    fleet.set_server_state(replica.name, "ready")
    wait_for(
        lambda: fleet.servers()[replica.name]["status"] == "UP", UP_TIMEOUT_S, f"HAProxy to have {replica.name} UP"
    )
    return Step(replica.name, held, time.monotonic() - started, sent_again(fleet, replica.name) - retried)


def restart(
    fleet: Fleet, name: str, probe: bytes, *, load_timeout: float = 180.0, say: Callable[[str], None] = print
) -> Step:
    """Start replica `name` again on the archive it runs, as it loaded it: drain, restart on the same ports and
    cores, probe, back in rotation (`move_replica` onto its own archive). What brings back a replica whose
    TorchServe died or hangs (HAProxy has it DOWN): a roll leaves a replica already on its archive as it is.
    FleetError before anything is touched for the surge slot, a replica the fleet has not, an archive file
    changed since the replica loaded it, or a restart that would leave no replica in rotation; FleetError
    naming the replica's log when it cannot load or answer (it stays out of rotation: nothing to go back to)."""
    with only_roll(fleet.dir, f"the restart of {name}"):  # a roll moving replicas meanwhile could take a second one out
        check_current(fleet)
        replica = replica_to_restart(fleet, name)
        say(f"==> {name}: drain, restart on {replica.archive}, probe, back in rotation")
        try:
            with said_where_interrupted(name, say, f"`restart {name}` again starts it"):
                step = move_replica(fleet, replica, replica.archive, replica.archive_stamp, probe, load_timeout)
        except Exception as error:
            raise FleetError(
                f"{name} could not be restarted on {replica.archive}: {error}. It is out of rotation; its logs are "
                f"under {replica.workdir / 'logs'}"
            ) from error
        say(
            f"    {name} serves {replica.archive} again: out of rotation {step.seconds:.1f} s, "
            f"{step.in_flight_at_drain} in flight when drained, {step.retried} sent again by HAProxy"
        )
        return step


def restart_watcher(fleet: Fleet, name: str, say: Callable[[str], None] = print) -> None:
    """Start the fleet's HAProxy (FRONT) or Prometheus again once it has ended (Fleet.restart_haproxy,
    Fleet.restart_prometheus), under the roll lock: a roll sets its servers' states through HAProxy and asks
    Prometheus what it scrapes."""
    with only_roll(fleet.dir, f"the restart of {'HAProxy' if name == FRONT else 'Prometheus'}"):
        if name == FRONT:
            fleet.restart_haproxy()
            say(f"==> HAProxy runs again on {fleet.front_url} (pid {fleet.haproxy.pid}), each replica as last set "
                "(drained stays drained), back in rotation once its checks pass: `status` shows them")  # fmt: skip
        else:
            fleet.restart_prometheus()
            say(f"==> Prometheus runs again on {fleet.prometheus_url} (pid {fleet.prometheus.pid}), on its data "
                "folder: the series it had written to disk go on; nothing was scraped while it was down")  # fmt: skip


def named_replica(fleet: Fleet, name: str) -> Replica:
    """The fleet's replica `name`; FleetError for the surge slot or a name the fleet has not."""
    if fleet.surge is not None and name == fleet.surge.name:
        raise FleetError(f"{name} is the surge slot, the roll's alone: a roll starts and stops it")
    replica = next((replica for replica in fleet.replicas if replica.name == name), None)
    if replica is None:
        names = ", ".join(replica.name for replica in fleet.replicas)
        raise FleetError(f"no replica {name} in this fleet (it has {names}; `status` lists them)")
    return replica


def replica_to_restart(fleet: Fleet, name: str) -> Replica:
    """Replica `name`, if `restart` may start it again; FleetError saying why not."""
    replica = named_replica(fleet, name)
    refuse_unless_as_loaded(
        fleet,
        replica,
        "a restart",
        "restarted, it would serve another model than the others under the same name. Put the old file back, or "
        "`roll` every replica onto a new archive (it moves this one first)",
    )
    servers = fleet.servers()
    serving = [other for other, row in servers.items() if row["status"] == "UP"]
    if serving == [name]:
        raise FleetError(
            f"{name} is the only replica in rotation: restarting it would fail every request meanwhile. "
            "Bring another back first (`status`; `restart` or `ready` it)"
        )
    return replica


def roll(
    fleet: Fleet,
    archive: str,
    probe: bytes,
    *,
    load_timeout: float = 180.0,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    surge: bool = True,
    every: bool = False,
) -> list[Step]:
    """Serve `archive` (a file name in the fleet's model store) on every replica of `fleet`, one at a time,
    with the surge replica in rotation meanwhile (`surge`, where the fleet has the slot).

    Replicas that already run it are left as they are, unless `every` (a rolling restart: each replica started
    again, the same way, on the archive it runs). FleetError if it cannot: nothing was touched (a
    refused roll, or an archive the surge replica cannot serve), or every replica it moved is back on the
    archive it ran (a rolled-back one), as the message says. `stop` set: the replica in hand is finished,
    and the roll ends before the next one (the steps taken are returned). An abort (KeyboardInterrupt,
    SystemExit) is not rolled back: it says where. The surge replica is stopped however the roll ends,
    but for an abort: the next roll, or `down`, stops it then.
    """
    with only_roll(fleet.dir, "the rolling restart" if every else f"the roll onto {archive}"):
        check_current(fleet)
        moving = replicas_to_move(fleet, archive, every)
        stamp = file_stamp(fleet.spec.model_store / archive)
        surging = surge and fleet.surge is not None and bool(moving) and not (stop is not None and stop.is_set())
        problem = None  # what went wrong retiring the surge replica, said at the end
        left = fleet.surge is not None and fleet.surge.leader is not None
        if left and not (surging and surge_serves(fleet, archive, stamp)):
            problem = retire_surge(fleet, say)  # one an aborted roll left running, not wanted now
        steps: list[Step] = []
        if not moving:
            say(f"==> every replica already serves {archive}")
        elif surging:
            surge_name = fleet.surge.name
            since = surge_counts(fleet)
            if fleet.surge.leader is None:
                bring_in_surge(fleet, archive, stamp, probe, load_timeout, say)
            else:
                say(f"==> {surge_name}: serves {archive} already (a roll interrupted), kept in rotation")
            with said_if_aborted(f"    {surge_name} still runs: the next `roll`, or `down`, stops it", say):
                try:
                    steps = roll_replicas(fleet, archive, stamp, moving, probe, load_timeout, say, stop)
                except Exception:
                    retire_surge(fleet, say, since)
                    raise
                record_archive(fleet, archive)
                problem = retire_surge(fleet, say, since) or problem
        else:
            if surge and fleet.surge is None:
                say("==> no surge slot (a fleet started by an older checkout): each step runs a replica short")
            steps = roll_replicas(fleet, archive, stamp, moving, probe, load_timeout, say, stop)
        record_archive(fleet, archive)
        if problem is not None:
            raise FleetError(f"every replica it reached serves {archive}, but the surge replica {problem}")
        return steps


def record_archive(fleet: Fleet, archive: str) -> None:
    """Once every replica serves `archive`, it is the fleet's (what `status` and the next `attach` read)."""
    if all(replica.archive == archive for replica in fleet.replicas) and fleet.spec.archive != archive:
        fleet.spec = dataclasses.replace(fleet.spec, archive=archive)
        fleet.save_state()


@contextlib.contextmanager
def said_if_aborted(message: str, say: Callable[[str], None]) -> Iterator[None]:
    """Say `message` when an abort (KeyboardInterrupt, SystemExit) passes through."""
    try:
        yield
    except Exception:
        raise
    except BaseException:
        say(message)
        raise


def surge_serves(fleet: Fleet, archive: str, stamp: list[int]) -> bool:
    """Whether the surge replica, left running, serves `archive`'s file as it is now (`stamp`), in rotation."""
    surge = fleet.surge
    assert surge is not None
    return surge.archive == archive and surge.archive_stamp == stamp and fleet.servers()[surge.name]["status"] == "UP"


def bring_in_surge(
    fleet: Fleet, archive: str, stamp: list[int], probe: bytes, load_timeout: float, say: Callable[[str], None]
) -> None:
    """Start the surge replica on `archive`, probe it and put it in rotation; FleetError, with it stopped
    again, if it cannot serve the archive: no replica was touched."""
    surge = fleet.surge
    assert surge is not None
    taken = ports_taken(surge)
    if taken:
        raise FleetError(
            f"the surge replica's ports {taken} (chosen at `up`) are taken by another process: nothing was touched; "
            "`roll --no-surge` goes without it"
        )
    say(f"==> {surge.name}: start on {archive}, probe, in rotation (the fleet keeps its capacity meanwhile)")
    try:
        with said_if_aborted(f"    aborted while {surge.name} started: the next `roll`, or `down`, stops it", say):
            move_replica(fleet, surge, archive, stamp, probe, load_timeout)
    except Exception as error:
        say(f"    {error}")
        retire_surge(fleet, say)
        raise FleetError(
            f"the roll onto {archive} stopped before any replica: the surge replica could not serve it: {error}. "
            "No replica was touched"
        ) from error


def roll_replicas(
    fleet: Fleet,
    archive: str,
    stamp: list[int],
    moving: list[int],
    probe: bytes,
    load_timeout: float,
    say: Callable[[str], None],
    stop: threading.Event | None,
) -> list[Step]:
    """Move the replicas `moving`, in order; on a failure, roll back those moved and raise FleetError."""
    before = [(replica.archive, replica.archive_stamp) for replica in fleet.replicas]
    steps: list[Step] = []
    for position, index in enumerate(moving):
        name = fleet.replicas[index].name
        if stop is not None and stop.is_set():
            say(f"==> stopped before {name}, as asked: every replica in rotation; the same `roll` moves the rest")
            return steps
        say(f"==> {name}: drain, restart on {archive}, probe, back in rotation")
        try:
            with said_where_interrupted(name, say, "the same `roll` again moves it first"):
                steps.append(move_replica(fleet, fleet.replicas[index], archive, stamp, probe, load_timeout))
        except Exception as error:
            say(f"    {error}")
            roll_back(fleet, before, moving[: position + 1], probe, load_timeout, say)
            was = ", ".join(sorted({name for name, _ in before}))
            raise FleetError(
                f"the roll onto {archive} stopped at {name}: {error}. Rolled back: each replica it moved "
                f"serves what it did before; the fleet runs {was}"
            ) from error
        step = steps[-1]
        say(
            f"    {name} serves {archive}: out of rotation {step.seconds:.1f} s, "
            f"{step.in_flight_at_drain} in flight when drained, {step.retried} sent again by HAProxy"
        )
    return steps


def surge_counts(fleet: Fleet) -> tuple[int, int]:
    """HAProxy's counts for the surge slot: requests sent to it, and requests it had to send again."""
    assert fleet.surge is not None
    return int(fleet.servers()[fleet.surge.name]["stot"] or 0), sent_again(fleet, fleet.surge.name)


def retire_surge(fleet: Fleet, say: Callable[[str], None], since: tuple[int, int] | None = None) -> str | None:
    """Drain the surge replica, wait until HAProxy counts nothing in flight on it, stop it, and put its slot
    back in maintenance; say what it answered since `since` (surge_counts before it came in). What went wrong,
    if anything, is said and returned, not raised (a roll that failed has its own error to raise); the
    process is stopped even then, since HAProxy then sends it nothing or is gone."""
    surge = fleet.surge
    assert surge is not None
    problem, counts = None, None
    try:
        fleet.set_server_state(surge.name, "drain")
        wait_for(lambda: in_flight(fleet, surge.name) == 0, fleet.timeout_server + 5, f"{surge.name} to finish")
        counts = surge_counts(fleet)
    except (FleetError, OSError, LookupError, ValueError) as error:
        problem = f"could not be drained: {error}"
    fleet.stop_surge()
    try:
        fleet.set_server_state(surge.name, "maint")
    except (FleetError, OSError) as error:
        problem = problem or f"was stopped, but its slot is not back in maintenance: {error}"
    if problem is not None:
        say(f"    {surge.name} {problem}")
        return problem
    said = f"==> {surge.name}: drained and stopped"
    if since is not None and counts is not None:
        said += f"; it answered {counts[0] - since[0]} requests, {counts[1] - since[1]} sent again by HAProxy"
    say(said)
    return None


def said_where_interrupted(name: str, say: Callable[[str], None], then: str) -> contextlib.AbstractContextManager:
    """On an abort, say where the roll stopped and what to do; no roll back, which would take as long."""
    return said_if_aborted(
        f"    aborted at {name}: it may be stopped, or still loading (`status`). Once it is READY, `ready {name}` "
        f"puts it back; stopped, {then}",
        say,
    )


def roll_back(
    fleet: Fleet,
    before: list[tuple[str, list[int] | None]],
    moved: list[int],
    probe: bytes,
    load_timeout: float,
    say: Callable[[str], None],
) -> None:
    """Put the replicas in `moved` (the last one the one that failed) back on the archive each ran, last first."""
    failed = moved[-1]
    for index in reversed(moved):
        replica = fleet.replicas[index]
        archive, stamp = before[index]
        say(f"==> {replica.name}: back to {archive}")
        try:
            with said_where_interrupted(replica.name, say, f"the same `roll` onto {archive} puts it back"):
                if index == failed and replica.archive == archive and ready(fleet, index):
                    # It failed before its restart (the drain): it still serves the old archive; only put it back.
                    fleet.set_server_state(replica.name, "ready")
                else:
                    move_replica(fleet, replica, archive, stamp, probe, load_timeout)
        except Exception as error:
            raise FleetError(
                f"the roll failed, and {replica.name} could not go back to {archive} either: {error}. "
                "`status` shows what serves; `down`, then `up`, starts the fleet anew"
            ) from error


def ready(fleet: Fleet, index: int) -> bool:
    """Whether replica `index` answers that every worker is READY (False when it cannot be asked)."""
    try:
        return fleet.replica_ready(fleet.replicas[index])
    except (requests.RequestException, ValueError, LookupError):
        return False
