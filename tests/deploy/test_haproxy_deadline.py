"""The fleet's HAProxy stamps each request with its deadline: arrival + latency budget, or the client's if earlier.

A real haproxy, rendered from deploy/fleet/haproxy.cfg.template by tooling/fleet_config.py, in front of a
loopback HTTP server that answers every request with the X-Request-Deadline it received. The handler's side
(a request past that deadline is refused before the model) is tests/e2e/test_overload.py.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from handlers.deadline import DEADLINE_HEADER
from tooling.fleet_config import haproxy_config
from tooling.torchserve import free_port

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")

BUDGET_MS = 1500


class EchoDeadline(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = (self.headers.get(DEADLINE_HEADER) or "").encode()
        if self.path == "/models/bert":  # HAProxy's health check: the model's one worker is READY
            body = b'[{"modelName": "bert", "workers": [{"id": "9000", "status": "READY"}]}]'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """HAProxy's front URL, HAProxy in front of the echo server, with a budget of BUDGET_MS."""
    backend = ThreadingHTTPServer(("127.0.0.1", 0), EchoDeadline)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    workdir = tmp_path_factory.mktemp("haproxy")
    front_port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(haproxy_config(
        servers={"r0": (f"127.0.0.1:{backend.server_address[1]}", backend.server_address[1])}, model="bert",
        front_port=front_port, stats_port=free_port(),
        socket_path=workdir / "admin.sock", response_timeout=60, retries=1, latency_budget_ms=BUDGET_MS,
    ))  # fmt: skip
    process = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{front_port}/predictions/bert"
    try:
        # Ready once HAProxy forwards a request to the echo server (its health check has marked it up): polled.
        deadline, seen = time.monotonic() + 30, "nothing yet"
        while True:
            try:
                answer = requests.post(url, data=b"x", timeout=1)
                if answer.status_code == 200:
                    break
                seen = f"HTTP {answer.status_code}: {answer.text[:200]}"
            except requests.RequestException as error:
                seen = repr(error)
            if process.poll() is not None:
                pytest.fail(f"haproxy exited with {process.returncode} before it answered; last seen: {seen}")
            if time.monotonic() > deadline:
                pytest.fail(f"haproxy did not forward a request within 30s; last seen: {seen}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        backend.shutdown()


def test_a_request_without_a_deadline_leaves_with_its_arrival_plus_the_budget(front):
    before = int(time.time() * 1000)
    stamped = int(requests.post(front, data=b"text", timeout=10).text)
    after = int(time.time() * 1000)
    # HAProxy's clock reads milliseconds; the arrival lies within the request's round trip.
    assert before + BUDGET_MS - 1 <= stamped <= after + BUDGET_MS + 1


def test_a_clients_earlier_deadline_is_kept_and_a_later_one_is_cut_to_the_budget(front):
    now = int(time.time() * 1000)
    earlier = now + BUDGET_MS // 3
    assert requests.post(front, data=b"t", headers={DEADLINE_HEADER: str(earlier)}, timeout=10).text == str(earlier)
    later = now + 100 * BUDGET_MS
    stamped = int(requests.post(front, data=b"t", headers={DEADLINE_HEADER: str(later)}, timeout=10).text)
    assert stamped < later and abs(stamped - (now + BUDGET_MS)) < 5000
