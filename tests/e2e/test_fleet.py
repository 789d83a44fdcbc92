"""A fleet on one machine, proven against the real processes: TorchServe replicas, HAProxy, Prometheus.

One fleet of two replicas serving a tiny model is shared by the module (its fixture starts it once);
each test first brings it back to a known state (every replica alive, in rotation, scraped).
Load is closed-loop from a bounded number of clients, on loopback only. Run with `-s` to see the counts.
Needs the Debian packages haproxy and prometheus: without them the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import psutil
import pytest
import requests

from tests.support import expected_alone, fleet_command, listening, require_system_packages, wait_until
from tooling.fleet import SURGE, Fleet, read_state
from tooling.fleet_config import FleetSpec
from tooling.fleet_roll import in_flight, roll
from tooling.paths import REPO
from tooling.processes import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLIENTS = 8
RESPONSE_TIMEOUT_S = 3  # the archive's responseTimeout: short, so HAProxy's timeout (derived from it) is short too
REPLICA_DOWN_FOR = "3s"  # BertReplicaDown's `for:` in this fleet (1m as shipped)
SLOW_MARKER = "SLOW"  # a text holding it makes its batch take SLOW_DELAY_S (the handler's test-only fault hook)
# 2 s: the drain test must see the slow request still unanswered beside the load's (1 s was that test's whole margin
# for a test thread descheduled on a loaded machine); under RESPONSE_TIMEOUT_S, which would fail the batch.
SLOW_DELAY_S = 2.0
TEXTS = [
    f"review {i}: "
    + " ".join(
        ["the room was clean", "the staff were rude", "great film", "cold food"][i % 4] for _ in range(1 + i % 7)
    )
    for i in range(40)
]
INVALID_EVERY = 10  # every tenth request is empty: answered 400, and feeds the rejected-items rule


# ---- the fleet ------------------------------------------------------------------------------------------


def fleet_model(make_archive, checkpoint, name: str, version: str = "1.0") -> str:
    """The tiny model with this module's response timeout and slow-batch hook, archived as `name`."""
    return make_archive(
        checkpoint,
        name,
        model_config={"responseTimeout": RESPONSE_TIMEOUT_S},
        version=version,
        fault_marker=SLOW_MARKER,
        fault_delay_s=SLOW_DELAY_S,
    )


@pytest.fixture(scope="module")
def fleet_archive(tiny_checkpoint, make_archive) -> str:
    return fleet_model(make_archive, tiny_checkpoint, "fleet-tiny")


@pytest.fixture(scope="module")
def unloadable_archive(tiny_checkpoint, make_archive, tmp_path_factory) -> str:
    """The fleet's model with weights that fail its load in every worker (bytes that are no safetensors file): its
    handler options are sound, so nothing before the surge replica's load refuses it (an archive whose options
    its workers would refuse is refused before anything: tests/unit/test_fleet_roll.py)."""
    broken = tmp_path_factory.mktemp("unloadable") / "checkpoint"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"\xff" * 2048)
    return make_archive(broken, "fleet-unloadable", model_config={"responseTimeout": RESPONSE_TIMEOUT_S})


@pytest.fixture(scope="module")
def next_archive(tiny_checkpoint, make_archive) -> str:
    """The fleet's model as version 2.0, what a roll moves it onto: the answers stay the same, so each is checked."""
    return fleet_model(make_archive, tiny_checkpoint, "fleet-tiny-2", version="2.0")


@pytest.fixture(scope="module")
def fleet(fleet_archive, model_store, tmp_path_factory):
    require_system_packages()
    # These tests count every non-200 as a lost request; on a shared 2-core machine a request can stall past the
    # default latency budget (1 s) and be shed with 503 DeadlineExceeded, by design. A budget far above any stall
    # keeps shedding out of them: tests/e2e/test_overload.py and tests/deploy/test_haproxy_deadline.py test it.
    spec = FleetSpec(
        replicas=2, model_store=model_store, archive=fleet_archive, alert_for={"BertReplicaDown": REPLICA_DOWN_FOR},
        latency_budget_ms=60_000,
    )  # fmt: skip
    started = time.monotonic()
    with Fleet(spec, root=tmp_path_factory.mktemp("fleet")) as running:
        print(f"\nfleet of {len(running.replicas)} up in {time.monotonic() - started:.1f}s")
        yield running


@pytest.fixture(scope="module")
def answers_alone(loaded_handler, unpacked_model_dir) -> dict[str, dict]:
    """The answer for each text sent alone, in-process: what every replica must answer."""
    return dict(zip(TEXTS, expected_alone(loaded_handler, unpacked_model_dir, TEXTS)))


def java_alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def restore(fleet: Fleet) -> None:
    """Every replica alive, running, in rotation and scraped: the state each test starts from."""
    for index, replica in enumerate(fleet.replicas):
        if not java_alive(replica.java_pid):
            fleet.restart_replica(index)
        else:
            os.kill(replica.java_pid, signal.SIGCONT)
        fleet.set_server_state(replica.name, "ready")
    fleet.wait_ready(timeout=120)


