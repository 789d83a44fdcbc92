"""The fleet's configuration as rendered by tooling/fleet_config.py, checked by the real haproxy and promtool.

No process is started: `haproxy -c` and `promtool check config` read the files the fleet would run with
(tests/e2e/test_fleet.py runs them).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tooling.fleet_config import (
    FRONT_LABELS,
    RECORDING_RULES,
    FleetError,
    alerting_rules,
    core_shares,
    haproxy_config,
    haproxy_timeout_server,
    prometheus_config,
    surge_targets,
)


def test_replicas_get_equal_disjoint_core_shares_or_none():
    assert core_shares(2, [3, 0, 2, 1]) == [[0, 1], [2, 3]]
    assert core_shares(2, [0, 1, 2]) == [[0], [1]]
    assert core_shares(3, [0, 1]) == [None, None, None]


@pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy not installed (scripts/install_system_packages.sh)"
)
def test_haproxy_accepts_the_rendered_configuration(tmp_path):
    servers = {"r0": ("127.0.0.1:18080", 18081), "r1": ("127.0.0.1:18090", 18091)}
    text = haproxy_config(
        servers=servers, model="bert", front_port=18000, stats_port=18001, socket_path=tmp_path / "s.sock",
        response_timeout=60, retries=3, spares={"surge": ("127.0.0.1:18100", 18101)},
    )  # fmt: skip
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    for name, (address, management_port) in servers.items():
        assert f"server {name} {address} check port {management_port}" in text
    assert "server surge 127.0.0.1:18100 check port 18101 disabled" in text  # in maintenance until a roll
    assert "http-check send meth GET uri /models/bert" in text
    assert f"timeout server {haproxy_timeout_server(60)}s" in text and haproxy_timeout_server(60) > 60
    # The client's connection outlasts the first try and each of the 3 retries, each of which may wait a whole
    # server timeout: otherwise HAProxy would drop the client while a retry is still to be answered.
    [client_timeout] = re.findall(r"timeout client (\d+)s", text)
    assert int(client_timeout) > (3 + 1) * haproxy_timeout_server(60)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_rendered_prometheus_configuration(tmp_path):
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text(alerting_rules({"BertReplicaDown": "5s"}))
    text = prometheus_config(
        replica_targets={"r0": "127.0.0.1:18082", "r1": "127.0.0.1:18083"},
        haproxy_target="127.0.0.1:18001",
        rule_files=[RECORDING_RULES, alerts],
        interval_s=1,
        surge_targets_file=tmp_path / "surge-targets.json",
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    # promtool reads the discovery file too: the surge listed (a roll runs it) and the slot empty.
    for target in ("127.0.0.1:18102", None):
        (tmp_path / "surge-targets.json").write_text(json.dumps(surge_targets("surge", target)))
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    jobs = {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}
    assert [c["labels"]["replica"] for c in jobs["torchserve"]["static_configs"]] == ["r0", "r1"]
    assert jobs["torchserve"]["file_sd_configs"][0]["files"] == [str(tmp_path / "surge-targets.json")]
    # HAProxy with the labels BertFrontDown selects (tests/unit/test_prometheus_rules.py fires it on them).
    assert jobs["haproxy"]["static_configs"] == [{"targets": ["127.0.0.1:18001"], "labels": FRONT_LABELS}]
    assert surge_targets("surge", "127.0.0.1:18102") == [
        {"targets": ["127.0.0.1:18102"], "labels": {"replica": "surge"}}
    ]
    shortened = {r["alert"]: r["for"] for g in yaml.safe_load(alerts.read_text())["groups"] for r in g["rules"]}
    assert shortened["BertReplicaDown"] == "5s"


def test_an_alert_the_rules_do_not_have_is_refused_by_name():
    """A misspelt --alert-for would otherwise leave the alert at its minute, silently."""
    with pytest.raises(FleetError, match=r"no such alert in alerts\.yaml: \['BertReplicaGone'\]"):
        alerting_rules({"BertReplicaDown": "5s", "BertReplicaGone": "5s"})
