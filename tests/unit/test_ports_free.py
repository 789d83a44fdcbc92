"""scripts/ports_free.py, what serve.sh asks before it starts TorchServe, on real listeners and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from tooling.paths import REPO
from tooling.torchserve import ADDRESS_KEYS, PID_FILE_NAME, free_port, pid_file


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
    # The pid file in tmp_path, the folder the fake servers below name as their Java temp dir.
    command = [sys.executable, "-m", "scripts.ports_free", "--properties", str(properties_file)]
    return subprocess.run(
        [*command, "--pid-file", str(tmp_path / PID_FILE_NAME)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_checkouts_pid_file_is_where_its_server_writes_it_whatever_this_processs_tmpdir(monkeypatch, tmp_path):
    # serve.sh and stop.sh start TorchServe with TMPDIR=logs/tmp (scripts/runtime_env.sh); a command run by hand
    # has another TMPDIR, and found no server of this checkout, so named its own server's ports as taken.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert pid_file() == REPO / "logs" / "tmp" / PID_FILE_NAME
    assert 'TMPDIR="$PWD/logs/tmp"' in (REPO / "scripts" / "runtime_env.sh").read_text()


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
            (tmp_path / PID_FILE_NAME).write_text(str(ours.pid))
            assert ports_free(path, tmp_path).returncode == 0
            (tmp_path / PID_FILE_NAME).write_text(str(os.getpid()))  # alive, but not a TorchServe
            assert ports_free(path, tmp_path).returncode == 1
            # The pid reused by another TorchServe (a fleet replica, a test's, another checkout's): not this one.
            (tmp_path / PID_FILE_NAME).write_text(str(other.pid))
            assert ports_free(path, tmp_path).returncode == 1
    finally:
        for server in (ours, other):
            server.kill()
            server.wait()
