"""tooling.torchserve.TorchServe's start, stop and wait for a model, where they cannot succeed: a launcher that exits
or does not answer in time is said at once and leaves nothing running (the benchmark, the soak and the fleet start
servers through it), and a model that never gets ready is named with what was last seen. The launcher here is the
real `torchserve`, stopped before it starts Java; the management API a local HTTP server."""

from __future__ import annotations

import os
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.support import serving_http
from tooling.torchserve import TorchServe


def open_in_this_process(path: Path) -> bool:
    fds = Path("/proc/self/fd")
    return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir() if fd.is_symlink())


def test_a_launcher_that_exits_at_once_is_said_with_its_log_and_its_log_is_closed(tmp_path):
    """Here the model store is missing, which the launcher refuses before it starts Java. What a killed server of the
    same folder left unpacked is cleared before the launch (tooling/torchserve.clear_unpacked_archives)."""
    left = tmp_path / "server" / "tmp" / "models" / "unpacked-by-a-killed-server"
    left.mkdir(parents=True)
    server = TorchServe(tmp_path / "server", tmp_path / "no-store")
    with pytest.raises(RuntimeError, match=r"^torchserve exited early; the end of .*/server/console\.log:\n") as raised:
        server.start(timeout=120)
    console = (tmp_path / "server" / "console.log").resolve()
    assert "--model-store directory not found" in console.read_text()
    assert "--model-store directory not found" in str(raised.value)  # the cause, in what is raised
    assert not open_in_this_process(console), "the console log is still open after the failed start"
    assert not left.exists(), "a start left what a killed server of its folder had unpacked"


def test_a_launcher_that_does_not_answer_in_time_is_stopped(tmp_path):
    (tmp_path / "store").mkdir()
    server = TorchServe(tmp_path / "server", tmp_path / "store")
    spawned: list[subprocess.Popen] = []
    try:
        with pytest.raises(TimeoutError, match=r"^torchserve did not answer /ping within 0s$"):
            server.start(timeout=0, on_spawn=spawned.append)  # no time to answer: it is stopped at once
        [launcher] = spawned
        assert launcher.poll() is not None, "the launcher runs on after the failed start"
    finally:
        server.stop()  # what it started, by its process group, if the start left it running


def test_stopping_a_server_never_started_or_stopped_already_does_nothing(tmp_path):
    """An owner's cleanup (a fixture's, the fleet's) stops what it may not have started, or stopped already."""
    server = TorchServe(tmp_path / "server", tmp_path / "store")
    server.stop()
    server.stop()


class Management(BaseHTTPRequestHandler):
    """GET /models/NAME: 404 (TorchServe's answer for a model it does not know yet) `unknown_for` times, then one READY
    worker; never ready while `unknown_for` is None."""

    unknown_for: int | None = 0
    asked = 0

    def do_GET(self) -> None:
        cls = type(self)
        cls.asked += 1
        known = cls.unknown_for is not None and cls.asked > cls.unknown_for
        body = b'[{"workers": [{"status": "READY"}]}]' if known else b'{"code": 404, "message": "Model not found"}'
        self.send_response(200 if known else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def server_asking(tmp_path: Path, url: str) -> TorchServe:
    """A TorchServe object (not started) whose management API is at `url`, without keys."""
    overrides = {"management_address": url, "disable_token_authorization": "true"}
    return TorchServe(tmp_path / "server", tmp_path / "store", overrides=overrides)


def test_waiting_for_a_model_asks_again_while_the_server_does_not_know_it_yet(tmp_path):
    handler = type("NotYetKnown", (Management,), {"unknown_for": 2, "asked": 0})
    with serving_http(handler) as url:
        server_asking(tmp_path, url).wait_until_ready("bert", timeout=30)
    assert handler.asked == 3


def test_a_model_never_ready_is_named_with_what_was_last_seen(tmp_path):
    handler = type("NeverKnown", (Management,), {"unknown_for": None, "asked": 0})
    with serving_http(handler) as url, pytest.raises(TimeoutError) as waited:
        server_asking(tmp_path, url).wait_until_ready("bert", timeout=0.5)
    assert str(waited.value).startswith("bert has no ready worker after 0.5s (last: HTTPError('404 Client Error")
