"""Open-loop load: requests arrive on a schedule whatever the answers, each client giving up after its timeout.

A closed loop (loadgen.py) sends its next request only after an answer, so it can never overload a
server; an API layer under a traffic spike does not wait. Arrivals are at a constant rate or a
Poisson process (exponential gaps, seeded), for a warm-up and then the counted window, every request
ending by its timeout.

Every request is timed from when the schedule says it arrives, not from when the event loop got to
send it (a stalled generator must not hide latency: coordinated omission): its latency runs from its
scheduled time to its answer, its client gives up at its scheduled time plus its timeout (one already
past that when its turn comes is not sent at all: given up), and with `deadline` it carries
handlers/deadline.py's header, its scheduled time plus the client's timeout, as a client that states
its deadline would send it. How late each request was sent (its send lag) is kept, and a cell whose
p99 send lag is a tenth of the timeout or more is flagged as unreliable.

The figures (OpenLoopResult.summary) count the requests *scheduled* in the window, [warm-up, end of the
schedule): the queue filling at the start is left out, and the requests still queued when arrivals
stop are counted (answered afterwards), as in a steady state the same number were queued when the
window began and are left out. Goodput is those answered in time per second of the window. The
whole schedule's counts are kept beside them (`whole_schedule`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from handlers.deadline import DEADLINE_HEADER
from tooling.bench.loadgen import cpu_seconds, percentile_ms

ARRIVALS = ("constant", "poisson")
# A cell whose p99 send lag reaches this share of the client's timeout measured the generator as much as the server.
LAG_UNRELIABLE_SHARE = 0.1
# Refusals at the door: TorchServe's frontend refusing a request its full queue has no room for, at once. Every
# other request was admitted (a 503 DeadlineExceeded is one that waited and would have been answered late).
SHED_AT_THE_DOOR = ("503 ServiceUnavailableException",)


@dataclass(frozen=True)
class Outcome:
    """One request: its index, status (0: the client gave up; -1: a connection error), seconds from its scheduled
    time to its end, body (kept on ask), when it was sent (its task ran; seconds after the first arrival), when it
    was scheduled, whether it was sent at all (not when already past its timeout), and its refusal ("503 Type")."""

    index: int
    status: int
    seconds: float
    body: bytes = b""
    sent_at: float = 0.0
    scheduled_at: float = 0.0
    sent: bool = True
    refusal: str = ""

    @property
    def lag(self) -> float:
        """Seconds it was sent after its scheduled time."""
        return self.sent_at - self.scheduled_at


def percentile_or_beyond_ms(answered_s: Sequence[float], total: int, q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation as percentile_ms) of `total` requests of which `answered_s`
    were answered in time (their latencies, seconds) and the rest never were (infinitely late), in ms; None when it
    falls on an unanswered one ("beyond the timeout"), NaN without requests."""
    if total == 0:
        return float("nan")
    ordered = sorted(answered_s)
    rank = q / 100 * (total - 1)
    low, high = math.floor(rank), math.ceil(rank)
    if high >= len(ordered):
        return None
    return 1000 * (ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


@dataclass
class OpenLoopResult:
    offered: int  # the whole schedule's requests
    seconds: float  # the schedule's length: warm-up and window
    timeout_s: float
    window: tuple[float, float] = (0.0, math.inf)  # the counted window, seconds after the first arrival
    rate: float = math.nan  # the requested rate, per second
    outcomes: list[Outcome] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)  # the whole schedule's: "503 DeadlineExceeded" -> count
    client_cpu_s: float = 0.0
    elapsed_s: float = 0.0  # from the first arrival until the last request ended
    max_lag_ms: float = 0.0  # the latest any request of the whole schedule was sent against its scheduled time

    def summary(self, shed: Sequence[str] = SHED_AT_THE_DOOR) -> dict:
        """The window's figures (the requests scheduled in it), the whole schedule's counts under `whole_schedule`.

        p50_ms/p99_ms: of the answered (200) only. all_*: of every request scheduled in the window, one not answered
        in time (refused, gave up, connection error) counting as infinitely late: None ("beyond the timeout") when
        the percentile falls on one. admitted_*: the same over the requests not refused at the door (`shed`).
        refusal_*: the latency of the refusals (every status but 200)."""
        start, end = self.window[0], min(self.window[1], self.seconds)
        length = end - start
        window = [o for o in self.outcomes if start <= o.scheduled_at < end]
        answered = [o.seconds for o in window if o.status == 200]
        admitted = [o for o in window if o.refusal not in shed]
        refusals = [o.seconds for o in window if o.refusal]
        lags = [o.lag for o in window]
        lag_p99 = percentile_ms(lags, 99)
        all_p99 = percentile_or_beyond_ms(answered, len(window), 99)
        admitted_p99 = percentile_or_beyond_ms(answered, len(admitted), 99)
        sent = sum(1 for o in self.outcomes if o.sent and start <= o.sent_at < end)
        whole_answered = sum(1 for o in self.outcomes if o.status == 200)
        per_s = (lambda n: n / length) if length > 0 else (lambda n: float("nan"))
        return {
            "window_s": [start, end],
            "requested_rps": self.rate,
            "offered": len(window),
            "offered_rps": per_s(len(window)),
            "sent_rps": per_s(sent),
            "answered_in_time": len(answered),
            "goodput_rps": per_s(len(answered)),
            "not_answered_in_time_share": 1 - len(answered) / len(window) if window else float("nan"),
            "refused": dict(Counter(o.refusal for o in window if o.refusal)),
            "refused_total": len(refusals),
            "gave_up": sum(1 for o in window if o.status == 0),
            "connection_errors": sum(1 for o in window if o.status == -1),
            "p50_ms": percentile_ms(answered, 50),
            "p99_ms": percentile_ms(answered, 99),
            "all_p50_ms": percentile_or_beyond_ms(answered, len(window), 50),
            "all_p99_ms": all_p99,
            "all_p99_beyond_timeout": all_p99 is None,
            "admitted": len(admitted),
            "admitted_p99_ms": admitted_p99,
            "admitted_p99_beyond_timeout": admitted_p99 is None,
            "refusal_p50_ms": percentile_ms(refusals, 50),
            "refusal_p99_ms": percentile_ms(refusals, 99),
            "send_lag_p99_ms": lag_p99,
            "send_lag_max_ms": 1000 * max(lags) if lags else float("nan"),
            "send_lag_unreliable": lag_p99 >= 1000 * LAG_UNRELIABLE_SHARE * self.timeout_s,
            "max_lag_ms": self.max_lag_ms,
            "client_cpu_fraction": self.client_cpu_s / self.elapsed_s if self.elapsed_s else float("nan"),
            "whole_schedule": {
                "seconds": self.seconds,
                "offered": self.offered,
                "answered_in_time": whole_answered,
                # What goodput was before the window: every answer over the schedule's length, the queue left at
                # its end included (answered after it) and the queue's filling at its start too.
                "goodput_rps": whole_answered / self.seconds if self.seconds else float("nan"),
                "refused": dict(self.refused),
                "refused_total": sum(self.refused.values()),
                "gave_up": sum(1 for o in self.outcomes if o.status == 0),
                "connection_errors": sum(1 for o in self.outcomes if o.status == -1),
            },
        }


