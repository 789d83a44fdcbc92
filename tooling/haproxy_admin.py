"""HAProxy's admin socket: one command, and the fleet backend's servers as `show stat` lists them."""

from __future__ import annotations

import csv
import socket
from pathlib import Path

from tooling.files import write_atomically
from tooling.fleet_config import BACKEND, FleetError, server_state_file


def haproxy_command(socket_path: Path | str, command: str, timeout: float = 5.0) -> str:
    """Send one command to HAProxy's admin socket and return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(socket_path))
        except OSError as error:  # still an OSError (callers poll through it), naming what could not be reached
            raise OSError(error.errno, f"HAProxy's admin socket {socket_path}: {error.strerror or error}") from error
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def haproxy_servers(socket_path: Path | str) -> dict[str, dict[str, str]]:
    """`show stat` for the replicas' backend: {server name: its columns (status, scur, stot, ...)}."""
    text = haproxy_command(socket_path, "show stat").lstrip("# ")
    rows = csv.DictReader(line for line in text.splitlines() if line.strip())
    return {row["svname"]: row for row in rows if row["pxname"] == BACKEND and row["svname"] != "BACKEND"}


# srv_admin_state bits (HAProxy's SRV_ADMF_*) an operator sets through the admin socket: maintenance, drain.
_FORCED_MAINT, _FORCED_DRAIN = 0x01, 0x08


def held_out(socket_path: Path | str) -> set[str]:
    """The replicas' backend servers set `drain` or `maint` through the admin socket (`show servers state`): `show
    stat` says DOWN for one whose checks fail whatever it was set, and only this tells an operator's drain apart."""
    held = set()
    for line in servers_state(socket_path).splitlines():
        fields = line.split()
        if len(fields) > 6 and not line.startswith("#") and int(fields[6]) & (_FORCED_MAINT | _FORCED_DRAIN):
            held.add(fields[3])  # srv_name; srv_admin_state is the seventh column
    return held


def is_down(status: str) -> bool:
    """Whether a server's `show stat` status says HAProxy's health checks find it not answering: DOWN, or "DOWN 1/2"
    while its checks start passing again. DRAIN and MAINT are an operator's doing, not a fault."""
    return status.startswith("DOWN")


def set_server_state(socket_path: Path | str, name: str, state: str) -> None:
    """Set replica `name` of the fleet's backend `ready`, `drain` (finish in-flight requests, take no new ones) or
    `maint`; FleetError with HAProxy's answer where it refuses (an unknown server)."""
    answer = haproxy_command(socket_path, f"set server {BACKEND}/{name} state {state}").strip()
    if answer:
        raise FleetError(f"haproxy refused to set {name} {state}: {answer}")
    save_server_states(socket_path)


def save_server_states(socket_path: Path | str) -> None:
    """Write HAProxy's `show servers state` to the file its configuration loads at a start (server_state_file),
    whole: an HAProxy killed and started again then has each server as last set."""
    write_atomically(server_state_file(socket_path), servers_state(socket_path))


def servers_state(socket_path: Path | str) -> str:
    """`show servers state` for the replicas' backend: a version line, a header, a line per server (admin state and
    all), the format HAProxy loads at a start."""
    return haproxy_command(socket_path, f"show servers state {BACKEND}")
