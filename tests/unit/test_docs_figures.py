"""Figures the README, docs/benchmarks.md and code comments derive from a committed measurement, read here from its
JSON (docs/bench-*/), so that a figure cannot drift from the run it cites. The CPU autoscaling targets are checked
in tests/deploy/test_observability.py, the GPU figures in tests/deploy/test_gpu.py."""

from __future__ import annotations

import json

from tooling.paths import REPO

DOCS = REPO / "docs"


def _one_line(path) -> str:
    """A file's text with line breaks and comment markers inside a sentence taken out."""
    return " ".join(line.strip().lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines())


def _demo_cell(config: str, concurrency: int) -> dict:
    served = json.loads((DOCS / "bench-demo" / "benchmark.json").read_text())["served"]
    [cell] = [c for c in served if c["config"] == config and c["concurrency"] == concurrency]
    return cell


def test_the_noise_section_states_the_committed_demo_runs_ratio_on_each_basis():
    sequential = _demo_cell("batch_size=1", 16)["rps"]
    at_10_ms = _demo_cell("batch_size=8, delay=10ms", 16)["rps"]
    at_2_ms = _demo_cell("batch_size=8, delay=2ms", 16)["rps"]
    text = _one_line(DOCS / "benchmarks.md")
    assert f"for `batch_size=8, delay=10ms` at 16 clients 79.4, 73.4 and {at_10_ms:.1f} req/s" in text
    assert f"`batch_size=1` at 16 clients 40.5, 50.4 and {sequential:.1f} req/s" in text
    assert f"1.96, 1.46 and {at_10_ms / sequential:.2f} (the third run is `docs/bench-demo/`" in text
    assert f"gives the {at_2_ms / sequential:.2f} of its targets: {at_2_ms:.1f} / {sequential:.1f})" in text


def test_the_readme_delay_figures_are_the_demo_runs_lone_client_medians():
    readme = _one_line(REPO / "README.md")
    lone = {delay: _demo_cell(f"batch_size=8, delay={delay}ms", 1)["p50_ms"] for delay in (2, 50)}
    assert f"({lone[2]:.1f} ms at 2 ms, {lone[50]:.1f} ms at 50 ms)" in readme
    assert "Measured with the PyTorch archive, one worker, on a 2-core AMD VM" in readme
    assert json.loads((DOCS / "bench-demo" / "benchmark.json").read_text())["machine"].startswith("2 cores, AMD")


def test_the_float16_difference_cited_is_the_largest_of_the_committed_gpu_runs():
    runs = [json.loads(path.read_text()) for path in sorted((DOCS / "bench-gpu").glob("*.json"))]
    largest = max(
        cell["answers_max_abs_diff"] for run in runs for cell in run["served"] if "answers_max_abs_diff" in cell
    )
    figure = f"{largest:.1e}".replace("e-0", "e-")
    assert f"measured at most {figure}" in _one_line(REPO / "tooling" / "bench" / "answers.py")
    assert f"within {figure} of float32" in _one_line(REPO / "README.md")


def test_the_cuda_graphs_figures_quoted_are_the_committed_h200_runs():
    run = json.loads((DOCS / "bench-gpu-h200" / "benchmark.json").read_text())
    cells = {(c["backend"], c["workers"], c["concurrency"]): c for c in run["served"]}
    assert "NVIDIA H200 (CUDA" in (DOCS / "bench-gpu-h200" / "benchmark.md").read_text().splitlines()[0]
    readme, benchmarks = _one_line(REPO / "README.md"), _one_line(DOCS / "benchmarks.md")
    lone_graphs, lone_eager = cells["pytorch-graphs", 1, 1]["p50_ms"], cells["pytorch", 1, 1]["p50_ms"]
    assert f"median **{lone_graphs:.1f} ms** against eager passes' {lone_eager:.1f}" in readme
    graphs, eager = cells["pytorch-graphs", 8, 256]["rps"], cells["pytorch", 8, 256]["rps"]
    ratio = graphs / eager
    assert f"served {ratio:.1f}× eager's requests at 256 clients ({graphs:,.0f} against {eager:,.0f} req/s)" in readme
    graphs, eager = cells["pytorch-graphs", 8, 1024]["rps"], cells["pytorch", 8, 1024]["rps"]
    assert f"at 1,024 clients eager led, {eager:,.0f} against {graphs:,.0f}" in readme
    assert f"| 8 workers, 1,024 | {graphs:,.0f} | **{eager:,.0f}** |" in benchmarks
    checked = sum(c["answers_checked"] for c in run["served"])
    wrong = sum(c["answers_wrong"] for c in run["served"])
    assert f"{wrong} wrong of {checked:,}" in benchmarks
    assert f"{lone_eager / lone_graphs:.1f}× lower" in benchmarks  # "a median 2.5× lower"
