"""Where a private TorchServe's CPU went while load ran: the model's workers, and the rest of its process tree
(the frontend, which parses HTTP, queues, batches and answers, and its launcher), each in cores. Why: on a
machine the load generator shares, throughput is bounded by the cores each part gets, and a cell's
requests/s alone does not say which part ran out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


def server_cpu_seconds(server, model: str) -> tuple[float, float]:
    """CPU seconds used so far by (the model's workers, the rest of the server's process tree)."""
    import psutil

    workers = {w["pid"] for w in server.describe(model)[0]["workers"]}
    root = psutil.Process(server.process.pid)
    worker_s = frontend_s = 0.0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            if process.pid in workers:
                worker_s += times.user + times.system
            else:
                frontend_s += times.user + times.system
    return worker_s, frontend_s


@contextlib.contextmanager
def server_cpu_cores(server, model: str) -> Iterator[dict[str, float]]:
    """The cores (CPU seconds per second) the model's workers and the rest of the server used while the block
    ran: {"workers", "frontend", "seconds"}, filled in when it ends."""
    cores: dict[str, float] = {}
    before, started = server_cpu_seconds(server, model), time.monotonic()
    yield cores
    after, elapsed = server_cpu_seconds(server, model), time.monotonic() - started
    cores.update(workers=(after[0] - before[0]) / elapsed, frontend=(after[1] - before[1]) / elapsed, seconds=elapsed)
