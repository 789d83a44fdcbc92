"""Closed-loop asynchronous load: `concurrency` clients, each sending its next request when the last is answered."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Sequence

import numpy as np

from tooling.bench.answers import AnswerCheck


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100, linear interpolation) of latencies in seconds, in milliseconds."""
    return float(1000 * np.percentile(latencies_s, q)) if len(latencies_s) else float("nan")


def cpu_seconds() -> float:
    """CPU time of this process (the load generator), to show it is not the bottleneck."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _closed_loop(
    url: str, headers: dict, texts: Sequence[str], concurrency: int, seconds: float, check: AnswerCheck | None
) -> dict:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        start = time.perf_counter()
        deadline = start + seconds

        async def client(n: int) -> None:
            nonlocal errors
            i = n
            while time.perf_counter() < deadline:
                index = i
                body = texts[index % len(texts)].encode()
                i += concurrency
                sent = time.perf_counter()
                try:
                    async with session.post(url, data=body) as response:
                        answer = await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                    if check is not None:  # after the latency: checking is the client's time, not the server's
                        check.check(index, answer)
                else:
                    errors += 1

        cpu_before = cpu_seconds()
        await asyncio.gather(*(client(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - start
        cpu_used = cpu_seconds() - cpu_before
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile_ms(latencies, 50),
        "p95_ms": percentile_ms(latencies, 95),
        "p99_ms": percentile_ms(latencies, 99),
        "client_cpu_fraction": cpu_used / elapsed,
        **(check.figures() if check is not None else {}),
    }


def closed_loop(
    url: str, headers: dict, texts: Sequence[str], concurrency: int, seconds: float, check: AnswerCheck | None = None
) -> dict:
    """Run the load for `seconds`; requests/s, latency percentiles of the 200s, errors and this process' CPU use;
    with `check`, every 200's answer compared with its text's answer alone."""
    return asyncio.run(_closed_loop(url, headers, texts, concurrency, seconds, check))
