"""A fleet on one machine: N TorchServe replicas behind HAProxy, watched by Prometheus; its processes.

The configuration each component runs with is rendered by tooling/fleet_config.py (pure); this
module starts, watches and stops the processes.

The same components as a production fleet, on loopback ports:

- each replica is a private TorchServe (tooling/torchserve.py) built from the cluster configuration
  (tooling/cluster_config.py: the model loaded at start with its batching, registration off, token
  authorization off), in its own working directory, pinned to its share of the cores when there are
  at least as many cores as replicas;
- HAProxy (deploy/fleet/haproxy.cfg.template) balances them with `leastconn`, health-checks /ping every
  second, retries a failed or unanswered request on another replica, and has an admin socket for draining;
- Prometheus scrapes every replica's metrics port and HAProxy's own exporter, with the repository's
  recording and alerting rules (deploy/prometheus/);
- a surge slot: ports of its own and a server in HAProxy's configuration, in maintenance until a roll
  (tooling/fleet_roll.py) runs a replica there beside the others; Prometheus scrapes it while it
  answers, found through `fleet/surge-targets.json`.

What was started is written to `<root>/fleet.json` (the public description: front URL, Prometheus
URL, HAProxy's socket, each replica's Java frontend pid, URLs and archive), `<root>/fleet/processes.json`
(what `down` needs: each process id with its start time, so a recycled pid is never signalled) and
`<root>/fleet/layout.json` (what another process needs to operate the fleet: `Fleet.attach`, used by
`scripts.fleet roll`). Every process is stopped by its id (a replica by its process group), never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
import yaml

from handlers.cpu_quota import usable_cpus
from tooling import files
from tooling.cpu_layout import Layout, cpu_layout
from tooling.fleet_config import (
    ALERTING_RULES,
    RECORDING_RULES,
    FleetError,
    FleetSpec,
    alerting_rules,
    core_shares,
    haproxy_config,
    haproxy_timeout_server,
    prometheus_config,
    server_state_file,
    surge_targets,
)
from tooling.haproxy_admin import haproxy_command, haproxy_servers, held_out, set_server_state
from tooling.latency_budget import machine_throughput
from tooling.model_archive import archive_response_timeout
from tooling.paths import REPO
from tooling.processes import (
    in_parallel,
    java_frontend,
    process_record,
    same_process,
    still_running,
    stop_recorded,
    wait_for,
)
from tooling.torchserve import (
    ADDRESS_KEYS,
    SERVER_UMASK,
    TorchServe,
    all_workers_ready,
    free_port,
    new_load_failure,
    owner_only,
    port_in_use,
    server_ports,
)

DEFAULT_ROOT = REPO / "logs"
SURGE = "surge"  # the spare replica a roll runs beside the others, so the fleet keeps its capacity
FRONT = "haproxy"  # the fleet's HAProxy, as its records and `restart` name it
WATCHERS = (FRONT, "prometheus")  # what runs beside the replicas, each started again by `restart NAME`
PORT_KEYS = ("front", "stats", "prometheus")  # layout.json's ports: HAProxy's front and exporter, Prometheus

SYSTEM_COMMANDS = ("haproxy", "prometheus")
INSTALL_HINT = (
    "install them with scripts/install_system_packages.sh (as root), or "
    "`sudo apt-get install -y --no-install-recommends haproxy prometheus`"
)


def missing_system_commands() -> list[str]:
    """haproxy / prometheus commands not on PATH."""
    return [name for name in SYSTEM_COMMANDS if shutil.which(name) is None]


# ---- the fleet ------------------------------------------------------------------------------------------


@dataclass
class Replica:
    """One TorchServe replica: its name in HAProxy, its fixed addresses, its cores, its archive, its server."""

    name: str
    workdir: Path
    addresses: dict[str, str]  # properties that fix its ports: reused when it is restarted
    cores: list[int] | None
    archive: str  # file name in the model store: the spec's, until a roll replaces it
    archive_stamp: list[int] | None = None  # that file's size and mtime when the replica loaded it (file_stamp)
    server: TorchServe | None = None  # None in a fleet attached from another process: it has the leader only
    java_pid: int | None = None
    leader: dict[str, float] | None = None  # the torchserve process (its process group) with its start time

    @property
    def inference_url(self) -> str:
        return self.addresses["inference_address"]

    @property
    def metrics_url(self) -> str:
        return self.addresses["metrics_address"]

    @property
    def management_url(self) -> str:
        return self.addresses["management_address"]

    @property
    def host_port(self) -> str:
        return self.inference_url.removeprefix("http://")

    @property
    def management_port(self) -> int:
        return int(self.management_url.rsplit(":", 1)[1])


class Fleet:
    """The running fleet, owned by this object: `up()` starts it, `down()` stops exactly what it started.

    `root` holds fleet.json and the fleet/ directory (every replica's working directory, HAProxy's
    and Prometheus's configuration, data and logs). For a fleet started by another process use
    `Fleet.attach(root)` to operate it, or `stop_fleet(root)` to stop it.
    """

    def __init__(self, spec: FleetSpec, root: Path = DEFAULT_ROOT) -> None:
        self.spec = spec
        self.root = Path(root)
        self.dir = self.root / "fleet"
        self.state_file = self.root / "fleet.json"
        self.processes_file = self.dir / "processes.json"
        self.layout_file = self.dir / "layout.json"
        self.surge_targets_file = self.dir / "surge-targets.json"  # Prometheus's file discovery of the surge
        self.replicas: list[Replica] = []
        # The surge slot: fixed ports, in HAProxy's configuration in maintenance; a roll starts it on the new
        # archive and stops it at the end. None in a fleet whose layout predates it.
        self.surge: Replica | None = None
        self.haproxy: subprocess.Popen | None = None
        self.prometheus: subprocess.Popen | None = None
        self.front_port = 0
        self.stats_port = 0
        self.prometheus_port = 0
        self.socket_path = self.dir / "haproxy.sock"
        self.response_timeout = 0
        # HAProxy's and Prometheus's pids with start times; in an attached fleet they are all it has of them.
        self.records: dict[str, dict[str, float] | None] = {"haproxy": None, "prometheus": None}
        self._logs: list = []
        self._state_lock = threading.Lock()  # replicas start in threads of their own, and each records itself

    @classmethod
    def attach(cls, root: Path = DEFAULT_ROOT) -> Fleet:
        """The fleet that `up()` started under `root` in another process, to operate: roll, restart, down.

        It holds no process object, only the records: replicas are reached by their addresses and
        stopped by their process groups, HAProxy through its socket.
        """
        root = Path(root)
        try:
            layout = json.loads((root / "fleet" / "layout.json").read_text())
            records = json.loads((root / "fleet" / "processes.json").read_text())
            state = read_state(root)
        except FileNotFoundError:
            raise FleetError(f"no fleet is up under {root} (start one with `up`)") from None
        spec = layout["spec"]
        fleet = cls(FleetSpec(**{**spec, "model_store": Path(spec["model_store"])}), root)
        fleet.response_timeout = layout["response_timeout"]
        fleet.front_port, fleet.stats_port, fleet.prometheus_port = (layout["ports"][k] for k in PORT_KEYS)
        fleet.records = {name: records.get(name) for name in fleet.records}
        for row, described, leader in zip(layout["replicas"], state["replicas"], records["replicas"], strict=True):
            replica = Replica(
                row["name"],
                Path(row["workdir"]),
                row["addresses"],
                row["cores"],
                row["archive"],
                row.get("archive_stamp"),  # absent in a layout written before archives were stamped: refused
            )
            replica.java_pid, replica.leader = described["pid"], leader
            fleet.replicas.append(replica)
        if layout.get("surge"):
            row = layout["surge"]
            fleet.surge = Replica(
                row["name"], Path(row["workdir"]), row["addresses"], row["cores"], row["archive"], row["archive_stamp"]
            )
            fleet.surge.java_pid = (state.get("surge") or {}).get("pid")
            fleet.surge.leader = records.get("surge")
        return fleet

    # ---- addresses --------------------------------------------------------------------------------

    @property
    def front_url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def timeout_server(self) -> int:
        """HAProxy's `timeout server` in seconds: how long a request waits on a replica that does not answer."""
        return haproxy_timeout_server(self.response_timeout)

    @property
    def haproxy_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.stats_port}"

    def describe(self) -> dict:
        """The contents of fleet.json."""
        return {
            "front": self.front_url,
            "prometheus": self.prometheus_url,
            "haproxy_socket": str(self.socket_path),
            "replicas": [
                {
                    "pid": replica.java_pid,
                    "inference": replica.inference_url,
                    "metrics": replica.metrics_url,
                    "archive": replica.archive,
                }
                for replica in self.replicas
            ],
            # While a roll runs it: the spare replica that keeps the fleet's capacity (null otherwise).
            "surge": (
                {"pid": self.surge.java_pid, "inference": self.surge.inference_url, "archive": self.surge.archive}
                if self.surge is not None and self.surge.leader is not None
                else None
            ),
        }

    # ---- lifecycle --------------------------------------------------------------------------------

    def refuse_to_start(self) -> None:
        """FleetError where `up` cannot start this fleet: HAProxy or Prometheus missing, a fleet already up under
        this root, no archive. Checked by `up` itself; the command line asks first, before it says it starts."""
        missing = missing_system_commands()
        if missing:
            raise FleetError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
        if self.state_file.exists():
            raise FleetError(f"{self.state_file} exists: a fleet is already up (stop it with `down` first)")
        archive = Path(self.spec.model_store) / self.spec.archive
        if not archive.is_file():
            raise FleetError(f"no archive {archive} (scripts/setup.sh builds model_store/bert.mar)")

    def up(self, timeout: float = 180.0) -> Fleet:
        """Start every replica, HAProxy and Prometheus; return once all are ready and every target is up."""
        self.refuse_to_start()
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.response_timeout = self.response_timeout_of(self.spec.archive)
        try:
            self._start_replicas(timeout)
            self._start_haproxy()
            self._start_prometheus()
            self.wait_ready(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop everything this fleet runs, by pid, and remove its state files.

        What this object started is stopped through it; then whatever the records name that still runs:
        a replica that another process restarted (`scripts.fleet roll`), or, in an attached fleet, all.
        """
        self._stop_popen(self.prometheus)
        self.prometheus = None
        self._stop_popen(self.haproxy)
        self.haproxy = None
        in_parallel([lambda r=replica: self._stop_replica(r) for replica in self.running()])
        stop_fleet(self.root)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> Fleet:
        return self.up()

    def __exit__(self, *exc_info) -> None:
        self.down()

    # ---- replicas ---------------------------------------------------------------------------------

    @staticmethod
    def _fewer_workers(fit: int) -> str:
        return f"give the FleetSpec workers={fit}, or none"

    def replica_layout(self, archive: str) -> Layout:
        """Each replica's workers on `archive` (tooling/cpu_layout.py): the spec's, or as many as its part of the CPUs
        holds at the archive's cpu_threads each (one a CPU for the demo archive's one thread, one for cpu_threads 0),
        its part being an even share of those this process may use (handlers/cpu_quota.py; its pinned share of them,
        where pinned). FleetError for an archive whose handler options every worker would refuse at load."""
        cpus = max(1, usable_cpus() // self.spec.replicas)
        try:
            return cpu_layout(Path(self.spec.model_store) / archive, cpus, self.spec.workers, self._fewer_workers)
        except ValueError as error:  # not an archive, or handler options every worker would refuse at load
            raise FleetError(str(error)) from None

    def _base_properties(self, archive: str) -> dict[str, str]:
        from tooling.cluster_config import cluster_properties

        layout = self.replica_layout(archive)
        options = {
            "archive": archive,
            "batch_size": self.spec.batch_size,
            "max_batch_delay": self.spec.max_batch_delay,
            "workers": layout.workers,
            # The queue holds what the replica's busy CPUs serve in the budget (as scripts.kserve_layout sizes a pod's).
            "throughput_rps": machine_throughput("cpu", layout.busy),
            "latency_budget_ms": self.spec.latency_budget_ms,
        }
        if self.spec.job_queue_size is not None:
            options["job_queue_size"] = self.spec.job_queue_size
        return cluster_properties(self.spec.model_name, **options)

    def response_timeout_of(self, archive: str) -> int:
        """The response timeout a replica gives `archive` (a file name in the model store)."""
        server_default = int(self._base_properties(archive)["default_response_timeout"])
        return archive_response_timeout(Path(self.spec.model_store) / archive, default=server_default)

    def _start_replicas(self, timeout: float) -> None:
        cores = os.sched_getaffinity(0)
        shares = core_shares(self.spec.replicas, cores) if self.spec.pin_cores else [None] * self.spec.replicas
        for index, share in enumerate(shares):
            workdir = self.dir / f"r{index}"
            server = TorchServe(workdir, self.spec.model_store, base=self._base_properties(self.spec.archive))
            addresses = {key: server.properties[key] for key in ADDRESS_KEYS}
            self.replicas.append(Replica(f"r{index}", workdir, addresses, share, self.spec.archive, server=server))
        # The surge slot's ports are chosen now, with the others', so HAProxy's configuration names them; a roll
        # starts it unpinned: it shares the fleet's cores, the restarting replica's among them.
        spare = TorchServe(self.dir / SURGE, self.spec.model_store, base=self._base_properties(self.spec.archive))
        self.surge = Replica(SURGE, self.dir / SURGE, {key: spare.properties[key] for key in ADDRESS_KEYS}, None, "")
        self.save_state()
        # In parallel: on 2 cores, two JVMs starting one after the other double the wait.
        errors: list[BaseException] = []
        in_parallel([lambda r=replica: self._start_replica_thread(r, timeout, errors) for replica in self.replicas])
        self.save_state()
        if errors:
            raise errors[0]

    def _start_replica_thread(self, replica: Replica, timeout: float, errors: list[BaseException]) -> None:
        try:
            self._start_replica(replica, timeout)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            errors.append(error)

    def _start_replica(self, replica: Replica, timeout: float) -> None:
        """Start the replica's server from a thread pinned to its cores (in a thread of its own)."""
        # Linux applies sched_setaffinity(0, ...) to the calling thread only, and a child process
        # inherits the mask of the thread that forked it: torchserve, its Java frontend and every
        # Python worker the frontend spawns (now or after a crash) all stay on these cores, with
        # no window in which a worker starts unpinned.
        if replica.cores is not None:
            os.sched_setaffinity(0, replica.cores)
        assert replica.server is not None
        # TorchServe retries a model that fails to load for ever, with back-off: its workers' log says why.
        load_failure = new_load_failure(replica.workdir / "logs" / "model_log.log")

        def record(process: subprocess.Popen) -> None:
            # Recorded before the wait: if whoever starts it dies meanwhile (a `roll` interrupted), `down` finds it.
            replica.leader, replica.java_pid = process_record(process.pid), None
            self.save_state()

        # What it loads, as it is now: a roll refuses to go back to, or onto, a file that changed since.
        replica.archive_stamp = file_stamp(Path(self.spec.model_store) / replica.archive)

        replica.server.start(timeout=timeout, on_spawn=record)
        assert replica.server.process is not None
        replica.java_pid = java_frontend(replica.server.process.pid).pid
        self.save_state()

        def loaded() -> bool:
            cause = load_failure()
            if cause:
                raise FleetError(f"replica {replica.name} cannot load {replica.archive}: {cause}")
            if replica.server is None or replica.server.process is None or replica.server.process.poll() is not None:
                raise FleetError(f"replica {replica.name} exited while loading {replica.archive}")
            return self.replica_ready(replica)

        wait_for(loaded, timeout, f"replica {replica.name}'s model to be ready")

    def replica_ready(self, replica: Replica) -> bool:
        """Every worker of the model READY (management API, which listens on loopback only, without a key)."""
        response = requests.get(f"{replica.management_url}/models/{self.spec.model_name}", timeout=2)
        response.raise_for_status()
        return all_workers_ready(response.json())

    def _stop_replica(self, replica: Replica) -> None:
        if replica.leader is not None and same_process(replica.leader):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(replica.leader["pid"]), signal.SIGCONT)  # a stopped JVM never sees SIGTERM
        if replica.server is not None:
            replica.server.stop()  # SIGTERM to its process group, SIGKILL if needed, and reaps it
            replica.server = None
        else:
            stop_recorded(replica.leader, group=True)
        replica.leader = None

    def running(self) -> list[Replica]:
        """The replicas, and the surge replica while it runs."""
        surge = [self.surge] if self.surge is not None and self.surge.leader is not None else []
        return [*self.replicas, *surge]

    def restart_replica(self, index: int, timeout: float = 120.0, archive: str | None = None) -> Replica:
        """Stop what is left of replica `index` and start it again on the same ports (HAProxy knows them),
        on `archive` (a file name in the model store) when given, else on the one it ran."""
        return self.restart(self.replicas[index], timeout, archive)

    def stop_surge(self) -> None:
        """Stop the surge replica (take it out of rotation first: its requests would be retried elsewhere)."""
        if self.surge is not None:
            scraped = self.surge.java_pid is not None
            self.surge.java_pid = None
            self.save_state()  # out of Prometheus's targets before it stops answering: else it is a replica down
            if scraped:
                self._wait_unscraped(self.surge.name)
            self._stop_replica(self.surge)
            self.save_state()

    def _wait_unscraped(self, name: str, timeout: float = 15.0) -> None:
        """Wait until Prometheus no longer scrapes replica `name` (gone from its discovery file): it applies the
        change within about 10 s (discovery and the scrape manager each update at most every 5 s), and a target
        scraped after it stopped is recorded down. Bounded: a Prometheus that cannot be asked is not waited for,
        and one slower than `timeout` records a moment of `up` 0, far below BertReplicaDown's minute."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                targets = self.api("targets", state="active")["activeTargets"]
            except (requests.RequestException, FleetError):
                return
            if not any(target["labels"].get("replica") == name for target in targets):
                return
            time.sleep(0.25)

    def restart(self, replica: Replica, timeout: float = 120.0, archive: str | None = None) -> Replica:
        """`restart_replica` for any replica of this fleet, the surge replica included."""
        self._stop_replica(replica)
        replica.archive = archive or replica.archive
        replica.server = TorchServe(
            replica.workdir,
            self.spec.model_store,
            overrides=replica.addresses,
            base=self._base_properties(replica.archive),
        )
        errors: list[BaseException] = []
        # A thread of its own, for the pinning; a daemon, so that an aborted roll need not wait out the load.
        in_parallel([lambda: self._start_replica_thread(replica, timeout, errors)], daemon=True)
        self.save_state()
        if errors:
            raise errors[0]
        return replica

    # ---- HAProxy and Prometheus -------------------------------------------------------------------

    def _spawn(self, command: list[str], log_name: str) -> subprocess.Popen:
        # Private, as the replicas' own files are (SERVER_UMASK): HAProxy's log names clients by address and port,
        # and Prometheus' data holds every series; neither is for the machine's other users.
        log = open(self.dir / log_name, "ab", opener=owner_only)  # noqa: SIM115 - closed in down()
        self._logs.append(log)
        # Its own session: `up` returns and the fleet runs on; Ctrl-C in the shell does not reach it.
        return subprocess.Popen(
            command,
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=SERVER_UMASK,
        )

    def _start_haproxy(self) -> None:
        self.front_port, self.stats_port = free_port(), free_port()
        config = self.dir / "haproxy.cfg"
        config.write_text(
            haproxy_config(
                servers={replica.name: (replica.host_port, replica.management_port) for replica in self.replicas},
                spares={self.surge.name: (self.surge.host_port, self.surge.management_port)} if self.surge else None,
                model=self.spec.model_name,
                front_port=self.front_port,
                stats_port=self.stats_port,
                socket_path=self.socket_path,
                response_timeout=self.response_timeout,
                retries=self.spec.retries,
                latency_budget_ms=self.spec.latency_budget_ms,
            )
        )
        # Not -q: quiet, HAProxy 2.6 prints nothing on a file it rejects, and its ALERT lines name the line and why.
        check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise FleetError(f"haproxy rejects {config}:\n{check.stdout}{check.stderr}")
        self.socket_path.unlink(missing_ok=True)
        # A new fleet's servers start as configured, whatever states an earlier fleet under this root left: the file
        # holds the format's version line alone (a missing one would be a warning in the log).
        server_state_file(self.socket_path).write_text("1\n")
        self.haproxy = self._run(FRONT, self._haproxy_command())

    def restart_haproxy(self, timeout: float = 30.0) -> None:
        """Start HAProxy again on the configuration it ran, on the same front, stats and socket, once its process has
        ended (killed: every request to the front failed meanwhile). The replicas run on as they were; the new HAProxy
        loads each server's state as last set through the socket (one drained stays drained, the surge replica a roll
        runs stays in rotation), and its checks take each one it may use back into rotation once READY. FleetError
        while the recorded HAProxy still runs, or when the new one does not answer."""
        self.haproxy = self._start_again(
            FRONT,
            self._haproxy_command(),
            answers=lambda: self.servers() is not None,
            prepare=lambda: self.socket_path.unlink(missing_ok=True),
            timeout=timeout,
        )

    def restart_prometheus(self, timeout: float = 60.0) -> None:
        """Start Prometheus again on the configuration, port and data folder it had (the series it had written to disk
        go on), once its process has ended (killed: nothing was scraped and no alert could fire meanwhile).
        FleetError while the recorded one still runs, or when the new one is not ready."""
        self.prometheus = self._start_again(
            "prometheus",
            self._prometheus_command(),
            answers=lambda: requests.get(f"{self.prometheus_url}/-/ready", timeout=2).ok,
            timeout=timeout,
        )

    def _start_again(
        self,
        name: str,
        command: list[str],
        answers: Callable[[], bool],
        timeout: float,
        prepare: Callable[[], None] = lambda: None,
    ) -> subprocess.Popen:
        """HAProxy or Prometheus (`name`, as recorded) started again with `command`, logging to its log, recorded for
        `down`; returns once `answers`. Refused while the recorded process runs (a zombie has ended)."""
        self.refuse_restart_while_running(name)
        prepare()
        process = self._run(name, command)
        failed = FleetError(f"{name} did not start again: {self.dir / f'{name}.log'} says why")

        def started() -> bool:  # wait_for polls through the errors of a process not listening yet
            if process.poll() is not None:  # ended at once (its port taken since, say): no use waiting
                raise failed
            return answers()

        try:
            wait_for(started, timeout, name)
        except FleetError:
            raise failed from None
        return process

    def refuse_restart_while_running(self, name: str) -> None:
        """FleetError while HAProxy or Prometheus (`name`, as recorded) still runs: a restart would start a second one
        on its ports (a zombie has ended)."""
        record = self.records.get(name)
        if record and still_running(record):
            raise FleetError(f"{name} (pid {record['pid']}) is running: nothing to restart")

    def _run(self, name: str, command: list[str]) -> subprocess.Popen:
        """HAProxy or Prometheus (`name`, as the records and its log file name it) started with `command`, and
        recorded for `down` at once."""
        process = self._spawn(command, f"{name}.log")
        self.records[name] = process_record(process.pid)
        self.save_state()
        return process

    def _haproxy_command(self) -> list[str]:
        # -db: stay in the foreground, one process, so its pid is the one to stop.
        return ["haproxy", "-db", "-f", str(self.dir / "haproxy.cfg")]

    def _prometheus_command(self) -> list[str]:
        return [
            "prometheus",
            f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]

    def _start_prometheus(self) -> None:
        self.prometheus_port = free_port()
        alerts = self.dir / "alerts.yaml"
        alerts.write_text(alerting_rules(self.spec.alert_for))
        config = self.dir / "prometheus.yml"
        config.write_text(
            prometheus_config(
                replica_targets={r.name: r.metrics_url.removeprefix("http://") for r in self.replicas},
                haproxy_target=self.haproxy_metrics_url.removeprefix("http://"),
                rule_files=[RECORDING_RULES, alerts],
                interval_s=self.spec.scrape_interval_s,
                surge_targets_file=self.surge_targets_file,
            )
        )
        # A previous fleet's series name ports that no longer exist.
        shutil.rmtree(self.dir / "prometheus-data", ignore_errors=True)
        self.prometheus = self._run("prometheus", self._prometheus_command())

    def _stop_popen(self, process: subprocess.Popen | None) -> None:
        if process is None:
            return
        stop_recorded(process_record(process.pid) if process.poll() is None else None, group=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    # ---- readiness --------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Every replica ready and UP in HAProxy, every Prometheus target up and the rules loaded."""
        for replica in self.replicas:
            wait_for(lambda r=replica: self.replica_ready(r), timeout, f"replica {replica.name} to be ready")
        wait_for(self.all_servers_up, timeout, "HAProxy to mark every replica UP")
        wait_for(
            lambda: requests.get(f"{self.prometheus_url}/-/ready", timeout=2).ok, timeout, "Prometheus to be ready"
        )
        wait_for(self.all_targets_up, timeout, "every Prometheus target to be up")
        groups = sum(len(yaml.safe_load(path.read_text())["groups"]) for path in (RECORDING_RULES, ALERTING_RULES))
        wait_for(lambda: len(self.rule_groups()) == groups, timeout, "Prometheus to load the rules")

    def all_servers_up(self) -> bool:
        servers = haproxy_servers(self.socket_path)
        return all(servers.get(replica.name, {}).get("status") == "UP" for replica in self.replicas)

    def all_targets_up(self) -> bool:
        targets = self.api("targets")["activeTargets"]
        return len(targets) == len(self.replicas) + 1 and all(t["health"] == "up" for t in targets)

    def rule_groups(self) -> list[dict]:
        return self.api("rules")["groups"]

    # ---- operating it -----------------------------------------------------------------------------

    def haproxy_command(self, command: str) -> str:
        return haproxy_command(self.socket_path, command)

    def servers(self) -> dict[str, dict[str, str]]:
        """HAProxy's view of every replica, and of the surge slot: {name: show-stat columns}."""
        return haproxy_servers(self.socket_path)

    def held_out(self) -> set[str]:
        """The servers set `drain` or `maint` through HAProxy's admin socket, DOWN or not (haproxy_admin's)."""
        return held_out(self.socket_path)

    def set_server_state(self, name: str, state: str) -> None:
        """`ready`, `drain` (finish in-flight requests, take no new ones) or `maint`: haproxy_admin's."""
        set_server_state(self.socket_path, name, state)

    def api(self, path: str, **params: str) -> dict:
        """GET Prometheus's /api/v1/<path>; its `data`."""
        response = requests.get(f"{self.prometheus_url}/api/v1/{path}", params=params, timeout=10)
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise FleetError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector (at `at`, a Unix time, if given)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    # ---- state ------------------------------------------------------------------------------------

    def save_state(self) -> None:
        """Write fleet.json, processes.json, layout.json and surge-targets.json for what runs now (after every
        start and restart)."""
        with self._state_lock:
            self._write_state()

    def _write_state(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.state_file, self.describe())
        records = {
            "replicas": [replica.leader for replica in self.replicas],
            "surge": self.surge.leader if self.surge is not None else None,
            **self.records,
        }
        write_atomically(self.processes_file, records)
        ports = dict(zip(PORT_KEYS, (self.front_port, self.stats_port, self.prometheus_port), strict=True))
        row_keys = ("name", "workdir", "addresses", "cores", "archive", "archive_stamp")
        layout = {
            "spec": asdict(self.spec),
            "response_timeout": self.response_timeout,
            "ports": ports,
            "replicas": [{key: getattr(r, key) for key in row_keys} for r in self.replicas],
            "surge": {key: getattr(self.surge, key) for key in row_keys} if self.surge is not None else None,
        }
        write_atomically(self.layout_file, layout)
        surge_answers = self.surge is not None and self.surge.leader is not None and self.surge.java_pid is not None
        metrics = self.surge.metrics_url.removeprefix("http://") if surge_answers else None
        write_atomically(self.surge_targets_file, surge_targets(SURGE, metrics))


