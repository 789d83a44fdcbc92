"""BERT's ASCII texts and pairs tokenized word by word, each word's pieces remembered.

Why: with its normalizer skipped (handlers/ascii_normalization.py), what is left of the Rust tokenizer's
batch call is mostly its machinery around WordPiece (each text split into pieces that keep their
offsets into the original), not WordPiece itself. Reviews repeat their words: the benchmark's texts,
split here with one regular expression and each word's pieces asked of the checkpoint's own WordPiece
model once, then remembered, took a quarter to about a half of that call's time. A word never met before
costs a question to WordPiece from Python, about what one thread of that call spends on it, so texts
whose every word is new take about as long as on one thread, and up to twice as long as the call's
pool of two threads at batch 128 (docs/benchmarks.md, "ASCII texts word by word").

Only where the answer is certain to be the same: texts already normalized, through a tokenizer whose
pre-tokenizer is BERT's and whose model is WordPiece. On ASCII, BERT's pre-tokenizer splits at
whitespace (Rust's: tab, line feed, vertical tab, form feed, carriage return, space) and makes each
ASCII punctuation mark a word of its own; a word's pieces depend on that word alone. The special tokens
and token types around the pieces, the side a text is cut from at the cap, and a pair's cut (longest
first, as the tokenizers library cuts it) are read from the tokenizer at load, and the whole path is
checked at load against the tokenizer on texts and pairs with every kind of character: a tokenizer on
which it disagrees does not get it (nor its pairs, where only they disagree).
tests/inprocess/test_tokenization.py holds the ids, types and flags to the wrapper's over any ASCII text
and pair.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
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


def pair_probes(max_length: int) -> list[tuple[str, str]]:
    """Pairs checked at load, sized to the cap: each text shorter or longer than it, each the longer, as long as
    each other (the odd piece of an odd budget goes to the second), and every kind of character. Longer texts
    would cost the check dearly: the tokenizer's cut of a pair makes every pairing of both texts' overflowing
    pieces."""
    long, longer = " ".join(["a"] * (max_length + 1)), " ".join(["b"] * (max_length + 2))  # a piece a word
    return [("a", "b"), (PROBES[2], PROBES[3]), ("a short question?", long), (long, "a short answer."),
            (long, longer), (longer, long), (long, long), (longer, longer)]  # fmt: skip


@dataclass(frozen=True)
class PairTemplate:
    """Where a pair's pieces go among the special tokens, and each part's token types: read from the tokenizer."""

    ids: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # before the first text, between, after the second
    types: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # their token types
    first_type: int  # the first text's pieces' token type
    second_type: int  # the second's
    budget: int  # pieces a pair keeps under the cap: the cap less the special tokens


def longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """The pieces each text of a pair keeps, `first` and `second` long, under `budget`: the tokenizers library's
    `longest_first` truncation (its utils/truncation.rs), step for step. The shorter text is kept whole where the
    longer can give up the rest; otherwise each keeps half, the longer (the second, where they are as long) the
    odd one."""
    swapped = first > second
    shorter, longer = (second, first) if swapped else (first, second)
    longer = shorter if shorter > budget else max(shorter, budget - shorter)
    if shorter + longer > budget:
        shorter = budget // 2
        longer = shorter + budget % 2
    kept = (longer, shorter) if swapped else (shorter, longer)
    return min(first, kept[0]), min(second, kept[1])  # the library's targets, past a text's end, keep it whole


@dataclass(frozen=True)
class WordPieces:
    """One tokenizer's texts and pairs as ids, from its WordPiece model's pieces of each word, remembered.

    `remembered` holds the worker's one memo of a pure function (a word's pieces), filled as words arrive: no
    batch leaves anything else in it, and what it holds cannot change an answer."""

    tokenize: Callable[[str], tuple[int, ...]]  # a word -> its WordPiece ids, asked of the model
    remembered: Callable[[str], tuple[int, ...]]  # the same, the last CACHED_WORDS words remembered (functools)
    prefix: tuple[int, ...]  # the special tokens before a text's pieces ([CLS])
    suffix: tuple[int, ...]  # and after them ([SEP])
    budget: int  # pieces a text keeps under the cap: the cap less the special tokens
    keep_end: bool  # a text over the cap keeps its end (the tokenizer's truncation_side "left")
    pair: PairTemplate | None = None  # None: pairs keep the Rust call

    def encode(self, normalized: str) -> tuple[list[int], bool]:
        """The ids of a text the normalizer has already read, and whether pieces were cut at the cap."""
        words = WORDS.findall(normalized)
        # WordPiece gives every word one piece at least ([UNK] at worst): past the first budget + 1 words (the last,
        # when the end is kept) none is kept, and one more than the budget is enough to tell that the text is cut.
        pieces = self._pieces(words[-(self.budget + 1) :] if self.keep_end else words[: self.budget + 1])
        return [*self.prefix, *self._kept(pieces, self.budget), *self.suffix], len(pieces) > self.budget

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int], bool]:
        """A pair of normalized texts' ids and token types, and whether pieces were cut at the cap (self.pair)."""
        template = self.pair
        assert template is not None, "encode_pair needs the pair's template"
        # All of both texts' pieces: a pair's cut depends on both whole lengths.
        a, b = self._pieces(WORDS.findall(first)), self._pieces(WORDS.findall(second))
        cut = len(a) + len(b) > template.budget
        if cut:
            keep_a, keep_b = longest_first(len(a), len(b), template.budget)
            a, b = self._kept(a, keep_a), self._kept(b, keep_b)
        (before, between, after), (before_types, between_types, after_types) = template.ids, template.types
        ids = [*before, *a, *between, *b, *after]
        types = [*before_types, *[template.first_type] * len(a), *between_types, *[template.second_type] * len(b)]
        return ids, [*types, *after_types], cut

    def _pieces(self, words: list[str]) -> list[int]:
        """The words' pieces in order, remembered unless a word is too long to keep."""
        short = max(map(len, words), default=0) <= LONGEST_CACHED_WORD
        return list(chain.from_iterable(map(self.remembered if short else self.tokenize, words)))

    def _kept(self, pieces: list[int], count: int) -> list[int]:
        """The `count` pieces a text cut at the cap keeps, from its end where the tokenizer cuts from the left."""
        if count >= len(pieces):
            return pieces
        return pieces[len(pieces) - count :] if self.keep_end else pieces[:count]


