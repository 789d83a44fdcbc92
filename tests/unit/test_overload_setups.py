"""The overload benchmark's setups: each budget as the product derives it, comparisons measured but never judged."""

from __future__ import annotations

import re

import pytest

from handlers.cpu_quota import usable_cpus
from scripts import latency_budget, overload
from tooling.bench.overload import TODAY_QUEUE, cells_for, setups, shipped_setup, work_figures
from tooling.bench.overload_report import evaluate, legend, table, targets_table
from tooling.cpu_layout import Layout
from tooling.latency_budget import admission, queue_size
from tooling.paths import REPO


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
            "admitted_p99_ms": 250.0, "deadline_header": True, "comparison": comparison,
            "refused_total": 0}  # fmt: skip


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


# ---- what the shipped defaults do: the setups derived as scripts/serve.sh derives them ---------------------------


@pytest.mark.parametrize(("cores", "workers"), [(2, 2), (4, 4), (4, 1)])  # one a CPU (the demo), one of every CPU
@pytest.mark.parametrize("budget", [300, 1000, 2000])
def test_the_shipped_setup_is_the_queue_and_batch_serve_sh_registers_on_a_cpu_host(capsys, cores, workers, budget):
    # What serve.sh evaluates on a CPU host of `cores` cores with LATENCY_BUDGET_MS=budget and no THROUGHPUT_RPS.
    assert latency_budget.main(["--device", "cpu", "--units", str(cores), "--workers", str(workers),
                                "--batch-size", "8", "--budget-ms", str(budget)]) == 0  # fmt: skip
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.split())
    shipped = shipped_setup(budget, cores, workers, overload.BATCH_SIZE)
    assert (shipped.job_queue_size, shipped.batch_size) == (int(printed["JOB_QUEUE_SIZE"]), int(printed["BATCH_SIZE"]))
    assert shipped.throughput_rps == float(printed["THROUGHPUT_RPS"]) and shipped.budget_ms == budget
    assert shipped.label == f"budget {budget} ms, as serve.sh ships" and shipped.shipped and not shipped.comparison


def test_serve_sh_still_derives_its_queue_from_the_inputs_the_shipped_setups_pass(tmp_path):
    """A tripwire: the shipped setups pass --device cpu --units CPUS --workers WORKERS --batch-size 8 and no
    --throughput-rps, CPUS and WORKERS serve.sh's layout of the archive (scripts/cpu_layout.py: one worker a CPU for
    the demo archive's one thread, one for an archive whose workers take every CPU), as serve.sh does on CPU; if
    serve.sh changes that, tooling/bench/overload.py must follow."""
    from tests.deploy.manifests import archive_with_handler_options
    from tooling.cpu_layout import cpu_layout

    serve = (REPO / "scripts" / "serve.sh").read_text()
    assert "BATCH_SIZE=${BATCH_SIZE:-8}" in serve and "UNITS=$CPUS" in serve
    assert 'scripts.cpu_layout "model_store/$MODEL_NAME.mar" ${WORKERS:+--workers "$WORKERS"}' in serve
    demo = archive_with_handler_options(tmp_path / "bert.mar", {"cpu_threads": 1})  # as scripts/setup.sh archives it
    assert "--backend onnx --handler-option cpu_threads=1" in (REPO / "scripts" / "setup.sh").read_text()
    assert (cpu_layout(demo, 3).cpus, cpu_layout(demo, 3).workers) == (3, 3)
    call = re.search(r"scripts\.latency_budget (.*?)\)\n", serve, re.S)
    assert call is not None, "serve.sh no longer evaluates scripts.latency_budget"
    assert '--device "$DEVICE" --units "$UNITS" --workers "$WORKERS"' in call.group(1)
    assert '--batch-size "$BATCH_SIZE"' in call.group(1)
    assert "${THROUGHPUT_RPS:+--throughput-rps" in call.group(1)  # only when the operator sets it
    assert overload.BATCH_SIZE == 8
    # The benchmark takes serve.sh's layout for the archive it serves, whatever its cpu_threads.
    every_cpu = archive_with_handler_options(tmp_path / "every-cpu.mar", {"cpu_threads": 0})
    cpus = usable_cpus()
    for archive, workers in ((demo, cpus), (every_cpu, 1)):
        layout = overload.serve_sh_layout(archive)
        assert (layout.cpus, layout.workers) == (cpus, workers), archive.name


