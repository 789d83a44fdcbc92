"""Free ports for private servers: below the kernel's ephemeral range, never handed out twice."""

from __future__ import annotations

import itertools
import socket

from tooling import torchserve
from tooling.torchserve import LOWEST_PORT, _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < _ephemeral_low() for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # free when handed out


def test_a_port_already_listened_on_is_never_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # The busy port is drawn first, twice; whatever is handed out must be another.
        candidates = itertools.chain([busy, busy], range(20_000, 30_000))
        monkeypatch.setattr(torchserve.random, "randrange", lambda low, high: next(candidates))
        monkeypatch.setattr(torchserve, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(torchserve, "LOWEST_PORT", 1)
        assert free_port() != busy


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t60999\n")
    assert _ephemeral_low(range_file) == 40000
    assert _ephemeral_low(tmp_path / "absent") == 32768
