"""The cluster server configuration: the one generator of what TorchServe runs with in a pod.

The single-machine service (config.properties, scripts/serve.sh) registers the model through the
management API with a token. In a pod nothing may register anything and nobody can present
TorchServe's per-process, hourly-expiring keys, so the cluster configuration differs on purpose:

- the model is loaded at start-up with its batching (`model_snapshot`, the form KServe's own
  sample configuration uses; it carries batchSize, maxBatchDelay, responseTimeout and workers,
  and its responseTimeout wins over the archive's model-config.yaml: tests/e2e/test_cluster_config.py);
- the model registration API is off (`enable_model_api=false`) and management listens on
  127.0.0.1 only: reachable from inside the pod (probes may use it), never from the network;
- token authorization is off (`disable_token_authorization=true`): authentication moves to the
  ingress, and a NetworkPolicy admits only the ingress to the inference port (deploy/);
- no request envelope: TorchServe reads `TS_*` environment variables (KServe's runtime sets
  TS_SERVICE_ENVELOPE) only when `enable_envvars_config=true`, so it is written `false` here;
- metrics in Prometheus mode with the repository's metrics.yaml next to the config;
- every path absolute under `root` (/mnt/models, where KServe's storage initializer puts the
  storage layout `config/config.properties` + `model-store/<name>.mar`).

- the queue (job_queue_size) follows from the latency budget and the pod's throughput, as
  scripts/serve.sh derives it on one machine (tooling/latency_budget.py).

Everything else (size caps, gRPC on loopback) is taken from config.properties, so the
two configurations agree wherever they are not different on purpose.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from tooling.latency_budget import DEFAULT_BUDGET_MS, Admission, admission, machine_throughput
from tooling.model_archive import archive_version
from tooling.paths import METRICS_CONFIG, MODEL_CONFIG, REPO, SERVER_CONFIG

DEFAULT_ROOT = "/mnt/models"
CONFIG_DIR = "config"
MODEL_STORE_DIR = "model-store"
PROPERTIES_NAME = "config.properties"
METRICS_NAME = "metrics.yaml"
# What the manifests probe and scrape (tests/deploy checks they agree). /ping is the liveness probe only:
# TorchServe 0.12 answers 200 while a model loads and while a dead worker is restarted, 500 once a worker
# has failed to recover for maxRetryTimeoutInSec; readiness asks the management API (deploy/docker/model_ready.py).
HEALTH_PATH = "/ping"
METRICS_PATH = "/metrics"
ARCHIVE_VERSION = "1.0"  # scripts/archive_model.py's default --version; the snapshot must name the archive's

# The single-machine defaults: scripts/serve.sh's BATCH_SIZE and MAX_BATCH_DELAY (docs/benchmarks.md
# explains 2 ms). The response timeout and queue size are read from model-config.yaml and config.properties below.
DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_BATCH_DELAY_MS = 2

# The GPU layout. On one H100 at 1,024 clients, batch 128, 8 workers served 3.6x what one did (8,757
# against 2,409 requests/s: one worker's Python, not the GPU, is the limit; docs/benchmarks.md#gpu, read
# by tests/deploy from docs/bench-gpu/benchmark.json), with a 5 ms delay. scripts/serve.sh uses the same on a
# GPU host (tests/deploy checks they agree).
GPU_WORKERS_PER_GPU = 8
GPU_BATCH_SIZE = 128
GPU_MAX_BATCH_DELAY_MS = 5

# Taken unchanged from config.properties: same backpressure, same size caps, same loopback gRPC.
SHARED_KEYS = (
    "grpc_inference_address",
    "grpc_management_address",
    "allowed_urls",
    "max_request_size",
    "max_response_size",
)


def _single_machine_properties() -> dict[str, str]:
    from tooling.torchserve import read_properties

    return read_properties(SERVER_CONFIG)


def _model_config_response_timeout() -> int:
    """responseTimeout of model-config.yaml: the single-machine service's (the snapshot's value overrides it)."""
    import yaml

    return int(yaml.safe_load(MODEL_CONFIG.read_text()).get("responseTimeout", 120))


DEFAULT_RESPONSE_TIMEOUT_S = _model_config_response_timeout()


def derived_admission(
    workers: int, batch_size: int, latency_budget_ms: int = DEFAULT_BUDGET_MS, throughput_rps: float | None = None
) -> Admission:
    """The batch size and queue the latency budget gives a pod (tooling/latency_budget.py): by default a CPU pod
    whose one-thread workers each serve the throughput measured per core; a GPU pod passes its measured figure."""
    throughput = throughput_rps or machine_throughput("cpu", workers)
    return admission(latency_budget_ms, throughput, workers, batch_size)


def model_snapshot(
    model_name: str,
    archive: str,
    *,
    batch_size: int,
    max_batch_delay: int,
    workers: int,
    response_timeout: int,
    version: str = ARCHIVE_VERSION,
) -> str:
    """The `model_snapshot` JSON that makes TorchServe load `archive` at start-up with this batching."""
    entry = {
        "defaultVersion": True,
        "marName": archive,
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": batch_size,
        "maxBatchDelay": max_batch_delay,
        "responseTimeout": response_timeout,
    }
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {version: entry}}}
    return json.dumps(snapshot, separators=(",", ":"))


def cluster_properties(
    model_name: str = "bert",
    *,
    archive: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batch_delay: int = DEFAULT_MAX_BATCH_DELAY_MS,
    workers: int = 1,
    response_timeout: int = DEFAULT_RESPONSE_TIMEOUT_S,
    root: str = DEFAULT_ROOT,
    inference_address: str = "http://0.0.0.0:8080",
    management_address: str = "http://127.0.0.1:8081",
    metrics_address: str = "http://0.0.0.0:8082",
    grpc_inference_port: int = 7070,
    grpc_management_port: int = 7071,
    job_queue_size: int | None = None,
    latency_budget_ms: int = DEFAULT_BUDGET_MS,
    throughput_rps: float | None = None,
    version: str = ARCHIVE_VERSION,
) -> dict[str, str]:
    """The cluster server properties, in the order they are written (see the module docstring for why each).

    job_queue_size None: derived from the latency budget and the throughput (derived_admission), which also
    lowers batch_size where the budget is shorter than five batch times."""
    if job_queue_size is None:
        given = derived_admission(workers, batch_size, latency_budget_ms, throughput_rps)
        batch_size, job_queue_size = given.batch_size, given.job_queue_size
    archive = archive or f"{model_name}.mar"
    shared = _single_machine_properties()
    root = root.rstrip("/")  # "/mnt/models/" and "/mnt/models" give the same paths
    properties = {
        "inference_address": inference_address,
        "management_address": management_address,
        "metrics_address": metrics_address,
        "grpc_inference_address": shared["grpc_inference_address"],
        "grpc_inference_port": str(grpc_inference_port),
        "grpc_management_address": shared["grpc_management_address"],
        "grpc_management_port": str(grpc_management_port),
        "model_store": f"{root}/{MODEL_STORE_DIR}",
        "enable_model_api": "false",
        "allowed_urls": shared["allowed_urls"],
        "disable_token_authorization": "true",
        "enable_envvars_config": "false",
        "metrics_mode": "prometheus",
        "metrics_config": f"{root}/{CONFIG_DIR}/{METRICS_NAME}",
        "job_queue_size": str(job_queue_size),
        "max_request_size": shared["max_request_size"],
        "max_response_size": shared["max_response_size"],
        "default_response_timeout": str(response_timeout),
        "default_workers_per_model": str(workers),
        "model_snapshot": model_snapshot(
            model_name,
            archive,
            batch_size=batch_size,
            max_batch_delay=max_batch_delay,
            workers=workers,
            response_timeout=response_timeout,
            version=version,
        ),
    }
    return properties


def write_properties(properties: Mapping[str, str], path: Path) -> Path:
    """Write `properties` as a Java properties file TorchServe reads back unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Generated by tooling/cluster_config.py (python -m scripts.kserve_layout); do not edit by hand."]
    lines += [f"{key}={value}" for key, value in properties.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def build_kserve_layout(archive: Path, out_dir: Path, model_name: str = "bert", **cluster_options) -> Path:
    """KServe's TorchServe storage layout: out_dir/config/{config.properties,metrics.yaml}, model-store/<name>.mar.

    `cluster_options` go to cluster_properties(); `root` is where out_dir will be mounted (/mnt/models).
    Returns the written config.properties.
    """
    cluster_options.setdefault("version", archive_version(archive))  # before writing anything: fails on a non-.mar
    out_dir = Path(out_dir)
    store = out_dir / MODEL_STORE_DIR
    store.mkdir(parents=True, exist_ok=True)
    mar_name = f"{model_name}.mar"
    shutil.copyfile(archive, store / mar_name)
    config_dir = out_dir / CONFIG_DIR
    config_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(METRICS_CONFIG, config_dir / METRICS_NAME)
    properties = cluster_properties(model_name, archive=mar_name, **cluster_options)
    return write_properties(properties, config_dir / PROPERTIES_NAME)


# ---- the Prometheus Operator's PrometheusRule ------------------------------------------------------

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = (PROMETHEUS_DIR / "rules.yaml", PROMETHEUS_DIR / "alerts.yaml")
OPERATOR_RULE = REPO / "deploy" / "kubernetes" / "components" / "prometheus-operator" / "prometheusrule.yaml"
RULE_NAME = "bert-torchserve"


def prometheus_rule(rule_files: tuple[Path, ...] = RULE_FILES) -> dict:
    """The PrometheusRule holding every group of the rule files, unchanged: the Operator loads rules only from these."""
    import yaml

    groups = [group for path in rule_files for group in yaml.safe_load(path.read_text())["groups"]]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULE_NAME, "labels": {"app.kubernetes.io/name": "bert-torchserve"}},
        "spec": {"groups": groups},
    }


def render_prometheus_rule(rule_files: tuple[Path, ...] = RULE_FILES) -> str:
    """prometheus_rule() as the YAML file the kustomize component holds (multi-line expressions as blocks)."""
    import yaml

    class BlockDumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, text)
    sources = ", ".join(str(path.relative_to(REPO)) for path in rule_files)
    header = (
        f"# Generated from {sources} by `python -m tooling.cluster_config prometheus-rule`; do not edit.\n"
        "# Your Prometheus resource's ruleSelector must match its labels (kube-prometheus-stack: release=<release>,\n"
        "# unless ruleSelectorNilUsesHelmValues=false): add them in your overlay.\n"
    )
    return header + yaml.dump(prometheus_rule(rule_files), Dumper=BlockDumper, sort_keys=False, width=120)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["prometheus-rule"]:
        sys.exit("usage: python -m tooling.cluster_config prometheus-rule")
    OPERATOR_RULE.write_text(render_prometheus_rule())
    print(f"wrote {OPERATOR_RULE.relative_to(REPO)}")
