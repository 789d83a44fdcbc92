"""Before scripts/serve.sh starts TorchServe: is every address of its configuration free?

    .venv/bin/python -m scripts.ports_free [--properties config.properties]

Exits 0 when this checkout's TorchServe already runs (the pid file TorchServe keeps in $TMPDIR, which
scripts/runtime_env.sh points into logs/, names a live TorchServe: serve.sh then talks to it), or when
nothing listens on any port of the configuration. Otherwise it says, for each port taken, which setting
names it and what holds it, and exits 1. Without it, another program on 8080 was asked for /ping as if it
were this TorchServe, and serve.sh ended in a bare curl error; another TorchServe on the ports left this
one failing to bind while serve.sh waited two minutes for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psutil

from tooling.cli_arguments import existing_file
from tooling.paths import SERVER_CONFIG
from tooling.torchserve import TORCHSERVE_MAIN, pid_file, port_in_use, read_properties, running_torchserve, server_ports


def holder(port: int) -> str:
    """What listens on `port`, in words (another user's process shows no pid to a user who is not root)."""
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
                command = psutil.Process(connection.pid).cmdline()
                what = "another TorchServe" if TORCHSERVE_MAIN in command else " ".join(command)[:80]
                return f"pid {connection.pid} ({what})"
    except psutil.Error:
        pass
    return "another process"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--properties", type=existing_file, default=SERVER_CONFIG, help="the server's configuration")
    parser.add_argument("--pid-file", type=Path, default=pid_file(), help="this checkout's TorchServe's pid file")
    args = parser.parse_args(argv)
    if running_torchserve(args.pid_file) is not None:
        return 0
    ports = server_ports(read_properties(args.properties))
    taken = {key: port for key, port in ports.items() if port_in_use(port)}
    for key, port in taken.items():
        print(
            f"port {port} ({key} in {args.properties}) is taken by {holder(port)}, not by this checkout's "
            f"TorchServe: stop it, or give {key} a free port there",
            file=sys.stderr,
        )
    return 1 if taken else 0


if __name__ == "__main__":
    sys.exit(main())