def schedule_for(rate: float, seconds: float, arrivals: str, seed: int = 0) -> list[float]:
    """Arrival times in [0, seconds) at `rate` per second on average, at least one: constant, round(rate x seconds)
    of them; Poisson, exponential gaps until `seconds` is reached (the count varies, as a Poisson process's does,
    and the arrivals span the whole time, so a window near its end is as loaded as one near its start)."""
    if arrivals == "constant":
        return [i / rate for i in range(max(1, round(rate * seconds)))]
    if arrivals == "poisson":
        rng = random.Random(seed)
        times, t = [], 0.0
        while t < seconds or not times:
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
    url: str, headers: dict, payloads: Sequence[Payload], schedule: Sequence[float], window: tuple[float, float],
    rate: float, timeout_s: float, deadline: bool, keep_bodies: bool,
) -> OpenLoopResult:  # fmt: skip
    from tooling.bench.http_client import Endpoint, Pool, header_lines

    # Each request holds a socket for at most its timeout: the rate x timeout in flight must all fit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pool = Pool(Endpoint.of(url, {}))
    # Each payload's headers over the run's (a payload's Content-Type wins), written once.
    heads = [header_lines({**headers, **payload_headers}) for _, payload_headers in payloads]
    result = OpenLoopResult(offered=len(schedule), seconds=window[1], timeout_s=timeout_s, window=window, rate=rate)
    loop = asyncio.get_running_loop()

    async def send(i: int, at: float) -> None:
        scheduled = start + at  # on the loop's clock, which asyncio.timeout_at reads
        ran = loop.time()
        data, head = payloads[i % len(payloads)][0], heads[i % len(payloads)]
        if deadline:  # the scheduled time as Unix ms, plus the timeout
            head += header_lines({DEADLINE_HEADER: str(int(1000 * (wall_start + at + timeout_s)))})
        status, body = 0, b""
        sent = ran < scheduled + timeout_s  # else its client has given up already: nothing to send
        if sent:
            try:
                async with asyncio.timeout_at(scheduled + timeout_s):
                    status, body = await pool.post(data, head)
            except TimeoutError:
                status = 0
            except OSError:  # refused, reset, or closed before the answer
                status = -1
        ended = loop.time()
        refusal = _refusal(status, body) if status > 0 and status != 200 else ""
        if refusal:
            result.refused[refusal] += 1
        kept = body if keep_bodies else b""
        result.outcomes.append(Outcome(i, status, ended - scheduled, kept, ran - start, at, sent, refusal))

    cpu_before = cpu_seconds()
    start, wall_start = loop.time(), time.time()
    tasks = []
    for i, at in enumerate(schedule):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(i, at)))
    await asyncio.gather(*tasks)
    result.elapsed_s = loop.time() - start
    result.client_cpu_s = cpu_seconds() - cpu_before
    result.max_lag_ms = 1000 * max((o.lag for o in result.outcomes), default=0.0)
    pool.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return result


