"""A fleet on one machine: N TorchServe replicas behind HAProxy, watched by Prometheus (tooling/fleet.py).

    .venv/bin/python -m scripts.fleet up --replicas 2     # start; prints the front URL and a curl
    .venv/bin/python -m scripts.fleet status              # what runs, HAProxy's and Prometheus's view (--json)
    .venv/bin/python -m scripts.fleet drain r0            # HAProxy: r0 finishes its requests, gets no new ones
    .venv/bin/python -m scripts.fleet ready r0            # back in rotation
    .venv/bin/python -m scripts.fleet restart r0          # r0 started again on its archive (its TorchServe died)
    .venv/bin/python -m scripts.fleet restart r0 r1       # several in turn (HAProxy, Prometheus first where named)
    .venv/bin/python -m scripts.fleet restart --all       # a rolling restart: each replica in turn, as a roll does
    .venv/bin/python -m scripts.fleet restart haproxy     # HAProxy started again as it ran (its process died)
    .venv/bin/python -m scripts.fleet heal                # start again what died (from cron: every minute)
    .venv/bin/python -m scripts.fleet heal --every 5      # the same every 5 s, until the fleet is down
    .venv/bin/python -m scripts.fleet roll bert-2.mar     # every replica onto another archive, one at a time
    .venv/bin/python -m scripts.fleet down                # stop exactly what `up` started (and a roll running)

`up` serves model_store/bert.mar (built by scripts/setup.sh) as `bert` with the cluster configuration,
writes logs/fleet.json, and returns once every replica is ready and every scrape target is up.
`roll` first brings in a surge replica on the archive (the fleet keeps its capacity; an archive it
cannot serve stops the roll with nothing touched), then drains one replica at a time, restarts it on
the archive, probes it and puts it back, failing no request; a replica that cannot serve the archive
rolls every replica back; the surge replica is stopped at the end (tooling/fleet_roll.py).
`restart` is one such step onto the archive the replica runs (`--all`: every replica, as a roll onto the fleet's
archive that moves each one). `heal` restarts, as `restart` does, HAProxy or Prometheus whose process ended and each
replica HAProxy has had DOWN for --down-for seconds: what a timer runs, since nothing else starts them again.
`status` exits 1 while a replica is DOWN.
Needs the Debian packages haproxy and prometheus (scripts/install_system_packages.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tooling.cli_arguments import existing_file, non_negative_float, non_negative_int, positive_float, positive_int
from tooling.cpu_layout import Layout
from tooling.fleet import DEFAULT_ROOT, FRONT, SURGE, WATCHERS, Fleet, ended_processes, read_state, stop_fleet
from tooling.fleet_config import FleetError, FleetSpec
from tooling.fleet_roll import (
    holding,
    named_replica,
    restart,
    restart_watcher,
    roll,
    roll_running,
    roll_stopped,
)
from tooling.haproxy_admin import haproxy_servers, is_down, set_server_state
from tooling.latency_budget import DEFAULT_BUDGET_MS
from tooling.paths import MODEL_STORE, REVIEW
from tooling.termination import exit_on_sigterm, raise_terminated

SAMPLE = '{"text": "The staff were friendly and the room was spotless."}'
# How long `heal` leaves a replica DOWN to come back by itself: TorchServe starts a worker that died again (the demo's
# load takes seconds; its retries back off), and the whole replica's restart takes it out longer than that.
HEAL_AFTER_DOWN_S = 30.0
HEAL_BACK_OFF_MAX_S = 3600.0  # the longest heal --every waits before it tries a replica that failed to restart again


def alert_for(value: str) -> tuple[str, str]:
    """One --alert-for ALERT=DURATION, read as the command line is."""
    name, _, duration = value.partition("=")
    if not name or not duration:
        raise argparse.ArgumentTypeError(f"expected ALERT=DURATION (e.g. BertReplicaDown=10s), got {value!r}")
    return name, duration


def fleet_command(args: argparse.Namespace, command: str) -> str:
    """`command` as the operator types it for this fleet: with --root where the fleet is not under the default."""
    root = "" if args.root == DEFAULT_ROOT else f" --root {args.root}"
    return f".venv/bin/python -m scripts.fleet{root} {command}"


def say_layout(fleet: Fleet, archive: str) -> Layout:
    """Each replica's layout on `archive`, and what is worth saying of it: why fewer workers than its CPUs (a note),
    more threads than its CPUs (a warning, on standard error: PyTorch's pools collapse then)."""
    layout = fleet.replica_layout(archive)
    if layout.note:
        print(f"    each replica's {layout.cpus} CPU(s): {layout.note}")
    if layout.warning:
        print(f"fleet: warning: each replica's {layout.cpus} CPU(s): {layout.warning}", file=sys.stderr)
    return layout


def up(args: argparse.Namespace) -> int:
    archive = Path(args.archive)
    if len(archive.parts) == 1:
        archive = args.model_store / archive
    spec = FleetSpec(
        replicas=args.replicas,
        model_store=archive.parent.resolve(),
        archive=archive.name,
        batch_size=args.batch_size,
        max_batch_delay=args.max_batch_delay,
        latency_budget_ms=args.latency_budget_ms,
        alert_for=dict(args.alert_for),
    )
    fleet = Fleet(spec, root=args.root)
    fleet.refuse_to_start()  # before saying it starts
    print(f"==> starting {spec.replicas} replicas of {archive}, HAProxy and Prometheus (files in {args.root}/fleet)")
    layout = say_layout(fleet, archive.name)
    fleet.up()
    for replica in fleet.replicas:
        cores = ",".join(map(str, replica.cores)) if replica.cores else "all"
        print(f"    {replica.name}: java pid {replica.java_pid}, cores {cores}, {layout.workers} worker(s), "
              f"{replica.inference_url}")  # fmt: skip
    print(f"""
Ready: {fleet.front_url} (HAProxy, leastconn over {len(fleet.replicas)} replicas; state in {fleet.state_file})
  curl -H "Content-Type: application/json" -d '{SAMPLE}' {fleet.front_url}/predictions/bert
Prometheus: {fleet.prometheus_url}   HAProxy stats: {fleet.haproxy_metrics_url}/stats
Drain a replica: {fleet_command(args, "drain r0")}   (back: ... ready r0)
Health: {fleet_command(args, "status")}   (exit 1 names a replica DOWN; start it again: ... restart r0)
Start again what dies, every 5 s until down: {fleet_command(args, "heal --every 5")}   (or `heal` from cron)
Stop: {fleet_command(args, "down")}""")
    return 0


def health(args: argparse.Namespace) -> dict:
    """What `status` says of the fleet under --root, as one document (`status --json` prints it as it is): its
    records (`fleet`, fleet.json), HAProxy's view of each server (`haproxy`), Prometheus's of each scrape target
    (`prometheus`), and `problems`: a line each, what is wrong and what mends it, empty while the fleet is well.
    A view the fleet could not give is null."""
    report: dict = {"fleet": None, "haproxy": None, "prometheus": None, "problems": []}
    problems = report["problems"]
    try:
        report["fleet"] = state = read_state(args.root)
    except FileNotFoundError:
        problems.append(f"no fleet is up under {args.root}")
        return report
    import requests

    try:
        servers = haproxy_servers(state["haproxy_socket"])
        targets = requests.get(f"{state['prometheus']}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    except (OSError, requests.RequestException, KeyError, ValueError) as error:
        problems.append(f"could not reach the fleet: {error}")
        # The front (every request fails meanwhile) or the watch: neither comes back by itself.
        for name, pid in ended_processes(args.root).items():
            problems.append(f"{name} (pid {pid}) no longer running: {fleet_command(args, f'restart {name}')} starts "
                            "it again as it ran")  # fmt: skip
        return report
    report["haproxy"] = {
        name: {"status": row["status"], "in_flight": int(row["scur"]), "requests": int(row["stot"])}
        for name, row in servers.items()
    }
    report["prometheus"] = [
        {
            "job": target["labels"]["job"],
            "replica": target["labels"].get("replica"),
            "url": target["scrapeUrl"],
            "health": target["health"],
        }
        for target in targets
    ]
    # Drained or in maintenance is the operator's doing; DOWN is a replica HAProxy's checks find not answering.
    for name, row in servers.items():
        if is_down(row["status"]):
            problems.append(f"{name} is DOWN: its TorchServe does not answer (logs under "
                            f"{args.root / 'fleet' / name}); {starts_again(args, name)}")  # fmt: skip
    unscraped = [target["url"] for target in report["prometheus"] if target["health"] == "down"]
    if unscraped:  # BertReplicaDown's cause, which HAProxy's view may not show (a metrics port alone gone)
        problems.append(f"Prometheus cannot scrape {', '.join(unscraped)}")
    return report


def status(args: argparse.Namespace) -> int:
    report = health(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if report["problems"] else 0
    if report["fleet"] is not None:
        print(json.dumps(report["fleet"], indent=2))
    for name, row in (report["haproxy"] or {}).items():
        print(f"haproxy: {name} {row['status']}, {row['in_flight']} in flight, {row['requests']} requests")
    for target in report["prometheus"] or []:
        who = " ".join(filter(None, (target["job"], target["replica"])))
        print(f"prometheus: {who} {target['url']} {target['health']}")
    for problem in report["problems"]:
        print(f"fleet: {problem}", file=sys.stderr)
    return 1 if report["problems"] else 0


def starts_again(args: argparse.Namespace, name: str) -> str:
    """What starts replica `name` again once HAProxy finds it DOWN: its `restart`, or for the surge slot (the roll's
    alone: `restart` refuses it) what stops it."""
    if name == SURGE:
        return "the next `roll`, or `down`, stops it"
    return f"{fleet_command(args, f'restart {name}')} starts it again"


def set_state(args: argparse.Namespace) -> int:
    if args.replica == SURGE:
        # HAProxy has the slot, but only a roll may put it in rotation or take it out: set by hand it would show
        # DOWN between rolls, and nothing here would bring back its MAINT.
        raise FleetError(f"{SURGE} is not a replica to {args.command}: the surge slot is the roll's alone")
    try:
        socket_path = read_state(args.root)["haproxy_socket"]
    except FileNotFoundError:
        raise FleetError(f"no fleet is up under {args.root}") from None
    try:
        set_server_state(socket_path, args.replica, args.command)
    except FleetError as refused:  # an unknown replica: where the names are
        raise FleetError(f"{refused} (`status` lists them)") from None
    print(f"==> {args.replica}: {args.command}")
    health = haproxy_servers(socket_path).get(args.replica, {}).get("status", "")
    if args.command == "ready" and is_down(health):
        # In rotation as far as the command goes, but HAProxy sends it nothing while its checks fail: not a success.
        print(f"fleet: HAProxy's health checks find {args.replica} {health}: its TorchServe does not answer, so it "
              f"gets no requests. Its logs are under {args.root / 'fleet' / args.replica}; "
              f"{starts_again(args, args.replica)}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def stop_on_signals(stop: threading.Event) -> None:
    """The first Ctrl-C or SIGTERM sets `stop`: the roll ends between replicas, with every replica in rotation
    (stopping a replica in the middle of its restart would leave it out). The second aborts where it stands,
    with the status of the signal that asked: `down` sends two SIGTERMs (tooling/fleet_roll.roll_stopped)."""

    def interrupted(signum: int, frame: object) -> None:
        if stop.is_set():
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise_terminated(signum, frame)
        stop.set()
        # os.write, not print: the signal may arrive while the roll itself is printing.
        os.write(1, b"==> finishing the replica in hand, then stopping (interrupt again to abort at once)\n")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)


def roll_archive(args: argparse.Namespace) -> int:
    fleet = Fleet.attach(args.root)
    archive = Path(args.archive)
    store = fleet.spec.model_store.resolve()
    if len(archive.parts) > 1 and archive.resolve().parent != store:
        raise FleetError(f"{archive} is not in the fleet's model store {store}: copy it there")
    say_layout(fleet, archive.name)
    return rolled(fleet, archive.name, args)


def rolled(fleet: Fleet, archive: str, args: argparse.Namespace, every: bool = False) -> int:
    """`roll` onto `archive` as the command line runs it (`every`: `restart --all`), and its exit status."""
    stop = threading.Event()
    stop_on_signals(stop)
    steps = roll(fleet, archive, args.probe.read_bytes(), stop=stop, surge=not args.no_surge, every=every)
    # Stopped before the last replica: some run another archive, or (a rolling restart) were not restarted.
    unfinished = len(steps) < len(fleet.replicas) if every else any(r.archive != archive for r in fleet.replicas)
    if stop.is_set() and unfinished:
        return 1
    if not steps:  # nothing moved: the roll said every replica already serves it
        return 0
    slowest = max(step.seconds for step in steps)
    done = f"Every replica restarted on {archive}" if every else f"Every replica serves {archive}"
    print(f"{done} (each out of rotation at most {slowest:.1f} s)")
    return 0


def restart_replica(args: argparse.Namespace) -> int:
    names: list[str] = args.replica
    if bool(names) == args.all:
        raise FleetError("restart takes replicas (r0, r1, ...), haproxy or prometheus, or --all")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FleetError(f"restart names {', '.join(twice)} more than once")
    fleet = Fleet.attach(args.root)
    if args.all:
        archives = {replica.archive for replica in fleet.replicas}
        if len(archives) > 1:
            runs = ", ".join(f"{replica.name} {replica.archive}" for replica in fleet.replicas)
            raise FleetError(f"the replicas run different archives ({runs}): finish the roll first (`roll`)")
        return rolled(fleet, archives.pop(), args, every=True)
    # HAProxy first: a replica's restart drains it and puts it back through HAProxy. Every name is checked before
    # anything is touched; each restart then makes its own checks, in turn.
    order = [name for name in WATCHERS if name in names] + [name for name in names if name not in WATCHERS]
    for name in order:
        if name in WATCHERS:
            fleet.refuse_restart_while_running(name)
        else:
            named_replica(fleet, name)
    probe = args.probe.read_bytes()
    for index, name in enumerate(order):
        # No stop-between-steps here: the first Ctrl-C aborts, saying where it stood.
        try:
            if name in WATCHERS:
                restart_watcher(fleet, name)
            else:
                restart(fleet, name, probe)
        except FleetError as error:
            if len(order) == 1:
                raise
            done, left = ", ".join(order[:index]) or "none", ", ".join(order[index + 1 :]) or "none"
            raise FleetError(f"{error} (restarted before it: {done}; not tried: {left})") from None
    return 0


def heal(args: argparse.Namespace) -> int:
    """`heal` once (from a timer), or with --every, again and again until the fleet is down or the command is
    stopped: saying only what it starts or cannot start, never "nothing to do" (a line every few seconds)."""
    if args.every is None:
        return heal_once(args)
    failures: dict[str, int] = {}  # replica -> its restarts that failed in a row, for the back-off
    while True:
        try:
            heal_once(args, quiet=True, failures=failures)
        except FleetError as error:
            if not (args.root / "fleet.json").exists():  # `down` ran: nothing left to watch
                print(f"==> no fleet under {args.root} any more: heal ends")
                return 0
            print(f"fleet: {error}", file=sys.stderr)  # the next round looks again
        except OSError as error:  # HAProxy's socket gone mid-round (a `down` under way, say)
            print(f"fleet: {error}", file=sys.stderr)
        time.sleep(args.every)


def heal_once(args: argparse.Namespace, quiet: bool = False, failures: dict[str, int] | None = None) -> int:
    """Start again what the fleet lost, as `restart` would: HAProxy or Prometheus whose process ended, then each
    replica HAProxy has had DOWN for --down-for seconds (its TorchServe died or hangs; a worker TorchServe replaces
    brings its replica back sooner by itself). Nothing while a roll, a restart or `down` holds the fleet. Exit 1 when
    something could not be started again (a `fleet:` line each), else 0; `quiet`: nothing said when nothing is done.
    `failures` (a loop's, kept between rounds): each replica's restarts that failed in a row, each doubling the time
    it must have been DOWN before the next try, up to an hour: a replica that cannot load its archive is not restarted
    every round, a JVM start and a model load taken from the replicas that serve each time."""
    fleet = Fleet.attach(args.root)
    if roll_running(fleet.dir):
        if not quiet:
            print("==> a roll, a restart or `down` holds the fleet now: nothing started again (the next `heal` looks)")
        return 0
    failed: dict[str, str] = {}  # what could not be started again: why
    ended = [name for name in WATCHERS if name in ended_processes(args.root)]  # HAProxy first: the replicas' view
    for name in ended:
        try:
            restart_watcher(fleet, name)
        except FleetError as error:
            failed[name] = f"{name} could not be started again: {error}"
    servers = {} if FRONT in failed else fleet.servers()  # no HAProxy: no view of the replicas
    replicas = {replica.name for replica in fleet.replicas}  # not the surge slot: a roll's, which stops it
    down = {name: int(row["lastchg"]) for name, row in servers.items() if name in replicas and is_down(row["status"])}
    probe = args.probe.read_bytes()
    failures = {} if failures is None else failures
    for name in set(failures) - set(down):  # back in rotation: a fresh start
        del failures[name]
    # Drained or in maintenance by hand and then stopped (or dead): the operator's. A restart this heal tried leaves
    # its replica drained too, and only a loop remembers that (`failures`): from cron such a one is left to you.
    held = fleet.held_out() if down else set()
    for name in sorted(held & set(down) - set(failures)):
        if not quiet:
            print(f"    {name}: DOWN and set drain or maint by hand: left as it is (`restart {name}` brings it back)")
        del down[name]
    for name, seconds in down.items():
        wait = min(args.down_for * 2 ** failures.get(name, 0), HEAL_BACK_OFF_MAX_S)
        if seconds < wait:
            if not quiet:
                print(f"    {name}: DOWN for {seconds} s, heal waits {wait:g} s: left as it is for now")
            continue
        try:
            restart(fleet, name, probe)
        except FleetError as error:
            failed[name] = str(error)
            failures[name] = failures.get(name, 0) + 1
        else:
            failures.pop(name, None)
    if not ended and not down and not quiet:
        print("==> every replica, HAProxy and Prometheus run: nothing to start again")
    for line in failed.values():
        print(f"fleet: {line}", file=sys.stderr)
    return 1 if failed else 0


def down(args: argparse.Namespace) -> int:
    with roll_stopped(args.root / "fleet") as rolling:
        if rolling is not None:
            print(f"==> stopped {holding(rolling)}, as it stood: nothing rolled back")
        stopped = stop_fleet(args.root)
    print("==> stopped " + (", ".join(stopped) if stopped else f"nothing (no fleet was running under {args.root})"))
    return 0


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    # A SIGTERM during `up` unwinds through Fleet.up(), which stops whatever it had started.
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where fleet.json and fleet/ live (logs/)")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the fleet")
    start.add_argument("--replicas", type=positive_int, default=2)
    start.add_argument("--model-store", type=Path, default=MODEL_STORE)
    start.add_argument("--archive", default="bert.mar", help="archive in the model store, or a path to one")
    start.add_argument("--batch-size", type=positive_int, default=8)
    start.add_argument("--max-batch-delay", type=non_negative_int, default=2, help="ms")
    start.add_argument("--latency-budget-ms", type=positive_int, default=DEFAULT_BUDGET_MS,
                       help="how long a request may wait: each replica's queue, HAProxy's deadline")  # fmt: skip
    start.add_argument(
        "--alert-for",
        type=alert_for,
        action="append",
        default=[],
        metavar="ALERT=DURATION",
        help="e.g. BertReplicaDown=10s",
    )
    rolling = commands.add_parser("roll", help="serve another archive, one replica at a time, failing no request")
    rolling.add_argument("archive", help="the new .mar, in the fleet's model store (a file name or a path)")
    rolling.add_argument(
        "--probe", type=existing_file, default=REVIEW, help="a text file each replica must answer (200)"
    )
    rolling.add_argument(
        "--no-surge",
        action="store_true",
        help="no surge replica: each step runs the fleet a replica short (when the host has no memory for one more)",
    )
    again = commands.add_parser(
        "restart",
        help="start a replica again on the archive it runs (drain, restart, probe, back in rotation), or HAProxy or "
        "Prometheus as it ran",
    )
    again.add_argument("replica", nargs="*", help=f"r0, r1, ..., {' or '.join(WATCHERS)}; several in turn")
    again.add_argument("--all", action="store_true", help="every replica in turn, the surge replica in rotation")
    again.add_argument("--probe", type=existing_file, default=REVIEW, help="a text file it must answer (200)")
    again.add_argument("--no-surge", action="store_true", help="--all without the surge replica (as `roll`)")
    healing = commands.add_parser(
        "heal", help="start again HAProxy or Prometheus that ended and each replica DOWN for --down-for seconds"
    )
    healing.add_argument("--down-for", type=non_negative_float, default=HEAL_AFTER_DOWN_S,
                         help=f"seconds a replica must have been DOWN (default {HEAL_AFTER_DOWN_S:g})")  # fmt: skip
    healing.add_argument("--probe", type=existing_file, default=REVIEW, help="a text file it must answer (200)")
    healing.add_argument(
        "--every", type=positive_float, metavar="SECONDS", help="heal again every SECONDS until the fleet is down"
    )
    shown = commands.add_parser("status", help="show the running fleet (exit 1 while a replica is DOWN)")
    shown.add_argument("--json", action="store_true", help="one JSON document: records, views and problems")
    commands.add_parser("down", help="stop the fleet")
    for state, what in (("drain", "finish in-flight requests, take no new ones"), ("ready", "back in rotation")):
        commands.add_parser(state, help=f"HAProxy: {what}").add_argument("replica", help="r0, r1, ...")
    args = parser.parse_args(argv)
    try:
        run = {
            "up": up,
            "status": status,
            "roll": roll_archive,
            "restart": restart_replica,
            "heal": heal,
            "down": down,
            "drain": set_state,
            "ready": set_state,
        }
        return run[args.command](args)
    except FleetError as error:
        print(f"fleet: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # HAProxy's socket or a replica gone: the fleet is down, or going
        print(f"fleet: {error} (is the fleet up? `status` says)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # an aborted roll has said where it stood
        return 130


if __name__ == "__main__":
    sys.exit(main())
