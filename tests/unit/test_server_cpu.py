"""The server's CPU split (tooling/bench/server_cpu.py) over a real process tree with known loads: a root process
whose one child spins (standing for a worker, named by its pid as TorchServe's describe names workers) and whose
other child sleeps (standing for the rest of the server)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil

from tooling.bench.server_cpu import server_cpu_cores

TREE = """
import subprocess, sys
spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(spin.pid, idle.pid, flush=True)
spin.wait()
"""


def test_a_spinning_worker_counts_as_the_workers_and_an_idle_frontend_as_almost_nothing():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    started = [root.pid]
    try:
        spin_pid, idle_pid = (int(pid) for pid in root.stdout.readline().split())
        started[:0] = [spin_pid, idle_pid]
        server = SimpleNamespace(process=root, describe=lambda model: [{"workers": [{"pid": spin_pid}]}])
        time.sleep(0.2)  # the children's own start-up (imports) is not what is measured
        with server_cpu_cores(server, "model") as cores:
            time.sleep(1.0)
        assert 0.95 <= cores["seconds"] < 2.0
        # One spinning thread: up to a core, less where this machine is busy; nothing like the idle rest.
        assert cores["workers"] >= 0.3, cores
        assert cores["frontend"] <= 0.15, cores
    finally:
        for pid in started:  # the children first: killing the root alone would leave them running
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        root.wait(timeout=10)
        root.stdout.close()
