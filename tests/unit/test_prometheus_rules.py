"""The Prometheus rules and the Grafana dashboard, checked offline with promtool (Debian package prometheus).

`promtool check rules` validates the files; `promtool test rules` evaluates them over synthetic series
and compares every recording rule's value and the alerts' firing with what the formulas must give.
The fleet test (tests/e2e/test_fleet.py) runs the same rules in a real Prometheus.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tooling.fleet_config import ALERTING_RULES, FRONT_LABELS, RECORDING_RULES, alerting_rules
from tooling.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "dashboard.json"

# The names other parts of the project rely on (the Kubernetes HPA's prometheus-adapter, the dashboard).
RECORDED = [
    "bert_requests_per_second",
    "bert_latency_ms_per_request",
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
    "BertFrontDown",
    "BertLatencyHigh",
    "BertAutoscalerAtMax",
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
        assert f"instance:{name}:rate3m" in names
        assert f"fleet:{name}:rate3m" in names
    alerts = [
        rule["alert"] for group in yaml.safe_load(ALERTING_RULES.read_text())["groups"] for rule in group["rules"]
    ]
    assert sorted(alerts) == sorted(ALERTS)


def test_every_alert_has_a_runbook_section():
    sections = re.findall(r"^## (\w+)$", (REPO / "docs" / "runbooks.md").read_text(), re.M)
    for group in yaml.safe_load(ALERTING_RULES.read_text())["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url.endswith("#" + rule["alert"].lower()), url
            assert rule["alert"] in sections


def test_per_replica_rules_keep_the_kubernetes_labels():
    """prometheus-adapter maps a series to a pod through `namespace` and `pod`: every per-replica rule keeps them."""
    for record, expr in recording_rules().items():
        if record.startswith("instance:"):
            assert "by (namespace, pod, instance" in expr, record


def test_the_dashboard_shows_every_recording_rule_and_its_queries_parse(tmp_path):
    queries = dashboard_queries()
    for name in RECORDED:
        for level in ("instance", "fleet"):
            assert any(f"{level}:{name}:rate3m" in query for query in queries), f"no panel for {level}:{name}"
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

# Scrape intervals the rules must work at: the prometheus-community chart's 60 s (its kubernetes-pods job
# honours the prometheus.io/* annotations), kube-prometheus-stack's 30 s, and the local fleet's short one.
INTERVALS = [15, 30, 60]
NAMESPACE = "ml"

# Four replicas of one namespace; counters grow by these amounts per second (per scrape: times the interval).
# a runs batches of 4 with little queueing; b runs batches of one while its requests wait 12 ms (batching
# misconfigured) and take 1490 ms end to end; c waits 619 ms in the queue; d is idle. The fleet's mean batch
# size is 6 items / 3 batches = 2, not the mean of the ratios: ratios divide sums of rates.
PER_SECOND = {
    "a": {
        "bert_items_total": 4,
        "bert_batches_total": 1,
        "ts_inference_requests_total": 3,
        "ts_queue_latency_microseconds": 9_000,  # 3 ms per request
        "ts_inference_latency_microseconds": 60_000,  # 20 ms per request
        'bert_stage_milliseconds_total{Stage="forward"}': 3,
        'bert_stage_milliseconds_total{Stage="tokenization"}': 1,
        "bert_padded_tokens_total": 15,
        "bert_real_tokens_total": 10,
        'bert_rejected_items_total{Reason="EmptyText"}': 1,
        'bert_rejected_items_total{Reason="InferenceFailed"}': 1,
        'bert_rejected_items_total{Reason="DeadlineExceeded"}': 1,
        'Requests5XX{Level="Host"}': 3,
    },
    "b": {
        "bert_items_total": 2,
        "bert_batches_total": 2,
        "ts_inference_requests_total": 6,
        "ts_queue_latency_microseconds": 72_000,  # 12 ms per request
        "ts_inference_latency_microseconds": 8_940_000,  # 1490 ms per request
        'bert_stage_milliseconds_total{Stage="forward"}': 2,
    },
    "c": {
        "ts_inference_requests_total": 1,
        "ts_queue_latency_microseconds": 619_000,
        "ts_inference_latency_microseconds": 700_000,
    },
    "d": {"ts_inference_requests_total": 0},  # idle
}


def replica_labels(replica: str, **extra: str) -> str:
    labels = {"namespace": NAMESPACE, "pod": replica, "instance": f"{replica}:8082", **extra}
    return ",".join(f'{key}="{value}"' for key, value in labels.items())


def series(replica: str, metric: str) -> str:
    name, _, labels = metric.partition("{")
    own = labels.rstrip("}")
    return f'{name}{{job="torchserve",{replica_labels(replica)}{"," + own if own else ""}}}'


def per_replica(rule: str, values: dict[str, float], **extra: str) -> dict[str, float]:
    return {f"instance:{rule}:rate3m{{{replica_labels(r, **extra)}}}": v for r, v in values.items()}


def fleet(rule: str, value: float, **extra: str) -> dict[str, float]:
    labels = ",".join(f'{k}="{v}"' for k, v in {"namespace": NAMESPACE, **extra}.items())
    return {f"fleet:{rule}:rate3m{{{labels}}}": value}


EXPECTED = {  # at 5m
    **per_replica("bert_requests_per_second", {"a": 3, "b": 6, "c": 1, "d": 0}),
    **fleet("bert_requests_per_second", 10),
    **per_replica("bert_latency_ms_per_request", {"a": 20, "b": 1490, "c": 700}),  # none for idle d
    **fleet("bert_latency_ms_per_request", 970),  # 9700 ms / 10 requests
    **per_replica("bert_mean_batch_size", {"a": 4, "b": 1}),
    **fleet("bert_mean_batch_size", 2),
    **per_replica("bert_queue_ms_per_request", {"a": 3, "b": 12, "c": 619}),
    **fleet("bert_queue_ms_per_request", 70),  # (9 + 72 + 619) ms / 10 requests
    **per_replica("bert_handler_ms_per_batch", {"a": 4, "b": 1}),
    **fleet("bert_handler_ms_per_batch", 2),
    **per_replica("bert_padding_waste", {"a": 1.5}),
    **fleet("bert_padding_waste", 1.5),
    **per_replica("bert_rejected_items_per_second", {"a": 1}, Reason="EmptyText"),
    **fleet("bert_rejected_items_per_second", 1, Reason="InferenceFailed"),
    # a: 3 5xx/s, of which 1/s the handler's own InferenceFailed: 2/s from the frontend (queue full);
    # the others export no Requests5XX yet and read 0.
    **per_replica("bert_unavailable_per_second", {"a": 2, "b": 0, "c": 0, "d": 0}),
    **fleet("bert_unavailable_per_second", 2),
    # a is handed 4 items/s and refuses 3 (EmptyText, InferenceFailed, DeadlineExceeded): 1 answered; b 2, all.
    **per_replica("bert_goodput_per_second", {"a": 1, "b": 2}),
    **fleet("bert_goodput_per_second", 3),
    **per_replica("bert_deadline_exceeded_per_second", {"a": 1, "b": 0}),
    **fleet("bert_deadline_exceeded_per_second", 1),
    # shed: a's 2/s of its 3 requests/s (its DeadlineExceeded 503s are among the 5xx); the fleet's 2 of 10.
    **per_replica("bert_shed_ratio", {"a": 0.667, "b": 0, "c": 0}),
    **fleet("bert_shed_ratio", 0.2),
}


def adapter_queries() -> dict[str, str]:
    """prometheus-adapter's metricsQuery per metric name, rendered as the adapter does for pods of NAMESPACE."""
    values = yaml.safe_load((REPO / "deploy" / "kubernetes" / "prometheus-adapter" / "values.yaml").read_text())
    queries = {}
    for rule in values["rules"]["custom"]:
        series_name = rule["seriesQuery"].split("{", 1)[0].strip("'")
        queries[rule["name"]["as"]] = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series_name)
            .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"a|b|c|d"')
            .replace("<<.GroupBy>>", "namespace, pod")
        )
    return queries


