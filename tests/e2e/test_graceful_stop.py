"""The image's entry command (Dockerfile ENTRYPOINT + CMD), run as a real process on the generated
cluster layout: SIGTERM under load, and every request admitted before it is answered.

A container ends when its entry command does: everything left of it is then killed. The test does
the same after the entry command exits, so a command that exits before answering loses requests here
as it would in a pod.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from tests.deploy.manifests import dockerfile_stages, exec_form
from tooling.paths import REPO

pytestmark = pytest.mark.e2e

MODEL = "bert"
SLOW = "slow"  # the test-only fault hook: a batch holding this text stalls
STALL_S = 0.4
BATCH = 4
REQUESTS = 24  # 6 batches, each stalled: seconds of work queued when SIGTERM comes


def entry_command(config: Path, model_store: Path) -> list[str]:
    """The runtime stage's ENTRYPOINT + CMD with the image's paths mapped onto this machine."""
    runtime = dockerfile_stages()["runtime"]
    [entrypoint] = [exec_form(a) for k, a in runtime if k == "ENTRYPOINT"]
    [cmd] = [exec_form(a) for k, a in runtime if k == "CMD"]
    tini = shutil.which("tini")
    paths = {
        "/usr/bin/tini": tini,
        "python3": sys.executable,
        "/usr/local/bin/graceful_stop.py": str(REPO / "deploy" / "docker" / "graceful_stop.py"),
        "torchserve": str(Path(sys.executable).with_name("torchserve")),
        "/mnt/models/model-store": str(model_store),
        "/mnt/models/config/config.properties": str(config),
        "/usr/local/etc/torchserve/log4j2.xml": str(REPO / "deploy" / "docker" / "log4j2.xml"),
    }
    command = [paths.get(part, part) for part in entrypoint + cmd]
    if tini is None:  # tini only hands the signal on to its child: without it, signal that child directly
        assert command[:2] == [None, "--"], command
        command = command[2:]
    return command


@pytest.fixture(scope="module")
def layout(tiny_checkpoint, make_archive, model_store, tmp_path_factory):
    """The generated cluster layout for a model whose batches stall, with free loopback ports."""
    from tests.support import server_from_layout
    from tooling.cluster_config import build_kserve_layout

    archive = make_archive(tiny_checkpoint, "graceful-tiny", fault_marker=SLOW, fault_delay_s=STALL_S)
    root = tmp_path_factory.mktemp("mnt-models")
    config = build_kserve_layout(
        model_store / archive, root, MODEL, root=str(root), batch_size=BATCH, max_batch_delay=50, response_timeout=30
    )
    # Only free ports and the configuration are written here; the entry command starts the server.
    return server_from_layout(tmp_path_factory.mktemp("graceful"), root, config)


def _wait_until_ready(server, entry: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert entry.poll() is None, "the entry command exited while starting"
        with contextlib.suppress(requests.RequestException):
            if server.model_ready(MODEL):
                return
        time.sleep(0.5)
    raise TimeoutError(f"{MODEL} not ready after {timeout}s")


def _kill_what_is_left(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def test_sigterm_under_load_answers_every_admitted_request(layout):
    from tooling.prometheus import metric_value
    from tooling.torchserve import server_environment

    server = layout
    command = entry_command(server.config_path, server.model_store)
    log = open(server.workdir / "entry.log", "wb")  # noqa: SIM115 - closed below
    entry = subprocess.Popen(
        command, cwd=server.workdir, env=server_environment(server.workdir), stdout=log, stderr=subprocess.STDOUT
    )
    tree: list[psutil.Process] = []
    try:
        _wait_until_ready(server, entry)
        tree = psutil.Process(entry.pid).children(recursive=True)
        url = f"{server.inference_url}/predictions/{MODEL}"
        texts = [f"{SLOW} review {i}: the room was lovely" for i in range(REQUESTS)]
        with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
            futures = [
                pool.submit(requests.post, url, data=t.encode(), headers={"Content-Type": "text/plain"}, timeout=60)
                for t in texts
            ]
            # Every request admitted (counted by the frontend), and most of them still unanswered.
            while metric_value(server.metrics_text(), "ts_inference_requests_total", model_name=MODEL) < REQUESTS:
                time.sleep(0.05)
            answered = sum(f.done() for f in futures)
            assert answered < REQUESTS - BATCH, "the load was answered before SIGTERM: nothing was in flight"
            entry.send_signal(signal.SIGTERM)
            code = entry.wait(timeout=120)
            # The container ends with its entry command: nothing of it outlives that.
            _kill_what_is_left(tree)
            results = [f.result() if not f.exception() else f.exception() for f in futures]
    finally:
        if entry.poll() is None:
            entry.kill()
            entry.wait()
        _kill_what_is_left(tree)
        log.close()
    output = (server.workdir / "entry.log").read_text(errors="replace")
    failed = [r for r in results if not isinstance(r, requests.Response) or r.status_code != 200]
    print(f"\n{answered} of {REQUESTS} answered when SIGTERM came; exit code {code}")
    assert not failed, (failed[:3], output[-3000:])
    assert all(r.json()["label"] for r in results)
    assert code == 0, output[-3000:]
    assert "drained: every admitted request is answered" in output
    # The image's logging: everything on standard output (the access log included), no file written.
    assert "ACCESS_LOG" in output and "/predictions/" in output
    assert not list((server.workdir / "logs").rglob("*.log*")), "log files written under LOG_LOCATION"
