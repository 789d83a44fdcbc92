"""The fleet's HAProxy logs a failed request without its query string, where a text sent as `?text=...` would be.

A real haproxy, rendered from deploy/fleet/haproxy.cfg.template by tooling/fleet_config.py, its standard output
(the fleet's logs/fleet/haproxy.log) in a file, in front of a replica address where nothing listens: the request
fails, and a failed request is what the template's `option dontlog-normal` still logs.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import requests

from tooling.fleet_config import haproxy_config
from tooling.torchserve import free_port

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")

MARKER = "HAPROXY-MARKER-41c7e2"


def test_a_failed_request_is_logged_without_its_query_string(tmp_path):
    front_port, down = free_port(), free_port()  # nothing listens on `down`
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(
        servers={"r0": (f"127.0.0.1:{down}", down)}, model="bert", front_port=front_port, stats_port=free_port(),
        socket_path=tmp_path / "admin.sock", response_timeout=60, retries=1,
    ))  # fmt: skip
    log = tmp_path / "haproxy.log"
    with log.open("wb") as out:
        process = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{front_port}/predictions/bert"
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = requests.post(url, params={"text": MARKER}, data=b"", timeout=10)
                break
            except requests.ConnectionError:  # HAProxy not listening yet
                assert time.monotonic() < deadline and process.poll() is None, log.read_text()
                time.sleep(0.1)
        assert answer.status_code == 503
        while "/predictions/bert" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=10)
    written = log.read_text()
    assert MARKER not in written, written
    assert '"POST /predictions/bert HTTP/1.1"' in written, written  # the request is logged, without its query
