"""Checks on decoded text that need no tokenizer. Pure and torch-free.

The token-length cap needs the tokenizer and lives in tokenization.py.
"""

from __future__ import annotations

from handlers import rejection
from handlers.rejection import Rejection


def validate_text(text: str) -> str | Rejection:
    """Return the text unchanged if it can be tokenized, else the reason it cannot."""
    if not text or text.isspace():
        return rejection.empty_text()
    try:
        # JSON escapes can smuggle lone surrogates ("\ud800") into a str; the Rust
        # tokenizer would raise on them mid-batch, so they are refused here.
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return rejection.invalid_unicode(exc.start)
    return text
