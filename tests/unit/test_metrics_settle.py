"""The handler's counters read from /metrics once they are in and still (tooling/bench/scrape.py's read_until_still).

Each counter of a batch reaches /metrics as a log line of its own: read as soon as the items were counted, a cell of
59 one-text batches once counted 57 forward passes, 0.97 per batch where the handler always makes one.
"""

from __future__ import annotations

import time

from tooling.bench.scrape import read_until_still


def reader(values):
    """read() giving `values` in turn, then the last one for ever; with the count of reads made."""
    reads = []

    def read():
        reads.append(None)
        return values[min(len(reads), len(values)) - 1]

    return read, reads


def test_the_counters_are_read_once_the_items_are_in_and_nothing_moved_since():
    # (items, forward passes): the items arrive first, the passes of the last batches a moment later.
    read, reads = reader([(50, 50), (59, 57), (59, 58), (59, 59)])
    settled = read_until_still(read, still_s=0.001, timeout_s=5, ready=lambda counts: counts[0] >= 59)
    assert settled == (59, 59) and len(reads) == 5  # the last value twice: nothing moved between the two reads


def test_a_read_that_is_not_ready_never_counts_as_still():
    read, _ = reader([(10, 10), (10, 10), (20, 20), (20, 20)])
    assert read_until_still(read, still_s=0.001, timeout_s=5, ready=lambda counts: counts[0] >= 20) == (20, 20)


def test_only_the_key_must_hold_still():
    read, _ = reader([("text 1", 7), ("text 2", 7)])
    assert read_until_still(read, still_s=0.001, timeout_s=5, key=lambda value: value[1]) == ("text 2", 7)


def test_counters_that_never_settle_give_the_last_read_at_the_deadline():
    count = iter(range(10**9))
    started = time.monotonic()
    value = read_until_still(lambda: next(count), still_s=0.01, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2 and value > 3
