"""The generated cluster configuration, the image and the manifests agree: ports, paths, probes, timeouts.

Each test reads the configuration from tooling/cluster_config.py (what the image and the KServe
layout carry), the Dockerfile and the manifests (kustomize renderings included), and compares them.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import PurePosixPath
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
    dockerfile_env,
    dockerfile_stages,
    documents,
    exec_form,
    fake_archive,
    one,
    queue_proxy,
    render,
    render_kserve,
)
from tooling import cluster_config
from tooling.paths import REPO
from tooling.torchserve import read_properties

GENERATED = cluster_config.cluster_properties()
ROOT = cluster_config.DEFAULT_ROOT
CONFIG_PATH = f"{ROOT}/{cluster_config.CONFIG_DIR}/{cluster_config.PROPERTIES_NAME}"
STAGES = dockerfile_stages()
RUNTIME = STAGES["runtime"]
[RUNTIME_DOC] = documents(KSERVE / "serverless" / "servingruntime.yaml")
[RUNTIME_CONTAINER] = RUNTIME_DOC["spec"]["containers"]


def _port(address: str) -> int:
    return urlsplit(address).port


INFERENCE_PORT = _port(GENERATED["inference_address"])
METRICS_PORT = _port(GENERATED["metrics_address"])
PRIVATE_PORTS = {
    _port(GENERATED["management_address"]),
    int(GENERATED["grpc_inference_port"]),
    int(GENERATED["grpc_management_port"]),
}


def _instruction(stage, keyword: str) -> list[str]:
    return [arguments for kw, arguments in stage if kw == keyword]


def _deployments() -> dict[str, dict]:
    return {overlay: one(render(overlay), "Deployment") for overlay in OVERLAYS}


def _container(deployment: dict) -> dict:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _resolve(port, container: dict) -> int:
    """A probe's or Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return number


def _copy_destination(source: str) -> str:
    """Where the runtime stage's COPY puts `source` (into a directory: under its own name)."""
    [destination] = [args.split()[-1] for args in _instruction(RUNTIME, "COPY") if source in args.split()[:-1]]
    return posixpath.join(destination, posixpath.basename(source)) if destination.endswith("/") else destination


# ---- the entry command ---------------------------------------------------------------------------


def test_the_image_and_the_serving_runtime_start_torchserve_on_the_generated_layout():
    [cmd] = _instruction(RUNTIME, "CMD")
    command = exec_form(cmd)
    assert RUNTIME_CONTAINER["args"] == command
    assert "command" not in RUNTIME_CONTAINER  # the image's ENTRYPOINT (graceful_stop.py) stays
    assert command[:2] == ["torchserve", "--start"]
    assert "--foreground" in command  # the container lives as long as TorchServe does
    assert "--ncs" in command  # no config snapshots next to a read-only configuration
    assert command[command.index("--ts-config") + 1] == CONFIG_PATH
    assert command[command.index("--model-store") + 1] == GENERATED["model_store"]
    # The default stage bakes the layout exactly where the command reads it.
    [copy] = _instruction(STAGES["bundled"], "COPY")
    assert copy.split()[-1].rstrip("/") == ROOT


def test_the_generated_paths_are_absolute_and_under_the_layout_root():
    for key in ("model_store", "metrics_config"):
        path = PurePosixPath(GENERATED[key])
        assert path.is_absolute() and path.is_relative_to(ROOT), (key, path)
    assert GENERATED["metrics_config"] == f"{ROOT}/{cluster_config.CONFIG_DIR}/{cluster_config.METRICS_NAME}"


# ---- ports ---------------------------------------------------------------------------------------


def test_only_the_inference_and_metrics_ports_leave_the_pod():
    # What must be reachable from outside the pod listens on every interface, the rest on loopback.
    assert urlsplit(GENERATED["inference_address"]).hostname == "0.0.0.0"
    assert urlsplit(GENERATED["metrics_address"]).hostname == "0.0.0.0"
    assert urlsplit(GENERATED["management_address"]).hostname == "127.0.0.1"
    assert GENERATED["grpc_inference_address"] == GENERATED["grpc_management_address"] == "127.0.0.1"

    [expose] = _instruction(RUNTIME, "EXPOSE")
    assert {int(port) for port in expose.split()} == {INFERENCE_PORT, METRICS_PORT}
    for overlay, deployment in _deployments().items():
        ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
        assert ports == {"http": INFERENCE_PORT, "metrics": METRICS_PORT}, overlay
    # KServe (Knative) allows one declared port: the inference one; metrics are announced by annotation.
    assert [p["containerPort"] for p in RUNTIME_CONTAINER["ports"]] == [INFERENCE_PORT]


