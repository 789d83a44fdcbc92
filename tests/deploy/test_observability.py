"""Metrics reach Prometheus in every setup, the autoscaling figures come from measurements, and the containers
committed here meet Pod Security "restricted": annotation-based scraping, the Prometheus Operator component,
KServe Serverless and RawDeployment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    KSERVE,
    KSERVE_MODES,
    KUBERNETES,
    OVERLAYS,
    by_kind,
    kubectl,
    one,
    queue_proxy,
    render,
    render_kserve,
    validate,
)
from tooling import cluster_config

GENERATED = cluster_config.cluster_properties()
METRICS_PORT = urlsplit(GENERATED["metrics_address"]).port
OPERATOR_COMPONENT = KUBERNETES / "components" / "prometheus-operator"
ALERTS = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())

# ---- KServe's pod webhook (kserve v0.15.2 pkg/webhook/admission/pod/metrics_aggregate_injector.go) ------

ENABLE_AGGREGATION = "serving.kserve.io/enable-metric-aggregation"
ENABLE_SCRAPING = "serving.kserve.io/enable-prometheus-scraping"
QUEUE_PROXY_AGGREGATE_PORT = "9088"  # constants.QueueProxyAggregatePrometheusMetricsPort
QUEUE_PROXY_METRICS_PORT = "9091"  # constants.DefaultPodPrometheusPort
WEBHOOK_DEFAULTS = {"enableMetricAggregation": "false", "enablePrometheusScraping": "false"}  # the ConfigMap's
# Only KServe's qpext image of queue-proxy listens on 9088 (kserve v0.14.0 qpext/README.md, "How to use"); Knative's
# stock queue-proxy does not, so aggregation needs it as Knative's queue-proxy image, set once per cluster.
KSERVE_RELEASE = "v0.15.2"  # the release whose webhook kserve_webhook() replays
QPEXT_PATCH = (
    "kubectl patch configmap config-deployment -n knative-serving --type merge"
    f""" -p '{{"data":{{"queue-sidecar-image":"kserve/qpext:{KSERVE_RELEASE}"}}}}'"""
)


def kserve_webhook(annotations: dict[str, str], queue_proxy: bool) -> tuple[dict[str, str], str | None]:
    """The pod annotations after KServe's metrics injector, and the port queue-proxy aggregates from (if any)."""
    pod = dict(annotations)
    aggregation = pod.setdefault(ENABLE_AGGREGATION, WEBHOOK_DEFAULTS["enableMetricAggregation"])
    aggregated_from = None
    if aggregation == "true" and queue_proxy:  # the env vars go into the queue-proxy container, if there is one
        aggregated_from = pod.get("prometheus.kserve.io/port", "8080")
    if pod.setdefault(ENABLE_SCRAPING, WEBHOOK_DEFAULTS["enablePrometheusScraping"]) == "true":
        pod["prometheus.io/port"] = QUEUE_PROXY_AGGREGATE_PORT if aggregation == "true" else QUEUE_PROXY_METRICS_PORT
        pod["prometheus.io/path"] = "/metrics"
    return pod, aggregated_from


def pod_annotations(mode: str) -> dict[str, str]:
    """What KServe's controller puts on the predictor pod: the ServingRuntime's, InferenceService's and predictor's."""
    docs = render_kserve(mode)
    isvc = one(docs, "InferenceService")
    runtime = one(docs, "ServingRuntime")
    return {
        **runtime["spec"].get("annotations", {}),
        **isvc["metadata"].get("annotations", {}),
        **isvc["spec"]["predictor"].get("annotations", {}),
    }


def torchserve_metrics_reached(annotations: dict[str, str], queue_proxy: bool) -> bool:
    """Does an annotation-based scrape of this pod get TorchServe's metrics?"""
    pod, aggregated_from = kserve_webhook(annotations, queue_proxy)
    if pod.get("prometheus.io/scrape") != "true" or pod.get("prometheus.io/path", "/metrics") != "/metrics":
        return False
    port = pod.get("prometheus.io/port")
    if queue_proxy and port == QUEUE_PROXY_AGGREGATE_PORT:
        return aggregated_from == str(METRICS_PORT)
    return port == str(METRICS_PORT)


