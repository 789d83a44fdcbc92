"""Requests/s and p95 latency against clients: one colour per backend, one line style per layout and batching."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

_STYLES = ("-", "--", ":", "-.")


def plot(report: Mapping, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report["served"]
    backends = list(dict.fromkeys(c["backend"] for c in cells))
    configs = list(dict.fromkeys(f"{c['layout']}, {c['config']}" for c in cells))
    colours = {b: f"C{i}" for i, b in enumerate(backends)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for backend in backends:
        for i, config in enumerate(configs):
            line = [c for c in cells if c["backend"] == backend and f"{c['layout']}, {c['config']}" == config]
            if not line:
                continue
            x = [c["concurrency"] for c in line]
            style = dict(color=colours[backend], linestyle=_STYLES[i % len(_STYLES)], marker="o")
            left.plot(x, [c["rps"] for c in line], label=f"{backend}, {config}", **style)
            right.plot(x, [c["p95_ms"] for c in line], **style)
    for row in report["ceilings"]:
        if row["kind"] == "loop" and row["backend"] == "pytorch":
            left.axhline(row["texts_per_s"], linestyle=":", color="grey")
            what = f"plain PyTorch loop, batch {row['batch_size']}, {row.get('order', 'arrival')} order"
            left.annotate(what, (1, row["texts_per_s"]), fontsize=7, color="grey")
    levels = sorted({c["concurrency"] for c in cells})
    for axis, label in ((left, "requests/s"), (right, "p95 latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    right.set_yscale("log")
    if cells:  # a run whose every registration failed plots its ceilings alone
        left.legend(fontsize=7)
    fig.suptitle(f"{report['settings']['model']} on {report['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