def test_the_service_exposes_the_inference_port_only():
    for overlay in OVERLAYS:
        service = one(render(overlay), "Service")
        container = _container(one(render(overlay), "Deployment"))
        [port] = service["spec"]["ports"]
        assert port["port"] == INFERENCE_PORT
        assert _resolve(port["targetPort"], container) == INFERENCE_PORT
        assert not PRIVATE_PORTS & {port["port"], _resolve(port["targetPort"], container)}


def test_the_network_policy_admits_the_ingress_to_inference_and_prometheus_to_metrics_only():
    policy = one(render("cpu"), "NetworkPolicy")
    spec = policy["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    assert spec.get("egress", []) == []  # no egress at all: the model is in the image
    admitted = {}
    for rule in spec["ingress"]:
        [peer] = rule["from"]
        [port] = rule["ports"]
        namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        admitted[namespace] = port["port"]
    assert admitted == {"ingress-nginx": INFERENCE_PORT, "monitoring": METRICS_PORT}


@pytest.mark.parametrize("mode", [m for m in KSERVE_MODES if not queue_proxy(m)])
def test_the_raw_deployment_predictors_admit_the_gateway_to_inference_and_prometheus_to_metrics_only(mode):
    docs = render_kserve(mode)
    policy = one(docs, "NetworkPolicy")
    service = one(docs, "InferenceService")
    # The label KServe puts on every pod of an InferenceService (kserve pkg/constants InferenceServicePodLabelKey).
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"serving.kserve.io/inferenceservice": service["metadata"]["name"]}
    }
    # Ingress only: the storage initializer fetches storageUri at each start.
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted = {}
    for rule in policy["spec"]["ingress"]:
        [peer] = rule["from"]
        [port] = rule["ports"]
        admitted[peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]] = port["port"]
        if port["port"] == METRICS_PORT:
            assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert admitted == {"istio-system": INFERENCE_PORT, "monitoring": METRICS_PORT}
    # Where the runtime's container serves inference and where the predictor announces its metrics.
    assert [port["containerPort"] for port in RUNTIME_CONTAINER["ports"]] == [INFERENCE_PORT]
    assert int(service["spec"]["predictor"]["annotations"]["prometheus.io/port"]) == METRICS_PORT


def test_serverless_ships_no_network_policy():
    # Knative's activator, autoscaler and gateway reach queue-proxy on ports that vary by installation
    # (docs/kubernetes.md, "Authorization in the cluster"): a policy missing one would take the predictor off the
    # network, so the Serverless modes leave it to the cluster's owner.
    for mode in KSERVE_MODES:
        if queue_proxy(mode):
            assert not by_kind(render_kserve(mode), "NetworkPolicy"), mode


def test_metrics_are_announced_where_torchserve_serves_them():
    for overlay, deployment in _deployments().items():
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", overlay
        assert int(annotations["prometheus.io/port"]) == METRICS_PORT
        assert annotations["prometheus.io/path"] == cluster_config.METRICS_PATH
    announced = RUNTIME_DOC["spec"]["annotations"]
    assert int(announced["prometheus.kserve.io/port"]) == METRICS_PORT
    assert announced["prometheus.kserve.io/path"] == cluster_config.METRICS_PATH
    assert GENERATED["metrics_mode"] == "prometheus"


# ---- probes --------------------------------------------------------------------------------------


def _containers_with_probes() -> dict[str, dict]:
    return {
        **{f"deployment/{o}": _container(d) for o, d in _deployments().items()},
        "servingruntime": RUNTIME_CONTAINER,
    }


@pytest.mark.parametrize("where", sorted(_containers_with_probes()))
def test_the_probes_ask_for_a_loaded_model_and_a_live_frontend(where):
    container = _containers_with_probes()[where]
    probe_script = _copy_destination("deploy/docker/model_ready.py")
    expected_readiness = ["python3", probe_script, "--config", CONFIG_PATH]
    assert container["readinessProbe"]["exec"]["command"] == expected_readiness
    if "startupProbe" in container:
        assert container["startupProbe"]["exec"]["command"] == expected_readiness
    liveness = container["livenessProbe"]["httpGet"]
    assert liveness["path"] == cluster_config.HEALTH_PATH
    assert _resolve(liveness["port"], container) == INFERENCE_PORT