@pytest.fixture
def healthy_fleet(fleet) -> Fleet:
    restore(fleet)
    return fleet


# ---- closed-loop load through the front ----------------------------------------------------------------


@dataclass
class Outcome:
    text: str
    sent: float  # time.monotonic()
    done: float
    status: int | None = None  # None: no HTTP answer at all (an exception)
    replica: str | None = None  # which replica answered (HAProxy's X-Replica header)
    body: dict | None = None
    error: str | None = None  # no HTTP answer: the client's exception
    timed_out: bool = False  # no answer within the client's timeout: the request hung

    @property
    def expected_status(self) -> int:
        return 200 if self.text.strip() else 400

    @property
    def ok(self) -> bool:
        return self.status == self.expected_status


class Load:
    """CLIENTS threads, each sending its next request as soon as the previous one is answered."""

    def __init__(self, url: str, timeout: float, clients: int = CLIENTS, texts: list[str] | None = None) -> None:
        self.url = f"{url}/predictions/bert"
        self.timeout = timeout
        self.texts = texts or TEXTS
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]

    def _client(self, index: int) -> None:
        session = requests.Session()
        n = 0
        while not self._stop.is_set():
            n += 1
            text = "" if n % INVALID_EVERY == 0 else self.texts[(index * 7 + n) % len(self.texts)]
            outcome = Outcome(text, time.monotonic(), 0.0)
            try:
                response = session.post(
                    self.url, data=text.encode(), headers={"Content-Type": "text/plain"}, timeout=self.timeout
                )
                outcome.status = response.status_code
                outcome.replica = response.headers.get("X-Replica")
                with contextlib.suppress(ValueError):  # HAProxy's own 5xx pages are HTML
                    outcome.body = response.json()
            except requests.RequestException as error:
                outcome.error = repr(error)
                outcome.timed_out = isinstance(error, requests.Timeout)
            outcome.done = time.monotonic()
            with self._lock:
                self.outcomes.append(outcome)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def request_timeout(fleet: Fleet) -> float:
    """The longest a request can legitimately take through HAProxy: every attempt timing out, plus slack."""
    return fleet.timeout_server * (fleet.spec.retries + 1) + 5


def wrong_answers(outcomes: list[Outcome], answers_alone: dict[str, dict]) -> list[Outcome]:
    """Successful answers that differ from the answer for the same text alone."""
    wrong = []
    for outcome in outcomes:
        if outcome.status == 200:
            alone = answers_alone[outcome.text]
            if outcome.body["label"] != alone["label"] or abs(outcome.body["score"] - alone["score"]) > 1e-4:
                wrong.append(outcome)
    return wrong


