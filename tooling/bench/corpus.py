"""The benchmark's texts: a realistic spread of lengths (a few words to ~200 tokens) from data/reviews_*.tsv."""

from __future__ import annotations

import random

DEFAULT_SEED = 7


def build_corpus(n: int, seed: int = DEFAULT_SEED) -> list[str]:
    """`n` texts: 20 % fragments of a few words, 50 % one or two sentences, 30 % long reviews of 3 to 14 sentences."""
    from tooling.corpus import read_examples

    sentences = [text for _, _, text in read_examples()]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        shape = rng.random()
        if shape < 0.2:
            words = rng.choice(sentences).split()
            texts.append(" ".join(words[: rng.randint(2, 5)]))
        elif shape < 0.7:
            texts.append(" ".join(rng.sample(sentences, rng.randint(1, 2))))
        else:
            texts.append(" ".join(rng.sample(sentences, rng.randint(3, 14))))
    return texts
