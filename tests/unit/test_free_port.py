"""Free ports for private servers: below the kernel's ephemeral range, never handed out twice."""

from __future__ import annotations

import itertools
import os
import socket

import pytest

from tests.support import port_share
from tooling import torchserve
from tooling.torchserve import LOWEST_PORT, PORT_RANGE_VARIABLE, _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable(monkeypatch):
    monkeypatch.delenv(PORT_RANGE_VARIABLE, raising=False)  # set for the suite's own processes: tests/conftest.py
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
        monkeypatch.delenv(PORT_RANGE_VARIABLE, raising=False)
        assert free_port() != busy


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t60999\n")
    assert _ephemeral_low(range_file) == 40000
    assert _ephemeral_low(tmp_path / "absent") == 32768


def test_a_range_set_in_the_environment_is_the_only_one_drawn_from(monkeypatch):
    """What keeps processes side by side (the suite's two: tests/conftest.py) from drawing each other's ports."""
    monkeypatch.setenv(PORT_RANGE_VARIABLE, "20000-20100")
    ports = [free_port() for _ in range(30)]
    assert all(20_000 <= port < 20_100 for port in ports) and len(set(ports)) == 30
    for wrong in ("20000", "20100-20000", "20000-20000", "a-b", "0-10"):  # an empty range included
        monkeypatch.setenv(PORT_RANGE_VARIABLE, wrong)
        with pytest.raises(ValueError, match=PORT_RANGE_VARIABLE):
            free_port()


def test_the_suites_processes_draw_from_halves_that_do_not_meet():
    """Under scripts/test.sh each process draws from its own share of the range: tests/support.port_share's
    slice for its index, one of `count` equal, consecutive slices."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("one process (pytest without -n): nothing to share")
    count, index = int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), int(worker.removeprefix("gw"))
    assert torchserve.port_range() == port_share(index, count)


def test_with_no_room_below_the_ephemeral_range_a_port_is_still_handed_out(monkeypatch):
    """A kernel whose ephemeral range starts at or below LOWEST_PORT (ip_local_port_range "1024 65535"): free_port
    falls back to a port the kernel picks, not an empty draw."""
    monkeypatch.setattr(torchserve, "_ephemeral_low", lambda: LOWEST_PORT)  # the kernel's reading, as it would be
    monkeypatch.delenv(PORT_RANGE_VARIABLE, raising=False)
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_range_whose_every_port_is_taken_is_named_not_handed_out(monkeypatch):
    """BERT_PORT_RANGE narrowed to ports all in use: an error naming the range, never a port that is taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_VARIABLE, f"{busy}-{busy + 1}")
        with pytest.raises(RuntimeError, match=f"^no free loopback port between {busy} and {busy + 1}$"):
            free_port()
