"""scripts/ports_free.py, what serve.sh asks before it starts TorchServe, on real listeners and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tooling.paths import REPO
from tooling.torchserve import ADDRESS_KEYS, free_port


@pytest.fixture
def properties(tmp_path):
    """A configuration whose five addresses are free ports."""
    ports = {key: free_port() for key in ADDRESS_KEYS}
    lines = [
        f"{key}=http://127.0.0.1:{port}" if key.endswith("_address") else f"{key}={port}" for key, port in ports.items()
    ]
    path = tmp_path / "config.properties"
    path.write_text("\n".join(lines) + "\n")
    return path, ports


def ports_free(properties_file, tmp_path) -> subprocess.CompletedProcess:
    # TMPDIR: where TorchServe keeps its pid file, as scripts/runtime_env.sh sets it.
    return subprocess.run(
        [sys.executable, "-m", "scripts.ports_free", "--properties", str(properties_file)],
        cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_free_ports_pass_and_a_listener_on_one_is_named_with_its_setting_and_process(properties, tmp_path):
    path, ports = properties
    free = ports_free(path, tmp_path)
    assert free.returncode == 0 and not free.stderr, free.stderr
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports["management_address"]))
        listener.listen()
        taken = ports_free(path, tmp_path)
    assert taken.returncode == 1, taken.stderr
    port = ports["management_address"]
    assert taken.stderr.startswith(f"port {port} (management_address in {path}) is taken by pid {os.getpid()} ("), (
        taken.stderr
    )
    assert len(taken.stderr.splitlines()) == 1, taken.stderr  # the four free ones are not named


def fake_torchserve(tmpdir) -> subprocess.Popen:
    """A process whose command line has what a TorchServe frontend's has that running_torchserve reads: its main
    class and its Java temp dir (TorchServe's launcher passes TEMP)."""
    command = ["import time; time.sleep(60)", f"-Djava.io.tmpdir={tmpdir}", "org.pytorch.serve.ModelServer"]
    return subprocess.Popen([sys.executable, "-c", *command])


def test_this_checkouts_running_torchserve_holding_the_ports_passes(properties, tmp_path):
    """The pid file names a live TorchServe (its main class on its command line, as `torchserve --start` itself
    checks) whose Java temp dir is the pid file's folder: the one that wrote it. serve.sh goes on to talk to it."""
    path, ports = properties
    ours, other = fake_torchserve(tmp_path), fake_torchserve(tmp_path / "elsewhere")
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", ports["inference_address"]))
            listener.listen()
            (tmp_path / ".model_server.pid").write_text(str(ours.pid))
            assert ports_free(path, tmp_path).returncode == 0
            (tmp_path / ".model_server.pid").write_text(str(os.getpid()))  # alive, but not a TorchServe
            assert ports_free(path, tmp_path).returncode == 1
            # The pid reused by another TorchServe (a fleet replica, a test's, another checkout's): not this one.
            (tmp_path / ".model_server.pid").write_text(str(other.pid))
            assert ports_free(path, tmp_path).returncode == 1
    finally:
        for server in (ours, other):
            server.kill()
            server.wait()