@pytest.mark.parametrize("mode", KSERVE_MODES)
def test_kserve_pods_expose_torchserves_metrics_to_prometheus(mode):
    annotations = pod_annotations(mode)
    assert torchserve_metrics_reached(annotations, queue_proxy(mode)), annotations
    # What the issue found: scraping on, aggregation off -> queue-proxy's own port, no TorchServe metric.
    broken = {**annotations, ENABLE_SCRAPING: "true", ENABLE_AGGREGATION: "false"}
    assert not torchserve_metrics_reached(broken, queue_proxy(mode))


def test_the_serverless_metrics_prerequisite_is_stated_where_it_is_applied():
    """Every mode whose pods Prometheus scrapes on queue-proxy's 9088 states the qpext prerequisite with the
    command that meets it; the docs give the same command."""
    aggregated = [
        mode
        for mode in KSERVE_MODES
        if kserve_webhook(pod_annotations(mode), queue_proxy(mode))[0].get("prometheus.io/port")
        == QUEUE_PROXY_AGGREGATE_PORT
    ]
    assert aggregated == [mode for mode in KSERVE_MODES if queue_proxy(mode)]  # Serverless, CPU and GPU
    isvc_comments = _comments(KSERVE / "serverless" / "inferenceservice.yaml")
    assert QPEXT_PATCH in isvc_comments
    for mode in aggregated:
        # The GPU variant reuses ../serverless's InferenceService and points at its comment.
        own = "\n".join(_comments(path) for path in sorted((KSERVE / mode).glob("*.yaml")))
        assert "queue-sidecar-image" in own, f"deploy/kserve/{mode} does not state the qpext prerequisite"
    for doc in ("autoscaling.md", "kubernetes.md"):
        assert QPEXT_PATCH in (DEPLOY.parent / "docs" / doc).read_text(), doc


def test_the_serverless_knative_version_prerequisite_is_stated():
    """Knative Serving 1.12 and earlier refuse a volume mounted at /tmp or /var/log among others (reserved paths;
    knative/serving#14719, commit 1e2faa3b37, freed those two, first in v1.13.0; /var stays reserved). The
    ServingRuntime mounts its emptyDir at /tmp, so Serverless needs Knative 1.13: the runtime and
    docs/kubernetes.md say so."""
    reserved_before_1_13 = {"/tmp", "/var/log"}  # the two 1.13 freed
    prerequisite = "Knative Serving 1.13 or later"
    for mode in KSERVE_MODES:
        if not queue_proxy(mode):
            continue
        containers = one(render_kserve(mode), "ServingRuntime")["spec"]["containers"]
        mounts = {mount["mountPath"] for c in containers for mount in c.get("volumeMounts", [])}
        assert mounts & reserved_before_1_13, mounts  # else the prerequisite is gone: drop it and this test
    runtime_comments = " ".join(_comments(KSERVE / "serverless" / "servingruntime.yaml").split())
    assert prerequisite in runtime_comments
    assert prerequisite in " ".join((DEPLOY.parent / "docs" / "kubernetes.md").read_text().split())


def _comments(path: Path) -> str:
    """The text of a YAML file's comments, one line each, without their `#`."""
    return "\n".join(line.strip()[1:].strip() for line in path.read_text().splitlines() if line.strip().startswith("#"))


@pytest.mark.parametrize(("mode", "overlay"), [("raw-deployment", "cpu"), ("raw-deployment-gpu", "gpu")])
def test_kserve_raw_deployment_scales_with_the_projects_autoscaler(mode, overlay):
    docs = render_kserve(mode)
    isvc = one(docs, "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    hpa = one(docs, "HorizontalPodAutoscaler")
    # KServe names the predictor Deployment <isvc>-predictor.
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": f"{isvc['metadata']['name']}-predictor",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        isvc["spec"]["predictor"]["minReplicas"],
        isvc["spec"]["predictor"]["maxReplicas"],
    )
    # The targets of the plain Kubernetes overlay for the same hardware (CPU or GPU pods).
    assert hpa["spec"]["metrics"] == one(render(overlay), "HorizontalPodAutoscaler")["spec"]["metrics"]
    # The HPA alert knows this autoscaler's name.
    [at_max] = [r for g in ALERTS["groups"] for r in g["rules"] if r.get("alert") == "BertAutoscalerAtMax"]
    assert hpa["metadata"]["name"] in at_max["expr"]
    assert one(render(overlay), "HorizontalPodAutoscaler")["metadata"]["name"] in at_max["expr"]