def word_pieces(fast: Any, max_length: int) -> WordPieces | None:
    """The word-by-word path for `fast` (a tokenizers.Tokenizer set to truncate at `max_length`, never to pad;
    handlers/tokenization.text_encoder), or None where it would not give `fast`'s own ids and cuts. Its `pair` is
    None where pairs would not."""
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
    at = _find(ids, word)
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
    template = _pair_template(whole, tokenize, max_length, truncation)
    if template is not None:
        paired = replace(words, pair=template)
        for first, second in pair_probes(max_length):
            encoded = fast.encode(first, second)
            made = paired.encode_pair(normalize(first), normalize(second))
            if made != (encoded.ids, encoded.type_ids, bool(encoded.overflowing)):
                break
        else:
            words = paired
    remembered.cache_clear()  # the probes' words are not the traffic's
    return words


def _find(ids: list[int], pieces: tuple[int, ...], start: int = 0) -> int | None:
    """Where `pieces` first stand in `ids`, from `start`; None where they do not."""
    return next(
        (i for i in range(start, len(ids) - len(pieces) + 1) if tuple(ids[i : i + len(pieces)]) == pieces), None
    )


def _pair_template(
    whole: Any, tokenize: Callable[[str], tuple[int, ...]], max_length: int, truncation: dict
) -> PairTemplate | None:
    """A pair's template, from the tokenizer's whole encoding of the pair "a", "b"; None where the tokenizer cuts
    pairs otherwise than longest first, or a text's pieces would not share one token type."""
    if truncation.get("strategy", "longest_first") != "longest_first":
        return None
    encoded = whole.encode("a", "b")
    ids, types = encoded.ids, encoded.type_ids
    a, b = tokenize("a"), tokenize("b")
    i = _find(ids, a)
    j = None if i is None else _find(ids, b, i + len(a))
    if i is None or j is None or len(set(types[i : i + len(a)])) != 1 or len(set(types[j : j + len(b)])) != 1:
        return None
    budget = max_length - (len(ids) - len(a) - len(b))
    if budget < 0:  # a cap under the pair's special tokens: the tokenizer's own call decides what happens
        return None
    cuts = (slice(0, i), slice(i + len(a), j), slice(j + len(b), len(ids)))
    parts, part_types = (tuple(tuple(seq[cut]) for cut in cuts) for seq in (ids, types))
    return PairTemplate(parts, part_types, types[i], types[j], budget)  # type: ignore[arg-type] - three parts each
