"""tooling.torchserve.RunningServer: how the scripts reach a server started elsewhere, from its config and key file;
running_torchserve and scripts/stop.sh: which server its pid file names, and stopping only that one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest
import requests

from tooling.paths import REPO, SERVER_CONFIG
from tooling.torchserve import TORCHSERVE_MAIN, RunningServer, key_expiry, running_torchserve


def write_server(folder: Path, properties: dict[str, str], keys: dict | None) -> tuple[Path, Path]:
    config = folder / "config.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    key_file = folder / "key_file.json"
    if keys is not None:
        key_file.write_text(json.dumps(keys))
    return config, key_file


def keys(inference: str, management: str = "m1") -> dict:
    stamp = "2999-01-01T00:00:00.123456789Z"
    return {
        "management": {"key": management, "expiration time": stamp},
        "inference": {"key": inference, "expiration time": stamp},
        "API": {"key": "api"},
    }


def test_addresses_store_and_lifetime_come_from_the_config_relative_to_where_the_server_started(tmp_path):
    config, key_file = write_server(
        tmp_path, {"management_address": "http://127.0.0.1:9081", "model_store": "store", "token_expiration_min": "5"},
        keys("i1"),
    )  # fmt: skip
    server = RunningServer.from_files(config, key_file)
    assert server.management_url == "http://127.0.0.1:9081"
    assert server.inference_url == "http://127.0.0.1:8080"  # TorchServe's default
    assert server.model_store == (tmp_path / "store").resolve()
    assert server.key_lifetime_min == 5.0
    assert server.headers("inference") == {"Authorization": "Bearer i1"}


def test_a_missing_key_file_is_an_error_unless_the_config_turns_authorization_off(tmp_path):
    config, key_file = write_server(tmp_path, {}, None)
    with pytest.raises(FileNotFoundError, match="is the server running"):
        RunningServer.from_files(config, key_file)
    config, key_file = write_server(tmp_path, {"disable_token_authorization": "true"}, None)
    assert RunningServer.from_files(config, key_file).headers("management") == {}


class RotatingServer:
    """Stands in for requests.Session against a TorchServe whose key is rotated by the first call's refusal:
    it holds `held`, and rewrites the key file to it when it first refuses another key."""

    def __init__(self, key_file: Path, held: str) -> None:
        self.key_file, self.held, self.sent = key_file, held, []

    def request(self, method: str, url: str, headers: dict, **kwargs) -> requests.Response:
        self.sent.append(headers["Authorization"])
        response = requests.Response()
        if headers["Authorization"] == f"Bearer {self.held}":
            response.status_code, response._content = 200, b"{}"
        else:
            response.status_code = 400
            response._content = b'{"code": 400, "type": "InvalidKeyException", "message": "Token ..."}'
            self.key_file.write_text(json.dumps(keys(self.held)))
        return response


def test_a_call_refused_during_a_rotation_is_made_again_with_the_new_key(tmp_path):
    config, key_file = write_server(tmp_path, {}, keys("old"))
    server = RunningServer.from_files(config, key_file)
    session = RotatingServer(key_file, held="new")
    response = server.request(session, "GET", "http://127.0.0.1:8080/ping", "inference", timeout=1)
    assert response.status_code == 200 and session.sent == ["Bearer old", "Bearer new"]


def test_a_key_refused_and_not_rotated_is_not_tried_again(tmp_path):
    config, key_file = write_server(tmp_path, {}, keys("old"))
    server = RunningServer.from_files(config, key_file)
    session = RotatingServer(key_file, held="old-but-expired")
    key_file.write_text(json.dumps(keys("old")))
    session.key_file = tmp_path / "elsewhere.json"  # the server's refusal rotates nothing this client reads
    response = server.request(session, "GET", "http://127.0.0.1:8080/ping", "inference", timeout=1)
    assert response.status_code == 400 and session.sent == ["Bearer old"]


@pytest.mark.parametrize("fraction", ["", ".1", ".123", ".123456", ".123456789"])
def test_key_expiry_reads_javas_instants(fraction):
    expected = datetime(2026, 11, 24, 13, 35, 48, int((fraction[1:] + "000000")[:6] or 0), tzinfo=timezone.utc)
    assert key_expiry(f"2026-11-24T13:35:48{fraction}Z") == expected


def fake_torchserve(tmpdir: Path) -> subprocess.Popen:
    """A process with what running_torchserve reads of a TorchServe frontend's command line: its main class and its
    Java temp dir (TorchServe's launcher passes TEMP)."""
    command = ["import time; time.sleep(60)", f"-Djava.io.tmpdir={tmpdir}", "org.pytorch.serve.ModelServer"]
    process = subprocess.Popen([sys.executable, "-c", *command])
    # Until it has exec'd, the child's command line is still this test process's (seen on a loaded machine, with
    # the suite's workers side by side): wait for its own, as a TorchServe has it before it writes its pid file.
    deadline = time.monotonic() + 10
    while TORCHSERVE_MAIN not in psutil.Process(process.pid).cmdline() and time.monotonic() < deadline:
        time.sleep(0.01)
    return process


@pytest.fixture
def servers():
    """Starts fake TorchServes (fake_torchserve), each killed at the end."""
    started: list[subprocess.Popen] = []

    def start(tmpdir: Path) -> subprocess.Popen:
        started.append(fake_torchserve(tmpdir))
        return started[-1]

    yield start
    for server in started:
        server.kill()
        server.wait()


def test_the_pid_file_names_this_checkouts_server_only_if_that_server_wrote_it(tmp_path, servers):
    pid_file = tmp_path / "tmp" / ".model_server.pid"
    pid_file.parent.mkdir()
    pid_file.write_text(str(servers(tmp_path / "tmp").pid))
    assert running_torchserve(pid_file).pid == int(pid_file.read_text())
    (tmp_path / "link").symlink_to(tmp_path / "tmp")  # the same folder by another path
    assert running_torchserve(tmp_path / "link" / ".model_server.pid") is not None
    pid_file.write_text(str(servers(tmp_path / "other").pid))  # the pid reused by another TorchServe
    assert running_torchserve(pid_file) is None
    pid_file.write_text(str(os.getpid()))  # by a process that is no TorchServe
    assert running_torchserve(pid_file) is None


# Stands in for `torchserve --stop --foreground`, as TorchServe 0.12 does it: terminates the process the pid file
# names (unless IGNORED: a server that outlives its 60 s wait) and removes the file either way.
TORCHSERVE = """#!/bin/sh
echo "torchserve $*" >>"$LOG"
[ -n "${IGNORED:-}" ] || kill "$(cat logs/tmp/.model_server.pid)"
rm -f logs/tmp/.model_server.pid
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """What stop.sh runs: scripts/, tooling/, config.properties, and a .venv whose python is the repository's and
    whose torchserve is the stand-in above."""
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("scripts", "tooling"):
        shutil.copytree(REPO / folder, checkout / folder, ignore=ignore)
    shutil.copy(SERVER_CONFIG, checkout / SERVER_CONFIG.name)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec {REPO / ".venv" / "bin" / "python"} "$@"\n')
    (checkout / ".venv" / "bin" / "torchserve").write_text(TORCHSERVE)
    for name in ("python", "torchserve"):
        (checkout / ".venv" / "bin" / name).chmod(0o755)
    (checkout / "logs" / "tmp").mkdir(parents=True)
    return checkout


def stop_sh(checkout: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOG": str(checkout.parent / "calls.log"), **variables}
    return subprocess.run(
        ["bash", "scripts/stop.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )


def gone(server: subprocess.Popen) -> bool:
    return not psutil.pid_exists(server.pid) or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE


def test_stop_sh_leaves_another_torchserve_its_pid_file_names_alone(checkout, servers):
    """The pid reused by another TorchServe: it runs on, and the stale file, which would keep `torchserve --start`
    from starting this checkout's, is removed."""
    other = servers(checkout.parent / "elsewhere")
    pid_file = checkout / "logs" / "tmp" / ".model_server.pid"
    pid_file.write_text(str(other.pid))
    stop = stop_sh(checkout)
    assert stop.returncode == 0, stop.stderr
    assert not gone(other) and not (checkout.parent / "calls.log").exists() and not pid_file.exists()
    assert f"named pid {other.pid}, not this checkout's TorchServe" in stop.stdout, stop.stdout


def test_stop_sh_stops_this_checkouts_torchserve_and_fails_when_it_outlives_the_stop(checkout, servers):
    pid_file = checkout / "logs" / "tmp" / ".model_server.pid"
    ours = servers(checkout / "logs" / "tmp")
    pid_file.write_text(str(ours.pid))
    stop = stop_sh(checkout)
    assert stop.returncode == 0 and stop.stdout.endswith("stop: done\n") and gone(ours), stop.stdout + stop.stderr
    lasting = servers(checkout / "logs" / "tmp")
    pid_file.write_text(str(lasting.pid))
    stop = stop_sh(checkout, IGNORED="1")
    assert stop.returncode == 1 and "stop: done" not in stop.stdout, stop.stdout
    assert f"stop: TorchServe (pid {lasting.pid}) still runs after torchserve --stop" in stop.stderr
    assert not gone(lasting)


def test_a_key_file_that_is_not_json_stops_a_command_in_one_line(tmp_path, capsys):
    """The commands reach a running server through tooling.torchserve.running_server, which reads the key file
    before anything is sent: a file that is not TorchServe's is said in one line (exit 2), not a traceback later."""
    from scripts import rotate_keys

    config, key_file = write_server(tmp_path, {}, None)
    key_file.write_text("not json")
    with pytest.raises(SystemExit) as stopped:
        rotate_keys.main(["--config", str(config), "--key-file", str(key_file)])
    said = capsys.readouterr().err
    assert stopped.value.code == 2, said
    assert f"error: {key_file} is not a TorchServe key file (JSON)" in said and "Traceback" not in said


def test_a_rotation_the_server_refuses_is_said_and_fails_the_command(tmp_path, capsys):
    """From cron, a refused rotation (a wrong API key: 400 InvalidKeyException) must fail loudly, or the keys lapse an
    hour later with nothing said. A real HTTP server here answers POST /token as TorchServe refuses it."""
    from http.server import BaseHTTPRequestHandler

    from scripts import rotate_keys
    from tests.support import serving_http

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b'{"code": 400, "type": "InvalidKeyException", "message": "Token is not valid"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    with serving_http(Refusing) as url:
        config, key_file = write_server(tmp_path, {"management_address": url}, keys("old"))
        assert rotate_keys.main(["--config", str(config), "--key-file", str(key_file)]) == 1
    said = capsys.readouterr()
    assert "the inference key was not rotated (HTTP 400: " in said.err and "InvalidKeyException" in said.err
    assert "rotated;" not in said.out


def test_a_command_pointed_at_a_config_that_is_not_there_says_how_to_start_the_server(tmp_path, capsys):
    from scripts import rotate_keys

    absent = tmp_path / "config.properties"
    with pytest.raises(SystemExit) as stopped:
        rotate_keys.main(["--config", str(absent), "--key-file", str(tmp_path / "key_file.json")])
    said = capsys.readouterr().err
    assert stopped.value.code == 2, said
    assert f"error: {absent} is not there: start the server with scripts/serve.sh, or name its config" in said, said


def test_a_command_for_a_server_without_its_key_file_stops_in_one_line(tmp_path, capsys):
    """The server is not running (it writes key_file.json where it starts), or was started elsewhere."""
    from scripts import rotate_keys

    config, key_file = write_server(tmp_path, {}, None)
    with pytest.raises(SystemExit) as stopped:
        rotate_keys.main(["--config", str(config), "--key-file", str(key_file)])
    said = capsys.readouterr().err
    assert stopped.value.code == 2, said
    assert f"error: no key file {key_file}: is the server running" in said and "Traceback" not in said, said


def test_rotate_keys_on_a_server_without_token_authorization_fails_and_asks_nothing(tmp_path, capsys):
    """From cron against a server whose config turns authorization off: said, and no POST /token sent."""
    from scripts import rotate_keys
    from tests.support import answering_every_call, serving_http

    asked: list[str] = []
    with serving_http(answering_every_call(asked=asked)) as url:
        config, key_file = write_server(
            tmp_path, {"management_address": url, "disable_token_authorization": "true"}, None
        )
        assert rotate_keys.main(["--config", str(config), "--key-file", str(key_file)]) == 1
    said = capsys.readouterr().err
    assert "the server's configuration turns token authorization off: it has no keys" in said, said
    assert asked == []


def test_rotate_keys_fails_in_one_line_when_the_server_does_not_answer(tmp_path, capsys):
    """Stopped, or not yet up: cron's mail says so in one line, and the command fails."""
    from scripts import rotate_keys
    from tooling.torchserve import free_port

    config, key_file = write_server(tmp_path, {"management_address": f"http://127.0.0.1:{free_port()}"}, keys("old"))
    assert rotate_keys.main(["--config", str(config), "--key-file", str(key_file)]) == 1
    said = capsys.readouterr()
    assert said.err.startswith("rotate_keys: ") and "Connection refused" in said.err, said.err
    assert "Traceback" not in said.err and "rotated;" not in said.out
