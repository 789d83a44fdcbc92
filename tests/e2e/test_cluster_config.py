"""The generated cluster (KServe) configuration, proved against a TorchServe started from exactly it.

The server (tests/e2e/conftest.py::kserve_config_server) runs the generated config.properties with
only addresses and ports changed, and TS_SERVICE_ENVELOPE=kserve in its environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from tests.e2e.conftest import CLUSTER_OPTIONS, ENVELOPE_ENV
from tests.support import JSON, TEXT, listening
from tooling import cluster_config
from tooling.cluster_config import DEFAULT_RESPONSE_TIMEOUT_S
from tooling.inprocess import make_context, set_batch
from tooling.paths import REPO
from tooling.torchserve import read_properties

MODEL_READY_PROBE = REPO / "deploy" / "docker" / "model_ready.py"

pytestmark = pytest.mark.e2e


def _in_process_answer(handler, model_dir, body: bytes, content_type: str) -> tuple[int, dict]:
    """What the project's handler answers for `body` with no envelope around it (same code, same weights)."""
    context = make_context(model_dir)
    [out] = handler.handle(set_batch(context, [(body, content_type)]), context)
    return context.get_response_status(0)[0], json.loads(out)


def _same_answer(a: dict, b: dict) -> bool:
    """Equal JSON, floats within 1e-4 (a forward pass alone on each side)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_answer(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_answer(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-4
    return a == b


def test_the_model_is_loaded_at_start_with_the_configured_batching(kserve_config_server, kserve_layout):
    server, model = kserve_config_server
    generated = read_properties(kserve_layout[1])
    assert generated["enable_model_api"] == "false"  # so nothing but the configuration can have loaded it
    [description] = server.describe(model)
    assert description["batchSize"] == CLUSTER_OPTIONS["batch_size"]
    assert description["maxBatchDelay"] == CLUSTER_OPTIONS["max_batch_delay"]
    # Not model-config.yaml's value, which the archive also carries: the configuration's must win.
    assert description["responseTimeout"] == CLUSTER_OPTIONS["response_timeout"] != DEFAULT_RESPONSE_TIMEOUT_S
    assert description["minWorkers"] == description["maxWorkers"] == CLUSTER_OPTIONS["workers"]
    assert [worker["status"] for worker in description["workers"]] == ["READY"] * CLUSTER_OPTIONS["workers"]


def test_registration_through_the_management_api_is_refused(kserve_config_server):
    server, model = kserve_config_server
    refused = server.session.post(
        f"{server.management_url}/models", params={"url": "cluster-tiny.mar", "model_name": "intruder"}, timeout=30
    )
    assert refused.status_code == 405, refused.text
    unregister = server.session.delete(f"{server.management_url}/models/{model}", timeout=30)
    assert unregister.status_code == 405, unregister.text
    listed = server.session.get(f"{server.management_url}/models", timeout=10).json()["models"]
    assert [entry["modelName"] for entry in listed] == [model]


def test_management_and_grpc_listen_on_loopback_only(kserve_config_server, kserve_layout):
    server, _ = kserve_config_server
    generated = read_properties(kserve_layout[1])
    # The fixture changes ports only; the management host is the generated one.
    assert urlsplit(generated["management_address"]).hostname == "127.0.0.1"
    assert urlsplit(server.management_url).hostname == "127.0.0.1"
    assert generated["grpc_inference_address"] == generated["grpc_management_address"] == "127.0.0.1"
    launcher = psutil.Process(server.process.pid)  # the Java frontend is a child of the launcher
    sockets = listening([launcher, *launcher.children(recursive=True)])
    for port in (
        urlsplit(server.management_url).port,
        int(server.properties["grpc_inference_port"]),
        int(server.properties["grpc_management_port"]),
    ):
        assert sockets.get(port) == {"127.0.0.1"}, (port, sockets)


def test_no_token_is_needed_anywhere(kserve_config_server):
    server, model = kserve_config_server
    assert server.token_auth is False
    plain = requests.post(f"{server.inference_url}/predictions/{model}", data=b"a calm quiet room", timeout=30)
    assert plain.status_code == 200, plain.text
    assert requests.get(f"{server.management_url}/models/{model}", timeout=10).status_code == 200
    assert not (server.workdir / "key_file.json").exists()


def _model_ready(config) -> subprocess.CompletedProcess:
    """The readiness probe the manifests run (deploy/docker/model_ready.py), against `config`."""
    return subprocess.run(
        [sys.executable, str(MODEL_READY_PROBE), "--config", str(config)], capture_output=True, text=True, timeout=30
    )


def test_the_probes_answer_as_the_manifests_expect(kserve_config_server, tmp_path):
    server, _ = kserve_config_server
    ping = requests.get(f"{server.inference_url}{cluster_config.HEALTH_PATH}", timeout=5)
    assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"})
    metrics = requests.get(f"{server.metrics_url}{cluster_config.METRICS_PATH}", timeout=10)
    assert metrics.status_code == 200
    assert "ts_inference_requests_total" in metrics.text
    ready = _model_ready(server.config_path)
    assert ready.returncode == 0, ready.stderr
    # A configuration naming a model the server has not loaded: /ping would still say Healthy.
    ghost = dict(server.properties)
    ghost["model_snapshot"] = ghost["model_snapshot"].replace('"bert"', '"ghost"')
    not_loaded = _model_ready(cluster_config.write_properties(ghost, tmp_path / "ghost.properties"))
    assert not_loaded.returncode == 1
    assert "ghost" in not_loaded.stderr


def test_the_envelope_variable_changes_nothing(kserve_config_server, loaded_handler, unpacked_model_dir):
    """TS_SERVICE_ENVELOPE=kserve is set for this server: requests must still reach the handler as sent."""
    server, model = kserve_config_server
    assert os.environ.get("TS_SERVICE_ENVELOPE") is None  # the variable was the server's, not the test's
    environment = psutil.Process(server.process.pid).environ()
    assert {k: environment.get(k) for k in ENVELOPE_ENV} == ENVELOPE_ENV
    cases = [
        (f"/predictions/{model}", b"The breakfast was cold and the staff ignored us.", TEXT),
        (f"/v1/models/{model}:predict", json.dumps({"instances": ["fine stay", {"text": "awful"}]}).encode(), JSON),
    ]
    for path, body, content_type in cases:
        response = server.post(path, body, content_type)
        status, expected = _in_process_answer(loaded_handler, unpacked_model_dir, body, content_type)
        assert response.status_code == status, (path, response.text)
        assert _same_answer(response.json(), expected), (path, response.json(), expected)


def test_a_dead_worker_turns_readiness_off_until_torchserve_replaces_it(kserve_config_server):
    """Readiness follows the loaded model; liveness (/ping) stays 200 while TorchServe heals the worker itself."""
    server, model = kserve_config_server
    [worker] = server.describe(model)[0]["workers"]
    os.kill(worker["pid"], signal.SIGKILL)
    killed = time.monotonic()
    readiness: list[int] = []  # the probe's exit codes, each change once
    liveness: set[int] = set()
    deadline = killed + 90
    while time.monotonic() < deadline:
        code = _model_ready(server.config_path).returncode
        if not readiness or readiness[-1] != code:
            readiness.append(code)
        liveness.add(requests.get(f"{server.inference_url}{cluster_config.HEALTH_PATH}", timeout=5).status_code)
        if code == 0 and 1 in readiness:
            break
    print(f"readiness {readiness} and /ping {sorted(liveness)} over {time.monotonic() - killed:.1f} s after the kill")
    assert readiness in ([0, 1, 0], [1, 0]), readiness
    assert liveness == {200}, liveness
    assert server.predict(model, "back again").status_code == 200


def _can_make_the_root_read_only() -> bool:
    """Whether this machine lets a test remount / read-only in a private mount namespace (root with CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        return False
    probe = "mount --make-rprivate / && mount --rbind / / && mount -o remount,bind,ro / && ! touch /.ro-probe"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _can_make_the_root_read_only(), reason="needs unshare -m and mount (root, CAP_SYS_ADMIN)")
