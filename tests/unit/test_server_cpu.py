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

from tests.support import wait_until
from tooling.bench.server_cpu import server_cpu_cores

# Each child says "ready" once its interpreter has started, so the measurement starts after every start-up. The
# three share one pipe: each line is one write (os.write), so lines never interleave.
TREE = """
import os, subprocess, sys
spin = subprocess.Popen([sys.executable, "-c", "import os; os.write(1, b'ready\\\\n')\\nwhile True: pass"])
idle = subprocess.Popen([sys.executable, "-c", "import os, time; os.write(1, b'ready\\\\n'); time.sleep(600)"])
os.write(1, f"{spin.pid} {idle.pid}\\n".encode())
spin.wait()
"""
# CPU seconds the spinning child must get inside the measured block, however busy this machine is: enough that the
# idle rest's share, a few clock ticks at most, is small beside it.
SPUN_S = 0.5
# The bracket below holds exactly (CPU time only grows, and the readings are ordered); this is room for the floats
# (/proc counts 1/100 s ticks; user + system are summed as floats), a tick's worth.
TICK_S = 0.011


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_a_spinning_worker_counts_as_the_workers_and_an_idle_frontend_as_almost_nothing():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        lines = [root.stdout.readline() for _ in range(3)]  # the pids and two "ready"s, in whatever order
        [pids] = [line.split() for line in lines if line.strip() != "ready"]
        spin_pid = int(pids[0])  # the other is the idle child's
        spin = psutil.Process(spin_pid)
        server = SimpleNamespace(process=root, describe=lambda model: [{"workers": [{"pid": spin_pid}]}])
        # Side by side with the split, the spinning child's own CPU time and the clock, read just outside the
        # measured block and just inside it: what the split reports must lie between the two.
        outer_cpu, outer_clock = cpu_s(spin), time.monotonic()
        with server_cpu_cores(server, "model") as cores:
            inner_cpu, inner_clock = cpu_s(spin), time.monotonic()
            wait_until(lambda: cpu_s(spin) - inner_cpu >= SPUN_S, 120, f"the spinning child to use {SPUN_S}s of CPU")
            inner_cpu, inner_clock = cpu_s(spin) - inner_cpu, time.monotonic() - inner_clock
        outer_cpu, outer_clock = cpu_s(spin) - outer_cpu, time.monotonic() - outer_clock
        workers_s, frontend_s = cores["workers"] * cores["seconds"], cores["frontend"] * cores["seconds"]
        assert inner_clock <= cores["seconds"] <= outer_clock, (inner_clock, cores, outer_clock)
        # The workers' share is exactly the spinning child's CPU, however much of a core this machine gave it.
        assert inner_cpu - TICK_S <= workers_s <= outer_cpu + TICK_S, (inner_cpu, cores, outer_cpu)
        # The rest (the root waiting, the other child sleeping) used next to nothing beside it.
        assert frontend_s < workers_s / 5, cores
    finally:
        # The children first (read from the root, not yet reaped, so its pid is still this test's): killing the root
        # alone would leave them running.
        with contextlib.suppress(psutil.NoSuchProcess):
            for process in [*psutil.Process(root.pid).children(recursive=True), psutil.Process(root.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        root.wait(timeout=10)
        root.stdout.close()
