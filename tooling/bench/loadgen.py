"""Closed-loop asynchronous load: `concurrency` clients, each sending its next request when the last is answered.

Each client holds one keep-alive connection (tooling/bench/http_client.py: about 13 µs of CPU per request on
a 2-core VM, where aiohttp took 75-106). Larger client counts are still spread over several processes
(`processes_for`), each with its own event loop and connections, starting together, so one core's event loop
never sets the pace; their latencies and answer checks are merged.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tooling.bench.answers import AnswerCheck


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100, linear interpolation) of latencies in seconds, in milliseconds."""
    return float(1000 * np.percentile(latencies_s, q)) if len(latencies_s) else float("nan")


@dataclass(frozen=True)
class Readings:
    """Rounds of one measurement: every value in order, and whether the last two agreed."""

    values: list[float]
    agreed: bool

    @property
    def lower_of_agreeing_pair(self) -> float:
        """The lower of the two that agreed; the last reading when none did."""
        return min(self.values[-2:]) if self.agreed else self.values[-1]


def readings_until_stable(measure: Callable[[int], float], rounds: int = 6, agree: float = 0.1) -> Readings:
    """measure(round) in rounds until two in a row agree within `agree` (at most `rounds`). A saturation read
    once on a shared machine strays (a fresh server speeds up over its first minute; neighbours come and go);
    each caller chooses which reading it keeps."""
    values: list[float] = []
    for round_ in range(rounds):
        values.append(measure(round_))
        if len(values) > 1 and abs(values[-1] - values[-2]) <= agree * values[-2]:
            return Readings(values, agreed=True)
    return Readings(values, agreed=False)


def cpu_seconds() -> float:
    """CPU time of this process (the load generator), to show it is not the bottleneck."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# Clients per load-generating process, and the most processes (the server needs the other cores).
CLIENTS_PER_PROCESS = 256
MAX_PROCESSES = 4
# How long a request may go unanswered after the cell ends before it counts as an error.
REQUEST_TIMEOUT_S = 120.0


def processes_for(concurrency: int) -> int:
    return max(1, min(MAX_PROCESSES, math.ceil(concurrency / CLIENTS_PER_PROCESS), multiprocessing.cpu_count() // 4))


async def _closed_loop(
    url: str, headers: dict, texts: Sequence[str], clients: range, stride: int, seconds: float,
    check: AnswerCheck | None, start_at: float | None = None,
) -> dict:  # fmt: skip
    """Clients numbered `clients`, client n sending texts n, n + stride, …; from wall-clock `start_at` if given.
    Each client has its own keep-alive connection (tooling/bench/http_client.py), opened before the clock starts
    and opened again, inside the clock, after the server closed it."""
    from tooling.bench.http_client import Connection, Endpoint

    endpoint = Endpoint.of(url, headers)
    bodies = [text.encode() for text in texts]
    latencies: list[float] = []
    errors = 0
    opened = await asyncio.gather(*(Connection.to(endpoint) for _ in clients), return_exceptions=True)
    connections = [c if isinstance(c, Connection) else None for c in opened]
    if start_at is not None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    start = time.perf_counter()
    deadline = start + seconds
    # A request the server never answers fails when the watchdog closes every connection.
    watchdog = asyncio.get_running_loop().call_later(seconds + REQUEST_TIMEOUT_S, _close_all, connections)

    async def client(slot: int, n: int) -> None:
        nonlocal errors
        i = n
        while time.perf_counter() < deadline:
            index = i
            body = bodies[index % len(bodies)]
            i += stride
            sent = time.perf_counter()
            try:
                connection = connections[slot]
                if connection is None or not connection.open:
                    connection = connections[slot] = await Connection.to(endpoint)
                status, answer = await connection.post(endpoint, body)
                ok = status == 200
            except OSError:  # refused, reset, or closed before the answer (http_client.ConnectionClosed)
                ok = False
            if ok:
                latencies.append(time.perf_counter() - sent)
                if check is not None:  # after the latency: checking is the client's time, not the server's
                    check.check(index, answer)
            else:
                errors += 1

    cpu_before = cpu_seconds()
    await asyncio.gather(*(client(slot, n) for slot, n in enumerate(clients)))
    elapsed = time.perf_counter() - start
    cpu_used = cpu_seconds() - cpu_before
    watchdog.cancel()
    _close_all(connections)
    return {"latencies": latencies, "errors": errors, "seconds": elapsed, "cpu_seconds": cpu_used,
            "check": check.figures() if check is not None else None}  # fmt: skip


def _close_all(connections: Sequence) -> None:
    for connection in connections:
        if connection is not None:
            connection.close()


def _shard(args: tuple) -> dict:
    url, headers, texts, clients, stride, seconds, expected, tolerance, start_at = args
    check = AnswerCheck(expected, tolerance) if expected is not None else None
    return asyncio.run(_closed_loop(url, headers, texts, clients, stride, seconds, check, start_at))


def _merged_checks(checks: list[Mapping]) -> dict:
    return {
        "answers_checked": sum(c["answers_checked"] for c in checks),
        "answers_wrong": sum(c["answers_wrong"] for c in checks),
        "answers_max_abs_diff": max(c["answers_max_abs_diff"] for c in checks),
        "answers_tolerance": checks[0]["answers_tolerance"],
    }


def closed_loop(
    url: str, headers: dict, texts: Sequence[str], concurrency: int, seconds: float, check: AnswerCheck | None = None
) -> dict:
    """Run the load for `seconds`; requests/s, latency percentiles of the 200s, errors and the load generator's
    CPU use (all its processes, in cores); with `check`, every 200's answer compared with its text's answer alone."""
    processes = processes_for(concurrency)
    expected, tolerance = (check.expected, check.tolerance) if check is not None else (None, 0.0)
    if processes == 1:
        shards = [_shard((url, headers, texts, range(concurrency), concurrency, seconds, expected, tolerance, None))]
    else:
        start_at = time.time() + 3.0  # every process has its session open before the clock starts
        jobs = [(url, headers, texts, range(k, concurrency, processes), concurrency, seconds, expected, tolerance,
                 start_at) for k in range(processes)]  # fmt: skip
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            shards = pool.map(_shard, jobs)
    latencies = [latency for shard in shards for latency in shard["latencies"]]
    elapsed = max(shard["seconds"] for shard in shards)
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": sum(shard["errors"] for shard in shards),
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile_ms(latencies, 50),
        "p95_ms": percentile_ms(latencies, 95),
        "p99_ms": percentile_ms(latencies, 99),
        "client_cpu_fraction": sum(shard["cpu_seconds"] for shard in shards) / elapsed,
        "load_processes": processes,
        **(_merged_checks([shard["check"] for shard in shards]) if check is not None else {}),
    }
