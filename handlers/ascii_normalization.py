"""BERT's text normalization of an ASCII text, done in Python ahead of a copy of the Rust tokenizer without it.

Why: the Rust tokenizer's `BertNormalizer` keeps a character-by-character alignment to the original
text, which nothing here uses, and for the reviews this service reads it costs about a quarter of the
whole batch call (one thread, batches of 128 of the benchmark's corpus: 60 µs a text through the whole
tokenizer, 44 with the text normalized here and the normalizer left out; docs/benchmarks.md,
"Tokenization"). On a GPU, tokenizing a batch costs about as much as its forward pass.

Only where the answer is certain to be the same: on an ASCII text, BertNormalizer drops the control
characters, turns tab, line feed and carriage return into spaces, and lowercases where configured;
accents (NFD) and Chinese characters do not arise. Any other text goes through the whole tokenizer,
as does a text in which an added token ([CLS], [SEP] ...) could be matched: the tokenizer matches those
on the original text or on the normalized one, depending on the token, and the copy without the
normalizer sees only the normalized one. tests/inprocess/test_tokenization.py holds the normalization
to the library's own over any ASCII text, and the ids to the Hugging Face wrapper's over any text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# clean_text on ASCII: what Rust's char::is_control calls "other" (C0 controls and DEL) is dropped, except tab,
# line feed and carriage return, which become spaces (vertical tab and form feed are controls, so dropped).
_CONTROLS = [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]
CLEAN_TEXT_TABLE: Mapping[int, int | None] = {
    **dict.fromkeys(_CONTROLS),
    **dict.fromkeys(map(ord, "\t\n\r"), ord(" ")),
}

# Every text is searched for the added tokens (BERT has five); a tokenizer with more than this many takes the
# whole tokenizer for every text rather than spend on the search what the shortcut saves.
MAX_ADDED_TOKENS = 32


@dataclass(frozen=True)
class AsciiShortcut:
    """A copy of a BERT tokenizer without its normalizer, and the normalization it skips, for ASCII texts."""

    tokenizer: Any  # tokenizers.Tokenizer: the checkpoint's, normalizing nothing, truncating at the cap, no padding
    clean_text: bool
    lowercase: bool
    added_tokens: re.Pattern[str] | None  # any of the tokenizer's added tokens, as written or as normalized

    def normalize(self, text: str) -> str | None:
        """The text as the checkpoint's BertNormalizer leaves it; None where it must go through the whole tokenizer."""
        if not text.isascii():
            return None
        normalized = text.translate(CLEAN_TEXT_TABLE) if self.clean_text else text
        if self.lowercase:
            normalized = normalized.lower()
        if self.added_tokens is not None and (self.added_tokens.search(text) or self.added_tokens.search(normalized)):
            return None
        return normalized


def ascii_shortcut(fast: Any) -> AsciiShortcut | None:
    """The shortcut for a Rust tokenizer whose normalizer is BERT's; None for any other (RoBERTa has none).
    The copy keeps `fast`'s truncation and padding (handlers/tokenization.text_encoder sets them)."""
    from tokenizers import Tokenizer
    from tokenizers.normalizers import BertNormalizer, Sequence

    normalizer = fast.normalizer
    added = fast.get_added_tokens_decoder().values()
    if not isinstance(normalizer, BertNormalizer) or len(added) > MAX_ADDED_TOKENS:
        return None
    plain = Tokenizer.from_str(fast.to_str())
    # A normalizer that does nothing rather than None, which only some versions of tokenizers accept; the same
    # speed (measured), and the added tokens are then matched on the text as given, normalized or not.
    plain.normalizer = Sequence([])
    # Each added token as written and as normalized: the tokenizer matches a token on the original text by its
    # content, or (a token added with normalized=True, as add_tokens does) on the normalized text by its content
    # normalized ("covid" for "COVID"). A text holding either form anywhere takes the whole tokenizer. One pattern
    # for all, searched once per text rather than once per token: for BERT's five, 0.3 µs a text against 2.5.
    contents = [token.content for token in added if token.content]
    forms = [form for form in dict.fromkeys([*contents, *map(normalizer.normalize_str, contents)]) if form]
    pattern = re.compile("|".join(map(re.escape, forms))) if forms else None
    return AsciiShortcut(plain, normalizer.clean_text, normalizer.lowercase, pattern)
