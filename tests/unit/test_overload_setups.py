"""The overload benchmark's setups: each budget as the product derives it, comparisons measured but never judged."""

from __future__ import annotations

from tooling.bench.overload import TODAY_QUEUE, setups
from tooling.bench.overload_report import evaluate
from tooling.latency_budget import admission, queue_size


def test_each_budget_runs_with_the_batch_and_queue_it_gives_and_comparisons_keep_their_own_batch():
    plan = setups(180.0, [300, 1000], workers=2, batch_size=8, batch_sizes=[8, 2])
    by_label = {s.label: s for s in plan}
    assert by_label["today"].job_queue_size == TODAY_QUEUE and by_label["today"].batch_size == 8
    given = admission(300, 180.0, 2, 8)
    assert (by_label["budget 300 ms"].batch_size, by_label["budget 300 ms"].job_queue_size) == (
        given.batch_size,
        given.job_queue_size,
    )
    assert not by_label["budget 300 ms"].comparison
    batch_8 = by_label["budget 300 ms, batch 8"]
    assert (batch_8.batch_size, batch_8.job_queue_size, batch_8.comparison) == (8, queue_size(300, 180.0, 2, 8), True)
    # At 1 s the budget leaves batch 8 as asked: 8 is that budget's own setup, not a comparison.
    assert "budget 1000 ms, batch 8" not in by_label and by_label["budget 1000 ms"].batch_size == 8
    assert by_label["budget 1000 ms, batch 2"].comparison


def _cell(setup: str, comparison: bool, goodput: float) -> dict:
    return {"server": "torchserve", "setup": setup, "budget_ms": 300, "timeout_s": 0.3, "arrivals": "constant",
            "multiple": 2.0, "goodput_share": goodput, "wasted_share": 0.0, "p99_ms": 200.0,
            "deadline_header": True, "comparison": comparison, "refused_total": 0}  # fmt: skip


def test_only_the_setups_the_product_derives_are_judged_against_the_targets():
    rows = evaluate([_cell("budget 300 ms", False, 0.95), _cell("budget 300 ms, batch 8", True, 0.5)], 1000)
    assert rows and all(row["target"].startswith("budget 300 ms, client") for row in rows)
    assert all(row["met"] for row in rows)
