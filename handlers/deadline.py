"""The per-request deadline: a request its caller no longer waits for is answered at once, never computed.

TorchServe 0.12 hands the handler no arrival time (a request's headers, parameters and id are
all the worker passes), so the handler cannot tell how long a request waited in the frontend's
queue. The deadline therefore travels with the request: header X-Request-Deadline, the Unix time
in milliseconds after which the answer is of no use. A client sets it to its send time plus its
own timeout; the proxy in front of the replicas can set it to the arrival time plus the latency
budget (docs/reliability.md, "Overload"). Checked once per batch before a request's body is even
decoded, and again before each forward pass (a batch may take several, handlers/batching.py).

Every answer of a batch leaves when its last pass ends: TorchServe sends them in one message once
handle() returns. So before each pass the check asks whether the request would be answered in time
by the batch, not by its own pass: at the worker's pace (PassPace, measured over the passes it has
run), with the passes still to come. When not every request can be, the passes that answer the most
instances in time run (in_time), and the others are refused: a request that would be answered after
its deadline gets 503 DeadlineExceeded and costs no decoding, tokenization or forward pass, or none
after the check it failed. A request without the header has no deadline. The sender's clock
and this host's must agree (NTP keeps them within milliseconds; the budget is hundreds).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from handlers import rejection
from handlers.decoding import request_header
from handlers.rejection import Rejection

DEADLINE_HEADER = "X-Request-Deadline"
# 10^12 ms is September 2001: any real deadline is later, and a Unix time in seconds (about 1.7e9), the
# likeliest mistake, is far below. Read as ms it would be 1970, and every such request refused as late.
EARLIEST_MS = 1e12
# Digits, a fraction at most: what a proxy that caps the deadline reads as the same number. HAProxy's
# integer conversion reads "1e15" as 1, so a cap on the budget would let that deadline past it.
MILLISECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
K = TypeVar("K", bound=Hashable)


def read_deadline(headers: Mapping[str, Any] | None) -> float | Rejection | None:
    """The request's deadline in Unix ms; None without the header; a rejection when it is unreadable."""
    value = request_header(headers, DEADLINE_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not MILLISECONDS.fullmatch(value) or float(value) < EARLIEST_MS:
        return rejection.invalid_deadline(DEADLINE_HEADER)
    return float(value)


def late(deadline_ms: float, now_ms: float) -> Rejection | None:
    """DeadlineExceeded when `now_ms` is past `deadline_ms`."""
    return rejection.deadline_exceeded(DEADLINE_HEADER, now_ms - deadline_ms) if now_ms > deadline_ms else None


def refusal(deadline: float | Rejection | None, now_ms: float) -> Rejection | None:
    """Why a request whose header read as `deadline` (read_deadline) must not be computed at `now_ms`."""
    if deadline is None or isinstance(deadline, Rejection):
        return deadline
    return late(deadline, now_ms)


def past_deadline(headers: Mapping[str, Any] | None, now_ms: float) -> Rejection | None:
    """Why the request must not be computed at `now_ms` (Unix ms): its deadline passed, or it is unreadable."""
    return refusal(read_deadline(headers), now_ms)


class PassPace:
    """How long one forward pass of this worker takes: a moving average over the passes it has run.

    The check before a batch's first pass needs it, when the batch itself has measured nothing. It is
    the worker's one running figure, like its metrics: no batch leaves anything else behind. Zero
    before the first pass: a new worker refuses only what is already late."""

    WEIGHT = 0.3  # of the newest pass: a slow first pass (a cold start) fades within a few batches
    # What a batch that ran no pass leaves of the estimate. Only a pass measures, and a pace too high to let any
    # request through would otherwise keep the worker refusing every request with a deadline for ever; refusing
    # costs no pass, so under traffic these batches come quickly and the estimate comes down within a few dozen.
    IDLE_DECAY = 0.8

    def __init__(self) -> None:
        self.ms = 0.0

    def observe(self, ms: float) -> None:
        self.ms = ms if self.ms == 0.0 else self.ms + self.WEIGHT * (ms - self.ms)

    def ran_nothing(self) -> None:
        """A batch ran no pass: nothing was measured, and the estimate may be why."""
        self.ms *= self.IDLE_DECAY


def in_time(
    passes: Sequence[Sequence[K]], deadline_of: Callable[[K], float | None], now_ms: float, pace_ms: float
) -> set[K]:
    """The instances of `passes` (the batch's forward passes still to run, in order, each taking `pace_ms`)
    to compute: the most that are answered by their deadline (`deadline_of`, Unix ms; None: no deadline).

    Every answer leaves when the batch's last pass ends, so running k passes ends at now + k x pace and
    answers in time only the instances whose deadline is that late. For each k the passes holding an
    instance without a deadline run whatever happens; the rest are the ones with the most instances in time
    then. Fewer passes can answer more: a pass dropped for lateness no longer delays the others."""
    best: set[K] = set()
    timed = [[(key, deadline_of(key)) for key in keys] for keys in passes]  # each deadline read once
    for k in range(1, len(passes) + 1):
        end_ms = now_ms + k * pace_ms
        forced, optional = [], []
        for pairs in timed:
            timely = [key for key, d in pairs if d is None or d >= end_ms]
            if timely:
                (forced if any(d is None for _, d in pairs) else optional).append(timely)
        if len(forced) > k:
            continue
        optional.sort(key=len, reverse=True)  # stable: of passes as full, the earlier
        kept = {key for keys in forced + optional[: k - len(forced)] for key in keys}
        if len(kept) > len(best):
            best = kept
    return best


def refused_requests(
    passes: Sequence[Sequence[K]], request_of: Callable[[K], Hashable], deadline_of: Callable[[K], float | None],
    now_ms: float, pace_ms: float,
) -> set:  # fmt: skip
    """The requests to refuse before the next of `passes`: those in_time does not answer whole. A request is
    answered only whole, so one that in_time keeps in part is taken out and the choice made again without it (a
    pass it filled may no longer be the one to run), until every request in_time keeps, it keeps whole."""
    # Every pass runs in time when the latest, now + (passes) x pace, meets the earliest deadline: nothing to choose.
    # Checked first because it is the usual case and costs one look at each instance, where the choice below costs
    # passes x instances and runs before every pass: on a batch of 128 passes it took longer than the passes.
    deadlines = [d for keys in passes for d in map(deadline_of, keys) if d is not None]
    if not deadlines or min(deadlines) >= now_ms + sum(1 for keys in passes if keys) * pace_ms:
        return set()
    out: set = set()
    while True:
        left = [[key for key in keys if request_of(key) not in out] for keys in passes]
        kept = in_time(left, deadline_of, now_ms, pace_ms)
        dropped = {request_of(key) for keys in left for key in keys if key not in kept}
        partial = dropped & {request_of(key) for key in kept}
        if not partial:
            return out | dropped
        out |= partial
