"""What the model classifies: one text, or a pair of texts read together. Pure and torch-free.

A pair is what a cross-encoder scores (a query and a passage) and what NLI or paraphrase models
classify (a premise and a hypothesis): the tokenizer joins the two with its separator and marks the
second with token type 1 (`[CLS] text [SEP] text_pair [SEP]` for BERT), as transformers'
text-classification pipeline does for `{"text": ..., "text_pair": ...}`. A request names the second
text `text_pair` in every format (handlers/protocols.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PAIR_FIELD = "text_pair"


@dataclass(frozen=True)
class TextPair:
    text: str
    text_pair: str


Instance = str | TextPair
