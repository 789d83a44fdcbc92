"""Open-loop load: requests arrive on a schedule whatever the answers, each client giving up after its timeout.

A closed loop (loadgen.py) sends its next request only after an answer, so it can never overload a
server; an API layer under a traffic spike does not wait. Arrivals are at a constant rate or a
Poisson process (exponential gaps, seeded), bounded in count (rate x seconds) and in time (every
request ends by its timeout). With `deadline` each request carries handlers/deadline.py's header:
its send time plus the client's timeout, as a client that states its deadline would send it.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from handlers.deadline import DEADLINE_HEADER
from tooling.bench.loadgen import cpu_seconds, percentile_ms

ARRIVALS = ("constant", "poisson")


@dataclass(frozen=True)
class Outcome:
    """One request: its index, status (0: the client gave up; -1: a connection error), seconds, body (kept on ask),
    and when it was sent (seconds after the first arrival)."""

    index: int
    status: int
    seconds: float
    body: bytes = b""
    sent_at: float = 0.0


@dataclass
class OpenLoopResult:
    offered: int
    seconds: float  # the schedule's length: requests / rate
    timeout_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)  # "503 DeadlineExceeded" -> count
    client_cpu_s: float = 0.0
    max_lag_ms: float = 0.0  # how late the generator sent its latest request against the schedule

    def summary(self) -> dict:
        ok = [o.seconds for o in self.outcomes if o.status == 200]
        return {
            "offered": self.offered,
            "offered_rps": self.offered / self.seconds if self.seconds else float("nan"),
            "answered_in_time": len(ok),
            "goodput_rps": len(ok) / self.seconds if self.seconds else float("nan"),
            "refused": dict(self.refused),
            "refused_total": sum(self.refused.values()),
            "gave_up": sum(1 for o in self.outcomes if o.status == 0),
            "connection_errors": sum(1 for o in self.outcomes if o.status == -1),
            "p50_ms": percentile_ms(ok, 50),
            "p99_ms": percentile_ms(ok, 99),
            "client_cpu_fraction": self.client_cpu_s / self.seconds if self.seconds else float("nan"),
            "max_lag_ms": self.max_lag_ms,
        }


def arrival_times(rate: float, count: int, arrivals: str, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of `count` requests is sent, at `rate` per second on average."""
    if arrivals == "constant":
        return [i / rate for i in range(count)]
    if arrivals == "poisson":
        rng = random.Random(seed)
        times, t = [], 0.0
        for _ in range(count):
            times.append(t)
            t += rng.expovariate(rate)
        return times
    raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")


def _refusal(status: int, body: bytes) -> str:
    """'503 DeadlineExceeded': the status and the error's type from TorchServe's error shape, when it has one."""
    try:
        kind = json.loads(body).get("type", "")
    except (ValueError, AttributeError):
        kind = ""
    return f"{status} {kind}".strip()


# One request to send: its body and its own headers (Content-Type, ...), on top of the session's.
Payload = tuple[bytes, dict]


async def _open_loop(
    url: str, headers: dict, payloads: Sequence[Payload], schedule: Sequence[float], seconds: float,
    timeout_s: float, deadline: bool, keep_bodies: bool,
) -> OpenLoopResult:  # fmt: skip
    from tooling.bench.http_client import Endpoint, Pool, header_lines

    # Each request holds a socket for at most its timeout: the rate x timeout in flight must all fit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pool = Pool(Endpoint.of(url, {}))
    # Each payload's headers over the run's (a payload's Content-Type wins), written once.
    heads = [header_lines({**headers, **payload_headers}) for _, payload_headers in payloads]
    result = OpenLoopResult(offered=len(schedule), seconds=seconds, timeout_s=timeout_s)

    async def send(i: int) -> None:
        data, head = payloads[i % len(payloads)][0], heads[i % len(payloads)]
        if deadline:
            head += header_lines({DEADLINE_HEADER: str(int(1000 * (time.time() + timeout_s)))})
        sent = time.perf_counter()
        status, body = 0, b""
        try:
            async with asyncio.timeout(timeout_s):
                status, body = await pool.post(data, head)
        except TimeoutError:
            status = 0
        except OSError:  # refused, reset, or closed before the answer
            status = -1
        if status > 0 and status != 200:
            result.refused[_refusal(status, body)] += 1
        kept = body if keep_bodies else b""
        result.outcomes.append(Outcome(i, status, time.perf_counter() - sent, kept, sent - start))

    cpu_before = cpu_seconds()
    start = time.perf_counter()
    tasks = []
    for i, at in enumerate(schedule):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.max_lag_ms = max(result.max_lag_ms, -1000 * delay)
        tasks.append(asyncio.create_task(send(i)))
    await asyncio.gather(*tasks)
    result.client_cpu_s = cpu_seconds() - cpu_before
    pool.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return result


def open_loop(
    url: str, headers: dict, texts: Sequence[str], rate: float, seconds: float, timeout_s: float,
    arrivals: str = "constant", deadline: bool = False, seed: int = 0, keep_bodies: bool = False,
) -> OpenLoopResult:  # fmt: skip
    """Send round(rate x seconds) requests on the schedule, text i % len(texts) as request i, with the session's
    headers; every outcome, the refusals by status and type."""
    payloads = [(text.encode(), {}) for text in texts]
    return open_loop_payloads(url, headers, payloads, rate, seconds, timeout_s, arrivals, deadline, seed, keep_bodies)


def open_loop_payloads(
    url: str, headers: dict, payloads: Sequence[Payload], rate: float, seconds: float, timeout_s: float,
    arrivals: str = "constant", deadline: bool = False, seed: int = 0, keep_bodies: bool = False,
) -> OpenLoopResult:  # fmt: skip
    """As open_loop, request i being payloads[i % len(payloads)]: a body with its own headers."""
    count = max(1, round(rate * seconds))
    schedule = arrival_times(rate, count, arrivals, seed)
    return asyncio.run(_open_loop(url, headers, payloads, schedule, count / rate, timeout_s, deadline, keep_bodies))