def ports_taken(replica: Replica) -> list[int]:
    """`replica`'s ports that something listens on now (a slot's ports are chosen at `up`, not held)."""
    return [port for port in server_ports(replica.addresses).values() if port_in_use(port)]


def file_stamp(path: Path) -> list[int]:
    """A file's size and modification time (ns): what tells whether it is still the file a replica loaded."""
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def write_atomically(path: Path, document: object) -> None:
    """Write JSON so that a reader in another process (`status`, `down`, `roll`) sees the old file or the new one."""
    files.write_atomically(path, json.dumps(document, indent=2, default=str) + "\n")


def ended_processes(root: Path = DEFAULT_ROOT) -> dict[str, int]:
    """HAProxy and Prometheus of the fleet under `root` whose recorded process no longer runs (killed, crashed):
    {"haproxy": its recorded pid, ...}. Nothing starts either again by itself: `restart NAME` or `heal` does."""
    try:
        records = json.loads((Path(root) / "fleet" / "processes.json").read_text())
    except FileNotFoundError:
        return {}
    return {name: records[name]["pid"] for name in WATCHERS if records.get(name) and not still_running(records[name])}


def stop_fleet(root: Path = DEFAULT_ROOT) -> list[str]:
    """Stop the fleet under `root` from its records (one `up` started in another process, say); what was stopped."""
    root = Path(root)
    state_file = root / "fleet.json"
    processes_file = root / "fleet" / "processes.json"
    (root / "fleet" / "layout.json").unlink(missing_ok=True)
    if not processes_file.exists():
        state_file.unlink(missing_ok=True)
        return []
    records = json.loads(processes_file.read_text())
    stopped = []
    for name in ("prometheus", "haproxy"):
        if records.get(name) and same_process(records[name]):
            stopped.append(f"{name} (pid {records[name]['pid']})")
        stop_recorded(records.get(name), group=False)
    groups = dict(enumerate(records.get("replicas", [])))
    if records.get("surge"):
        groups[SURGE] = records["surge"]
    for index, record in groups.items():
        if record and same_process(record):
            name = index if index == SURGE else f"r{index}"
            stopped.append(f"replica {name} (process group {record['pid']})")
    in_parallel([lambda r=record: stop_recorded(r, group=True) for record in groups.values()])
    state_file.unlink(missing_ok=True)
    processes_file.unlink(missing_ok=True)
    (root / "fleet" / "haproxy.sock").unlink(missing_ok=True)
    return stopped


def read_state(root: Path = DEFAULT_ROOT) -> dict:
    """fleet.json of the fleet under `root`."""
    return json.loads((Path(root) / "fleet.json").read_text())
