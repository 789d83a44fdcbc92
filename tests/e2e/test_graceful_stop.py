"""The image's entry command (Dockerfile ENTRYPOINT + CMD), run as a real process on the generated
cluster layout: SIGTERM under load, and every request admitted before it is answered.

A container ends when its entry command does: everything left of it is then killed. The test does
the same after the entry command exits, so a command that exits before answering loses requests here
as it would in a pod.
"""

from __future__ import annotations

import contextlib
import os
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
MARKER = "POD-QUERY-MARKER-93b0d4"  # a text sent in a query string: never on the pod's standard output


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


def _stop_entry(entry: subprocess.Popen, seen: list[psutil.Process]) -> None:
    """Whatever is left of the entry command, however far the test got (a start that failed included): the entry's
    own process group (it runs in a session of its own), each group led by a process of its tree (tini gives its
    child a group, graceful_stop.py gives TorchServe a session of its own), then each process seen, by pid."""
    if entry.poll() is None:  # not reaped yet, so its pid is still this test's child: its tree is read now
        with contextlib.suppress(psutil.NoSuchProcess):
            seen = [*seen, *psutil.Process(entry.pid).children(recursive=True)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(entry.pid, signal.SIGKILL)
        entry.wait()
    for process in seen:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if process.is_running() and os.getpgid(process.pid) == process.pid:  # still that process, a group leader
                os.killpg(process.pid, signal.SIGKILL)
    _kill_what_is_left(seen)


def test_sigterm_under_load_answers_every_admitted_request(layout):
    from tests.support import umask_of
    from tooling.processes import java_frontend
    from tooling.prometheus import metric_value
    from tooling.torchserve import IGNORED_VARIABLES, server_environment

    server = layout
    command = entry_command(server.config_path, server.model_store)
    log = open(server.workdir / "entry.log", "wb")  # noqa: SIM115 - closed below
    # Set on the pod, they would replace the configuration (a file that is not there: TorchServe would not start)
    # and turn the Open Inference mode on; the entry command starts TorchServe without them.
    planted = {"TS_CONFIG_FILE": str(server.workdir / "absent.properties"), "TS_OPEN_INFERENCE_PROTOCOL": "oip"}
    # What a TorchServe of this pod killed before (out of memory) left unpacked in the /tmp emptyDir, which outlives
    # the container: the entry command clears it before it starts TorchServe.
    left = server.workdir / "tmp" / "models" / "unpacked-by-a-killed-server"
    left.mkdir(parents=True)
    entry = subprocess.Popen(
        command, cwd=server.workdir, env={**server_environment(server.workdir), **planted}, stdout=log,
        stderr=subprocess.STDOUT, umask=0o022,  # a shell's usual umask: the entry command sets its own for TorchServe
        start_new_session=True,  # a process group of its own: stopped whole below, whatever happens
    )  # fmt: skip
    tree: list[psutil.Process] = []
    try:
        _wait_until_ready(server, entry)
        tree = psutil.Process(entry.pid).children(recursive=True)
        assert not left.exists() and list((server.workdir / "tmp" / "models").glob("*/MAR-INF")), "unpacked archives"
        java = java_frontend(entry.pid)
        assert umask_of(java.pid) == "0077"
        assert not [name for name in IGNORED_VARIABLES if name in java.environ()]
        url = f"{server.inference_url}/predictions/{MODEL}"
        # A text in a query string, which /invocations hands to the handler: classified, and in no log line.
        invoked = {"model_name": MODEL, "text": MARKER}
        queried = requests.post(f"{server.inference_url}/invocations", params=invoked, timeout=60)
        assert queried.status_code == 200 and queried.json()["label"], queried.text
        admitted_before = metric_value(server.metrics_text(), "ts_inference_requests_total", model_name=MODEL)
        # The workers are frozen (SIGSTOP) while the load is admitted and let go just after the SIGTERM: every request
        # is in flight or queued when the signal comes, however slowly this machine gets there. Timed alone, a test
        # stalled for the 2 s the six slow batches take would have found the load answered before the signal.
        workers = [p for p in java.children(recursive=True) if "model_service_worker" in " ".join(p.cmdline())]
        assert workers, java.children(recursive=True)
        for worker in workers:
            worker.suspend()
        texts = [f"{SLOW} review {i}: the room was lovely" for i in range(REQUESTS)]
        with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
            futures = [
                pool.submit(requests.post, url, data=t.encode(), headers={"Content-Type": "text/plain"}, timeout=60)
                for t in texts
            ]
            # Every request admitted (counted by the frontend), and most of them still unanswered.
            admitted, deadline = admitted_before + REQUESTS, time.monotonic() + 60
            while (
                metric_value(text := server.metrics_text(), "ts_inference_requests_total", model_name=MODEL) < admitted
            ):
                if time.monotonic() > deadline:
                    counted = [line for line in text.splitlines() if "ts_inference_requests_total" in line]
                    pytest.fail(f"{REQUESTS} requests not all admitted within 60s (expected {admitted:.0f}): {counted}")
                time.sleep(0.05)
            answered = sum(f.done() for f in futures)
            assert answered == 0, "a frozen worker answered: nothing was in flight"
            entry.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.resume()
            code = entry.wait(timeout=120)
            # The container ends with its entry command: nothing of it outlives that.
            _kill_what_is_left(tree)
            results = [f.result() if not f.exception() else f.exception() for f in futures]
    finally:
        _stop_entry(entry, tree)
        log.close()
    output = (server.workdir / "entry.log").read_text(errors="replace")
    failed = [r for r in results if not isinstance(r, requests.Response) or r.status_code != 200]
    print(f"\n{answered} of {REQUESTS} answered when SIGTERM came; exit code {code}")
    assert not failed, (failed[:3], output[-3000:])
    assert all(r.json()["label"] for r in results)
    assert code == 0, output[-3000:]
    assert "drained: every admitted request is answered" in output
    # The image's logging: everything on standard output (the access log included), no file written; the query
    # string of a request redacted (on /invocations TorchServe hands every query parameter to the handler).
    assert "ACCESS_LOG" in output and "/predictions/" in output
    assert '"POST /invocations?<redacted> HTTP/1.1" 200' in output
    assert MARKER not in output
    assert not list((server.workdir / "logs").rglob("*.log*")), "log files written under LOG_LOCATION"