def test_the_readiness_probe_reads_the_models_from_the_generated_configuration():
    import runpy

    probe = runpy.run_path(str(DEPLOY / "docker" / "model_ready.py"))
    assert probe["DEFAULT_CONFIG"] == CONFIG_PATH
    assert probe["expected_models"](GENERATED) == {"bert": 1}
    snapshot = json.loads(GENERATED["model_snapshot"])
    assert list(snapshot["models"]) == ["bert"]


# ---- termination, file system, user ---------------------------------------------------------------


def _graceful_stop() -> dict:
    import runpy
    import sys

    # As in the image, model_ready.py sits next to it (a script's own directory is on its sys.path).
    sys.path.insert(0, str(DEPLOY / "docker"))
    try:
        return runpy.run_path(str(DEPLOY / "docker" / "graceful_stop.py"))
    finally:
        sys.path.remove(str(DEPLOY / "docker"))


def _pre_stop_seconds(container: dict) -> int:
    """The seconds of a container's preStop hook, a `sleep N` like the base Deployment's."""
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return int(command[1])


def test_termination_covers_the_prestop_the_drain_and_the_stop():
    """The grace period outlasts preStop + the entry command's drain (every admitted request answered,
    at most the response timeout + margin, and its linger) + TorchServe's stop, for the plain Deployment and
    KServe's RawDeployment alike. RawDeployment's preStop is on the InferenceService's model container, which
    KServe merges into the ServingRuntime's kserve-container (kserve v0.15.2 MergeRuntimeContainers) and no
    Knative validates; the ServingRuntime, shared with Serverless, has none (Knative refuses `lifecycle` and
    gives the container its own preStop), nor has Serverless's model container."""
    response_timeout = int(GENERATED["default_response_timeout"])
    [entry] = json.loads(GENERATED["model_snapshot"])["models"]["bert"].values()
    assert entry["responseTimeout"] == response_timeout
    stop = _graceful_stop()
    drain = max(stop["default_drain_timeout"](GENERATED), stop["DEFAULT_LINGER_S"])
    assert drain > response_timeout
    pre_stops = set()
    for overlay, deployment in _deployments().items():
        spec = deployment["spec"]["template"]["spec"]
        pre_stop = _pre_stop_seconds(_container(deployment))
        pre_stops.add(pre_stop)
        assert pre_stop + drain + stop["DEFAULT_STOP_TIMEOUT_S"] < spec["terminationGracePeriodSeconds"], overlay
    assert "lifecycle" not in RUNTIME_CONTAINER
    for mode in KSERVE_MODES:
        docs = render_kserve(mode)
        [runtime_container] = one(docs, "ServingRuntime")["spec"]["containers"]
        assert "lifecycle" not in runtime_container, mode
        predictor = one(docs, "InferenceService")["spec"]["predictor"]
        if queue_proxy(mode):  # Serverless: Knative refuses a lifecycle and sets the grace period itself
            assert "lifecycle" not in predictor["model"], mode
            continue
        merged = {**runtime_container, **predictor["model"]}  # a strategic merge, for the keys read here
        pre_stop = _pre_stop_seconds(merged)
        pre_stops.add(pre_stop)
        grace = predictor["terminationGracePeriodSeconds"]
        assert pre_stop + drain + stop["DEFAULT_STOP_TIMEOUT_S"] < grace, mode
    assert len(pre_stops) == 1, pre_stops  # every pod leaves the endpoints for as long


def test_the_entry_command_drains_and_stops_on_the_generated_configuration():
    entrypoint = exec_form(_instruction(RUNTIME, "ENTRYPOINT")[0])
    # tini hands SIGTERM to its child only (no -g): graceful_stop.py, which drains, then stops TorchServe.
    assert entrypoint == ["/usr/bin/tini", "--", "python3", _copy_destination("deploy/docker/graceful_stop.py"), "--"]
    command = exec_form(_instruction(RUNTIME, "CMD")[0])
    stop = _graceful_stop()
    assert stop["config_path"](command) == CONFIG_PATH
    # The drain subtracts every 5xx the handler answers from Requests5XX: bert_items_total already counts them.
    assert set(stop["HANDLER_5XX_REASONS"]) == _handler_5xx_reasons()
    rules = (DEPLOY / "prometheus" / "rules.yaml").read_text()
    [reasons] = re.findall(r'Reason=~"([^"]+)"', rules)
    # The recording rule instance:bert_unavailable_per_second subtracts the same ones but DeadlineExceeded,
    # which it keeps on purpose: that 503 is load shed, as the frontend's queue-full 503. The drain asks
    # another question (is a request still open?), and a DeadlineExceeded request is answered by the handler.
    assert (*reasons.split("|"), "DeadlineExceeded") == stop["HANDLER_5XX_REASONS"]
    # Logging goes to standard output only (no rolling files in the /tmp emptyDir).
    assert command[command.index("--log-config") + 1] == _copy_destination("deploy/docker/log4j2.xml")


