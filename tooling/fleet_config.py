"""The fleet's configuration, rendered: pure functions and no process (tooling/fleet.py runs them).

What a one-machine fleet runs with: the spec, each replica's share of the cores, the response
timeout its archive will get, HAProxy's configuration (deploy/fleet/haproxy.cfg.template) and
Prometheus's (every replica's metrics port and HAProxy's exporter, with the repository's recording
rules and the alerting rules, whose `for:` a test may shorten). Unit-testable without haproxy,
prometheus or a TorchServe, as tooling/cluster_config.py is for the cluster.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tooling.latency_budget import DEFAULT_BUDGET_MS
from tooling.paths import MODEL_STORE, REPO

DEPLOY = REPO / "deploy"
HAPROXY_TEMPLATE = DEPLOY / "fleet" / "haproxy.cfg.template"
RECORDING_RULES = DEPLOY / "prometheus" / "rules.yaml"
ALERTING_RULES = DEPLOY / "prometheus" / "alerts.yaml"

BACKEND = "torchserve"  # HAProxy backend name, and the Prometheus job the alerts expect
REPLICA_JOB = "torchserve"
HAPROXY_JOB = "haproxy"
# The label that tells the fleet's HAProxy from any other a Prometheus scrapes as `haproxy` (an ingress controller's):
# BertFrontDown (deploy/prometheus/alerts.yaml) names only this one.
FRONT_LABELS = {"service": "bert-torchserve"}


class FleetError(RuntimeError):
    """The fleet could not be started, reached, or stopped as asked."""


@dataclass(frozen=True)
class FleetSpec:
    """What to run. Batching and queue settings go to every replica's cluster configuration."""

    replicas: int = 2
    model_store: Path = MODEL_STORE
    archive: str = "bert.mar"  # file name inside model_store
    model_name: str = "bert"
    batch_size: int = 8
    max_batch_delay: int = 2
    # Each replica's workers; None: as many as its cores hold at the archive's cpu_threads each (Fleet.replica_layout)
    workers: int | None = None
    job_queue_size: int | None = None  # None: the cluster configuration's, from the latency budget
    latency_budget_ms: int = DEFAULT_BUDGET_MS  # each replica's queue, and HAProxy's deadline on each request
    retries: int = 3  # HAProxy: attempts after the first, each on another replica
    scrape_interval_s: int = 1  # short, so a test sees a replica down within seconds
    alert_for: Mapping[str, str] = field(default_factory=dict)  # alert name -> `for:` (e.g. shorter in tests)
    pin_cores: bool = True


def core_shares(replicas: int, cores: Sequence[int]) -> list[list[int] | None]:
    """Each replica's cores: an equal, disjoint share when there are enough cores, else None (no pinning)."""
    cores = sorted(cores)
    per_replica = len(cores) // replicas if replicas else 0
    if per_replica < 1:
        return [None] * replicas
    return [cores[i * per_replica : (i + 1) * per_replica] for i in range(replicas)]


def server_state_file(socket_path: Path | str) -> Path:
    """Where HAProxy's server states are kept, beside its admin socket: every state set through the socket is saved
    there (haproxy_admin.set_server_state), and an HAProxy started again loads them (`server-state-file`)."""
    return Path(socket_path).with_name("haproxy.state")


def haproxy_timeout_server(response_timeout: int) -> int:
    """HAProxy's `timeout server`: past the model's own timeout, so TorchServe answers a slow batch first
    (with its own error), with room for the time a request waits in the queue before its batch starts."""
    return int(response_timeout * 1.5) + 1


def haproxy_config(
    *,
    servers: Mapping[str, tuple[str, int]],
    model: str,
    front_port: int,
    stats_port: int,
    socket_path: Path,
    response_timeout: int,
    retries: int,
    latency_budget_ms: int = DEFAULT_BUDGET_MS,
    spares: Mapping[str, tuple[str, int]] | None = None,
) -> str:
    """HAProxy's configuration from deploy/fleet/haproxy.cfg.template for `servers`, {name: (inference
    "127.0.0.1:port", management port)}: requests go to the inference address, health checks ask the
    management API whether every worker of `model` is READY. Each request leaves HAProxy with a deadline:
    its arrival plus `latency_budget_ms`, or the client's if earlier. `spares`, the same way: servers that
    start in maintenance (the surge replica a roll brings in), put in rotation through the admin socket."""
    timeout_server = haproxy_timeout_server(response_timeout)
    lines = [f"    server {name} {address} check port {check_port}" for name, (address, check_port) in servers.items()]
    lines += [
        f"    server {name} {address} check port {check_port} disabled"
        for name, (address, check_port) in (spares or {}).items()
    ]
    return string.Template(HAPROXY_TEMPLATE.read_text()).substitute(
        socket=socket_path,
        state_file=server_state_file(socket_path),
        model=model,
        front_port=front_port,
        stats_port=stats_port,
        response_timeout=response_timeout,
        timeout_server=timeout_server,
        # The client waits through the first try and every retry, each up to a whole server timeout.
        timeout_client=timeout_server * (retries + 1) + 10,
        retries=retries,
        latency_budget_ms=latency_budget_ms,
        servers="\n".join(lines),
    )


def prometheus_config(
    *,
    replica_targets: Mapping[str, str],
    haproxy_target: str,
    rule_files: Sequence[Path],
    interval_s: int,
    surge_targets_file: Path | None = None,
) -> str:
    """Prometheus's configuration: every replica's metrics port (labelled with its replica name) and HAProxy's.
    `surge_targets_file` (see `surge_targets`) adds the surge replica to the replicas' job while a roll runs it."""
    interval = f"{interval_s}s"
    replicas: dict = {
        "job_name": REPLICA_JOB,
        "static_configs": [
            {"targets": [target], "labels": {"replica": name}} for name, target in replica_targets.items()
        ],
    }
    if surge_targets_file is not None:
        # Prometheus watches the file and re-reads it at once when it changes (and every interval besides).
        replicas["file_sd_configs"] = [{"files": [str(surge_targets_file)], "refresh_interval": interval}]
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            replicas,
            {"job_name": HAPROXY_JOB, "static_configs": [{"targets": [haproxy_target], "labels": FRONT_LABELS}]},
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def surge_targets(name: str, target: str | None) -> list[dict]:
    """The surge replica's target for Prometheus's file discovery: listed only while its server answers, so
    the fleet's figures (fleet:bert_requests_per_second…) count what it serves during a roll, and a slot
    left empty between rolls is no target at all, not a replica down for BertReplicaDown."""
    return [{"targets": [target], "labels": {"replica": name}}] if target is not None else []


def alerting_rules(alert_for: Mapping[str, str]) -> str:
    """deploy/prometheus/alerts.yaml with some alerts' `for:` replaced (a test cannot wait a minute)."""
    rules = yaml.safe_load(ALERTING_RULES.read_text())
    unknown = set(alert_for)
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in alert_for:
                rule["for"] = alert_for[rule["alert"]]
                unknown.discard(rule["alert"])
    if unknown:
        raise FleetError(f"no such alert in {ALERTING_RULES.name}: {sorted(unknown)}")
    return yaml.safe_dump(rules, sort_keys=False)
