"""Tables of the guides in docs/, read as they are when the tests run, so a test holds the docs to their word."""

from __future__ import annotations

import re

from tooling.paths import REPO

METRICS_GUIDE = REPO / "docs" / "metrics.md"


def documented_metrics(guide: str | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metrics table of docs/metrics.md: name -> (type, label names shown in braces after the name)."""
    guide = METRICS_GUIDE.read_text(encoding="utf-8") if guide is None else guide
    rows = re.findall(r"^\|\s*`(\w+)(?:\{([\w, ]*)\})?`\s*\|\s*(\w+)\s*\|", guide, flags=re.MULTILINE)
    return {
        name: (kind, tuple(label.strip() for label in labels.split(",") if label.strip()))
        for name, labels, kind in rows
    }


def table_row(guide: str, section: str, first_cell: str) -> list[str]:
    """The cells of the one row that starts with `first_cell` in the tables under the heading `section` of a
    guide's text (up to the next heading), bold marks dropped."""
    body = guide.split(section, 1)[1].split("\n#", 1)[0]
    [row] = [line for line in body.splitlines() if line.startswith(f"| {first_cell} |")]
    return [cell.strip().replace("**", "") for cell in row.strip().strip("|").split("|")]
