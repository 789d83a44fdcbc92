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


def latency(cell: Mapping, key: str) -> str:
    """A latency figure in ms: "> timeout" where it fell on a request not answered in time (None), "–" where the
    cell has none (no such request, or a run from before the figure existed)."""
    if key in cell and cell[key] is None:
        return f"> {_f(1000 * cell['timeout_s'])}"
    return _f(cell.get(key))


def _pair(cell: Mapping, first: str, second: str) -> str:
    return f"{latency(cell, first)} / {latency(cell, second)}"


def legend(cells: Sequence[Mapping]) -> list[str]:
    """What each column of table() counts, and the window the client's figures cover."""
    windows = sorted({tuple(c["window_s"]) for c in cells if "window_s" in c})
    if windows:
        counted = ", ".join(f"{start:g}–{end:g} s" for start, end in windows)
        scope = (
            f"The client's figures count the requests *scheduled* in the window ({counted} after each cell's first "
            "arrival): the queue filling during the warm-up before it is left out, and the requests still queued "
            "when the arrivals stop are counted however late they are answered."
        )
    else:
        scope = "The client's figures count every request of the cell (a run from before the counted window)."
    return [
        f"What each column counts. {scope} Every latency runs from the request's scheduled send time (a generator "
        "that sends late does not hide latency), and each client gives up at its scheduled time plus its timeout.",
        "",
        "- offered/s (sent/s): requests scheduled per second of the window; in brackets, those the generator actually "
        "sent in it.",
        "- answered in time/s: 200s per second of the window (the goodput); % of saturation: the same against the "
        "closed-loop saturation.",
        "- refused: answers other than 200, by status and type (503 ServiceUnavailableException: the queue was full, "
        "refused at the door; 503 DeadlineExceeded: refused by the handler after waiting, as it would be late); "
        "client gave up: no answer within the timeout.",
        "- p50 / p99 answered: of the 200s alone (never above the timeout, so no test of it); p50 / p99 all: of every "
        "request, one not answered in time (refused, gave up, connection error) counting as infinitely late: "
        '"> T" where the percentile falls on one (at least 1 % not answered in time, for the p99); p99 admitted: '
        "the same over the requests not refused at the door, the figure the p99 target judges; refusals: the latency "
        "of the answers other than 200 alone (the 503s: a refusal at the door should be fast).",
        "- send lag p99 / max: how late the generator sent the requests against their schedule; ⚠ marks a cell "
        "whose p99 send lag reached a tenth of the client's timeout: it measured the generator as much as the "
        "server, and is unreliable.",
        "- computed, computed for nobody, CPU cores: over the whole cell (warm-up, window and drain; the handler's "
        "counters and the processes' CPU cannot be split by scheduled time): items the handler computed, those "
        "of them whose client was no longer waiting (against the whole cell's answers), and the cores the model's "
        "workers, the rest of the server and the load generator used. Answered in time per worker core: the "
        "window's goodput per worker core, against the closed-loop saturation's.",
    ]


def table(cells: Sequence[Mapping], per_worker_core_at_saturation: float = math.nan) -> list[str]:
    """Every cell (legend() says what each column counts). `per_worker_core_at_saturation` (requests/s per core the
    workers used in the closed-loop saturation run) gives the last column: a cell's goodput per worker core against
    it. Where it is near 100 % and goodput is not, the workers were short of cores (taken by the frontend's refusals
    and the load generator), not wasting them."""
    lines = [
        "| server, setup | queue; batch | client timeout | arrivals | load | offered/s (sent/s) | answered in time/s "
        "| % of saturation | refused | client gave up | p50 / p99 answered, ms | p50 / p99 all, ms "
        "| p99 admitted, ms | refusals p50 / p99, ms | send lag p99 / max, ms | computed | computed for nobody "
        "| CPU cores: workers / frontend / load generator | answered in time per worker core, % of saturation's |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        workers = c.get("workers_cpu_cores")
        per_core = 100 * c["goodput_rps"] / workers / per_worker_core_at_saturation if workers else None
        refused = ", ".join(f"{k} × {v}" for k, v in sorted(c["refused"].items())) or "0"
        wasted = f"{_f(c['wasted'])} ({_f(100 * c['wasted_share'])} %)" if "wasted" in c else "–"
        flag = "⚠ " if c.get("send_lag_unreliable") else ""
        queue = f"{c.get('job_queue_size', '∞')}; {c.get('batch_size', '–')}"
        offered = f"{_f(c['offered_rps'])} ({_f(c.get('sent_rps'))})"
        lag = f"{flag}{_pair(c, 'send_lag_p99_ms', 'send_lag_max_ms')}"
        lines.append(
            f"| {flag}{c['server']}, {c['setup']} | {queue} | {c['timeout_s']} s | {c['arrivals']} | "
            f"{c['multiple']}x | {offered} | {_f(c['goodput_rps'])} | {_f(100 * c['goodput_share'])} | "
            f"{refused} | {c['gave_up']} | {_pair(c, 'p50_ms', 'p99_ms')} | {_pair(c, 'all_p50_ms', 'all_p99_ms')} "
            f"| {latency(c, 'admitted_p99_ms')} | {_pair(c, 'refusal_p50_ms', 'refusal_p99_ms')} | {lag} "
            f"| {_f(c.get('computed'))} | {wasted} "
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
        flagged = {"unreliable": True} if c.get("send_lag_unreliable") else {}
        rows.append({"target": f"{name}: goodput ≥ {MIN_GOODPUT_SHARE:.0%} of saturation",
                     "measured": c["goodput_share"], "met": c["goodput_share"] >= MIN_GOODPUT_SHARE,
                     **flagged})  # fmt: skip
        rows.append({"target": f"{name}: computed for nobody ≤ {MAX_WASTED_SHARE:.0%}",
                     "measured": c["wasted_share"], "met": c["wasted_share"] <= MAX_WASTED_SHARE,
                     **flagged})  # fmt: skip
        rows.append(p99_row(c, name, budget) | flagged)
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


def p99_row(cell: Mapping, name: str, budget: int) -> dict:
    """The p99 target, judged on every request the server admitted (all but those refused at the door), one not
    answered in time counting as infinitely late: met only when under 1 % of the admitted were late (refused by the
    handler, given up, lost) and the p99 of all of them is within the budget. (The p99 of the 200s alone can never
    exceed a client timeout equal to the budget; that of every request, refusals included, always does once the
    load is above what the server can take: neither would test anything.) A run from before these figures: not
    measured."""
    target = f"{name}: p99 of the admitted (late ones as beyond) ≤ {budget} ms"
    if "admitted_p99_ms" not in cell:
        return {"target": target, "measured": math.nan, "met": None}
    measured = cell["admitted_p99_ms"]
    return {"target": target, "measured": measured, "met": measured is not None and measured <= budget,
            "timeout_s": cell["timeout_s"]}  # fmt: skip


def targets_table(rows: Sequence[Mapping]) -> list[str]:
    lines = ["| target | measured | met |", "|---|---:|---|"]
    for r in rows:
        measured = r["measured"]
        if measured is None:
            shown = f"> {_f(1000 * r['timeout_s'])} ms (timeout)"
        elif "goodput" in r["target"] or "nobody" in r["target"]:
            shown = f"{100 * measured:.1f} %"
        else:
            shown = _f(measured, 2)
        met = {True: "yes", False: "**no**", None: "not measured"}[r["met"]]
        if r.get("unreliable"):
            met += " (⚠ send lag: unreliable)"
        lines.append(f"| {r['target']} | {shown} | {met} |")
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
