"""The benchmark's --quick mode runs end to end and writes complete, sane output (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tooling.paths import REPO

pytestmark = pytest.mark.e2e


def test_quick_benchmark_output_is_complete(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "scripts.benchmark", "--quick", "--model", "tiny", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "benchmark.json").read_text())

    configs = {c["config"] for c in report["served"]}
    assert configs == {"batch_size=1", "batch_size=8, delay=2ms"}
    assert {c["concurrency"] for c in report["served"]} == {1, 4, 16}
    for cell in report["served"]:
        assert cell["errors"] == 0
        assert cell["requests"] > 0 and cell["rps"] > 0
        assert 0 < cell["p50_ms"] <= cell["p95_ms"] <= cell["p99_ms"]
        assert 0 <= cell["client_cpu_fraction"] < 2
        if cell["batch_size"] == 1:
            assert cell["mean_batch_size"] == pytest.approx(1.0)
        else:
            assert 1.0 <= cell["mean_batch_size"] <= 8.0
    # With 16 clients and a batch size of 8, TorchServe must have formed real batches.
    assert max(c["mean_batch_size"] for c in report["served"] if c["batch_size"] == 8) > 1.5

    ceilings = report["ceilings"]
    assert set(ceilings) == {"hf_loop_b1", "hf_loop_b8", "handler_b8_pad_to_longest", "handler_b8_length_aware"}
    assert all(c["texts_per_s"] > 0 for c in ceilings.values())
    aware, padded = ceilings["handler_b8_length_aware"], ceilings["handler_b8_pad_to_longest"]
    assert aware["padding_waste"] <= padded["padding_waste"]
    assert report["targets"] and all(isinstance(t["met"], bool) for t in report["targets"])

    table = (tmp_path / "benchmark.md").read_text()
    assert "| batch_size=1 | 16 |" in table and "hf_loop_b8" in table
    png = (tmp_path / "benchmark.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
