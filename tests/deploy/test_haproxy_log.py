"""What the fleet's HAProxy logs: a failed request, without its query string, where a text sent as `?text=...` would
be; not a replica's own 503, which an overload sheds by the thousand.

A real haproxy, rendered from deploy/fleet/haproxy.cfg.template by tooling/fleet_config.py, its standard output
(the fleet's logs/fleet/haproxy.log, which nothing rotates) in a file, in front of a replica address: one where
nothing listens, or a stand-in replica. Only what the template's `option dontlog-normal` leaves is logged.
"""

from __future__ import annotations

import contextlib
import http.server
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support import serving_http
from tooling.fleet_config import haproxy_config
from tooling.torchserve import free_port

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")

MARKER = "HAPROXY-MARKER-41c7e2"
REQUEST_LINE = '"POST /predictions/bert HTTP/1.1"'


@contextlib.contextmanager
def haproxy_in_front_of(tmp_path: Path, replica_port: int) -> Iterator[tuple[str, Path]]:
    """The fleet's HAProxy with one replica at `replica_port`, started and stopped here: (its front URL, its log)."""
    front_port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(
        servers={"r0": (f"127.0.0.1:{replica_port}", replica_port)}, model="bert", front_port=front_port,
        stats_port=free_port(), socket_path=tmp_path / "admin.sock", response_timeout=60, retries=1,
    ))  # fmt: skip
    log = tmp_path / "haproxy.log"
    with log.open("wb") as out:
        process = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{front_port}", log
    finally:
        process.terminate()
        process.wait(timeout=10)


def post_when_listening(url: str, **request) -> requests.Response:
    deadline = time.monotonic() + 30
    while True:
        try:
            return requests.post(url, timeout=10, **request)
        except requests.ConnectionError:  # HAProxy not listening yet
            assert time.monotonic() < deadline, "HAProxy did not listen"
            time.sleep(0.1)


def logged_lines(log: Path, until: str) -> list[str]:
    """The request lines of `log` once one holds `until` (HAProxy writes a line as its request ends), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in log.read_text().splitlines() if REQUEST_LINE in line]
        if any(until in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_a_failed_request_is_logged_without_its_query_string(tmp_path):
    with haproxy_in_front_of(tmp_path, free_port()) as (front, log):  # nothing listens on the replica's port
        answer = post_when_listening(f"{front}/predictions/bert", params={"text": MARKER}, data=b"")
        assert answer.status_code == 503
        logged_lines(log, until=" 503 ")
    written = log.read_text()
    assert MARKER not in written, written
    assert REQUEST_LINE in written, written  # the request is logged, without its query


class Replica(http.server.BaseHTTPRequestHandler):
    """Ready for HAProxy's check; a prediction answered with the status its body names."""

    def do_GET(self) -> None:
        self._answer(200, b'[{"status": "READY"}]')

    def do_POST(self) -> None:
        self._answer(int(self.rfile.read(int(self.headers["Content-Length"]))), b"{}")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_replicas_own_503_is_not_logged_and_its_other_errors_are(tmp_path):
    """A replica's 503 (its queue full, or a request past its deadline: shed on purpose under overload) is in its own
    access log, which rotates, and counted on /metrics; in haproxy.log a sustained overload would add a line a shed
    request, without bound. Its 500 is logged, as HAProxy's own 503 is (the test above)."""
    with (
        serving_http(Replica) as replica,
        haproxy_in_front_of(tmp_path, int(replica.rsplit(":", 1)[1])) as (front, log),
    ):
        deadline = time.monotonic() + 30
        while post_when_listening(f"{front}/predictions/bert", data=b"200").status_code != 200:  # r0 checked UP
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        shed = [post_when_listening(f"{front}/predictions/bert", data=b"503").status_code for _ in range(20)]
        failed = post_when_listening(f"{front}/predictions/bert", data=b"500").status_code
        assert (set(shed), failed) == ({503}, 500)
        # The replica's answers only: HAProxy answered 503 itself (logged) until its checks found r0 UP.
        answered = [line.split()[5] for line in logged_lines(log, until=" 500 ") if " torchserve/r0 " in line]
    assert answered == ["500"], log.read_text()
