"""The benchmark's targets are data (tooling/bench/targets.yaml), evaluated by tooling/bench/targets.py."""

from __future__ import annotations

import pytest

from tooling.bench.backends import BACKENDS
from tooling.bench.targets import TargetError, evaluate_expression, evaluate_targets, load_targets

SERVED = [
    {
        "backend": "pytorch",
        "workers": 1,
        "batch_size": 1,
        "max_batch_delay_ms": 0,
        "concurrency": 16,
        "rps": 40.0,
        "p50_ms": 9.0,
    },
    {
        "backend": "pytorch",
        "workers": 1,
        "batch_size": 8,
        "max_batch_delay_ms": 2,
        "concurrency": 1,
        "rps": 30.0,
        "p50_ms": 20.0,
    },
    {
        "backend": "pytorch",
        "workers": 1,
        "batch_size": 8,
        "max_batch_delay_ms": 2,
        "concurrency": 16,
        "rps": 70.0,
        "p50_ms": 90.0,
    },
    {
        "backend": "pytorch",
        "workers": 1,
        "batch_size": 8,
        "max_batch_delay_ms": 2,
        "concurrency": 64,
        "rps": 66.0,
        "p50_ms": 99.0,
    },
    # Another CPU layout of the same backend: the baselines (one worker, the seed's) must not pick it up.
    {"backend": "pytorch", "workers": 2, "batch_size": 1, "max_batch_delay_ms": 0, "concurrency": 16, "rps": 999.0},
    {"backend": "onnx-fp32", "batch_size": 1, "max_batch_delay_ms": 0, "concurrency": 16, "rps": 100.0},
    {"backend": "onnx-fp32", "batch_size": 8, "max_batch_delay_ms": 2, "concurrency": 16, "rps": 120.0},
    {"backend": "onnx-int8", "batch_size": 8, "max_batch_delay_ms": 2, "concurrency": 16, "rps": 90.0},
]
CEILINGS = [
    {
        "backend": "pytorch",
        "kind": "loop",
        "order": "arrival",
        "batch_size": 1,
        "texts_per_s": 60.0,
        "p50_ms_per_batch": 14.0,
    },
    {
        "backend": "pytorch",
        "kind": "loop",
        "order": "arrival",
        "batch_size": 8,
        "texts_per_s": 50.0,
        "p50_ms_per_batch": 150.0,
    },
    # Length-sorted is not the Hugging Face loop as users run it: never the targets' reference.
    {
        "backend": "pytorch",
        "kind": "loop",
        "order": "length",
        "batch_size": 8,
        "texts_per_s": 500.0,
        "p50_ms_per_batch": 15.0,
    },
    {"backend": "pytorch", "kind": "handler", "planning": "pad_to_longest", "texts_per_s": 40.0},
    {"backend": "pytorch", "kind": "handler", "planning": "length_aware", "texts_per_s": 80.0},
]


def by_name(results: list[dict]) -> dict[str, dict]:
    return {r["target"]: r for r in results}


def test_the_shipped_targets_load_and_name_only_known_tables_and_backends():
    targets = load_targets()
    assert len(targets) >= 7
    for target in targets:
        for spec in target["select"].values():
            assert spec["table"] in ("served", "ceilings")
            assert spec["where"].get("backend", "pytorch") in BACKENDS


def test_each_shipped_target_is_computed_from_the_runs_figures():
    results = evaluate_targets({"served": SERVED, "ceilings": CEILINGS})
    expected = [
        120 / 60,  # ONNX fp32 at 16 clients (best batching) / the best plain PyTorch loop
        120 / 40,  # ONNX fp32 / the PyTorch batch_size=1 service at 16 clients
        90 / 40,  # int8 / the same baseline: 2.25, missed
        66 / 60,  # PyTorch batched at the most clients measured (64, not 16) / the best loop
        80 / 40,  # length-aware / pad-to-longest handler ceiling
        70 / 40,  # PyTorch batch_size=8 / batch_size=1 at 16 clients
        20 - 14 - 2,  # lone-client p50 - single-text median - delay, in ms, lower is better: 4 <= 5
    ]
    assert [r["measured"] for r in results] == pytest.approx(expected)
    assert [r["met"] for r in results] == [True, True, False, True, True, True, True]