def open_loop(
    url: str, headers: dict, texts: Sequence[str], rate: float, seconds: float, timeout_s: float,
    arrivals: str = "constant", deadline: bool = False, seed: int = 0, keep_bodies: bool = False,
    warmup_s: float = 0.0,
) -> OpenLoopResult:  # fmt: skip
    """Send requests at `rate` for `warmup_s` and then the `seconds` of the counted window, text i % len(texts) as
    request i, with the session's headers; every outcome, the refusals by status and type."""
    payloads = [(text.encode(), {}) for text in texts]
    return open_loop_payloads(
        url, headers, payloads, rate, seconds, timeout_s, arrivals, deadline, seed, keep_bodies, warmup_s
    )


def open_loop_payloads(
    url: str, headers: dict, payloads: Sequence[Payload], rate: float, seconds: float, timeout_s: float,
    arrivals: str = "constant", deadline: bool = False, seed: int = 0, keep_bodies: bool = False,
    warmup_s: float = 0.0,
) -> OpenLoopResult:  # fmt: skip
    """As open_loop, request i being payloads[i % len(payloads)]: a body with its own headers."""
    total = warmup_s + seconds
    schedule = schedule_for(rate, total, arrivals, seed)
    return asyncio.run(
        _open_loop(url, headers, payloads, schedule, (warmup_s, total), rate, timeout_s, deadline, keep_bodies)
    )