def test_each_budget_is_also_run_as_serve_sh_ships_it_with_deadlines_and_judged():
    shipped_layout = Layout(cpus=2, workers=1, threads=2, busy=2)  # an archive of every CPU: one worker of two
    plan = setups(144.0, [300, 1000, 2000], 2, 8, shipped_budgets_ms=[300, 1000, 2000], shipped_layout=shipped_layout)
    labels = [s.label for s in plan]
    shipped_after_each = [f"budget {b} ms{suffix}" for b in (300, 1000, 2000) for suffix in ("", ", as serve.sh ships")]
    assert labels == ["today", *shipped_after_each]
    by_label = {s.label: s for s in plan}
    # The measured setups from the saturation measured here, the shipped ones from 90 req/s per core.
    assert by_label["budget 1000 ms"].job_queue_size == admission(1000, 144.0, 2, 8).job_queue_size
    assert by_label["budget 1000 ms, as serve.sh ships"].job_queue_size == admission(1000, 180.0, 1, 8).job_queue_size
    assert admission(1000, 180.0, 1, 8).job_queue_size != admission(1000, 180.0, 2, 8).job_queue_size
    assert by_label["budget 1000 ms"].throughput_rps == 144.0
    assert by_label["budget 1000 ms, as serve.sh ships"].throughput_rps == 180.0
    shipped = by_label["budget 1000 ms, as serve.sh ships"]
    groups = cells_for(shipped, [0.3, 1.0, 2.0], [0.5, 2.0], 1000)
    # Clients that send their deadline (as the shipped product expects), at the matching timeout and, for the
    # default budget, the longer one; no "no deadline" contrast (the measured setup has it).
    assert [(t, deadline, arrivals) for t, deadline, arrivals, _ in groups] == [
        (1.0, True, "constant"), (1.0, True, "poisson"), (2.0, True, "constant"), (2.0, True, "poisson"),
    ]  # fmt: skip
    cell = {**_cell("budget 1000 ms, as serve.sh ships", False, 0.95), "budget_ms": 1000, "timeout_s": 1.0}
    assert evaluate([cell], 1000), "the shipped setups are the product's: judged"
    # Without --shipped-budgets nothing changes, and asking for them without the host's cores is an error.
    assert [s.label for s in setups(144.0, [1000], 2, 8)] == ["today", "budget 1000 ms"]
    with pytest.raises(ValueError):
        setups(144.0, [1000], 2, 8, shipped_budgets_ms=[1000])


# ---- the targets and the table read the window's figures ----------------------------------------------------------


def test_the_p99_target_judges_every_admitted_request_so_late_ones_make_it_fail():
    # The 200s' p99 (290 ms) is within the 300 ms budget, as it always is with 300 ms clients: what is judged is
    # the p99 of every admitted request, the late ones (given up, refused late) counting as beyond the timeout.
    late = {**_cell("budget 300 ms", False, 0.95), "p99_ms": 290.0, "admitted_p99_ms": None}
    timely = {**_cell("budget 300 ms", False, 0.95), "p99_ms": 290.0, "admitted_p99_ms": 280.0}
    older = {k: v for k, v in _cell("budget 300 ms", False, 0.95).items() if k != "admitted_p99_ms"}
    p99 = [next(r for r in evaluate([c], 1000) if "p99" in r["target"]) for c in (late, timely, older)]
    assert [r["met"] for r in p99] == [False, True, None]
    assert all("p99 of the admitted" in r["target"] for r in p99)
    shown = targets_table(p99)
    assert "| > 300 ms (timeout) | **no** |" in shown[2] and "| 280.00 | yes |" in shown[3], shown
    assert "not measured" in shown[4], shown  # a run from before the figure: never judged as met


def test_the_table_shows_percentiles_beyond_the_timeout_the_refusals_latency_and_flags_a_lagging_generator():
    cell = {**_cell("budget 300 ms", False, 0.7), "job_queue_size": 6, "batch_size": 4, "offered_rps": 400.0,
            "sent_rps": 380.0, "goodput_rps": 70.0, "refused": {"503 ServiceUnavailableException": 900},
            "gave_up": 3, "p50_ms": 150.0, "all_p50_ms": None, "all_p99_ms": None, "admitted_p99_ms": 290.0,
            "refusal_p50_ms": 2.0, "refusal_p99_ms": 9.0, "send_lag_p99_ms": 45.0, "send_lag_max_ms": 120.0,
            "send_lag_unreliable": True, "computed": 280.0, "wasted": 0.0, "workers_cpu_cores": 1.0,
            "frontend_cpu_cores": 0.45, "client_cpu_fraction": 0.4, "window_s": [1.0, 5.0]}  # fmt: skip
    row = table([cell])[2]
    assert "| 6; 4 |" in row and "| 400 (380) |" in row
    assert "| 150 / 200 | > 300 / > 300 | 290 | 2 / 9 | ⚠ 45 / 120 |" in row, row
    assert row.startswith("| ⚠ torchserve, budget 300 ms |"), row
    quiet = {**cell, "send_lag_unreliable": False}
    assert "⚠" not in table([quiet])[2]
    rows = evaluate([cell], 1000)
    assert rows and all(r.get("unreliable") for r in rows)
    assert all("⚠ send lag: unreliable" in line for line in targets_table(rows)[2:])
    assert "(1–5 s after each cell's first arrival)" in legend([cell])[0]


def test_work_computed_for_nobody_is_held_to_the_whole_cells_answers_not_the_windows():
    # The handler computed 400 items over the whole cell and the client received 400 answers in time, of which
    # 300 were scheduled in the window: nothing was computed for nobody.
    summary = {"answered_in_time": 300, "whole_schedule": {"answered_in_time": 400}}
    figures = work_figures(summary, handed=420.0, refused_by_handler=20.0)
    assert figures == {"handed_to_handler": 420.0, "computed": 400.0, "wasted": 0.0, "wasted_share": 0.0}
    assert work_figures(summary, handed=500.0, refused_by_handler=0.0)["wasted"] == 100.0