@pytest.mark.parametrize("mode", KSERVE_MODES)
def test_no_kserve_hpa_takes_the_name_kserves_reconciler_manages(mode):
    """In RawDeployment KServe runs its HPA reconciler even with autoscalerClass external (kserve v0.14.0
    reconcilers/autoscaler/autoscaler_reconciler.go: AutoscalerClassExternal -> hpa.NewHPAReconciler), and
    it manages the HPA named <isvc>-predictor (reconcilers/hpa/hpa_reconciler.go: v0.14.0 deletes it,
    later releases overwrite one it does not own with KServe's CPU HPA). Ours must have another name."""
    docs = render_kserve(mode)
    reserved = f"{one(docs, 'InferenceService')['metadata']['name']}-predictor"
    names = [hpa["metadata"]["name"] for hpa in by_kind(docs, "HorizontalPodAutoscaler")]
    assert reserved not in names, f"{mode}: an HPA named {reserved} would be deleted or overwritten by KServe"


# ---- the CPU autoscaling targets, from the committed measurement of what a CPU pod runs ----------------

# The committed run of the backends (docs/benchmarks.md, "Backends"): its ONNX fp32 cells with one one-thread worker
# per CPU are the layout a CPU pod runs (model_store/bert.mar, cpu_threads 1; scripts/kserve_layout.py's default).
BACKENDS_BENCHMARK = DEPLOY.parent / "docs" / "bench-backends" / "benchmark.json"
CPU_POD_BACKEND = "onnx-fp32"
HPA_TARGET_SHARE = 0.7  # of one pod's saturation throughput, as for GPU pods (tests/deploy/test_gpu.py)
KNEE_SHARE = 0.9  # more clients than where a pod first serves this share of its most only queue


def _cpu_pod_cells() -> list[dict]:
    """The measured cells of a CPU pod's layout: ONNX fp32, as many one-thread workers as the pod's CPUs, the
    layout's batch size and delay, on a machine with the pod's CPUs."""
    from scripts.kserve_layout import POD_CPUS

    measured = json.loads(BACKENDS_BENCHMARK.read_text())
    assert measured["machine"].startswith(f"{POD_CPUS} cores"), measured["machine"]
    cells = [
        cell
        for cell in measured["served"]
        if cell["backend"] == CPU_POD_BACKEND
        and (cell["workers"], cell["cpu_threads"]) == (POD_CPUS, 1)
        and cell["batch_size"] == cluster_config.DEFAULT_BATCH_SIZE
        and cell["max_batch_delay_ms"] == cluster_config.DEFAULT_MAX_BATCH_DELAY_MS
    ]
    assert len(cells) >= 3 and all(cell["errors"] == 0 for cell in cells), cells
    return sorted(cells, key=lambda cell: cell["concurrency"])


def _benchmark_peak_clients() -> int:
    """The fewest clients at which a CPU pod's layout served within 10 % of its most (docs/bench-backends)."""
    cells = _cpu_pod_cells()
    most = max(cell["rps"] for cell in cells)
    return min(cell["concurrency"] for cell in cells if cell["rps"] >= KNEE_SHARE * most)


def _autoscaling_doc() -> str:
    return " ".join((DEPLOY.parent / "docs" / "autoscaling.md").read_text().split())


def test_the_cpu_autoscaler_targets_70_percent_of_what_a_cpu_pod_served():
    most = max(cell["rps"] for cell in _cpu_pod_cells())
    expected = round(HPA_TARGET_SHARE * most)
    for docs in (render("cpu"), render_kserve("raw-deployment")):
        hpa = one(docs, "HorizontalPodAutoscaler")
        [target] = [
            m["pods"]["target"]["averageValue"]
            for m in hpa["spec"]["metrics"]
            if m["pods"]["metric"]["name"] == "bert_requests_per_second"
        ]
        assert int(target) == expected
    component = KUBERNETES / "components" / "autoscaling" / "horizontalpodautoscaler.yaml"
    comments = " ".join(_comments(component).split())
    assert f"served {most:.1f} requests/s" in comments and f"so {expected}." in comments, comments
    assert f"| {expected} | 70 % of the {most:.1f} req/s one 2-CPU pod" in _autoscaling_doc()


