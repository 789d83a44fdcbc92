"""The Prometheus rules and the Grafana dashboard, checked offline with promtool (Debian package prometheus).

`promtool check rules` validates the files; `promtool test rules` evaluates them over synthetic series
and compares every recording rule's value and the alerts' firing with what the formulas must give.
The fleet test (tests/e2e/test_fleet.py) runs the same rules in a real Prometheus.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from tooling.fleet_config import ALERTING_RULES, RECORDING_RULES, alerting_rules
from tooling.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "dashboard.json"

# The names other parts of the project rely on (the Kubernetes HPA's prometheus-adapter, the dashboard).
RECORDED = [
    "bert_requests_per_second",
    "bert_mean_batch_size",
    "bert_queue_ms_per_request",
    "bert_handler_ms_per_batch",
    "bert_padding_waste",
    "bert_rejected_items_per_second",
    "bert_unavailable_per_second",
    "bert_goodput_per_second",
    "bert_deadline_exceeded_per_second",
    "bert_shed_ratio",
]
ALERTS = [
    "BertReplicaDown",
    "BertQueueTimeHigh",
    "BertQueueFull",
    "BertRejectedItemsRising",
    "BertBatchesStuckAtSizeOne",
    "BertSheddingSustained",
]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = (
            "promtool is missing: install the Debian package prometheus "
            "(scripts/install_system_packages.sh as root, or apt-get install prometheus)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)


def recording_rules() -> dict[str, str]:
    groups = yaml.safe_load(RECORDING_RULES.read_text())["groups"]
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_promtool_check_rules_passes():
    result = run_promtool("check", "rules", str(RECORDING_RULES), str(ALERTING_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_recording_rule_exists_per_replica_and_fleet_wide():
    names = set(recording_rules())
    for name in RECORDED:
        assert f"instance:{name}:rate1m" in names
        assert f"fleet:{name}:rate1m" in names
    alerts = [
        rule["alert"] for group in yaml.safe_load(ALERTING_RULES.read_text())["groups"] for rule in group["rules"]
    ]
    assert sorted(alerts) == sorted(ALERTS)


def test_per_replica_rules_keep_the_kubernetes_labels():
    """prometheus-adapter maps a series to a pod through `namespace` and `pod`: every per-replica rule keeps them."""
    for record, expr in recording_rules().items():
        if record.startswith("instance:"):
            assert "by (namespace, pod, instance" in expr, record


def test_the_dashboard_shows_every_recording_rule_and_its_queries_parse(tmp_path):
    queries = dashboard_queries()
    for name in RECORDED:
        for level in ("instance", "fleet"):
            assert any(f"{level}:{name}:rate1m" in query for query in queries), f"no panel for {level}:{name}"
    # promtool parses PromQL only inside a rules file: wrap every panel query in a recording rule.
    wrapped = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"panel_{i}", "expr": q} for i, q in enumerate(queries)]}]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(wrapped))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fleets_shortened_alerts_stay_valid(tmp_path):
    path = tmp_path / "alerts.yaml"
    path.write_text(alerting_rules({"BertReplicaDown": "2s"}))
    assert run_promtool("check", "rules", str(path)).returncode == 0
    rules = {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}
    assert rules["BertReplicaDown"]["for"] == "2s"
    assert rules["BertQueueTimeHigh"]["for"] == "5m"


# ---- the formulas, evaluated by promtool over synthetic series ------------------------------------------

# Two replicas scraped every 15 s; counters grow by these amounts per scrape (so per second: /15).
# Per scrape, a runs 15 batches holding 60 items (mean 4) and b 30 batches of 30 (mean 1): the fleet's
# mean batch size is 90 items / 45 batches = 2, not the mean of the two ratios (2.5). b's requests wait 12 ms in
# the queue yet run one by one: batching misconfigured.
SERIES = {
    'bert_items_total{instance="a:1",job="torchserve"}': 60,
    'bert_batches_total{instance="a:1",job="torchserve"}': 15,
    'bert_items_total{instance="b:1",job="torchserve"}': 30,
    'bert_batches_total{instance="b:1",job="torchserve"}': 30,
    'ts_inference_requests_total{instance="a:1",job="torchserve",model_name="bert"}': 45,
    'ts_inference_requests_total{instance="b:1",job="torchserve",model_name="bert"}': 90,
    'ts_queue_latency_microseconds{instance="a:1",job="torchserve",model_name="bert"}': 135000,
    'ts_queue_latency_microseconds{instance="b:1",job="torchserve",model_name="bert"}': 1080000,
    'bert_stage_milliseconds_total{instance="a:1",job="torchserve",Stage="forward"}': 50,
    'bert_stage_milliseconds_total{instance="a:1",job="torchserve",Stage="tokenization"}': 10,
    'bert_padded_tokens_total{instance="a:1",job="torchserve"}': 150,
    'bert_real_tokens_total{instance="a:1",job="torchserve"}': 100,
    'bert_rejected_items_total{instance="a:1",job="torchserve",Reason="EmptyText"}': 15,
    'bert_rejected_items_total{instance="a:1",job="torchserve",Reason="InferenceFailed"}': 15,
    'bert_rejected_items_total{instance="a:1",job="torchserve",Reason="DeadlineExceeded"}': 15,
    'Requests5XX{instance="a:1",job="torchserve",Level="Host"}': 45,
}
EXPECTED = {  # at 5m, over the last minute
    'instance:bert_mean_batch_size:rate1m{instance="a:1"}': 4,
    'instance:bert_mean_batch_size:rate1m{instance="b:1"}': 1,
    "fleet:bert_mean_batch_size:rate1m": 2,
    'instance:bert_requests_per_second:rate1m{instance="a:1"}': 3,
    "fleet:bert_requests_per_second:rate1m": 9,
    'instance:bert_queue_ms_per_request:rate1m{instance="a:1"}': 3,  # 135 ms / 45 requests
    'instance:bert_queue_ms_per_request:rate1m{instance="b:1"}': 12,
    "fleet:bert_queue_ms_per_request:rate1m": 9,  # (135 + 1080) ms / (45 + 90) requests
    'instance:bert_handler_ms_per_batch:rate1m{instance="a:1"}': 4,  # (50 + 10) ms / 15 batches
    'instance:bert_padding_waste:rate1m{instance="a:1"}': 1.5,
    'instance:bert_rejected_items_per_second:rate1m{instance="a:1",Reason="EmptyText"}': 1,
    'fleet:bert_rejected_items_per_second:rate1m{Reason="InferenceFailed"}': 1,
    # 3 5xx/s, of which 1/s the handler's own InferenceFailed: 2/s from the frontend (queue full)
    'instance:bert_unavailable_per_second:rate1m{instance="a:1"}': 2,
    'instance:bert_unavailable_per_second:rate1m{instance="b:1"}': 0,  # no Requests5XX exported yet
    "fleet:bert_unavailable_per_second:rate1m": 2,
    # a is handed 4 items/s and refuses 3 (EmptyText, InferenceFailed, DeadlineExceeded): 1 answered; b 2, all answered
    'instance:bert_goodput_per_second:rate1m{instance="a:1"}': 1,
    'instance:bert_goodput_per_second:rate1m{instance="b:1"}': 2,
    "fleet:bert_goodput_per_second:rate1m": 3,
    'instance:bert_deadline_exceeded_per_second:rate1m{instance="a:1"}': 1,
    'instance:bert_deadline_exceeded_per_second:rate1m{instance="b:1"}': 0,
    "fleet:bert_deadline_exceeded_per_second:rate1m": 1,
    # shed: a's 2/s of 3 requests/s (the DeadlineExceeded 503s are among its 5xx); the fleet's 2 of 9
    'instance:bert_shed_ratio:rate1m{instance="a:1"}': 2 / 3,
    'instance:bert_shed_ratio:rate1m{instance="b:1"}': 0,
    "fleet:bert_shed_ratio:rate1m": 2 / 9,
}


def sample(series: str) -> tuple[str, str]:
    """'name{labels}' -> (name, labels as promtool writes them)."""
    name, _, labels = series.partition("{")
    return name, "{" + labels if labels else ""


def expected_alert(name: str, instance: str, value: str = "", **labels: str) -> dict:
    """The alert as promtool reports it: its labels, and its annotations rendered for `instance` and `value`."""
    rule = next(
        r for g in yaml.safe_load(ALERTING_RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == name
    )
    annotations = {
        key: text.replace("{{ $labels.instance }}", instance)
        .replace("{{ $value | humanize }}", value)
        .replace("{{ $value | humanizePercentage }}", value)
        for key, text in rule["annotations"].items()
    }
    return {"exp_labels": {"instance": instance, **labels, **rule["labels"]}, "exp_annotations": annotations}


def test_recording_rules_and_alerts_compute_what_they_claim(tmp_path):
    minutes = 20
    steps = minutes * 4
    input_series = [{"series": s, "values": f"0+{step}x{steps}"} for s, step in SERIES.items()]
    # Replica a goes down at 1m: BertReplicaDown pends for its `for:` (1m), then fires.
    input_series.append({"series": 'up{instance="a:1",job="torchserve"}', "values": "1 1 1 1 " + "0 " * (steps - 4)})
    input_series.append({"series": 'up{instance="b:1",job="torchserve"}', "values": f"1x{steps}"})
    tests = [
        {
            "interval": "15s",
            "input_series": input_series,
            "promql_expr_test": [
                {
                    "expr": sample(series)[0] + sample(series)[1],
                    "eval_time": "5m",
                    "exp_samples": [{"labels": series, "value": value}],
                }
                for series, value in EXPECTED.items()
            ],
            "alert_rule_test": [
                {"eval_time": "1m45s", "alertname": "BertReplicaDown", "exp_alerts": []},  # pending
                {
                    "eval_time": "2m15s",
                    "alertname": "BertReplicaDown",
                    "exp_alerts": [expected_alert("BertReplicaDown", "a:1", job="torchserve")],
                },
                {"eval_time": "1m", "alertname": "BertQueueFull", "exp_alerts": []},
                {
                    "eval_time": "4m",
                    "alertname": "BertQueueFull",
                    "exp_alerts": [expected_alert("BertQueueFull", "a:1", "2")],
                },
                # b runs batches of 1 while its requests wait: after 10 minutes, batching is flagged; a is fine.
                {"eval_time": "9m", "alertname": "BertBatchesStuckAtSizeOne", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "BertBatchesStuckAtSizeOne",
                    "exp_alerts": [expected_alert("BertBatchesStuckAtSizeOne", "b:1")],
                },
                # a sheds two thirds of its requests from the first minute: pending for 15 minutes, then firing.
                {"eval_time": "14m", "alertname": "BertSheddingSustained", "exp_alerts": []},
                {
                    "eval_time": "17m",
                    "alertname": "BertSheddingSustained",
                    "exp_alerts": [expected_alert("BertSheddingSustained", "a:1", "66.67%")],
                },
            ],
        }
    ]
    spec = {"rule_files": [str(RECORDING_RULES), str(ALERTING_RULES)], "evaluation_interval": "15s", "tests": tests}
    path = tmp_path / "rules-test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
