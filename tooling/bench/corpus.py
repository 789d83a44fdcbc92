"""The benchmark's texts: a realistic spread of lengths (a few words to ~200 tokens) from data/reviews_*.tsv."""

from __future__ import annotations

import itertools
import random
import re
import string
from collections.abc import Iterator

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


def _letters() -> Iterator[str]:
    """aa, ab, ..., zz, aaa, ...: every string of two or more lower-case letters, once."""
    letters = string.ascii_lowercase
    return ("".join(added) for n in itertools.count(2) for added in itertools.product(letters, repeat=n))


def with_every_word_new(texts: list[str]) -> list[str]:
    """The same texts with each word made one of its own (a few letters added, from a counter): where the handler
    remembers each word's pieces (handlers/word_pieces.py), it meets every word of these for the first time."""
    suffixes = _letters()
    return [re.sub(r"[A-Za-z]+", lambda word: word.group() + next(suffixes), text) for text in texts]


def other_words(n: int) -> list[str]:
    """`n` distinct words that are none of build_corpus's nor with_every_word_new's (the reviews hold no "qz")."""
    return ["qz" + letters for letters in itertools.islice(_letters(), n)]