def test_kserve_concurrency_target_is_the_measured_saturation_point():
    predictor = one(render_kserve("serverless"), "InferenceService")["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"
    assert predictor["scaleTarget"] == _benchmark_peak_clients()
    raw = one(render_kserve("raw-deployment"), "InferenceService")["spec"]["predictor"]
    assert "scaleMetric" not in raw and "scaleTarget" not in raw
    # docs/autoscaling.md cites every measured cell of the layout the target is read from.
    cited = ", ".join(f"{cell['rps']:.1f} req/s at {cell['concurrency']}" for cell in _cpu_pod_cells())
    assert cited in _autoscaling_doc()


# ---- the Prometheus Operator -------------------------------------------------------------------------


def render_with_operator(overlay: str, tmp_path: Path) -> tuple[dict, ...]:
    """An overlay with the Operator component added, as a user's kustomization would."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes relative paths only
                "resources": [os.path.relpath(KUBERNETES / "overlays" / overlay, tmp_path)],
                "components": [os.path.relpath(OPERATOR_COMPONENT, tmp_path)],
            }
        )
    )
    result = subprocess.run([kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def test_the_prometheus_rule_is_generated_from_the_one_rules_file():
    assert cluster_config.OPERATOR_RULE.read_text() == cluster_config.render_prometheus_rule(), (
        "regenerate: python -m tooling.cluster_config prometheus-rule"
    )
    rule = yaml.safe_load(cluster_config.OPERATOR_RULE.read_text())
    sources = [g for path in cluster_config.RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == sources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_operator_component_scrapes_the_metrics_port_with_the_labels_rules_and_alerts_use(overlay, tmp_path):
    docs = render_with_operator(overlay, tmp_path)
    for doc in docs:
        validate(doc)  # the PodMonitor and PrometheusRule against the Operator's own CRDs
    monitor = one(docs, "PodMonitor")
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [port] = [p for p in container["ports"] if p["name"] == endpoint["port"]]
    assert port["containerPort"] == METRICS_PORT and endpoint["path"] == cluster_config.METRICS_PATH
    # The NetworkPolicy lets Prometheus reach that port.
    policy = one(docs, "NetworkPolicy")
    assert any(p["port"] == METRICS_PORT for rule in policy["spec"]["ingress"] for p in rule["ports"])
    # The labels the alerts select replicas by: job="torchserve" and app_kubernetes_io_name.
    [job] = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert job["replacement"] == "torchserve" and job.get("action", "replace") == "replace"
    assert "app.kubernetes.io/name" in monitor["spec"]["podTargetLabels"]
    [down] = [r for g in ALERTS["groups"] for r in g["rules"] if r.get("alert") == "BertReplicaDown"]
    assert 'up{job="torchserve"}' in down["expr"]
    assert f'up{{app_kubernetes_io_name="{pod_labels["app.kubernetes.io/name"]}"}}' in down["expr"]
    assert one(docs, "PrometheusRule")["spec"] == yaml.safe_load(cluster_config.OPERATOR_RULE.read_text())["spec"]


def test_the_operator_check_is_strict():
    monitor = yaml.safe_load((OPERATOR_COMPONENT / "podmonitor.yaml").read_text())
    monitor["spec"]["podMetricsEndpoints"][0]["portt"] = "metrics"
    with pytest.raises(Exception, match="portt"):
        validate(monitor)


def test_prometheus_adapter_values_add_rules_and_replace_nothing():
    values = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    assert set(values) == {"rules"} and set(values["rules"]) == {"custom"}  # chart defaults and URL left alone


# ---- Pod Security "restricted" and spreading ---------------------------------------------------------


def _restricted(pod_security: dict, container_security: dict) -> None:
    merged = {**pod_security, **container_security}
    assert merged["runAsNonRoot"] is True
    assert merged["seccompProfile"]["type"] in {"RuntimeDefault", "Localhost"}
    assert container_security["allowPrivilegeEscalation"] is False
    assert container_security["capabilities"]["drop"] == ["ALL"]
    assert not container_security["capabilities"].get("add")


def test_every_pod_meets_pod_security_restricted():
    for overlay in OVERLAYS:
        spec = one(render(overlay), "Deployment")["spec"]["template"]["spec"]
        for container in spec["containers"]:
            _restricted(spec.get("securityContext", {}), container["securityContext"])
    for mode in KSERVE_MODES:
        docs = render_kserve(mode)
        pod = one(docs, "InferenceService")["spec"]["predictor"].get("securityContext", {})
        for container in one(docs, "ServingRuntime")["spec"]["containers"]:
            _restricted(pod, container["securityContext"])


@pytest.mark.parametrize("mode", KSERVE_MODES)
def test_no_kserve_kustomization_enforces_restricted_on_its_namespace(mode):
    """KServe's webhook adds a storage-initializer init container without a securityContext (kserve v0.14.0
    pkg/webhook/admission/pod/storage_initializer_injector.go): a namespace enforcing "restricted" would
    reject every predictor pod, however compliant the containers committed here are."""
    for namespace in by_kind(render_kserve(mode), "Namespace"):
        labels = namespace["metadata"].get("labels", {})
        assert labels.get("pod-security.kubernetes.io/enforce") != "restricted", namespace["metadata"]["name"]


def test_replicas_spread_over_nodes():
    for overlay in OVERLAYS:
        template = one(render(overlay), "Deployment")["spec"]["template"]
        constraints = template["spec"]["topologySpreadConstraints"]
        assert "kubernetes.io/hostname" in {c["topologyKey"] for c in constraints}
        for constraint in constraints:
            assert constraint["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    for mode in KSERVE_MODES:
        if queue_proxy(mode):
            assert not by_kind(render_kserve(mode), "HorizontalPodAutoscaler")  # Knative scales Serverless
            continue
        isvc = one(render_kserve(mode), "InferenceService")
        constraints = isvc["spec"]["predictor"]["topologySpreadConstraints"]
        assert "kubernetes.io/hostname" in {c["topologyKey"] for c in constraints}
        for constraint in constraints:
            # KServe labels predictor pods with their InferenceService's name.
            assert constraint["labelSelector"]["matchLabels"] == {
                "serving.kserve.io/inferenceservice": isvc["metadata"]["name"]
            }


# ---- the alerts and the dashboard say what their series hold ------------------------------------------

RULES = DEPLOY / "prometheus" / "rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
DOCS = DEPLOY.parent / "docs"
# Per replica and fleet-wide, the selector every panel of a recording rule applies (docs/fleet.md).
SELECTORS = {
    "instance": '{namespace=~"$namespace", pod=~"$pod"}',
    "fleet": '{namespace=~"$namespace"}',
}


def _promtool() -> str:
    import shutil

    path = shutil.which("promtool")
    if path is None:
        message = "promtool is missing: install the Debian package prometheus (scripts/install_system_packages.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _promtool_test(tmp_path: Path, tests: list[dict]) -> None:
    """Run `promtool test rules` on the shipped rule files with these tests."""
    spec = {"rule_files": [str(RULES), str(DEPLOY / "prometheus" / "alerts.yaml")], "evaluation_interval": "15s"}
    path = tmp_path / "rules-test.yaml"
    path.write_text(yaml.safe_dump({**spec, "tests": tests}, sort_keys=False))
    result = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _counter(per_second: float, minutes: int = 10, interval: int = 15) -> str:
    """promtool's expanding notation: a counter growing `per_second`, sampled every `interval` s."""
    return f"0+{per_second * interval:g}x{minutes * 60 // interval}"


