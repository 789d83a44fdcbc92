"""Figures the README, docs/benchmarks.md and code comments derive from a committed measurement, read here from its
JSON (docs/bench-*/), so that a figure cannot drift from the run it cites. The CPU autoscaling targets are checked
in tests/deploy/test_observability.py, the GPU figures in tests/deploy/test_gpu.py."""

from __future__ import annotations

import json

from tests.doc_tables import table_row
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
    runs = [
        json.loads(path.read_text())
        for folder in ("bench-gpu", "bench-gpu-h100-graphs")
        for path in sorted((DOCS / folder).glob("*.json"))
    ]
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
    benchmarks = _one_line(DOCS / "benchmarks.md")
    lone_graphs, lone_eager = cells["pytorch-graphs", 1, 1]["p50_ms"], cells["pytorch", 1, 1]["p50_ms"]
    lone_rps = cells["pytorch-graphs", 1, 1]["rps"], cells["pytorch", 1, 1]["rps"]
    assert f"| 1 worker, 1 client | {lone_rps[0]:.0f} | {lone_rps[1]:.0f} | {lone_graphs:.1f} / " in benchmarks
    graphs, eager = cells["pytorch-graphs", 8, 256]["rps"], cells["pytorch", 8, 256]["rps"]
    assert f"| 8 workers, 256 | **{graphs:,.0f}** | {eager:,.0f} |" in benchmarks
    assert f"served {graphs / eager:.1f}× the requests at 256" in benchmarks
    graphs, eager = cells["pytorch-graphs", 8, 1024]["rps"], cells["pytorch", 8, 1024]["rps"]
    assert f"| 8 workers, 1,024 | {graphs:,.0f} | **{eager:,.0f}** |" in benchmarks
    assert f"they served {graphs / eager:.2f}× ({graphs:,.0f} against {eager:,.0f};" in benchmarks
    checked = sum(c["answers_checked"] for c in run["served"])
    wrong = sum(c["answers_wrong"] for c in run["served"])
    assert f"{wrong} wrong of {checked:,}" in benchmarks
    assert f"{lone_eager / lone_graphs:.1f}× lower" in benchmarks  # "a median 2.5× lower"


def _ms(value: float) -> str:
    """A latency as the tables write it: one decimal under 100 ms, whole milliseconds from there."""
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def test_the_h100_cuda_graphs_figures_quoted_are_the_committed_run():
    folder = DOCS / "bench-gpu-h100-graphs"
    run = json.loads((folder / "benchmark.json").read_text())
    assert "NVIDIA H100 80GB HBM3 (CUDA" in (folder / "benchmark.md").read_text().splitlines()[0]
    assert run["settings"]["max_batch_tokens"] == {"pytorch-graphs": 0, "pytorch": 65536}  # planned by cost; 1 pass
    cells = {(c["backend"], c["concurrency"]): c for c in run["served"] if c["workers"] == 8}
    readme, benchmarks = _one_line(REPO / "README.md"), _one_line(DOCS / "benchmarks.md")
    graphs, eager = cells["pytorch-graphs", 1024]["rps"], cells["pytorch", 1024]["rps"]
    ratio = graphs / eager
    assert f"served **{graphs:,.0f}** requests/s at 1,024 clients, {ratio:.2f}× eager passes' {eager:,.0f}" in readme
    assert f"they served {ratio:.2f}× eager's requests ({graphs:,.0f} against {eager:,.0f})" in benchmarks
    at_256 = cells["pytorch-graphs", 256]["rps"], cells["pytorch", 256]["rps"]
    for text in (readme, benchmarks):
        assert f"{at_256[0] / at_256[1]:.2f}× at 256 clients ({at_256[0]:,.0f} against {at_256[1]:,.0f})" in text \
            or f"{at_256[0] / at_256[1]:.2f}× ({at_256[0]:,.0f} against {at_256[1]:,.0f})" in text  # fmt: skip
    lone_graphs, lone_eager = cells["pytorch-graphs", 1]["p50_ms"], cells["pytorch", 1]["p50_ms"]
    assert f"a lone client at a median {lone_graphs:.1f} ms against {lone_eager:.1f}" in readme
    checked = sum(c["answers_checked"] for c in run["served"])
    assert sum(c["answers_wrong"] for c in run["served"]) == 0
    assert f"none of {checked:,} wrong" in readme and f"0 wrong of {checked:,}" in benchmarks
    guide = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    for concurrency in sorted({c for _, c in cells}):
        graphs_cell, eager_cell = cells["pytorch-graphs", concurrency], cells["pytorch", concurrency]
        assert table_row(guide, "#### The H100 run", f"{concurrency:,}") == [
            f"{concurrency:,}",
            f"{graphs_cell['rps']:,.0f}",
            f"{eager_cell['rps']:,.0f}",
            f"{_ms(graphs_cell['p50_ms'])} / {_ms(graphs_cell['p99_ms'])}",
            f"{_ms(eager_cell['p50_ms'])} / {_ms(eager_cell['p99_ms'])}",
            f"{graphs_cell['forward_ms_per_batch']:.1f} ({graphs_cell['forward_passes_per_batch']:.2g})",
            f"{eager_cell['forward_ms_per_batch']:.1f}",
            f"{graphs_cell['padding_waste']:.2f}",
            f"{eager_cell['padding_waste']:.2f}",
        ], concurrency
    ceilings = {c["planning"]: c for c in run["ceilings"] if c["backend"] == "pytorch-graphs"}
    measured, padded = ceilings["measured_cost"]["texts_per_s"], ceilings["pad_to_longest"]["texts_per_s"]
    in_one_process = f"did {measured:,.0f} texts/s planned by measured times and {padded:,.0f} in one pass per batch"
    assert in_one_process in benchmarks
    [target] = [t for t in run["targets"] if t["target"].startswith("H100: the handler in-process")]
    assert target["measured"] == measured and target["met"] is False
