"""The cluster configuration generator and the layout command, without a server (the e2e tests start one)."""

from __future__ import annotations

import json

import pytest

from scripts import kserve_layout
from tests.deploy.manifests import fake_archive
from tooling import cluster_config
from tooling.latency_budget import admission, machine_throughput
from tooling.paths import METRICS_CONFIG, SERVER_CONFIG
from tooling.torchserve import read_properties


def test_the_cluster_configuration_differs_from_the_single_machine_one_only_on_purpose():
    single = read_properties(SERVER_CONFIG)
    cluster = cluster_config.cluster_properties()
    # Deliberate differences (docs/kubernetes.md: the cluster configuration, authorization in the cluster).
    assert single.get("disable_token_authorization", "false") == "false"
    assert cluster["disable_token_authorization"] == "true"
    assert single["enable_model_api"] == "true"
    assert cluster["enable_model_api"] == "false"
    assert cluster["enable_envvars_config"] == "false"
    # Shared on purpose: backpressure, size caps, gRPC on loopback, no remote archive URLs.
    for key in cluster_config.SHARED_KEYS:
        assert cluster[key] == single[key], key
    assert cluster["metrics_mode"] == single["metrics_mode"] == "prometheus"


def test_nothing_in_the_configuration_can_turn_an_envelope_on():
    cluster = cluster_config.cluster_properties()
    assert "service_envelope" not in cluster
    assert cluster["enable_envvars_config"] == "false"  # TS_* variables (TS_SERVICE_ENVELOPE) are ignored
    # TorchServe substitutes $$NAME$$ in any value with the environment variable NAME.
    assert not any("$$" in value for value in cluster.values())


def test_neither_configuration_turns_torchserves_open_inference_mode_on():
    # Its gRPC ModelInfer, answered by this handler, made the frontend drop the worker (docs/calling.md). TorchServe
    # 0.12 reads the mode from the property, and from TS_OPEN_INFERENCE_PROTOCOL whatever enable_envvars_config says
    # (ConfigManager.isOpenInferenceProtocol, System.getenv, "oip" wins): the launchers drop that variable
    # (tests/unit/test_server_environment.py, tests/e2e/test_serve_sh.py, tests/e2e/test_graceful_stop.py).
    for properties in (read_properties(SERVER_CONFIG), cluster_config.cluster_properties()):
        assert "ts_open_inference_protocol" not in properties
        assert properties.get("enable_envvars_config", "false") == "false"


def test_the_snapshot_loads_the_model_at_start_with_its_batching():
    cluster = cluster_config.cluster_properties(
        "clf", batch_size=16, max_batch_delay=5, workers=2, response_timeout=30, version="2.1"
    )
    snapshot = json.loads(cluster["model_snapshot"])
    assert snapshot["modelCount"] == 1
    assert snapshot["models"] == {
        "clf": {
            "2.1": {
                "defaultVersion": True,
                "marName": "clf.mar",
                "minWorkers": 2,
                "maxWorkers": 2,
                "batchSize": 16,
                "maxBatchDelay": 5,
                "responseTimeout": 30,
            }
        }
    }
    assert cluster["default_workers_per_model"] == "2"
    assert cluster["default_response_timeout"] == "30"


def test_the_defaults_are_the_single_machine_service_defaults():
    snapshot = json.loads(cluster_config.cluster_properties()["model_snapshot"])
    [entry] = snapshot["models"]["bert"].values()
    serve_sh = (SERVER_CONFIG.parent / "scripts" / "serve.sh").read_text()
    assert f"BATCH_SIZE=${{BATCH_SIZE:-{entry['batchSize']}}}" in serve_sh
    assert f"MAX_BATCH_DELAY=${{MAX_BATCH_DELAY:-{entry['maxBatchDelay']}}}" in serve_sh
    assert entry["responseTimeout"] == 60 == cluster_config.DEFAULT_RESPONSE_TIMEOUT_S  # model-config.yaml
    # The queue follows from the latency budget for the pod's layout, as scripts/serve.sh derives it.
    assert "job_queue_size" not in read_properties(SERVER_CONFIG)
    queue = cluster_config.cluster_properties(workers=2, latency_budget_ms=500)["job_queue_size"]
    assert int(queue) == admission(500, machine_throughput("cpu", 2), 2, entry["batchSize"]).job_queue_size


def test_a_short_budget_registers_the_pod_with_the_smaller_batch_it_leaves_room_for():
    properties = cluster_config.cluster_properties(workers=2, latency_budget_ms=300)
    [entry] = json.loads(properties["model_snapshot"])["models"]["bert"].values()
    given = admission(300, machine_throughput("cpu", 2), 2, cluster_config.DEFAULT_BATCH_SIZE)
    assert entry["batchSize"] == given.batch_size < cluster_config.DEFAULT_BATCH_SIZE
    assert int(properties["job_queue_size"]) == given.job_queue_size


def test_the_layout_command_writes_what_kserve_expects(tmp_path, capsys):
    archive = fake_archive(tmp_path / "built.mar", version="3.0")
    out = tmp_path / "kserve"
    assert kserve_layout.main([str(archive), "--out", str(out), "--name", "clf", "--batch-size", "4"]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["config/config.properties", "config/metrics.yaml", "model-store/clf.mar"]
    assert (out / "config" / "metrics.yaml").read_text() == METRICS_CONFIG.read_text()
    assert (out / "model-store" / "clf.mar").read_bytes() == archive.read_bytes()
    written = read_properties(out / "config" / "config.properties")
    # An archive without handler options runs one worker with cpu_threads 0: every core of the pod, so the queue
    # is sized for the pod's CPUs (tooling/cpu_layout.cpu_cores_used).
    pod = machine_throughput("cpu", kserve_layout.POD_CPUS)
    assert written == cluster_config.cluster_properties("clf", batch_size=4, version="3.0", throughput_rps=pod)
    assert written["model_store"] == "/mnt/models/model-store"
    assert written["metrics_config"] == "/mnt/models/config/metrics.yaml"
    printed = capsys.readouterr().out
    assert "storageUri" in printed and str(out) in printed


def test_the_layout_command_refuses_a_missing_archive(tmp_path, capsys):
    assert kserve_layout.main([str(tmp_path / "nope.mar"), "--out", str(tmp_path / "out")]) == 2
    assert "no such archive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_layout_command_refuses_a_file_that_is_not_an_archive(tmp_path, capsys):
    not_a_mar = tmp_path / "model.mar"
    not_a_mar.write_bytes(b"not a zip")
    assert kserve_layout.main([str(not_a_mar), "--out", str(tmp_path / "out")]) == 2
    assert "not a TorchServe model archive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_written_properties_read_back_unchanged(tmp_path):
    properties = cluster_config.cluster_properties()
    path = cluster_config.write_properties(properties, tmp_path / "sub" / "config.properties")
    assert read_properties(path) == properties


@pytest.mark.parametrize("root", ["/mnt/models", "/srv/models/"])
def test_every_path_is_absolute_under_the_root(root):
    cluster = cluster_config.cluster_properties(root=root)
    base = root.rstrip("/")
    assert cluster["model_store"] == f"{base}/model-store"
    assert cluster["metrics_config"] == f"{base}/config/metrics.yaml"
