"""The latency budget, the one overload knob: the queue it gives TorchServe, and the command serve.sh evaluates."""

from __future__ import annotations

import pytest

from scripts import latency_budget
from tooling.latency_budget import DEFAULT_BUDGET_MS, admission, machine_throughput, queue_size


def test_the_queue_holds_what_the_workers_finish_in_half_the_budget_less_one_and_a_half_batches_each():
    # 180 req/s for half of 1 s is 90 requests; two workers' batches of 8 are half done, its own batch follows.
    assert admission(1000, 180.0, workers=2, batch_size=8).job_queue_size == 90 - 24
    assert admission(2000, 180.0, 2, 8).job_queue_size == 180 - 24


def test_a_budget_too_short_still_queues_a_full_batch_per_worker():
    given = admission(50, 180.0, 2, 8)
    assert given.job_queue_size == 2 * given.batch_size


def test_a_budget_under_five_batch_times_gets_smaller_batches():
    # 90 req/s per worker: a batch of 8 takes 89 ms, and a full queue's floor waits 2.5 batch times (222 ms of
    # 300). Batches of 5 (56 ms) hold it to half the budget, and the queue follows the smaller batch.
    given = admission(300, 180.0, 2, 8)
    assert (given.batch_size, given.job_queue_size) == (5, int(180 * 0.15 - 1.5 * 2 * 5))
    assert 2.5 * given.batch_size / 90 <= 0.150 < 2.5 * (given.batch_size + 1) / 90
    assert queue_size(300, 180.0, 2, 8) == 16  # the batch as asked: the queue floor of one batch per worker


def test_the_default_budgets_leave_the_batch_as_asked():
    assert admission(DEFAULT_BUDGET_MS, machine_throughput("cpu", 2), 2, 8).batch_size == 8
    assert admission(DEFAULT_BUDGET_MS, machine_throughput("gpu", 1), 8, 128).batch_size == 128
    assert admission(60_000, 180.0, 2, 8).batch_size == 8  # never larger than asked


def test_the_queue_grows_with_the_budget_and_the_throughput():
    sizes = [admission(budget, 180.0, 2, 8).job_queue_size for budget in (300, 1000, 2000)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3
    assert admission(1000, machine_throughput("gpu", 1), 8, 128).job_queue_size > 10 * sizes[1]


@pytest.mark.parametrize(
    ("budget", "throughput", "workers", "batch"), [(0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)]
)
def test_nonsense_is_refused(budget, throughput, workers, batch):
    with pytest.raises(ValueError):
        admission(budget, throughput, workers, batch)


def test_the_command_prints_shell_assignments_for_serve_sh(capsys):
    assert latency_budget.main(["--device", "cpu", "--units", "2", "--workers", "2", "--batch-size", "8"]) == 0
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.split())
    expected = admission(DEFAULT_BUDGET_MS, machine_throughput("cpu", 2), 2, 8)
    assert printed == {
        "LATENCY_BUDGET_MS": str(DEFAULT_BUDGET_MS),
        "THROUGHPUT_RPS": f"{expected.throughput_rps:g}",
        "BATCH_SIZE": "8",
        "JOB_QUEUE_SIZE": str(expected.job_queue_size),
    }
    assert latency_budget.main(["--device", "cpu", "--units", "2", "--workers", "2", "--batch-size", "8",
                                "--budget-ms", "300", "--throughput-rps", "1000"]) == 0  # fmt: skip
    assert "JOB_QUEUE_SIZE=126" in capsys.readouterr().out
    # A budget too short for the batch asked: serve.sh registers the smaller one, and is told why.
    assert latency_budget.main(["--device", "cpu", "--units", "2", "--workers", "2", "--batch-size", "8",
                                "--budget-ms", "300"]) == 0  # fmt: skip
    printed = capsys.readouterr()
    assert "BATCH_SIZE=5" in printed.out.split()
    assert "batches of 5, not 8" in printed.err
    # Two workers at 180 req/s between them: each takes 89 ms over a batch of 8 (90 req/s of its own).
    assert "a batch takes 89 ms at 180 req/s" in printed.err
