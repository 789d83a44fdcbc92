"""Metrics reach Prometheus in every setup, the autoscaling figures come from measurements, and the containers
committed here meet Pod Security "restricted": annotation-based scraping, the Prometheus Operator component,
KServe Serverless and RawDeployment.
"""

from __future__ import annotations

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


def _benchmark_peak_clients() -> int:
    """Clients at which the served demo model peaked in docs/benchmarks.md (batch_size=8, delay=2ms)."""
    text = (DEPLOY.parent / "docs" / "benchmarks.md").read_text()
    rows = re.findall(r"^\| batch_size=8, delay=2ms \| (\d+) \| ([\d.]+) \|", text, re.M)
    assert len(rows) >= 3, rows
    clients, _ = max(((int(c), float(r)) for c, r in rows), key=lambda row: row[1])
    return clients


def test_kserve_concurrency_target_is_the_measured_saturation_point():
    predictor = one(render_kserve("serverless"), "InferenceService")["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"
    assert predictor["scaleTarget"] == _benchmark_peak_clients()
    raw = one(render_kserve("raw-deployment"), "InferenceService")["spec"]["predictor"]
    assert "scaleMetric" not in raw and "scaleTarget" not in raw


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