def wait_server_status(fleet: Fleet, name: str, prefix: str, timeout: float) -> float:
    """Poll HAProxy until server `name`'s status starts with `prefix`; when that was seen (monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.servers()[name]["status"].startswith(prefix):
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"HAProxy did not mark {name} {prefix} within {timeout}s: {fleet.servers()[name]}")


# ---- the command ----------------------------------------------------------------------------------------


def test_the_fleet_command_starts_a_working_fleet_and_down_leaves_nothing(
    fleet_archive, unloadable_archive, next_archive, model_store, tiny_checkpoint, make_archive, tmp_path
):
    """`scripts/fleet.py up --replicas 2` prints a curl that works; a `roll` onto an archive that cannot load
    exits 1 with the workers' exception once the surge replica fails on it, fails no request, touches no
    replica and stops the surge (roll backs of replicas: tests/unit/test_fleet_roll.py); `down`, another
    process, run while a roll starts the surge, aborts that roll first and stops every pid."""
    require_system_packages()
    root = tmp_path / "cli"

    # A budget far above any stall on a shared machine: see the `fleet` fixture.
    budget = ("--latency-budget-ms", "60000")
    archive = str(model_store / fleet_archive)
    started = fleet_command(root, "up", "--replicas", "2", "--archive", archive, *budget, timeout=240)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = read_state(root)
        assert set(state) == {"front", "prometheus", "haproxy_socket", "replicas", "surge"} and state["surge"] is None
        assert [set(r) for r in state["replicas"]] == [{"pid", "inference", "metrics", "archive"}] * 2
        assert all(psutil.Process(r["pid"]).name() == "java" for r in state["replicas"])
        curl = next(line.strip() for line in started.stdout.splitlines() if line.strip().startswith("curl "))
        assert state["front"] in curl
        answer = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=30)
        assert json.loads(answer.stdout)["label"] in {"negative", "positive"}, answer.stdout + answer.stderr
        assert fleet_command(root, "status", timeout=240).returncode == 0
        # The heal `up` suggests, once: a whole fleet, nothing started again (each case: tests/unit/test_fleet_roll.py).
        assert "heal --every 5" in started.stdout, started.stdout
        healed = fleet_command(root, "heal", timeout=240)
        assert (healed.returncode, healed.stderr) == (0, ""), healed
        assert healed.stdout.strip() == "==> every replica, HAProxy and Prometheus run: nothing to start again", healed

        slower = make_archive(tiny_checkpoint, "fleet-slower")  # the default response timeout, 60 s against 3 s
        refused = fleet_command(root, "roll", slower, timeout=240)
        assert refused.returncode == 1 and "HAProxy would cut its slow batches short" in refused.stderr, refused
        assert [r["pid"] for r in read_state(root)["replicas"]] == [r["pid"] for r in state["replicas"]]

        processes = root / "fleet" / "processes.json"
        groups = [record["pid"] for record in json.loads(processes.read_text())["replicas"]]
        with Load(state["front"], timeout=60, clients=4) as load:
            rolling = fleet_command(root, "roll", unloadable_archive, timeout=240)
        failed = [o for o in load.outcomes if not o.ok]
        output = rolling.stdout + rolling.stderr
        print(f"\nroll onto an archive that cannot load: {output}{len(load.outcomes)} requests meanwhile")
        assert rolling.returncode == 1, output
        assert "stopped before any replica: the surge replica could not serve it" in output, output
        assert "deserializing header" in output and "No replica was touched" in output, output
        assert "==> r0" not in output, output
        assert load.outcomes and not failed, failed[:3]
        assert read_state(root)["replicas"] == state["replicas"], "a replica was touched"
        assert read_state(root)["surge"] is None and not _running_from(root / "fleet" / SURGE), "the surge runs on"
        assert fleet_command(root, "status", timeout=240).returncode == 0
        records = json.loads(processes.read_text())
        pids = [records["haproxy"]["pid"], records["prometheus"]["pid"]]
        groups += [record["pid"] for record in records["replicas"]]  # the same ones: the roll restarted none

        # A roll under way as the fleet goes down must not start anything after `down`: `down` stops it first.
        command = [sys.executable, "-m", "scripts.fleet", "--root", str(root), "roll", next_archive]
        rolling = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = [rolling.stdout.readline()]
        while said[-1] and not said[-1].startswith(f"==> {SURGE}: start on"):
            said.append(rolling.stdout.readline())
        assert said[-1], "".join(said)
    finally:
        stopped = fleet_command(root, "down", timeout=240)
    try:
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        said.append(rolling.stdout.read())
        assert rolling.wait(timeout=30) == 128 + signal.SIGTERM, "".join(said)
    finally:
        rolling.kill()  # what this test started, if down did not stop it
        rolling.wait()
    assert f"stopped the roll onto {next_archive} (pid {rolling.pid})" in stopped.stdout, stopped.stdout
    assert not _running_from(root / "fleet"), "a replica, the surge, HAProxy or Prometheus outlived down"
    ready = next(line for line in started.stdout.splitlines() if line.startswith("Ready:"))
    print(f"\nCLI fleet: {ready}\n{stopped.stdout.strip()}")
    # A zombie has ended; whoever inherited it reaps it in its own time, and down does not wait for that.
    left = [p.pid for p in psutil.process_iter() if (p.pid in pids or _group(p.pid) in groups) and not _zombie(p)]
    assert not left, f"processes left behind by down: {left}"
    assert not (root / "fleet.json").exists()


def surge_targets(fleet: Fleet) -> list[dict]:
    """Prometheus's active targets for the surge slot."""
    return [t for t in fleet.api("targets")["activeTargets"] if t["labels"].get("replica") == SURGE]


def _zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True  # gone meanwhile


def _running_from(directory) -> list[int]:
    """Processes (not zombies) whose command line names `directory`: a replica's torchserve and Java frontend."""
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(directory) in part for part in p.info["cmdline"] or []) and not _zombie(p)
    ]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


# ---- the shared fleet -----------------------------------------------------------------------------------