def rendered_annotations(name: str, labels: dict[str, str], value: str = "") -> dict[str, str]:
    rule = next(
        r for g in yaml.safe_load(ALERTING_RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == name
    )
    rendered = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        rendered[key] = text.replace("{{ $value | humanize }}", value).replace(
            "{{ $value | humanizePercentage }}", value
        )
    return rendered


def expected_alert(name: str, labels: dict[str, str], value: str = "") -> dict:
    """The alert as promtool reports it: its labels, and its annotations rendered."""
    rule = next(
        r for g in yaml.safe_load(ALERTING_RULES.read_text())["groups"] for r in g["rules"] if r["alert"] == name
    )
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": rendered_annotations(name, labels, value)}


def replica(name: str) -> dict[str, str]:
    return {"namespace": NAMESPACE, "pod": name, "instance": f"{name}:8082"}


def counter(per_second: float, interval: int, minutes: int, missed: int | None = None) -> str:
    """A counter's samples every `interval` s; `missed`: the second of one failed scrape (no sample)."""
    samples = [per_second * interval * step for step in range(minutes * 60 // interval + 1)]
    return " ".join("_" if missed == step * interval else f"{value:g}" for step, value in enumerate(samples))


def counters(interval: int, minutes: int, missed: int | None = None) -> list[dict]:
    """Every replica's counters of PER_SECOND as promtool input series."""
    return [
        {"series": series(r, metric), "values": counter(rate, interval, minutes, missed=missed)}
        for r, metrics in PER_SECOND.items()
        for metric, rate in metrics.items()
    ]


# Rules are evaluated between two scrapes, as on a real server (scrapes and evaluations are not in phase):
# a 1 m window then holds a single sample at 60 s and rate() gives nothing.
EVALUATION_INTERVAL = "5s"
# Rates are floating point (2.9999999999999996 for 3): compare them rounded to this.
PRECISION = 0.001


def between_scrapes(interval: int) -> str:
    return f"{300 + interval // 2}s"


FRONT_SERIES_LABELS = ",".join(f'{key}="{value}"' for key, value in FRONT_LABELS.items())


def up_series(interval: int, minutes: int) -> list[dict]:
    """a (fleet-style job) and e (a Kubernetes pod scraped by annotations) go down at 1m; so does a pod
    of another application, which no alert may name."""
    steps = minutes * 60 // interval
    ones = 60 // interval
    down = " ".join(["1"] * ones + ["0"] * (steps + 1 - ones))
    kubernetes = 'job="kubernetes-pods",app_kubernetes_io_name'
    return [
        {"series": f'up{{job="torchserve",{replica_labels("a")}}}', "values": down},
        {"series": f'up{{job="torchserve",{replica_labels("b")}}}', "values": f"1x{steps}"},
        {"series": f'up{{{kubernetes}="bert-torchserve",{replica_labels("e")}}}', "values": down},
        {"series": f'up{{{kubernetes}="other-app",{replica_labels("f")}}}', "values": down},
        # The fleet's HAProxy (its label from tooling/fleet_config.FRONT_LABELS) goes down at 1m; so does another
        # HAProxy scraped as `haproxy` (an ingress controller's), which no alert may name.
        {"series": f'up{{job="haproxy",{FRONT_SERIES_LABELS},instance="127.0.0.1:18001"}}', "values": down},
        {"series": 'up{job="haproxy",instance="ingress:8404"}', "values": down},
    ]


def hpa_series(interval: int, minutes: int) -> list[dict]:
    steps = minutes * 60 // interval
    hpa = 'job="kube-state-metrics",namespace="ml",horizontalpodautoscaler'
    current, maximum = (
        "kube_horizontalpodautoscaler_status_current_replicas",
        "kube_horizontalpodautoscaler_spec_max_replicas",
    )
    return [
        {"series": f'{current}{{{hpa}="bert-torchserve"}}', "values": f"10x{steps}"},  # at its maximum
        {"series": f'{maximum}{{{hpa}="bert-torchserve"}}', "values": f"10x{steps}"},
        # KServe's own HPA name in RawDeployment, never the project's (deploy/kserve/raw-deployment): at its
        # maximum, and no alert for it.
        {"series": f'{current}{{{hpa}="bert-predictor"}}', "values": f"4x{steps}"},
        {"series": f'{maximum}{{{hpa}="bert-predictor"}}', "values": f"4x{steps}"},
        {"series": f'{current}{{{hpa}="someone-else"}}', "values": f"5x{steps}"},  # not ours
        {"series": f'{maximum}{{{hpa}="someone-else"}}', "values": f"5x{steps}"},
    ]


def alerts_at(name: str, quiet: str, firing: str, alerts: list[dict]) -> list[dict]:
    return [
        {"eval_time": quiet, "alertname": name, "exp_alerts": []},
        {"eval_time": firing, "alertname": name, "exp_alerts": alerts},
    ]


@pytest.mark.parametrize("interval", INTERVALS, ids=[f"scrape-{i}s" for i in INTERVALS])
def test_every_rule_has_values_and_every_alert_fires_at_common_scrape_intervals(tmp_path, interval):
    """Series sampled every `interval` seconds, rules evaluated as often: every recording rule and the
    autoscaler's two metrics have the values their formulas give, and each alert fires (and only for its cause).
    Firing times leave room for the first 3 minutes, when a rate's window is not yet full."""
    minutes = 18
    input_series = counters(interval, minutes)
    at = between_scrapes(interval)
    input_series += up_series(interval, minutes) + hpa_series(interval, minutes)
    samples = [
        {
            "expr": f"round({key}, {PRECISION})",
            "eval_time": at,
            "exp_samples": [{"labels": "{" + key.split("{", 1)[1], "value": value}],
        }
        for key, value in EXPECTED.items()
    ]
    # Everything recorded has a value (nothing recorded is left out of EXPECTED).
    recorded = {key.split("{", 1)[0] for key in EXPECTED}
    assert recorded == set(recording_rules())
    adapter = adapter_queries()
    assert set(adapter) == {"bert_requests_per_second", "bert_queue_ms_per_request"}
    per_pod = {
        "bert_requests_per_second": {"a": 3, "b": 6, "c": 1, "d": 0},
        "bert_queue_ms_per_request": {"a": 3, "b": 12, "c": 619, "d": 0},  # an idle pod reads 0, not nothing
    }
    for metric, query in adapter.items():
        samples.append(
            {
                "expr": f"round({query}, {PRECISION})",
                "eval_time": at,
                "exp_samples": [
                    {"labels": f'{{namespace="{NAMESPACE}",pod="{pod}"}}', "value": value}
                    for pod, value in per_pod[metric].items()
                ],
            }
        )
    kubernetes_pod = {"job": "kubernetes-pods", "app_kubernetes_io_name": "bert-torchserve", **replica("e")}
    front = {"job": "haproxy", **FRONT_LABELS, "instance": "127.0.0.1:18001"}
    hpa = {"job": "kube-state-metrics", "namespace": NAMESPACE, "horizontalpodautoscaler": "bert-torchserve"}
    alerts = [
        # Down at 1m: pending for its `for:` (1m), then firing, in either kind of setup.
        *alerts_at("BertReplicaDown", "1m30s", "2m30s",
                   [expected_alert("BertReplicaDown", {"job": "torchserve", **replica("a")}),
                    expected_alert("BertReplicaDown", kubernetes_pod)]),
        *alerts_at("BertFrontDown", "1m30s", "2m30s",
                   [expected_alert("BertFrontDown", front)]),
        *alerts_at("BertQueueFull", "30s", "5m30s", [expected_alert("BertQueueFull", replica("a"), "2")]),
        *alerts_at("BertLatencyHigh", "4m", "8m30s", [expected_alert("BertLatencyHigh", replica("b"), "1.49k")]),
        *alerts_at("BertQueueTimeHigh", "4m", "8m30s", [expected_alert("BertQueueTimeHigh", replica("c"), "619")]),
        *alerts_at("BertBatchesStuckAtSizeOne", "9m", "14m",
                   [expected_alert("BertBatchesStuckAtSizeOne", replica("b"))]),
        *alerts_at("BertAutoscalerAtMax", "14m", "16m30s", [expected_alert("BertAutoscalerAtMax", hpa)]),
        # a sheds two thirds of its requests from the start: pending for its 15 minutes, then firing.
        *alerts_at("BertSheddingSustained", "14m", "17m30s",
                   [expected_alert("BertSheddingSustained", replica("a"), "66.67%")]),
    ]  # fmt: skip
    rising = rising_rejections(interval)
    tests = [
        missed_scrape(interval, minutes, adapter),
        {
            "interval": f"{interval}s",
            "input_series": input_series,
            "promql_expr_test": samples,
            "alert_rule_test": alerts,
        },
        rising,
    ]
    fired = {test["alertname"] for group in tests for test in group.get("alert_rule_test", []) if test["exp_alerts"]}
    assert fired == set(ALERTS)
    spec = {
        "rule_files": [str(RECORDING_RULES), str(ALERTING_RULES)],
        "evaluation_interval": EVALUATION_INTERVAL,
        "tests": tests,
    }
    path = tmp_path / "rules-test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def missed_scrape(interval: int, minutes: int, adapter: dict[str, str]) -> dict:
    """The scrape just before the evaluation failed: every rule and the autoscaler's metrics still have a
    value for every series they had (the values themselves then depend on rate()'s extrapolation)."""
    missed = 300
    input_series = counters(interval, minutes, missed=missed)
    counts: dict[str, int] = {}
    for key in EXPECTED:
        counts[key.split("{", 1)[0]] = counts.get(key.split("{", 1)[0], 0) + 1
    counts.pop("instance:bert_rejected_items_per_second:rate3m")  # EXPECTED names one of its Reasons
    counts.pop("fleet:bert_rejected_items_per_second:rate3m")
    exprs = {f"count({name})": count for name, count in counts.items()}
    exprs.update({f"count({query})": 4 for query in adapter.values()})
    return {
        "interval": f"{interval}s",
        "input_series": input_series,
        "promql_expr_test": [
            {"expr": expr, "eval_time": between_scrapes(interval), "exp_samples": [{"labels": "{}", "value": count}]}
            for expr, count in exprs.items()
        ],
    }


def rising_rejections(interval: int) -> dict:
    """No rejections for 20 minutes, then 2 items/s: BertRejectedItemsRising fires once the rise has lasted
    its `for:` (10m) and keeps firing while the last hour's rate is under half the current one."""
    flat = 20 * 60 // interval
    rising = 25 * 60 // interval
    values = f"0x{flat} {2 * interval}+{2 * interval}x{rising}"
    labels = replica_labels("a", Reason="MalformedJSON")
    return {
        "interval": f"{interval}s",
        "input_series": [{"series": f'bert_rejected_items_total{{job="torchserve",{labels}}}', "values": values}],
        "alert_rule_test": alerts_at(
            "BertRejectedItemsRising",
            "22m",
            "40m",
            [expected_alert("BertRejectedItemsRising", {"namespace": NAMESPACE}, "2")],
        ),
    }