def _panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def test_the_queue_full_alert_says_what_its_series_counts(tmp_path):
    """BertQueueFull fires on instance:bert_unavailable_per_second, which counts the handler's 503 DeadlineExceeded
    as well as the frontend's queue-full 503 (rules.yaml keeps it there on purpose): a replica refusing only late
    requests fires it. Its texts, its runbook, the fleet's alert table and the dashboard's panels of that series
    name both causes, and the alert and the runbook point at the deadline's own series."""
    labels = 'job="torchserve",namespace="ml",pod="a",instance="a:8082"'
    late_only = {  # 3 requests/s, all handed to the handler, 2 of them refused DeadlineExceeded: no queue full
        f"ts_inference_requests_total{{{labels}}}": 3,
        f"bert_items_total{{{labels}}}": 3,
        f"bert_batches_total{{{labels}}}": 1,
        f'Requests5XX{{{labels},Level="Host"}}': 2,
        f'bert_rejected_items_total{{{labels},Reason="DeadlineExceeded"}}': 2,
    }
    firing = '{__name__="ALERTS",alertname="BertQueueFull",alertstate="firing",instance="a:8082",namespace="ml",'
    firing += 'pod="a",severity="warning"}'
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": _counter(v)} for s, v in late_only.items()],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="BertQueueFull",alertstate="firing"}',
                        "eval_time": "8m",
                        "exp_samples": [{"labels": firing, "value": 1}],
                    }
                ],
            }
        ],
    )
    [rule] = [r for g in ALERTS["groups"] for r in g["rules"] if r.get("alert") == "BertQueueFull"]
    assert "instance:bert_unavailable_per_second:rate3m" in rule["expr"]
    summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
    assert "queue full or deadline passed" in summary, summary
    assert "DeadlineExceeded" in description and "job_queue_size" in description, description
    assert "instance:bert_deadline_exceeded_per_second:rate3m" in description
    runbook = (DOCS / "runbooks.md").read_text().split("## BertQueueFull\n", 1)[1].split("\n## ", 1)[0]
    assert "DeadlineExceeded" in runbook and "instance:bert_deadline_exceeded_per_second:rate3m" in runbook, runbook
    [row] = [line for line in (DOCS / "fleet.md").read_text().splitlines() if line.startswith("| `BertQueueFull` |")]
    assert "queue full or deadline passed" in row, row
    titles = [p["title"] for p in _panels() if "bert_unavailable_per_second" in p["targets"][0]["expr"]]
    assert len(titles) == 2 and all("queue full or deadline passed" in title for title in titles), titles


