"""What a benchmark run keeps when part of it fails or is cut short: a backend's ceilings that raise are recorded and
the run goes on, results files are replaced whole, the workers' log is copied in bounded size, and the warm-up's
clients fill the batches without queueing the largest cell's crowd. No server here: tests/e2e/test_benchmark_quick.py
holds a failed registration, the copied model_log and a SIGTERM to a real TorchServe."""

from __future__ import annotations

import json
import os

import pytest

import scripts.benchmark
import tooling.bench.ceilings
import tooling.bench.served
from scripts.benchmark import main
from tooling.bench.backends import BACKENDS, Backend
from tooling.bench.report import failures_section
from tooling.bench.served import copy_model_log, model_load_failure, warm_up_clients
from tooling.files import write_atomically


def test_a_backend_whose_ceilings_fail_is_recorded_and_the_run_goes_on_then_exits_1(monkeypatch, tmp_path):
    """The run's own code path (main -> run) on the tiny model, its served cells stubbed (no TorchServe): the first
    backend's handler ceiling raises, as a CUDA graph capture in this process can; the second's are measured,
    benchmark.json says what failed and why, and was on disk before the first ceiling started."""
    out = tmp_path / "out"
    monkeypatch.setitem(BACKENDS, "pytorch-copy", Backend("pytorch-copy", onnx=False))
    on_disk_before_ceilings = []
    real_plain_loop, real_handler_ceiling = tooling.bench.ceilings.plain_loop, tooling.bench.ceilings.handler_ceiling

    def plain_loop(prepared, *args, **kwargs):
        if not on_disk_before_ceilings:
            on_disk_before_ceilings.append(json.loads((out / "benchmark.json").read_text()))
        return real_plain_loop(prepared, *args, **kwargs)

    def handler_ceiling(prepared, *args, **kwargs):
        if prepared.name == "pytorch":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return real_handler_ceiling(prepared, *args, **kwargs)

    served_with = {}

    def served_cells(backends, *args, **kwargs):
        served_with.update(backends=[p.name for p in backends], **kwargs)
        return []

    monkeypatch.setattr(tooling.bench.ceilings, "plain_loop", plain_loop)
    monkeypatch.setattr(tooling.bench.ceilings, "handler_ceiling", handler_ceiling)
    monkeypatch.setattr(scripts.benchmark, "served_cells", served_cells)
    argv = ["--quick", "--model", "tiny", "--device", "cpu", "--backends", "pytorch,pytorch-copy", "--out", str(out)]
    assert main(argv) == 1

    [before] = on_disk_before_ceilings
    assert before["complete"] is False and before["ceilings"] == [] and before["failures"] == []
    report = json.loads((out / "benchmark.json").read_text())
    assert report["complete"] is True
    assert report["failures"] == [
        {
            "stage": "ceilings",
            "backend": "pytorch",
            "error": "RuntimeError: CUDA error: operation not permitted when stream is capturing",
        }
    ]
    assert {row["backend"] for row in report["ceilings"]} == {"pytorch-copy"}
    assert len(report["ceilings"]) == 5  # the plain loop at 1, 8 arrival and 8 length; the handler twice
    # The served cells still ran, for both backends, told where failures go and where the workers' logs go.
    assert served_with["backends"] == ["pytorch", "pytorch-copy"] and served_with["logs_to"] == out
    assert served_with["failed"] is not None
    table = (out / "benchmark.md").read_text()
    error = "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert f"| ceilings | pytorch | – | {error} |" in table


def test_without_a_failure_callback_a_failing_ceiling_raises(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tooling.bench.ceilings, "_backend_ceilings", fail)
    monkeypatch.setattr(tooling.bench.ceilings, "release", lambda device: None)
    with pytest.raises(RuntimeError, match="boom"):
        tooling.bench.ceilings.ceilings([object()], [], 8, {}, print)


def test_results_are_replaced_whole_or_left_as_they_were(monkeypatch, tmp_path):
    path = tmp_path / "benchmark.json"
    write_atomically(path, '{"cells": 1}')
    assert path.read_text() == '{"cells": 1}'

    def stopped(*args):  # a time limit's SIGTERM (the benchmark turns it into SystemExit) just before the rename
        raise SystemExit(143)

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(SystemExit):
        write_atomically(path, '{"cells": 2, "more": "' + "x" * 100_000 + '"}')
    assert json.loads(path.read_text()) == {"cells": 1}  # the previous file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["benchmark.json"]  # no partial file left beside it


