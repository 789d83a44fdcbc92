"""Checks on decoded text that need no tokenizer. Pure and torch-free.

The token-length cap needs the tokenizer and lives in tokenization.py.
"""

from __future__ import annotations

from dataclasses import replace

from handlers import rejection
from handlers.instances import PAIR_FIELD, Instance, TextPair
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


def validate_instance(instance: Instance) -> Instance | Rejection:
    """An instance unchanged if each of its texts can be tokenized; else the reason, naming `text_pair` where the
    second text of a pair is the one refused."""
    if not isinstance(instance, TextPair):
        return validate_text(instance)
    for field, text in (("", instance.text), (PAIR_FIELD, instance.text_pair)):
        checked = validate_text(text)
        if isinstance(checked, Rejection):
            return replace(checked, message=f"{field}: {checked.message}") if field else checked
    return instance