def test_a_target_whose_rows_were_not_measured_is_reported_not_measured():
    served = [row for row in SERVED if row["backend"] != "onnx-int8"]
    results = evaluate_targets({"served": served, "ceilings": CEILINGS})
    int8 = [r for r in results if r["target"].startswith("int8")]
    assert int8 and all(r["measured"] is None and r["met"] is None for r in int8)


def test_lower_is_better_targets_compare_the_other_way():
    target = {
        "name": "p50",
        "select": {"p50": {"table": "served", "where": {"concurrency": 1}, "field": "p50_ms", "pick": "only"}},
        "measured": "p50 - 2",
        "goal": 17,
        "lower_is_better": True,
    }
    [result] = evaluate_targets({"served": SERVED, "ceilings": []}, [target])
    assert result["measured"] == 18 and result["met"] is False


def test_a_target_measured_exactly_at_its_goal_is_met_either_way():
    # targets.yaml: met when measured >= goal (<= with lower_is_better); reaching the goal is meeting it.
    select = {"p50": {"table": "served", "where": {"concurrency": 1}, "field": "p50_ms", "pick": "only"}}
    higher = {"name": "higher", "select": select, "measured": "p50", "goal": 20}
    lower = {**higher, "name": "lower", "lower_is_better": True}
    results = evaluate_targets({"served": SERVED, "ceilings": []}, [higher, lower])
    assert [(r["measured"], r["met"]) for r in results] == [(20.0, True), (20.0, True)]


def test_an_ambiguous_only_pick_is_an_error_not_a_silent_choice():
    target = {"name": "x", "select": {"a": {"table": "served", "where": {"backend": "pytorch"}, "field": "rps"}},
              "measured": "a", "goal": 1}  # fmt: skip
    with pytest.raises(TargetError, match="matches 5 rows"):
        evaluate_targets({"served": SERVED, "ceilings": []}, [target])


@pytest.mark.parametrize("expression", ["__import__('os')", "a.real", "a ** 2", "[a]", "b"])
def test_expressions_are_arithmetic_over_the_selected_names_only(expression):
    with pytest.raises(TargetError):
        evaluate_expression(expression, {"a": 2.0})
    assert evaluate_expression("(a + 1) / 3 - -1", {"a": 2.0}) == 2.0


def test_a_target_naming_a_device_is_held_to_runs_on_that_device_only():
    target = {"name": "gpu only", "device": "cuda", "select": {"x": {"table": "served", "field": "rps", "pick": "max"}},
              "measured": "x", "goal": 1}  # fmt: skip
    plain = {"name": "any device", "select": {"x": {"table": "served", "field": "rps", "pick": "max"}},
             "measured": "x", "goal": 1}  # fmt: skip
    run = {"served": SERVED, "ceilings": []}
    assert [r["target"] for r in evaluate_targets({**run, "settings": {"device": "cpu"}}, [target, plain])] == [
        "any device"
    ]
    on_gpu = evaluate_targets({**run, "settings": {"device": "cuda"}}, [target, plain])
    assert [r["target"] for r in on_gpu] == ["gpu only", "any device"] and on_gpu[0]["met"] is True
    shipped = load_targets()
    assert {t.get("device") for t in shipped} == {None, "cuda"}
    for target in shipped:
        for spec in target["select"].values():
            if target.get("device") == "cuda":
                assert spec["where"]["backend"] == "pytorch-graphs"


def test_the_targets_table_shows_rates_whole_and_ratios_to_three_decimals():
    from tooling.bench.report import targets_table

    rows = [
        {"target": "rate", "measured": 8757.4, "goal": 20000.0, "unit": "requests/s", "met": False},
        {"target": "ratio", "measured": 1.23456, "goal": 1.5, "unit": "x", "met": False},
        {"target": "gpu", "measured": None, "goal": 8.0, "unit": "ms", "met": None},
    ]
    assert targets_table(rows)[2:] == [
        "| rate | 8757 requests/s | 20000 requests/s | NO |",
        "| ratio | 1.235 | 1.500 | NO |",
        "| gpu | – ms | 8.000 ms | not measured |",
    ]