def test_each_replica_is_a_pinned_java_frontend_behind_the_front(healthy_fleet, answers_alone):
    fleet = healthy_fleet
    state = read_state(fleet.root)
    assert state["front"] == fleet.front_url and state["prometheus"] == fleet.prometheus_url
    assert [r["pid"] for r in state["replicas"]] == [r.java_pid for r in fleet.replicas]
    enough_cores = len(os.sched_getaffinity(0)) >= len(fleet.replicas)
    for replica in fleet.replicas:
        java = psutil.Process(replica.java_pid)
        assert java.name() == "java"
        if enough_cores:  # each replica (frontend, its threads and workers) on its own share of the cores
            assert replica.cores
            for process in (java, *java.children(recursive=True)):
                for thread in process.threads():
                    assert sorted(os.sched_getaffinity(thread.id)) == replica.cores, (process, thread.id)
    if enough_cores:
        shares = [set(r.cores) for r in fleet.replicas]
        assert sum(map(len, shares)) == len(set().union(*shares)), "replicas share cores"
    print(f"\ncores per replica: {[r.cores for r in fleet.replicas]}")

    session = requests.Session()
    served_by = set()
    for text in TEXTS[:16]:
        response = session.post(f"{fleet.front_url}/predictions/bert", data=text.encode(), timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["score"] == pytest.approx(answers_alone[text]["score"], abs=1e-4)
        served_by.add(response.headers["X-Replica"])
    assert served_by == {r.name for r in fleet.replicas}


def test_every_listener_of_the_fleet_is_on_loopback_and_its_files_are_private(healthy_fleet):
    # The replicas run without tokens (the cluster configuration): loopback is their guard, and HAProxy's, and
    # Prometheus'. A template edited to `bind *:` or a Prometheus on 0.0.0.0 would expose them unauthenticated.
    fleet = healthy_fleet
    processes = {"haproxy": fleet.haproxy.pid, "prometheus": fleet.prometheus.pid}
    processes.update({replica.name: replica.java_pid for replica in fleet.replicas})
    for name, pid in processes.items():
        addresses = listening([psutil.Process(pid)])
        assert addresses, name
        assert set().union(*addresses.values()) == {"127.0.0.1"}, (name, addresses)
    private = [fleet.socket_path, fleet.dir / "haproxy.log", fleet.dir / "prometheus.log"]
    for path in private:
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    for folder in (fleet.dir, fleet.dir / "prometheus-data"):
        assert folder.stat().st_mode & 0o077 == 0, (folder, oct(folder.stat().st_mode))


def test_a_drained_replica_finishes_its_requests_and_gets_no_new_ones(healthy_fleet, answers_alone):
    fleet = healthy_fleet
    drained = fleet.replicas[1].name
    session_timeout = request_timeout(fleet)
    slow_outcomes: list[Outcome] = []

    def send_slow(index: int) -> None:
        text = f"{SLOW_MARKER} request {index} holds its replica for {SLOW_DELAY_S}s"
        outcome = Outcome(text, time.monotonic(), 0.0)
        response = requests.post(f"{fleet.front_url}/predictions/bert", data=text.encode(), timeout=session_timeout)
        outcome.status, outcome.replica, outcome.done = (
            response.status_code,
            response.headers.get("X-Replica"),
            time.monotonic(),
        )
        slow_outcomes.append(outcome)

    # Slow requests first, spread by leastconn over both replicas: the one to drain is busy when drained.
    slow = [threading.Thread(target=send_slow, args=(i,)) for i in range(2)]
    for thread in slow:
        thread.start()
    deadline = time.monotonic() + 10
    while int(fleet.servers()[drained]["scur"]) == 0:
        assert time.monotonic() < deadline, "no request in flight on the replica to drain"
        time.sleep(0.02)
    with Load(fleet.front_url, session_timeout) as load:
        # Drained while it holds its slow request (unanswered: the slow batch takes SLOW_DELAY_S) and some of the
        # load beside it: requests in flight there that the drain must let it finish.
        def held_there() -> bool:
            return int(fleet.servers()[drained]["scur"]) >= 2 and not any(o.replica == drained for o in slow_outcomes)

        wait_until(
            held_there,
            10,
            lambda: f"{drained} to hold its slow request and the load's: {fleet.servers()[drained]}, {slow_outcomes}",
            interval=0.01,
        )
        in_flight = int(fleet.servers()[drained]["scur"])
        fleet.set_server_state(drained, "drain")
        drained_at = time.monotonic()
        # The load goes on until the drained replica has finished what it held and requests sent after the drain
        # have been answered.
        wait_until(
            lambda: (
                int(fleet.servers()[drained]["scur"]) == 0
                and sum(o.sent > drained_at for o in load.outcomes) >= 2 * CLIENTS
            ),
            60,
            lambda: f"{drained} to finish its requests under load: {fleet.servers()[drained]}",
        )
    for thread in slow:
        thread.join()
    outcomes = load.outcomes + slow_outcomes
    failed = [o for o in outcomes if not o.ok]
    after = [o for o in outcomes if o.sent > drained_at]
    finished_there = [o for o in outcomes if o.replica == drained and o.sent < drained_at < o.done]
    print(
        f"\ndrain: {len(outcomes)} requests, {in_flight} in flight on {drained} when drained, "
        f"{len(finished_there)} of them answered by it after the drain, {len(after)} sent after the drain "
        f"({sum(o.replica == drained for o in after)} to {drained}), {len(failed)} failed"
    )
    assert not failed, failed[:3]
    assert not wrong_answers(load.outcomes, answers_alone)
    assert after and all(o.replica != drained for o in after), "the drained replica received new requests"
    assert finished_there, "the drained replica's in-flight requests were not answered by it"
    assert fleet.servers()[drained]["status"] == "DRAIN"


def test_a_replica_whose_worker_died_leaves_rotation_until_the_worker_is_ready_again(healthy_fleet, answers_alone):
    """TorchServe's /ping stays 200 while a killed worker restarts; HAProxy's check asks the management API
    whether every worker is READY, so the replica leaves rotation and its share goes to the other one."""
    fleet = healthy_fleet
    replica = fleet.replicas[0]
    [worker] = replica.server.describe(fleet.spec.model_name)[0]["workers"]
    os.kill(worker["pid"], signal.SIGKILL)
    wait_for(lambda: fleet.servers()[replica.name]["status"] == "DOWN", 15, f"{replica.name} out of rotation", 0.1)
    assert replica.server.ping().status_code == 200  # what a /ping check would have kept in rotation
    # Each request is judged by the replica's state around it, read from HAProxy: one sent and answered while the
    # replica was out must have gone to the other. (All of them were required to, which rested on the worker's
    # restart outlasting the 40 requests: on a loaded machine the client may be the slower.)
    outcomes = []
    for text in TEXTS:
        out_before = fleet.servers()[replica.name]["status"] == "DOWN"
        response = requests.post(f"{fleet.front_url}/predictions/bert", data=text.encode(), timeout=30)
        outcomes.append((text, response, out_before and fleet.servers()[replica.name]["status"] == "DOWN"))
    while_out = [response for _, response, out in outcomes if out]
    assert len(while_out) >= 10, f"only {len(while_out)} of {len(TEXTS)} requests were sent while the replica was out"
    assert {(r.status_code, r.headers.get("X-Replica")) for r in while_out} == {(200, fleet.replicas[1].name)}, (
        "requests must go to the replica whose worker is alive"
    )
    for text, response, _ in outcomes:
        assert response.status_code == 200, response.text
        assert response.json()["score"] == pytest.approx(answers_alone[text]["score"], abs=1e-4)
    wait_for(lambda: fleet.servers()[replica.name]["status"] == "UP", 120, f"{replica.name} back in rotation")
    assert replica.server.model_ready(fleet.spec.model_name)


def test_a_hung_replica_is_taken_out_and_its_stuck_requests_are_answered(healthy_fleet, answers_alone):
    fleet = healthy_fleet
    hung = fleet.replicas[0]
    with Load(fleet.front_url, request_timeout(fleet)) as load:
        time.sleep(1.0)
        os.kill(hung.java_pid, signal.SIGSTOP)  # the frontend freezes; the kernel still accepts connections
        stopped_at = time.monotonic()
        try:
            down_at = wait_server_status(fleet, hung.name, "DOWN", timeout=15)
            time.sleep(fleet.timeout_server + 2.0)  # long enough for every stuck request to time out
        finally:
            os.kill(hung.java_pid, signal.SIGCONT)
    outcomes = load.outcomes
    stuck = [o for o in outcomes if o.done - o.sent >= fleet.timeout_server - 0.5]
    hanging = [o for o in outcomes if o.timed_out]
    failed = [o for o in outcomes if not o.ok]
    after_down = [o for o in outcomes if o.sent > down_at]
    slowest = max(o.done - o.sent for o in outcomes)
    print(
        f"\nhung replica: {len(outcomes)} requests; HAProxy marked it DOWN {down_at - stopped_at:.1f}s after "
        f"SIGSTOP; {len(stuck)} were stuck on it and answered after HAProxy's {fleet.timeout_server}s timeout "
        f"(statuses {sorted({str(o.status) for o in stuck})}); slowest {slowest:.1f}s; {len(failed)} failed"
    )
    assert not hanging, hanging[:3]
    assert slowest < request_timeout(fleet)
    assert stuck, "no request was stuck on the hung replica: the test did not test anything"
    # The stuck ones were retried on the other replica (retry-on response-timeout), so nothing failed.
    assert not failed, failed[:3]
    assert not wrong_answers(outcomes, answers_alone)
    assert after_down and all(o.ok and o.done - o.sent < fleet.timeout_server for o in after_down)
    assert down_at - stopped_at < 6.0  # fall 2 checks, each failing after `timeout check 1s`


# ---- failover: one replica killed under load; the tests after it read the same run ----------------------


@dataclass
class FailoverRun:
    outcomes: list[Outcome]
    killed: str
    killed_metrics: str  # host:port Prometheus scrapes it at (the alert's instance label)
    in_flight_at_kill: int
    killed_at: float  # time.monotonic()
    killed_at_wall: float  # time.time(), for Prometheus
    down_at: float
    ended_at_wall: float
    haproxy_retries: int
    haproxy_redispatches: int


@pytest.fixture(scope="module")
def failover_run(fleet) -> FailoverRun:
    restore(fleet)
    victim = fleet.replicas[0]
    before = fleet.servers()
    with Load(fleet.front_url, request_timeout(fleet)) as load:
        time.sleep(4.0)
        in_flight = int(fleet.servers()[victim.name]["scur"])
        os.kill(victim.java_pid, signal.SIGKILL)
        killed_at, killed_at_wall = time.monotonic(), time.time()
        down_at = wait_server_status(fleet, victim.name, "DOWN", timeout=15)
        time.sleep(3.0)
    ended_at_wall = time.time()
    after = fleet.servers()

    def counter(name: str, column: str) -> int:
        return int(after[name][column] or 0) - int(before[name][column] or 0)

    return FailoverRun(
        outcomes=load.outcomes,
        killed=victim.name,
        killed_metrics=victim.metrics_url.removeprefix("http://"),
        in_flight_at_kill=in_flight,
        killed_at=killed_at,
        killed_at_wall=killed_at_wall,
        down_at=down_at,
        ended_at_wall=ended_at_wall,
        haproxy_retries=sum(counter(r.name, "wretr") for r in fleet.replicas),
        haproxy_redispatches=sum(counter(r.name, "wredis") for r in fleet.replicas),
    )


def test_failover_a_replica_killed_under_load_costs_at_most_its_in_flight_requests(fleet, failover_run, answers_alone):
    run = failover_run
    outcomes = run.outcomes
    failed = [o for o in outcomes if not o.ok]
    hanging = [o for o in outcomes if o.timed_out]
    around_kill = [o for o in outcomes if o.sent <= run.killed_at <= o.done]
    after_down = [o for o in outcomes if o.sent > run.down_at]
    survivor = [o for o in outcomes if o.replica and o.replica != run.killed and o.status == 200]
    slowest = max(o.done - o.sent for o in outcomes)
    print(
        f"\nfailover: {len(outcomes)} requests from {CLIENTS} clients; SIGKILL of {run.killed}'s frontend with "
        f"{run.in_flight_at_kill} in flight on it ({len(around_kill)} in flight fleet-wide); HAProxy marked it "
        f"DOWN {run.down_at - run.killed_at:.1f}s later; {run.haproxy_retries} retries, "
        f"{run.haproxy_redispatches} redispatches; {len(failed)} failed "
        f"({sorted({str(o.status) for o in failed})}); {len(after_down)} requests after DOWN all answered by the "
        f"survivor; slowest request {slowest:.2f}s"
    )
    for o in failed:  # when, relative to the kill, and how each failure happened
        when = f"sent {o.sent - run.killed_at:+.3f}s from the kill, answered {o.done - o.sent:.3f}s later"
        print(f"  failed: {when}: {o.status or o.error}")
    assert not hanging, hanging[:3]
    assert len(failed) <= run.in_flight_at_kill, failed[:5]
    assert after_down and all(o.ok and o.replica != run.killed for o in after_down)
    assert survivor and not wrong_answers(survivor, answers_alone)
    assert not wrong_answers(outcomes, answers_alone)
    assert slowest < request_timeout(fleet)


def test_prometheus_rules_are_sane_after_the_load_and_the_replica_down_alert_fires(fleet, failover_run):
    run = failover_run
    at = run.ended_at_wall

    def values(record: str) -> dict[str, float]:
        return {r["metric"].get("instance", "fleet"): float(r["value"][1]) for r in fleet.query(record, at=at)}

    survivor = next(r.metrics_url.removeprefix("http://") for r in fleet.replicas if r.name != run.killed)
    batch = values("instance:bert_mean_batch_size:rate3m") | values("fleet:bert_mean_batch_size:rate3m")
    queue = values("instance:bert_queue_ms_per_request:rate3m") | values("fleet:bert_queue_ms_per_request:rate3m")
    rps = values("fleet:bert_requests_per_second:rate3m")
    rejected = values('fleet:bert_rejected_items_per_second:rate3m{Reason="EmptyText"}')
    print(f"\nafter the load: mean batch size {batch}, queue ms/request {queue}, requests/s {rps}")
    assert batch["fleet"] > 1 and batch[survivor] > 1, batch
    assert queue["fleet"] > 0 and queue[survivor] > 0, queue
    assert rps["fleet"] > 0 and rejected["fleet"] > 0

    # BertReplicaDown: pending from the first failed scrape, firing `for:` later, for the killed one only.
    deadline = time.monotonic() + 30
    while True:
        alerts = [a for a in fleet.alerts() if a["labels"]["alertname"] == "BertReplicaDown"]
        firing = [a for a in alerts if a["state"] == "firing"]
        if firing or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert [a["labels"]["instance"] for a in firing] == [run.killed_metrics], alerts
    active_at = _unix(firing[0]["activeAt"])
    pending_after = active_at - run.killed_at_wall
    print(
        f"BertReplicaDown for {run.killed}: pending {pending_after:.1f}s after the kill, "
        f"firing {REPLICA_DOWN_FOR} later"
    )
    assert -0.5 < pending_after < 2 * fleet.spec.scrape_interval_s + 2


def _unix(timestamp: str) -> float:
    """Prometheus's RFC 3339 time (nanoseconds, Z) as a Unix time."""
    from datetime import datetime, timezone

    seconds, _, fraction = timestamp.rstrip("Z").partition(".")
    parsed = datetime.fromisoformat(seconds).replace(tzinfo=timezone.utc)
    return parsed.timestamp() + float(f"0.{fraction or 0}")


def test_every_dashboard_panel_returns_data_after_traffic(fleet, failover_run):
    panels = json.loads((REPO / "deploy" / "grafana" / "dashboard.json").read_text())["panels"]
    empty = []
    for panel in panels:
        for target in panel["targets"]:
            # The namespace and pod variables as Grafana's "All" (allValue .*) expands them.
            expr = target["expr"].replace("$namespace", ".*").replace("$pod", ".*")
            if not fleet.query(expr, at=failover_run.ended_at_wall):
                empty.append(f"{panel['title']}: {target['expr']}")
    print(
        f"\ndashboard: {sum(len(p['targets']) for p in panels)} queries over {len(panels)} panels, {len(empty)} empty"
    )
    assert not empty, empty


def test_a_killed_replica_is_named_by_status_refused_by_a_roll_and_started_again_by_restart(
    fleet, failover_run, fleet_archive, answers_alone
):
    """The replica the failover killed stays dead (no command but a roll onto another archive, or `down` then `up`,
    started it). `status` exits 1 naming it and the command that starts it; a roll onto the archive it runs is
    refused, saying it is DOWN and to restart it; `restart`, from another process under load, starts it again
    on its archive, failing no request: a new Java frontend on the replica's cores, recorded for `down`, UP in
    HAProxy, answering as the same text alone, scraped by Prometheus, and `status` exits 0."""
    index = next(i for i, replica in enumerate(fleet.replicas) if replica.name == failover_run.killed)
    name, dead_java = fleet.replicas[index].name, fleet.replicas[index].java_pid
    assert fleet.servers()[name]["status"].startswith("DOWN") and not java_alive(dead_java)
    down = fleet_command(fleet.root, "status", timeout=240)
    assert down.returncode == 1, down.stdout + down.stderr
    assert f"fleet: {name} is DOWN: its TorchServe does not answer" in down.stderr, down.stderr
    assert f"scripts.fleet --root {fleet.root} restart {name} starts it again" in down.stderr, down.stderr
    assert f"prometheus: torchserve {name} http://" in down.stdout, down.stdout  # by replica, not only by URL
    refused = fleet_command(fleet.root, "roll", fleet_archive, timeout=240)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"({name}: DOWN, its TorchServe does not answer HAProxy's checks)" in refused.stderr, refused.stderr
    assert refused.stderr.rstrip().endswith(f"bring them back first (`restart {name}`)"), refused.stderr
    try:
        with Load(fleet.front_url, request_timeout(fleet)) as load:
            restarted = fleet_command(fleet.root, "restart", name, timeout=240)
    finally:
        # The command line restarted it: this module's fleet must act on its records now, not the dead process's
        # (`restore` would start a second one on the same ports; `down` would miss the new one).
        fleet.replicas[index] = Fleet.attach(fleet.root).replicas[index]
    replica = fleet.replicas[index]
    failed = [o for o in load.outcomes if not o.ok]
    said = restarted.stdout.strip().replace("\n", "; ")
    print(f"\nrestart of {name}: {said}; {len(load.outcomes)} requests meanwhile, {len(failed)} failed")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"==> {name}: drain, restart on {fleet_archive}, probe, back in rotation" in restarted.stdout
    assert f"{name} serves {fleet_archive} again: out of rotation" in restarted.stdout, restarted.stdout
    assert load.outcomes and not failed, failed[:3]
    assert not wrong_answers(load.outcomes, answers_alone)
    assert java_alive(replica.java_pid) and replica.java_pid != dead_java
    assert psutil.Process(replica.java_pid).name() == "java"
    assert read_state(fleet.root)["replicas"][index]["pid"] == replica.java_pid
    assert fleet.servers()[name]["status"] == "UP"
    answer = requests.post(f"{replica.inference_url}/predictions/bert", data=TEXTS[1].encode(), timeout=30)
    assert answer.status_code == 200 and answer.json()["label"] == answers_alone[TEXTS[1]]["label"], answer.text
    assert answer.json()["score"] == pytest.approx(answers_alone[TEXTS[1]]["score"], abs=1e-4)
    if replica.cores:  # on its own cores again, as `up` started it
        assert sorted(os.sched_getaffinity(replica.java_pid)) == replica.cores
    wait_for(lambda: well(fleet), 30, "`status` to find every replica well")


def well(fleet: Fleet) -> bool:
    """`status --json` finds nothing wrong: exit 0, no problem, every replica UP in HAProxy, every target scraped."""
    shown = fleet_command(fleet.root, "status", "--json", timeout=240)
    report = json.loads(shown.stdout)
    return (
        shown.returncode == 0
        and report["problems"] == []
        and {row["status"] for name, row in report["haproxy"].items() if name != SURGE} == {"UP"}  # the surge: MAINT
        and {target["health"] for target in report["prometheus"]} == {"up"}
    )


# ---- rolling onto another archive ------------------------------------------------------------------------


def test_a_roll_moves_every_replica_onto_the_new_archive_and_no_request_fails_or_is_retried(
    healthy_fleet, next_archive, answers_alone
):
    """Under load, with slow batches keeping the replicas busy, `roll` brings the surge replica in on 2.0, moves
    both replicas onto 2.0 and retires the surge: no request fails, the surge answered some, and none of a
    replica's or the surge's had to be sent again by HAProxy, so each drain waited for what its replica held.
    (An archive the surge cannot load: the command test above; roll backs: tests/unit/test_fleet_roll.py.)"""
    fleet = healthy_fleet
    java_pids = [replica.java_pid for replica in fleet.replicas]
    said: list[str] = []
    surge_pids: list[int | None] = []
    surge_found: list[list[int]] = []

    def busy_when_drained(message: str) -> None:
        """Before each replica's drain, wait until it holds a request, so every drain has something to wait for."""
        print(message)
        said.append(message)
        if message.endswith("back in rotation"):  # "==> rN: drain, restart on ..., probe, back in rotation"
            surge_pids.append(fleet.surge.java_pid)
            surge_found.append(_running_from(fleet.surge.workdir))  # what the command test looks for
            name = message.split()[1].rstrip(":")
            wait_for(lambda: in_flight(fleet, name) > 0, 30, f"a request in flight on {name}", 0.01)

    stop = threading.Event()
    held: list[int] = []

    def hold_a_batch() -> None:
        while not stop.is_set():
            text = f"{SLOW_MARKER}: this batch takes {SLOW_DELAY_S}s"
            answer = requests.post(f"{fleet.front_url}/predictions/bert", data=text.encode(), timeout=60)
            held.append(answer.status_code)

    holders = [threading.Thread(target=hold_a_batch) for _ in range(2)]
    with Load(fleet.front_url, request_timeout(fleet)) as load:
        for thread in holders:
            thread.start()
        time.sleep(0.5)
        steps = roll(fleet, next_archive, b"the room was clean", say=busy_when_drained)
        time.sleep(0.5)
        stop.set()
    for thread in holders:
        thread.join()
    failed = [o for o in load.outcomes if not o.ok]
    each = [f"{s.replica} out {s.seconds:.1f}s, {s.in_flight_at_drain} held, {s.retried} resent" for s in steps]
    print(f"\nroll: {len(load.outcomes)} requests and {len(held)} slow ones; {'; '.join(each)}; {len(failed)} failed")
    assert not failed and set(held) == {200}, (failed[:3], held)
    assert not wrong_answers(load.outcomes, answers_alone)
    assert [step.replica for step in steps] == ["r0", "r1"]
    answered_by = Counter(o.replica for o in load.outcomes)
    retired = next(line for line in said if line.startswith(f"==> {SURGE}: drained and stopped"))
    assert answered_by[SURGE] > 0 and retired.endswith(" 0 sent again by HAProxy"), (answered_by, retired)
    surge_java = surge_pids[0]
    assert surge_java is not None and surge_java in surge_found[0], (surge_java, surge_found)
    assert not psutil.pid_exists(surge_java) or _zombie(psutil.Process(surge_java)), "the surge replica still runs"
    assert fleet.servers()[SURGE]["status"] == "MAINT" and read_state(fleet.root)["surge"] is None
    # Prometheus scraped the surge while it served, so the fleet's figures count its requests; it never saw it
    # down (it leaves the targets before it stops), and the empty slot is no target after.
    counted = fleet.query(f'sum(max_over_time(ts_inference_requests_total{{replica="{SURGE}"}}[10m]))')
    lowest_up = fleet.query(f'min_over_time(up{{job="torchserve",replica="{SURGE}"}}[10m])')
    assert counted and float(counted[0]["value"][1]) > 0, counted
    assert [float(row["value"][1]) for row in lowest_up] == [1.0], lowest_up
    wait_for(lambda: not surge_targets(fleet), 10, "the surge out of Prometheus's targets")
    # Each replica had a request in flight just before its drain (busy_when_drained); a fast one may be done by
    # the drain itself, so at least one, not each, is asserted to have been held.
    assert any(step.in_flight_at_drain for step in steps), "no replica held a request when drained: nothing tested"
    assert [step.retried for step in steps] == [0, 0], "a replica was stopped holding requests: HAProxy resent them"
    assert [replica.server.describe("bert")[0]["modelVersion"] for replica in fleet.replicas] == ["2.0", "2.0"]
    assert not {replica.java_pid for replica in fleet.replicas} & set(java_pids)
    assert [row["archive"] for row in read_state(fleet.root)["replicas"]] == [next_archive] * 2
    wait_for(lambda: all(fleet.servers()[r.name]["status"] == "UP" for r in fleet.replicas), 10, "both replicas UP")
    assert roll(fleet, next_archive, b"the room was clean", say=print) == [], "a finished roll, again, does nothing"
