"""The machine a run was measured on, and the run's markdown tables."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from pathlib import Path


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    described = f"{len(os.sched_getaffinity(0))} cores, {cpu}, Python {platform.python_version()}"
    return described + _accelerator()


def _accelerator() -> str:
    """The torch build, and where torch sees a GPU its name and CUDA version, so a GPU run names its device."""
    import torch

    if not torch.cuda.is_available():
        return f", torch {torch.__version__}"
    return f", torch {torch.__version__}, {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"


def _f(value, digits: int = 1) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def served_table(cells: list[Mapping]) -> list[str]:
    lines = [
        "| backend | workers x threads | configuration | clients | req/s | p50 ms | p95 ms | p99 ms | errors "
        "| mean batch | frontend queue ms | worker ms | handler ms/batch | tokenization ms/batch | forward ms/batch "
        "| padded/real | server CPU cores: frontend / workers | client CPU | answers wrong / checked (max abs diff) "
        "| GPU % | GPU MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c['backend']} | {c['layout']} | {c['config']} | {c['concurrency']} | {_f(c['rps'])} | "
            f"{_f(c['p50_ms'])} | {_f(c['p95_ms'])} | {_f(c['p99_ms'])} | {c['errors']} | "
            f"{_f(c['mean_batch_size'], 2)} | "
            f"{_f(c['frontend_queue_ms'])} | {_f(c['worker_ms'])} | {_f(c['handler_ms_per_batch'])} | "
            f"{_f(c['tokenization_ms_per_batch'])} | {_f(c['forward_ms_per_batch'])} | {_f(c['padding_waste'], 2)} | "
            f"{_f(c.get('frontend_cpu_cores'), 2)} / {_f(c.get('workers_cpu_cores'), 2)} | "
            f"{100 * c['client_cpu_fraction']:.0f}% | {c.get('answers_wrong', '–')} / {c.get('answers_checked', '–')} "
            f"({c.get('answers_max_abs_diff', float('nan')):.1e}) | {_f(c.get('gpu_utilization_percent'), 0)} | "
            f"{_f(c.get('gpu_memory_used_mb'), 0)} |"
        )
    return lines


def ceilings_table(rows: list[Mapping]) -> list[str]:
    lines = [
        "| backend | ceiling (in-process, no server) | batch | texts/s | second pass, texts/s | notes |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in rows:
        if c["kind"] == "loop":
            what = f"plain loop, pad to longest, {c.get('order', 'arrival')} order"
            note = f"{c['ms_per_text']:.1f} ms/text; p50 per batch {c['p50_ms_per_batch']:.1f} ms"
        else:
            what = f"handler, {c['planning'].replace('_', '-')} (max_batch_tokens {c['max_batch_tokens']})"
            note = f"padded/real {c['padding_waste']:.2f}, {c['forward_passes_per_batch']:.2f} passes per batch"
        lines.append(f"| {c['backend']} | {what} | {c['batch_size']} | {c['texts_per_s']:.1f} | "
                     f"{_f(c.get('second_pass_texts_per_s'))} | {note} |")  # fmt: skip
    return lines


def exports_table(backends: Mapping[str, Mapping]) -> list[str]:
    lines = ["| backend | answers against PyTorch (measured by the export) |", "|---|---|"]
    for name, info in backends.items():
        export = info.get("export")
        lines.append(f"| {name} | {export['summary'] if export else 'the reference'} |")
    return lines


def targets_table(targets: list[Mapping]) -> list[str]:
    lines = ["| target | measured | goal | met |", "|---|---:|---:|---|"]
    for t in targets:
        met = "not measured" if t["met"] is None else ("yes" if t["met"] else "NO")
        unit = "" if t["unit"] == "x" else f" {t['unit']}"
        digits = 0 if t["goal"] >= 100 else 3  # a rate's goal (20,000 requests/s) needs no decimals
        lines.append(f"| {t['target']} | {_f(t['measured'], digits)}{unit} | {t['goal']:.{digits}f}{unit} | {met} |")
    return lines


def markdown(report: Mapping) -> str:
    s = report["settings"]
    lines = [
        f"Model: {s['model']}; backends: {', '.join(s['backends'])}; texts: {s['texts']} (mean "
        f"{s['mean_tokens']:.0f} tokens, max {s['max_tokens']}); {s['duration']} s per cell; handler options: "
        f"{s['handler_options'] or 'defaults'}; machine: {report['machine']}",
        f"Command: `{report['command']}`",
        "",
        *exports_table(report["backends"]),
        "",
        *served_table(report["served"]),
        "",
        *ceilings_table(report["ceilings"]),
        "",
        *targets_table(report["targets"]),
        *failures_section(report.get("failures", [])),
    ]
    return "\n".join(lines) + "\n"


def failures_section(failures: list[Mapping]) -> list[str]:
    """What failed and was skipped (ceilings of a backend, a model's registration), with the error; none: nothing."""
    if not failures:
        return []
    lines = ["", "Failed, and skipped (the run went on with the rest):", "",
             "| stage | backend | layout, configuration | error |", "|---|---|---|---|"]  # fmt: skip
    for f in failures:
        where = ", ".join(str(f[key]) for key in ("layout", "config") if f.get(key)) or "–"
        error = " ".join(str(f["error"]).split()).replace("|", "\\|")
        lines.append(f"| {f['stage']} | {f['backend']} | {where} | {error} |")
    return lines
