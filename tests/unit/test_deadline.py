"""The per-request deadline header (handlers/deadline.py): which requests the handler refuses before reading them."""

from __future__ import annotations

import pytest

from handlers.deadline import DEADLINE_HEADER, past_deadline

NOW_MS = 1_800_000_000_000.0


def test_a_request_without_the_header_has_no_deadline():
    assert past_deadline({"content-type": "text/plain"}, NOW_MS) is None
    assert past_deadline(None, NOW_MS) is None


@pytest.mark.parametrize("name", [DEADLINE_HEADER, DEADLINE_HEADER.lower(), DEADLINE_HEADER.upper()])
def test_a_deadline_still_ahead_lets_the_request_through_whatever_the_header_case(name):
    assert past_deadline({name: str(int(NOW_MS) + 1)}, NOW_MS) is None


def test_a_passed_deadline_is_refused_with_503_deadline_exceeded_saying_by_how_much():
    reason = past_deadline({DEADLINE_HEADER: str(int(NOW_MS) - 250)}, NOW_MS)
    assert (reason.status, reason.type) == (503, "DeadlineExceeded")
    assert "250 ms" in reason.message and "not computed" in reason.message


# 1800000000: seconds, not ms (it would read as January 1970 and be refused as late); "-0": nothing real.
@pytest.mark.parametrize("value", ["soon", "", "nan", "inf", "-5", "12:00", "1800000000", "-0"])
def test_an_unreadable_deadline_is_refused_with_400(value):
    reason = past_deadline({DEADLINE_HEADER: value}, NOW_MS)
    assert (reason.status, reason.type) == (400, "InvalidDeadline")
