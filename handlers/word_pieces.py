"""BERT's ASCII texts tokenized word by word, each word's pieces remembered.

Why: with its normalizer skipped (handlers/ascii_normalization.py), what is left of the Rust tokenizer's
batch call is mostly its machinery around WordPiece (each text split into pieces that keep their
offsets into the original), not WordPiece itself. Reviews repeat their words: the benchmark's texts,
split here with one regular expression and each word's pieces asked of the checkpoint's own WordPiece
model once, then remembered, took a quarter to about a half of that call's time. A word never met before
costs a question to WordPiece from Python, about what one thread of that call spends on it, so texts
whose every word is new take about as long as on one thread, and up to twice as long as the call's
pool of two threads at batch 128 (docs/benchmarks.md, "Single ASCII texts word by word").

Only where the answer is certain to be the same: a single text (a pair is cut longest first: it keeps
the Rust call), already normalized, through a tokenizer whose pre-tokenizer is BERT's and whose model
is WordPiece. On ASCII, BERT's pre-tokenizer splits at whitespace (Rust's: tab, line feed, vertical
tab, form feed, carriage return, space) and makes each ASCII punctuation mark a word of its own; a
word's pieces depend on that word alone. The special tokens around the pieces and the cut at the cap
are read from the tokenizer itself at load, and the whole path is checked at load against the
tokenizer on texts with every kind of character: a tokenizer on which it disagrees does not get it.
tests/inprocess/test_tokenization.py holds the ids and flags to the wrapper's over any ASCII text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

# ASCII punctuation as Rust's is_ascii_punctuation has it (BERT's pre-tokenizer isolates each such mark), and
# whitespace as Rust's char::is_whitespace has it on ASCII (\x1c-\x1f are not: they stay inside a word).
_PUNCTUATION = r"!-/:-@\[-`{-~"
WORDS = re.compile(rf"[^\t\n\x0b\x0c\r {_PUNCTUATION}]+|[{_PUNCTUATION}]")
# Words remembered per worker: reviews use a few thousand. Past this many the least recently used is forgotten, so a
# worker whose traffic changes its words learns the new ones (a few MB at most).
CACHED_WORDS = 1 << 15
# A longer word is asked of WordPiece each time and never kept, so the keys stay short however long the words a
# client sends. WordPiece reads a word past 100 characters as [UNK].
LONGEST_CACHED_WORD = 100
# Checked at load against the tokenizer: words, every ASCII punctuation mark, digits, cases, controls, a word
# over WordPiece's 100 characters, and more words than a small cap holds.
PROBES = (
    "",
    "a",
    "Hello, world! It's a test_case: 3.14 x-ray [ok] {a} ~b~ `c` \"d\" e's ##f @g #h $i %j ^k &l *m (n) +o =p |q",
    "tabs\tand\nnew lines\r\x0bvertical\x0cfeed \x1c\x1f \x01controls\x7f",
    "unbelievably untranslatable " + "x" * 120 + " supercalifragilistic",
    " ".join(f"word{n}" for n in range(300)),
)


@dataclass(frozen=True)
class WordPieces:
    """One tokenizer's single texts as ids, from its WordPiece model's pieces of each word, remembered.

    `remembered` holds the worker's one memo of a pure function (a word's pieces), filled as words arrive: no
    batch leaves anything else in it, and what it holds cannot change an answer."""

    tokenize: Callable[[str], tuple[int, ...]]  # a word -> its WordPiece ids, asked of the model
    remembered: Callable[[str], tuple[int, ...]]  # the same, the last CACHED_WORDS words remembered (functools)
    prefix: tuple[int, ...]  # the special tokens before a text's pieces ([CLS])
    suffix: tuple[int, ...]  # and after them ([SEP])
    budget: int  # pieces a text keeps under the cap: the cap less the special tokens
    keep_end: bool  # a text over the cap keeps its end (the tokenizer's truncation_side "left")

    def encode(self, normalized: str) -> tuple[list[int], bool]:
        """The ids of a text the normalizer has already read, and whether pieces were cut at the cap."""
        words = WORDS.findall(normalized)
        # WordPiece gives every word one piece at least ([UNK] at worst): past the first budget + 1 words (the last,
        # when the end is kept) none is kept, and one more than the budget is enough to tell that the text is cut.
        words = words[-(self.budget + 1) :] if self.keep_end else words[: self.budget + 1]
        short = max(map(len, words), default=0) <= LONGEST_CACHED_WORD
        ids = list(chain.from_iterable(map(self.remembered if short else self.tokenize, words)))
        cut = len(ids) > self.budget
        if cut:
            ids = ids[len(ids) - self.budget :] if self.keep_end else ids[: self.budget]
        return [*self.prefix, *ids, *self.suffix], cut


def word_pieces(fast: Any, max_length: int) -> WordPieces | None:
    """The word-by-word path for `fast` (a tokenizers.Tokenizer set to truncate at `max_length`, never to pad;
    handlers/tokenization.text_encoder), or None where it would not give `fast`'s own ids and cuts."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece
    from tokenizers.pre_tokenizers import BertPreTokenizer

    if not isinstance(fast.pre_tokenizer, BertPreTokenizer) or not isinstance(fast.model, WordPiece):
        return None
    model = fast.model

    def tokenize(word: str) -> tuple[int, ...]:
        return tuple(token.id for token in model.tokenize(word))

    remembered = functools.lru_cache(maxsize=CACHED_WORDS)(tokenize)

    # Where a text's pieces go between the special tokens: a whole encoding of one word, without the cap.
    whole = Tokenizer.from_str(fast.to_str())
    whole.no_truncation()
    word = tokenize("a")
    ids = whole.encode("a").ids
    at = next((i for i in range(len(ids) - len(word) + 1) if tuple(ids[i : i + len(word)]) == word), None)
    truncation = fast.truncation or {}
    if at is None or truncation.get("stride", 0) != 0:
        return None
    prefix, suffix = tuple(ids[:at]), tuple(ids[at + len(word) :])
    budget = max_length - len(prefix) - len(suffix)
    if budget < 0:  # a cap under the special tokens: the tokenizer's own call decides what happens
        return None
    words = WordPieces(tokenize, remembered, prefix, suffix, budget, truncation.get("direction") == "left")
    normalize = fast.normalizer.normalize_str if fast.normalizer is not None else (lambda text: text)
    # One text at a time: a batch call would start the Rust thread pool here, at its size for the process's life.
    for probe in PROBES:
        encoded = fast.encode(probe)
        if any(encoded.type_ids) or words.encode(normalize(probe)) != (encoded.ids, bool(encoded.overflowing)):
            return None
    remembered.cache_clear()  # the probes' words are not the traffic's
    return words