def test_torchserve_serves_with_a_read_only_root_and_only_the_image_s_writable_directory(tmp_path, kserve_layout):
    """As in the pod: / read-only, one empty writable directory standing for the /tmp emptyDir, the image's ENV."""
    from tests.deploy.manifests import dockerfile_env, dockerfile_stages
    from tooling.torchserve import free_port, java_home

    layout, _ = kserve_layout
    writable = tmp_path / "tmp"  # becomes an empty tmpfs: the pod's emptyDir at /tmp
    writable.mkdir()
    ports = [free_port() for _ in range(5)]
    properties = cluster_config.cluster_properties(
        "bert",
        root=str(layout),
        inference_address=f"http://127.0.0.1:{ports[0]}",
        management_address=f"http://127.0.0.1:{ports[1]}",
        metrics_address=f"http://127.0.0.1:{ports[2]}",
        grpc_inference_port=ports[3],
        grpc_management_port=ports[4],
    )
    config = cluster_config.write_properties(properties, tmp_path / "config.properties")
    image_env = dockerfile_env(dockerfile_stages()["runtime"])
    env = {key: value.replace("/tmp", str(writable), 1) for key, value in image_env.items() if key != "JAVA_HOME"}
    env.update(JAVA_HOME=java_home(), PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    command = [
        "torchserve", "--start", "--foreground", "--ncs",
        "--model-store", properties["model_store"], "--ts-config", str(config),
    ]  # fmt: skip
    script = (
        "mount --make-rprivate / && mount --rbind / / && mount -o remount,bind,ro / && "
        f"mount -t tmpfs -o size=1g tmpfs {writable} && cd {writable} && exec env -i "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        + " "
        + " ".join(command)
    )
    console = tmp_path / "console.log"
    with console.open("wb") as out:
        process = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        inference = properties["inference_address"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _model_ready(config).returncode != 0:
            assert process.poll() is None, console.read_text()[-3000:]
            time.sleep(0.5)
        assert _model_ready(config).returncode == 0, console.read_text()[-3000:]
        answer = requests.post(f"{inference}/predictions/bert", data=b"a quiet clean room", timeout=30)
        assert answer.status_code == 200, answer.text
        assert "Read-only file system" not in console.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
