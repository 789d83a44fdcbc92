"""The overload run's markdown tables, its targets (the issue's), and its plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

# The targets: at 2x and 4x overload with the budget matching the client's timeout.
OVERLOAD_MULTIPLES = (2.0, 4.0)
MIN_GOODPUT_SHARE = 0.90
MAX_WASTED_SHARE = 0.05


def _f(value, digits: int = 0) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def table(cells: Sequence[Mapping], per_worker_core_at_saturation: float = math.nan) -> list[str]:
    """Every cell. `per_worker_core_at_saturation` (requests/s per core the workers used in the closed-loop
    saturation run) gives the last column: a cell's goodput per worker core against it. Where it is near 100 %
    and goodput is not, the workers were short of cores (taken by the frontend's refusals and the load
    generator), not wasting them."""
    lines = [
        "| server, setup | queue | client timeout | arrivals | load | offered/s | answered in time/s | % of saturation "
        "| refused | client gave up | p50 ms | p99 ms | computed | computed for nobody "
        "| CPU cores: workers / frontend / load generator | answered in time per worker core, % of saturation's |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        workers = c.get("workers_cpu_cores")
        per_core = 100 * c["goodput_rps"] / workers / per_worker_core_at_saturation if workers else None
        refused = ", ".join(f"{k} × {v}" for k, v in sorted(c["refused"].items())) or "0"
        wasted = f"{_f(c['wasted'])} ({_f(100 * c['wasted_share'])} %)" if "wasted" in c else "–"
        lines.append(
            f"| {c['server']}, {c['setup']} | {c.get('job_queue_size', '∞')} | {c['timeout_s']} s | {c['arrivals']} | "
            f"{c['multiple']}x | {_f(c['offered_rps'])} | {_f(c['goodput_rps'])} | {_f(100 * c['goodput_share'])} | "
            f"{refused} | {c['gave_up']} | {_f(c['p50_ms'])} | {_f(c['p99_ms'])} | {_f(c.get('computed'))} | {wasted} "
            f"| {_f(c.get('workers_cpu_cores'), 2)} / {_f(c.get('frontend_cpu_cores'), 2)} / "
            f"{_f(c['client_cpu_fraction'], 2)} | {_f(per_core)} |"
        )
    return lines


def evaluate(cells: Sequence[Mapping], default_budget_ms: int) -> list[dict]:
    """Each target, per cell it applies to: measured, goal, met. Comparison setups (a batch size the budget would
    not give) are measured for contrast and never judged."""
    cells = [c for c in cells if not c.get("comparison")]
    rows = []
    for c in cells:
        budget = c.get("budget_ms")
        if c["server"] != "torchserve" or budget is None:
            continue
        matches = round(1000 * c["timeout_s"]) == budget or (
            budget == default_budget_ms and 1000 * c["timeout_s"] > budget
        )
        if not matches or c["multiple"] not in OVERLOAD_MULTIPLES:
            continue
        name = f"{c['setup']}, client {c['timeout_s']} s, {c['arrivals']}, {c['multiple']}x"
        rows.append({"target": f"{name}: goodput ≥ {MIN_GOODPUT_SHARE:.0%} of saturation",
                     "measured": c["goodput_share"], "met": c["goodput_share"] >= MIN_GOODPUT_SHARE})  # fmt: skip
        rows.append({"target": f"{name}: computed for nobody ≤ {MAX_WASTED_SHARE:.0%}",
                     "measured": c["wasted_share"], "met": c["wasted_share"] <= MAX_WASTED_SHARE})  # fmt: skip
        rows.append({"target": f"{name}: p99 of the answered ≤ {budget} ms",
                     "measured": c["p99_ms"], "met": not c["p99_ms"] > budget})  # fmt: skip
    today = {(c["timeout_s"], c["arrivals"]): c for c in cells if c["setup"] == "today" and c["multiple"] == 0.5}
    for c in cells:
        if c["server"] == "torchserve" and c["budget_ms"] is not None and c["multiple"] == 0.5 and c["deadline_header"]:
            name = f"{c['setup']}, client {c['timeout_s']} s, {c['arrivals']}, 0.5x"
            rows.append(
                {"target": f"{name}: no refusals", "measured": c["refused_total"], "met": c["refused_total"] == 0}
            )
            # Held to today's layout under the same arrivals: Poisson bursts batch differently from a steady rate.
            base = today.get((c["timeout_s"], c["arrivals"]))
            if base is not None:
                ratio = c["p50_ms"] / base["p50_ms"]
                rows.append({"target": f"{name}: p50 as today (≤ 1.2 × today's {base['p50_ms']:.0f} ms)",
                             "measured": ratio, "met": ratio <= 1.2})  # fmt: skip
    return rows


def targets_table(rows: Sequence[Mapping]) -> list[str]:
    lines = ["| target | measured | met |", "|---|---:|---|"]
    for r in rows:
        measured = r["measured"]
        shown = f"{100 * measured:.1f} %" if "goodput" in r["target"] or "nobody" in r["target"] else _f(measured, 2)
        lines.append(f"| {r['target']} | {shown} | {'yes' if r['met'] else '**no**'} |")
    return lines


def plot(cells: Sequence[Mapping], saturation_rps: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeouts = sorted({c["timeout_s"] for c in cells})
    fig, axes = plt.subplots(1, len(timeouts), figsize=(5 * len(timeouts), 4.2), sharey=True, squeeze=False)
    for axis, timeout in zip(axes[0], timeouts):
        lines = {}
        for c in cells:
            if c["timeout_s"] == timeout:
                lines.setdefault(f"{c['server']}, {c['setup']}, {c['arrivals']}", []).append(c)
        for i, (label, line) in enumerate(sorted(lines.items())):
            style = "--" if "poisson" in label else "-"
            axis.plot([c["multiple"] for c in line], [100 * c["goodput_share"] for c in line], style, marker="o",
                      color=f"C{i % 10}", label=label)  # fmt: skip
        axis.axhline(90, color="grey", linestyle=":")
        axis.set_xscale("log", base=2)
        axis.set_xticks([0.5, 1, 1.5, 2, 4], ["0.5x", "1x", "1.5x", "2x", "4x"])
        axis.set_title(f"client timeout {timeout} s")
        axis.set_xlabel(f"offered load (x saturation, {saturation_rps:.0f} req/s)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6)
    axes[0][0].set_ylabel("answered in time (% of saturation)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
