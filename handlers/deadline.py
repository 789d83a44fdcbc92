"""The per-request deadline: a request its caller no longer waits for is answered at once, never computed.

TorchServe 0.12 hands the handler no arrival time (a request's headers, parameters and id are
all the worker passes), so the handler cannot tell how long a request waited in the frontend's
queue. The deadline therefore travels with the request: header X-Request-Deadline, the Unix time
in milliseconds after which the answer is of no use. A client sets it to its send time plus its
own timeout; the proxy in front of the replicas can set it to the arrival time plus the latency
budget (docs/reliability.md, "Overload"). Checked once per batch before a request's body is even
decoded, and again before each forward pass (a batch may take several, handlers/batching.py),
allowing for the pass the time the batch's previous one took: a request that would be answered after
its deadline gets 503 DeadlineExceeded and costs no decoding, tokenization or forward pass, or none
after the check it failed. A request without the header has no deadline. The sender's clock
and this host's must agree (NTP keeps them within milliseconds; the budget is hundreds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from handlers import rejection
from handlers.decoding import request_header
from handlers.rejection import Rejection

DEADLINE_HEADER = "X-Request-Deadline"
# 10^12 ms is September 2001: any real deadline is later, and a Unix time in seconds (about 1.7e9), the
# likeliest mistake, is far below. Read as ms it would be 1970, and every such request refused as late.
EARLIEST_MS = 1e12


def read_deadline(headers: Mapping[str, Any] | None) -> float | Rejection | None:
    """The request's deadline in Unix ms; None without the header; a rejection when it is unreadable."""
    value = request_header(headers, DEADLINE_HEADER)
    if value is None:
        return None
    try:
        deadline_ms = float(value.strip())
    except ValueError:
        return rejection.invalid_deadline(DEADLINE_HEADER)
    if not math.isfinite(deadline_ms) or deadline_ms < EARLIEST_MS:
        return rejection.invalid_deadline(DEADLINE_HEADER)
    return deadline_ms


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
