"""Comparing an answer with the answer for the same text alone, and choosing texts whose answers differ.

A test that checks "each request got its own answer" can only see a swap between two
requests if their expected answers differ by more than the comparison tolerance; the
helpers here make that explicit instead of hoping the texts are different enough.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, pairwise
from pathlib import Path

from tests.support import expected_alone

# Served and in-process answers come from the same code and weights; padding in a batch
# moves probabilities by about 1e-7 (float32), so 1e-5 is loose for noise and tight for swaps.
TOLERANCE = 1e-5


def probabilities(answer: dict) -> tuple[float, ...]:
    """The class probabilities of a /predictions answer, in label order."""
    return tuple(answer["scores"][label] for label in sorted(answer["scores"]))


def assert_same_answer(got: dict, expected: dict, tolerance: float = TOLERANCE) -> None:
    """Same label and truncation flag, every probability within `tolerance`."""
    assert (got["label"], got["truncated"]) == (expected["label"], expected["truncated"]), (got, expected)
    assert set(got["scores"]) == set(expected["scores"]), (got, expected)
    for label, probability in expected["scores"].items():
        assert abs(got["scores"][label] - probability) <= tolerance, (label, got, expected)


def smallest_gap(answers: Sequence[dict]) -> float:
    """The smallest difference in the first label's probability between any two answers.

    Sorted by that probability, neighbours are the closest pairs, so this bounds every pair
    from below: answers whose smallest gap exceeds 2 x TOLERANCE cannot be swapped unseen.
    """
    ordered = sorted(probabilities(a)[0] for a in answers)
    return min((b - a for a, b in pairwise(ordered)), default=float("inf"))


def distinguishable_texts(
    handler, model_dir: Path, candidates: Iterable[str], count: int, separation: float
) -> tuple[list[str], list[dict]]:
    """The first `count` candidates whose answers alone all differ pairwise by more than `separation`.

    Returns the texts and their answers alone (computed in-process with `handler`). A
    candidate is kept when its first-label probability is more than `separation` away from
    every kept one; raises if the candidates run out first.
    """
    texts: list[str] = []
    answers: list[dict] = []
    kept: list[float] = []  # sorted first-label probabilities of the kept texts
    candidates = iter(candidates)
    while batch := list(islice(candidates, min(250, count + 8))):
        for text, answer in zip(batch, expected_alone(handler, model_dir, batch)):
            key = probabilities(answer)[0]
            at = bisect.bisect(kept, key)
            if all(abs(key - kept[j]) > separation for j in (at - 1, at) if 0 <= j < len(kept)):
                kept.insert(at, key)
                texts.append(text)
                answers.append(answer)
                if len(texts) == count:
                    return texts, answers
    raise ValueError(f"only {len(texts)} of {count} candidate texts have answers {separation} apart")


def candidate_texts() -> Iterator[str]:
    """Distinct texts of 3 to 22 words (up to about 50 tokens), so batches get split by the token budget."""
    for i in itertools.count():
        yield f"request {i}: " + " ".join(f"w{(i * 7 + k) % 97}" for k in range(3 + i % 20))