def _handler_5xx_reasons() -> set[str]:
    """The type of every Rejection handlers/rejection.py builds with a 5xx status."""
    text = (REPO / "handlers" / "rejection.py").read_text()
    reasons = {kind for status, kind in re.findall(r'Rejection\(\s*(\d{3}),\s*"(\w+)"', text) if int(status) >= 500}
    assert "DeadlineExceeded" in reasons and "InferenceFailed" in reasons, reasons  # the pattern still reads the file
    return reasons


def test_the_root_file_system_is_read_only_and_everything_torchserve_writes_is_on_the_empty_dir():
    env = dockerfile_env(RUNTIME)
    writable = ("HOME", "TMPDIR", "TEMP", "LOG_LOCATION", "METRICS_LOCATION", "HF_HOME")
    [workdir] = _instruction(RUNTIME, "WORKDIR")
    for where, container in _containers_with_probes().items():
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        mounts = [mount["mountPath"] for mount in container["volumeMounts"]]
        for path in [env[name] for name in writable] + [workdir]:
            assert any(posixpath.commonpath([path, mount]) == mount for mount in mounts), (where, path)


def test_the_image_user_is_the_one_the_manifests_require():
    [user] = _instruction(RUNTIME, "USER")
    uid = int(user.split(":")[0])
    assert uid != 0
    for overlay, deployment in _deployments().items():
        pod = deployment["spec"]["template"]["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == uid, overlay
    assert RUNTIME_CONTAINER["securityContext"]["runAsUser"] == uid


def test_no_pod_mounts_a_service_account_token():
    """Nothing in the pod calls the Kubernetes API: the plain Deployment and every KServe predictor opt out of the
    token. KServe's is on the InferenceService's predictor pod spec (merged into the pod; the ServingRuntime's pod
    spec has no such field), which Knative accepts when false."""
    for overlay, deployment in _deployments().items():
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, overlay
    for mode in KSERVE_MODES:
        predictor = one(render_kserve(mode), "InferenceService")["spec"]["predictor"]
        assert predictor["automountServiceAccountToken"] is False, mode


def test_every_launcher_starts_torchserve_with_umask_077_and_without_the_variables_that_replace_its_configuration():
    """The image's entry command, tooling/torchserve.py (tests, benchmark, fleet) and scripts/serve.sh (through
    runtime_env.sh) agree; each is run for real in tests/e2e (test_graceful_stop, test_service, test_serve_sh)."""
    from tooling.torchserve import IGNORED_VARIABLES, SERVER_UMASK

    stop = _graceful_stop()
    assert stop["SERVER_UMASK"] == SERVER_UMASK == 0o077
    assert stop["IGNORED_VARIABLES"] == IGNORED_VARIABLES == ("TS_CONFIG_FILE", "TS_OPEN_INFERENCE_PROTOCOL")
    runtime_env = (REPO / "scripts" / "runtime_env.sh").read_text().splitlines()
    assert "umask 077" in runtime_env
    assert f"unset {' '.join(IGNORED_VARIABLES)}" in runtime_env


def test_every_launcher_clears_the_same_folder_of_unpacked_archives():
    """The image's entry command and tooling/torchserve.py (which scripts/serve.sh calls) clear what a killed TorchServe
    left unpacked in one folder, the one TorchServe unpacks into; each is run for real in tests/e2e (test_graceful_stop,
    test_serve_sh) and tests/unit/test_server_lifecycle.py."""
    from tooling.torchserve import UNPACKED_ARCHIVES

    assert _graceful_stop()["UNPACKED_ARCHIVES"] == UNPACKED_ARCHIVES == "models"


def test_the_image_redacts_query_strings_from_the_access_log_as_the_repositorys_logging_does():
    """One replacement in both log4j2 configurations (the pod's writes to standard output only); each is run for real
    (tests/e2e/test_graceful_stop.py, tests/e2e/test_reliability.py::test_request_text_never_reaches_the_logs)."""
    import xml.etree.ElementTree as ElementTree

    def message(path):
        [prop] = ElementTree.parse(path).getroot().iter("Property")
        return prop.get("name"), prop.text

    assert message(REPO / "log4j2.xml") == message(DEPLOY / "docker" / "log4j2.xml")
    assert message(REPO / "log4j2.xml")[1].startswith("%replace{%m}")


def test_every_log_file_on_one_machine_rolls_over_and_nothing_goes_to_the_unrotated_console():
    """log4j2.xml: each file rolls over by size and keeps a bounded number; no Console appender, since the launchers
    send standard output to a console.log nothing rotates (what reaches it is run for real: tests/e2e/test_service.py).
    """
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(REPO / "log4j2.xml").getroot()
    [appenders] = root.iter("Appenders")
    assert [child.tag for child in appenders if child.tag != "RollingFile"] == []
    for appender in appenders:
        [size] = appender.iter("SizeBasedTriggeringPolicy")
        [strategy] = appender.iter("DefaultRolloverStrategy")
        assert (size.get("size"), strategy.get("max")) == ("100 MB", "5"), appender.get("name")


# ---- GPU, autoscaling, selectors ------------------------------------------------------------------


def test_the_gpu_overlay_runs_the_measured_workers_per_gpu(tmp_path):
    """The gpu overlay's GPUs per pod, laid out as docs/kubernetes.md says (kserve_layout --gpus), give each GPU
    the workers measured best (docs/benchmarks.md#gpu); serve.sh uses the same figures on a GPU host."""
    from scripts import kserve_layout

    gpu = _container(_deployments()["gpu"])["resources"]
    gpus = int(gpu["limits"]["nvidia.com/gpu"])
    assert gpus == int(gpu["requests"]["nvidia.com/gpu"]) >= 1
    archive = fake_archive(tmp_path / "bert.mar")
    assert kserve_layout.main([str(archive), "--out", str(tmp_path / "layout"), "--gpus", str(gpus)]) == 0
    properties = read_properties(tmp_path / "layout" / "config" / "config.properties")
    [entry] = json.loads(properties["model_snapshot"])["models"]["bert"].values()
    workers = cluster_config.GPU_WORKERS_PER_GPU * gpus
    assert entry["minWorkers"] == entry["maxWorkers"] == workers == int(properties["default_workers_per_model"])
    assert (entry["batchSize"], entry["maxBatchDelay"]) == (
        cluster_config.GPU_BATCH_SIZE,
        cluster_config.GPU_MAX_BATCH_DELAY_MS,
    )
    serve_sh = (REPO / "scripts" / "serve.sh").read_text()
    assert f"WORKERS_PER_GPU={cluster_config.GPU_WORKERS_PER_GPU}\n" in serve_sh
    assert f"BATCH_SIZE=${{BATCH_SIZE:-{cluster_config.GPU_BATCH_SIZE}}}" in serve_sh
    assert f"MAX_BATCH_DELAY=${{MAX_BATCH_DELAY:-{cluster_config.GPU_MAX_BATCH_DELAY_MS}}}" in serve_sh
    cpu = _container(_deployments()["cpu"])["resources"]
    assert "nvidia.com/gpu" not in cpu["limits"]
    assert cpu["requests"] == cpu["limits"]  # Guaranteed QoS: whole CPUs with the static CPU manager


def test_the_autoscaler_scales_on_rates_the_adapter_serves_from_the_recording_rules():
    hpa = one(render("cpu"), "HorizontalPodAutoscaler")
    deployment = one(render("cpu"), "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "bert-torchserve"}
    assert deployment["metadata"]["name"] == "bert-torchserve"
    assert "replicas" not in deployment["spec"]  # the autoscaler owns the count
    names = [metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"] if metric["type"] == "Pods"]
    assert len(names) == len(hpa["spec"]["metrics"])
    assert "bert_queue_ms_per_request" in names

    adapter = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    rules = {rule["name"]["as"]: rule for rule in adapter["rules"]["custom"]}
    assert set(names) <= set(rules)
    recorded = _recording_rules()
    for name in names:
        rule = rules[name]
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
        used = {word for word in _metric_names(rule["seriesQuery"] + " " + rule["metricsQuery"])}
        assert used, name
        assert used <= recorded, (name, used - recorded)  # only recording rules: rates, never raw counters
    assert "instance:bert_queue_ms_per_request:rate3m" in _metric_names(
        rules["bert_queue_ms_per_request"]["metricsQuery"]
    )


def test_the_adapter_values_name_the_autoscaler_file_they_feed():
    """The values file's header names the HPA manifest whose metrics it serves: that file exists (the path is
    what a reader opens) and scales on those metrics."""
    text = (KUBERNETES / "prometheus-adapter" / "values.yaml").read_text()
    [cited] = re.findall(r"[\w./-]*horizontalpodautoscaler\.yaml", text)  # a path from the repository root
    assert (REPO / cited).is_file(), f"values.yaml names {cited}, which does not exist"
    [hpa] = documents(REPO / cited)
    assert hpa["kind"] == "HorizontalPodAutoscaler"
    adapter = yaml.safe_load(text)
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    assert {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]} <= served


def _recording_rules() -> set[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


def _metric_names(query: str) -> set[str]:
    import re

    return set(re.findall(r"\binstance:[a-z_]+:rate3m\b|\b[a-z_]+_total\b", query))


def test_every_selector_finds_the_deployment_pods():
    for overlay in OVERLAYS:
        docs = render(overlay)
        labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        selectors = [
            one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
            one(docs, "Service")["spec"]["selector"],
            one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
            one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        ]
        for selector in selectors:
            assert selector.items() <= labels.items(), (overlay, selector)
        assert len(by_kind(docs, "Deployment")) == 1


def test_the_drain_counts_requests_answered_by_the_handler_or_refused_by_the_frontend():
    """Outstanding = admitted - answered by the handler - 5xx the frontend gave alone (queue full, lost worker)."""
    outstanding = _graceful_stop()["outstanding"]
    text = "\n".join(
        [
            "# TYPE ts_inference_requests_total counter",
            'ts_inference_requests_total{model_name="bert",model_version="default",hostname="h"} 10.0',
            'bert_items_total{ModelName="bert",Level="Model",Hostname="h"} 6.0',
            'Requests5XX{Level="Host",Hostname="h"} 3.0',
            'bert_rejected_items_total{ModelName="bert",Reason="InferenceFailed",Level="Model",Hostname="h"} 1.0',
            'bert_rejected_items_total{ModelName="bert",Reason="EmptyText",Level="Model",Hostname="h"} 2.0',
        ]
    )
    assert outstanding(text) == 10 - 6 - (3 - 1)
    assert outstanding("") == 0  # TorchServe exports a counter only once it is non-zero


def _metrics(admitted: int, handled: int, requests_5xx: int, deadline_exceeded: int) -> str:
    return "\n".join(
        [
            f'ts_inference_requests_total{{model_name="bert",model_version="default",hostname="h"}} {admitted}.0',
            f'bert_items_total{{ModelName="bert",Level="Model",Hostname="h"}} {handled}.0',
            f'Requests5XX{{Level="Host",Hostname="h"}} {requests_5xx}.0',
            'bert_rejected_items_total{ModelName="bert",Reason="DeadlineExceeded",Level="Model",Hostname="h"} '
            f"{deadline_exceeded}.0",
        ]
    )


def test_the_drain_counts_a_deadline_exceeded_503_once():
    """The handler's 503 DeadlineExceeded is in bert_items_total (every request of a batch) and, by its HTTP
    status, in Requests5XX: subtracted as both, every one of them would let the drain end with batches running."""
    outstanding = _graceful_stop()["outstanding"]
    # 10 admitted, 10 through the handler (2 of them refused DeadlineExceeded): nothing open.
    assert outstanding(_metrics(admitted=10, handled=10, requests_5xx=2, deadline_exceeded=2)) == 0
    # The same with 2 more still in a batch: 2 open, not 0.
    assert outstanding(_metrics(admitted=12, handled=10, requests_5xx=2, deadline_exceeded=2)) == 2


def test_a_ping_500_cannot_stand_for_an_open_request():
    """Requests5XX also counts /ping's 500, which lowers the drain's count. TorchServe answers it only once a
    worker has failed to come back for maxRetryTimeoutInSec (300 s by default; nothing here sets it), and
    readiness has had the pod out of the endpoints since that worker died: every request admitted before then
    is answered or timed out (responseTimeout) long before the first /ping 500 (graceful_stop.py's docstring)."""
    max_retry_timeout = 300  # TorchServe 0.12's default (ModelConfig.maxRetryTimeoutInSec)
    for entry in json.loads(GENERATED["model_snapshot"])["models"]["bert"].values():
        assert "maxRetryTimeoutInSec" not in entry
        assert entry["responseTimeout"] < max_retry_timeout
    assert "maxRetryTimeoutInSec" not in yaml.safe_load((REPO / "model-config.yaml").read_text())
