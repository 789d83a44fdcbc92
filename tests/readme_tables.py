"""Tables of README.md, read as the file is when the tests run, so a test can hold the README to its word."""

from __future__ import annotations

import re

from tooling.paths import REPO

README = REPO / "README.md"


def documented_metrics(readme: str | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The table under "## Metrics": name -> (type, label names shown in braces after the name)."""
    readme = README.read_text(encoding="utf-8") if readme is None else readme
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*`(\w+)(?:\{([\w, ]*)\})?`\s*\|\s*(\w+)\s*\|", section, flags=re.MULTILINE)
    return {
        name: (kind, tuple(label.strip() for label in labels.split(",") if label.strip()))
        for name, labels, kind in rows
    }
