"""tooling/corpus.py's held-out split: the demo model never trains on the examples its evaluation scores."""

from __future__ import annotations

from tooling.corpus import HOLD_OUT_EVERY, LABELS, split


def rows_of(domain: str, label: str, count: int) -> list[tuple[str, str, str]]:
    return [(label, domain, f"{domain} {label} {n}") for n in range(count)]


def test_a_group_smaller_than_hold_out_every_keeps_all_its_examples_for_training():
    """A small (domain, label) group is not robbed of its first example: holding out starts at the Nth."""
    rows = rows_of("books", "positive", HOLD_OUT_EVERY - 1)
    train, held_out = split(rows)
    assert held_out == []
    assert [text for text, _ in train] == [text for _, _, text in rows]


def test_the_hold_out_every_th_example_of_each_group_is_held_out():
    rows = rows_of("books", "positive", 2 * HOLD_OUT_EVERY) + rows_of("films", "negative", HOLD_OUT_EVERY)
    train, held_out = split(rows)
    assert held_out == [
        (f"books positive {HOLD_OUT_EVERY - 1}", LABELS.index("positive")),
        (f"books positive {2 * HOLD_OUT_EVERY - 1}", LABELS.index("positive")),
        (f"films negative {HOLD_OUT_EVERY - 1}", LABELS.index("negative")),
    ]
    assert len(train) + len(held_out) == len(rows)
