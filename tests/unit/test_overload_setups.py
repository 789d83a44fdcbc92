"""The overload benchmark's setups: each budget as the product derives it, comparisons measured but never judged."""

from __future__ import annotations

from tooling.bench.overload import TODAY_QUEUE, cells_for, setups
from tooling.bench.overload_report import evaluate, table
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


def test_todays_layout_also_runs_poisson_arrivals_at_half_load_as_the_reference_for_poisson_cells():
    today, budget = setups(180.0, [1000], workers=2, batch_size=8)
    groups = cells_for(today, [0.3, 1.0], [0.5, 1.0, 2.0], 1000)
    assert [(t, arrivals, loads) for t, _, arrivals, loads in groups] == [
        (0.3, "constant", [0.5, 1.0, 2.0]),
        (1.0, "constant", [0.5, 1.0, 2.0]),
        (0.3, "poisson", [0.5]),
        (1.0, "poisson", [0.5]),
    ]
    assert not any(deadline for _, deadline, _, _ in groups)
    # Without a half load there is nothing to hold to, so no Poisson cell for today.
    assert [a for _, _, a, _ in cells_for(today, [1.0], [2.0], 1000)] == ["constant"]
    budget_groups = cells_for(budget, [1.0, 2.0], [0.5, 2.0], 1000)
    assert [(t, deadline, arrivals) for t, deadline, arrivals, _ in budget_groups] == [
        (1.0, True, "constant"), (1.0, True, "poisson"), (1.0, False, "constant"),
        (2.0, True, "constant"), (2.0, True, "poisson"),
    ]  # fmt: skip


def _half_load(setup: str, arrivals: str, p50: float, budget: int | None) -> dict:
    return {"server": "torchserve", "setup": setup, "budget_ms": budget, "timeout_s": 1.0, "arrivals": arrivals,
            "multiple": 0.5, "p50_ms": p50, "refused_total": 0, "deadline_header": budget is not None}  # fmt: skip


def test_half_load_p50_is_held_to_today_under_the_same_arrivals():
    cells = [
        _half_load("today", "constant", 15.0, None),
        _half_load("today", "poisson", 30.0, None),
        _half_load("budget 1000 ms", "constant", 16.0, 1000),
        _half_load("budget 1000 ms", "poisson", 33.0, 1000),
    ]
    p50_rows = {row["target"]: row for row in evaluate(cells, 1000) if "p50" in row["target"]}
    assert len(p50_rows) == 2 and all(row["met"] for row in p50_rows.values()), p50_rows
    poisson = next(row for target, row in p50_rows.items() if "poisson" in target)
    assert poisson["measured"] == 33.0 / 30.0 and "today's 30 ms" in poisson["target"]


def test_the_table_shows_where_the_cpu_went_and_the_goodput_per_worker_core_against_saturations():
    cell = {**_cell("budget 300 ms", False, 0.7), "job_queue_size": 6, "offered_rps": 400.0, "goodput_rps": 70.0,
            "refused": {"503 ServiceUnavailableException": 900}, "gave_up": 0, "p50_ms": 150.0, "computed": 280.0,
            "wasted": 0.0, "workers_cpu_cores": 1.0, "frontend_cpu_cores": 0.45,
            "client_cpu_fraction": 0.4}  # fmt: skip
    row = table([cell], per_worker_core_at_saturation=70.0)[2]
    assert row.rstrip(" |").endswith("| 1.00 / 0.45 / 0.40 | 100"), row
    # Without a reference (or a cell without the split, LitServe's) the column says so rather than guessing.
    assert table([cell])[2].rstrip(" |").endswith("| –"), table([cell])[2]
