"""The per-request deadline header (handlers/deadline.py): which requests the handler refuses before reading them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handlers.deadline import DEADLINE_HEADER, PassPace, in_time, past_deadline, read_deadline, refused_requests

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


@pytest.mark.parametrize("value", ["1e15", "1.8e12", "+1800000000000", "0x1a2b3c4d5e6f", "1_800_000_000_000"])
def test_a_deadline_not_written_in_plain_digits_is_refused_as_a_proxy_could_not_cap_it(value):
    """HAProxy's integer conversion reads "1e15" as 1: the fleet's cap on the budget would let it through. Only
    digits, with a fraction at most, are read, so every deadline that gets past the proxy is the one it checked."""
    reason = past_deadline({DEADLINE_HEADER: value}, NOW_MS)
    assert (reason.status, reason.type) == (400, "InvalidDeadline")


def test_a_deadline_with_a_fraction_of_a_millisecond_is_read():
    assert read_deadline({DEADLINE_HEADER: f" {int(NOW_MS) + 5}.25 "}) == NOW_MS + 5.25


def test_one_slow_pass_moves_the_pace_only_part_of_the_way_and_a_slow_start_fades():
    """One pass ten times as slow (a pause of the host) must not make the worker refuse, for its next batch, the
    requests its usual passes answer in time; a cold first pass is the whole estimate at first, then fades."""
    pace = PassPace()
    pace.observe(500.0)  # a new worker's first pass: nothing else to go by
    assert pace.ms == 500.0
    for _ in range(20):  # a few dozen requests' batches at most
        pace.observe(10.0)
    assert 10.0 <= pace.ms < 20.0
    pace.observe(100.0)
    assert pace.ms < 50.0  # less than halfway to the outlier
    for _ in range(5):
        pace.observe(10.0)
    assert pace.ms < 20.0


def test_without_deadlines_or_pace_every_pass_runs_and_the_passes_with_no_deadline_always_do():
    passes = [["a", "b"], ["c"], ["d"]]
    assert in_time(passes, lambda key: None, NOW_MS, 100.0) == {"a", "b", "c", "d"}
    due = {"a": NOW_MS + 50, "c": NOW_MS + 1}
    # No pace measured yet: only what is already late would go.
    assert in_time(passes, due.get, NOW_MS, 0.0) == {"a", "b", "c", "d"}
    # A pass takes 100 ms: "b" and "d" have no deadline, so theirs run (200 ms), and "a" and "c" cannot make it.
    assert in_time(passes, due.get, NOW_MS, 100.0) == {"b", "d"}


def test_fewer_passes_answer_more_a_pass_dropped_no_longer_delays_the_others():
    passes = [["x"], ["a", "b", "c"], ["y"]]
    due = dict.fromkeys("xyabc", NOW_MS + 150)  # room for one 100 ms pass: the fullest runs
    assert in_time(passes, due.get, NOW_MS, 100.0) == {"a", "b", "c"}


@given(
    st.lists(st.lists(st.one_of(st.none(), st.integers(0, 1000)), max_size=4), max_size=6),
    st.integers(0, 300),
)
def test_when_every_pass_ends_by_the_earliest_deadline_nothing_is_refused_as_the_full_choice_agrees(due, pace_ms):
    """refused_requests skips the choice when the last pass ends by the earliest deadline. The choice itself keeps
    everything then, so the shortcut changes no answer; and otherwise the choice is made."""
    passes = [[(p, i) for i in range(len(keys))] for p, keys in enumerate(due)]
    deadline_of = {(p, i): None if d is None else NOW_MS + d for p, keys in enumerate(due) for i, d in enumerate(keys)}
    request_of = lambda key: key  # noqa: E731 - each instance a request of its own
    refused = refused_requests(passes, request_of, deadline_of.get, NOW_MS, float(pace_ms))
    everything = {key for keys in passes for key in keys}
    kept = in_time(passes, deadline_of.get, NOW_MS, float(pace_ms))
    assert refused == everything - kept