def _kept_labels(expr: str) -> set[str]:
    """The labels every `by (...)` of a rule's expression keeps (those a selector on its result can use)."""
    clauses = re.findall(r"\bby \(([^)]*)\)", expr)
    assert clauses, expr
    return set.intersection(*({label.strip() for label in clause.split(",")} for clause in clauses))


def test_every_dashboard_panel_selects_the_namespace_and_pods_its_series_keep():
    """Every query of a recording rule carries the selector of its level (per replica: namespace and pod; fleet:
    namespace), made of labels that rule keeps; raw series select both. Only HAProxy's panel, the local fleet's
    own, has none. Panel ids are unique and no two panels overlap."""
    kept = {
        rule["record"]: _kept_labels(rule["expr"])
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    panels = _panels()
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            if expr.startswith("haproxy_"):
                continue
            names = re.findall(r"\b((instance|fleet):\w+:rate3m)(\{[^}]*\})?", expr)
            for name, level, selector in names:
                assert selector == SELECTORS[level], (panel["title"], expr)
                used = set(re.findall(r"(\w+)=~", selector))
                assert used <= kept[name], (name, used - kept[name])
            if not names:  # a raw series (up): every selector of it
                selectors = re.findall(r"\{[^}]*\}", expr)
                assert selectors and all('namespace=~"$namespace"' in s and 'pod=~"$pod"' in s for s in selectors), expr
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), sorted(ids)
    cells = {}
    for panel in panels:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[x, y] = panel["title"]


def test_the_dashboard_variables_select_on_kubernetes_and_all_matches_the_local_fleet(tmp_path):
    """Every panel query (but HAProxy's), evaluated by promtool over a local-fleet replica (no namespace, no pod
    label) and a Kubernetes pod: the variables at All (Grafana's allValue .*) show both, a namespace and pod show
    that pod only, another namespace nothing."""
    fleet_replica = 'job="torchserve",instance="127.0.0.1:9082",replica="r0"'
    pod = 'job="kubernetes-pods",app_kubernetes_io_name="bert-torchserve",namespace="ml",pod="a",instance="a:8082"'
    per_second = {
        "ts_inference_requests_total": 4,
        "ts_inference_latency_microseconds": 80_000,
        "ts_queue_latency_microseconds": 8_000,
        "bert_items_total": 4,
        "bert_batches_total": 1,
        'bert_stage_milliseconds_total{Stage="forward"}': 3,
        "bert_padded_tokens_total": 12,
        "bert_real_tokens_total": 10,
        'bert_rejected_items_total{Reason="DeadlineExceeded"}': 1,
        'Requests5XX{Level="Host"}': 2,
    }
    series = []
    for labels in (fleet_replica, pod):
        for metric, rate in per_second.items():
            name, _, own = metric.partition("{")
            selector = labels + ("," + own.rstrip("}") if own else "")
            series.append({"series": f"{name}{{{selector}}}", "values": _counter(rate)})
        series.append({"series": f"up{{{labels}}}", "values": "1x40"})
    choices = {"all": (".*", ".*", 2), "one pod": ("ml", "a", 1), "another namespace": ("other", ".*", 0)}
    queries = [t["expr"] for p in _panels() for t in p["targets"] if not t["expr"].startswith("haproxy_")]
    assert len(queries) > 20
    _promtool_test(
        tmp_path,
        [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"count({query.replace('$namespace', namespace).replace('$pod', chosen)}) or vector(0)",
                        "eval_time": "8m",
                        "exp_samples": [{"labels": "{}", "value": count}],
                    }
                    for query in queries
                    for namespace, chosen, count in choices.values()
                ],
            }
        ],
    )
