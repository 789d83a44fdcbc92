"""Roll a running fleet onto another archive, one replica at a time, without failing a request.

For each replica in turn:

1. drain it in HAProxy (it gets no new request) and wait until HAProxy counts nothing in flight on
   it. Unlike a TorchServe version (tooling/model_update.py, which has to wait a whole response
   timeout), the load balancer knows exactly what a replica holds, so the wait is what it holds;
2. restart it on the new archive, on the same ports and cores, and wait until every worker is READY
   (a load failure is read from its workers' log at once, not waited out);
3. send it one probe request directly, past HAProxy: it must answer 200;
4. put it back in rotation and wait until HAProxy has it UP.

The other replicas serve meanwhile: the fleet runs one replica short during each step, and until the
last step both archives answer (each answer's `X-Replica` says which replica gave it).

If a replica cannot load or answer the new archive, it is restarted on the archive it ran and put
back, and every replica already rolled is rolled back the same way: the fleet ends on the archive it
began with, and the error says why. `scripts/fleet.py roll` is the command line; docs/fleet.md the guide.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from tooling.fleet import Fleet, wait_for
from tooling.fleet_config import FleetError
from tooling.model_archive import NotAnArchive

UP_TIMEOUT_S = 30.0  # HAProxy marks a server UP after two passing checks, one a second


@dataclass(frozen=True)
class Step:
    """One replica moved onto an archive: how long it was out of rotation, and what it held when drained."""

    replica: str
    archive: str
    in_flight_at_drain: int
    seconds: float


def check_rollable(fleet: Fleet, archive: str) -> None:
    """Refuse a roll that could fail a request, before anything is touched."""
    path = fleet.spec.model_store / archive
    if not path.is_file():
        raise FleetError(f"no {archive} in the fleet's model store {fleet.spec.model_store}: copy it there")
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
    out = {name: row["status"] for name, row in fleet.servers().items() if row["status"] != "UP"}
    if out:
        raise FleetError(
            f"not every replica is in rotation ({', '.join(f'{n} {s}' for n, s in sorted(out.items()))}): a roll "
            "takes one replica out at a time, and would leave none; bring them back first (`ready`)"
        )


def in_flight(fleet: Fleet, name: str) -> int:
    """Requests HAProxy has on replica `name`: being answered, or queued for it."""
    row = fleet.servers()[name]
    return int(row["scur"] or 0) + int(row["qcur"] or 0)


def move_replica(fleet: Fleet, index: int, archive: str, probe: bytes, load_timeout: float) -> Step:
    """Drain replica `index`, restart it on `archive`, probe it, and put it back in rotation."""
    replica = fleet.replicas[index]
    started = time.monotonic()
    fleet.set_server_state(replica.name, "drain")
    held = in_flight(fleet, replica.name)
    # Nothing outlives HAProxy's `timeout server` on a replica: by then HAProxy has retried it elsewhere.
    wait_for(
        lambda: in_flight(fleet, replica.name) == 0,
        fleet.timeout_server + 5,
        f"the requests in flight on {replica.name} to finish",
    )
    fleet.restart_replica(index, timeout=load_timeout, archive=archive)
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
    return Step(replica.name, archive, held, time.monotonic() - started)


def roll(
    fleet: Fleet,
    archive: str,
    probe: bytes,
    *,
    load_timeout: float = 180.0,
    say: Callable[[str], None] = print,
) -> list[Step]:
    """Serve `archive` (a file name in the fleet's model store) on every replica of `fleet`, one at a time.

    FleetError if it cannot: nothing was touched (a refused roll), or every replica is back on the
    archive it ran (a rolled-back one), as the message says.
    """
    check_rollable(fleet, archive)
    before = [replica.archive for replica in fleet.replicas]
    steps: list[Step] = []
    for index, replica in enumerate(fleet.replicas):
        say(f"==> {replica.name}: drain, restart on {archive}, probe, back in rotation")
        try:
            steps.append(move_replica(fleet, index, archive, probe, load_timeout))
        except (FleetError, RuntimeError, OSError, requests.RequestException) as error:
            say(f"    {error}")
            roll_back(fleet, before, index, probe, load_timeout, say)
            raise FleetError(
                f"the roll onto {archive} stopped at {replica.name}: {error}. Rolled back: every replica serves "
                f"{', '.join(sorted(set(before)))} again"
            ) from error
        say(
            f"    {replica.name} serves {archive}: out of rotation {steps[-1].seconds:.1f} s, "
            f"{steps[-1].in_flight_at_drain} in flight when drained"
        )
    fleet.spec = dataclasses.replace(fleet.spec, archive=archive)
    fleet.save_state()
    return steps


def roll_back(
    fleet: Fleet, before: list[str], failed: int, probe: bytes, load_timeout: float, say: Callable[[str], None]
) -> None:
    """Put replica `failed` and every replica rolled before it back on the archive each ran."""
    for index in range(failed, -1, -1):
        name = fleet.replicas[index].name
        say(f"==> {name}: back to {before[index]}")
        try:
            move_replica(fleet, index, before[index], probe, load_timeout)
        except (FleetError, RuntimeError, OSError, requests.RequestException) as error:
            raise FleetError(
                f"the roll failed, and {name} could not go back to {before[index]} either: {error}. "
                "`status` shows what serves; `down`, then `up`, starts the fleet anew"
            ) from error