def test_the_benchmark_writes_its_results_through_the_atomic_writer(monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(scripts.benchmark, "write_atomically", lambda path, text: written.append(path.name))
    monkeypatch.setattr(scripts.benchmark, "served_cells", lambda *args, **kwargs: [])
    assert main(["--quick", "--model", "tiny", "--device", "cpu", "--backends", "pytorch", "--no-ceilings",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    assert written[0] == "benchmark.json" and set(written) == {"benchmark.json", "benchmark.md"}
    assert not (tmp_path / "benchmark.json").exists()


@pytest.mark.parametrize(
    ("batch_size", "workers", "clients"),
    [(1, 1, 2), (128, 1, 256), (128, 8, 1024), (8, 0, 16)],  # 0 workers: counted as one
)
def test_the_warm_up_fills_every_workers_batches_twice_and_never_exceeds_the_largest_cell(batch_size, workers, clients):
    assert warm_up_clients([1, 256, 1024], batch_size, workers) == clients
    assert warm_up_clients([1, 16], 8, 1) == 16


LOG = """\
2026-01-01T00:00:00,000 [INFO ] W-9000-bench-pytorch-1xall-b8-d2_1.0-stdout MODEL_LOG - frame reader: buffered
2026-01-01T00:00:01,000 [INFO ] W-9001-bench-pytorch-graphs-1xall-b8-d2_1.0-stdout MODEL_LOG - Traceback (most recent call last):
2026-01-01T00:00:01,000 [INFO ] W-9001-bench-pytorch-graphs-1xall-b8-d2_1.0-stdout MODEL_LOG - RuntimeError: CUDA error: capture failed
2026-01-01T00:00:02,000 [INFO ] W-9002-bench-pytorch-1xall-b1-d0_1.0-stdout MODEL_LOG - ValueError: not this one's
"""  # noqa: E501


def test_a_failed_registration_is_explained_by_its_own_workers_exception_not_a_neighbours():
    assert model_load_failure(LOG, "bench-pytorch-graphs-1xall-b8-d2") == "RuntimeError: CUDA error: capture failed"
    assert model_load_failure(LOG, "bench-pytorch-1xall-b1-d0") == "ValueError: not this one's"
    assert model_load_failure(LOG, "bench-pytorch-1xall-b8-d2") is None


def test_the_model_log_copy_is_what_the_layout_added_head_and_tail_within_its_cap(monkeypatch, tmp_path):
    log = tmp_path / "model_log.log"
    log.write_bytes(b"earlier layout\n" + b"".join(b"line %05d\n" % i for i in range(1000)))
    start = len(b"earlier layout\n")
    copied = copy_model_log(log, start, tmp_path / "out" / "model_log-1xall.log")
    assert copied.read_bytes() == log.read_bytes()[start:]

    monkeypatch.setattr(tooling.bench.served, "MODEL_LOG_HEAD_BYTES", 110)
    monkeypatch.setattr(tooling.bench.served, "MODEL_LOG_TAIL_BYTES", 220)
    capped = copy_model_log(log, start, tmp_path / "out" / "capped.log").read_bytes()
    assert capped.startswith(b"line 00000\n") and capped.endswith(b"line 00999\n")
    assert b"bytes of model_log.log cut here" in capped and len(capped) < 110 + 220 + 100
    assert b"earlier layout" not in capped
    # log4j rolled the file over meanwhile (smaller than where the layout started): all of the new one.
    log.write_bytes(b"rolled\n")
    assert copy_model_log(log, start, tmp_path / "out" / "rolled.log").read_bytes() == b"rolled\n"
    assert copy_model_log(tmp_path / "absent.log", 0, tmp_path / "out" / "none.log") is None


def test_the_markdown_lists_each_failure_with_its_error_on_one_row():
    failures = [{"stage": "registration", "backend": "pytorch-graphs", "layout": "8xall", "config": "batch_size=128",
                 "model": "m", "error": "registering m failed: HTTP 500: a | b\nnext line"}]  # fmt: skip
    lines = failures_section(failures)
    assert lines[-1] == (
        "| registration | pytorch-graphs | 8xall, batch_size=128 | registering m failed: HTTP 500: a \\| b next line |"
    )
    assert failures_section([]) == []
