"""The labelled reviews in data/reviews_*.tsv (label, domain, text), and the demo model's held-out split."""

from __future__ import annotations

import csv
from pathlib import Path

from tooling.paths import DATA

LABELS = ("negative", "positive")
HOLD_OUT_EVERY = 5


def read_examples(data_dir: Path = DATA) -> list[tuple[str, str, str]]:
    """(label, domain, text) rows from every data/reviews_*.tsv file."""
    rows = []
    for path in sorted(data_dir.glob("reviews_*.tsv")):
        with path.open(newline="", encoding="utf-8") as f:
            for label, domain, text in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                if label not in LABELS:
                    raise ValueError(f"{path}: unknown label {label!r}")
                rows.append((label, domain, text))
    return rows


def split(rows: list[tuple[str, str, str]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Stratified split: every HOLD_OUT_EVERY-th example of each (domain, label) group is held out."""
    seen: dict[tuple[str, str], int] = {}
    train, held_out = [], []
    for label, domain, text in rows:
        n = seen.get((domain, label), 0)
        seen[(domain, label)] = n + 1
        (held_out if n % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1 else train).append((text, LABELS.index(label)))
    return train, held_out


def held_out_examples() -> list[tuple[str, int]]:
    """The demo model's held-out (text, label index) pairs: never seen in training."""
    return split(read_examples())[1]
