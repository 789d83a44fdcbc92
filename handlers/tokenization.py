"""Valid texts and pairs of texts -> token ids (with the token cap), and token ids -> padded tensors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from handlers.ascii_normalization import AsciiShortcut, ascii_shortcut
from handlers.batching import padded_width
from handlers.instances import Instance, TextPair
from handlers.word_pieces import WordPieces, word_pieces

# Models whose position ids start after the padding index, so two positions are unusable.
_OFFSET_POSITION_MODELS = {"roberta", "xlm-roberta", "camembert", "longformer"}


@dataclass(frozen=True)
class Encoding:
    features: dict[str, list[int]]  # input_ids and, for BERT, token_type_ids
    truncated: bool

    @property
    def length(self) -> int:
        return len(self.features["input_ids"])


def model_token_limit(tokenizer, config) -> int:
    """The longest sequence this model can embed, from its config and tokenizer."""
    limits = []
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        offset = 2 if getattr(config, "model_type", "") in _OFFSET_POSITION_MODELS else 0
        limits.append(positions - offset)
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:  # HF uses 1e30 for "unset"
        limits.append(declared)
    return min(limits) if limits else 512


@dataclass(frozen=True)
class TextEncoder:
    """How one model's texts become token ids, capped at `max_length` tokens; built once, at load.

    `fast`: a copy of the tokenizer's own Rust tokenizer (`tokenizers.Tokenizer`) set to truncate at the cap
    and never pad, or None where the tokenizer has none (a Python tokenizer). `features`: the ids the model
    takes besides the mask: input_ids, and token_type_ids where the tokenizer's model_input_names has them.
    `ascii`: for a BERT normalizer, the ASCII texts' shortcut past it (handlers/ascii_normalization.py).
    `words`: for BERT's pre-tokenizer and WordPiece, texts and pairs so normalized tokenized word by word, each
    word's pieces remembered (handlers/word_pieces.py).
    """

    tokenizer: Any
    max_length: int
    fast: Any = None
    features: tuple[str, ...] = ("input_ids",)
    ascii: AsciiShortcut | None = None
    words: WordPieces | None = None

    @property
    def description(self) -> str:
        """The ways texts take, for the load log."""
        if self.fast is None:
            return "the Hugging Face wrapper's call (no Rust tokenizer)"
        if self.words is not None:
            pairs = "texts and pairs" if self.words.pair is not None else "texts"
            return f"ASCII {pairs} word by word, words remembered; the others the Rust batch call"
        if self.ascii is not None:
            return "the Rust batch call, ASCII texts normalized in Python"
        return "the Rust batch call"


def text_encoder(tokenizer: Any, max_length: int) -> TextEncoder:
    """The encoder for `tokenizer` at a cap of `max_length` tokens (special tokens included)."""
    # What the wrapper's call returns too: token types where the model takes them.
    names = getattr(tokenizer, "model_input_names", ())
    features = ("input_ids", "token_type_ids") if "token_type_ids" in names else ("input_ids",)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return TextEncoder(tokenizer, max_length, None, features)
    from tokenizers import Tokenizer

    # A copy: the checkpoint's tokenizer.json may carry padding and truncation settings of its own, which the
    # Hugging Face wrapper resets on every call; this copy is set once.
    fast = Tokenizer.from_str(backend.to_str())
    fast.no_padding()
    # The side the checkpoint cuts from, as the wrapper passes it: a tokenizer saved with truncation_side="left"
    # keeps a long text's end, and enable_truncation's default would keep its beginning instead.
    fast.enable_truncation(max_length, direction=getattr(tokenizer, "truncation_side", "right"))
    ascii = ascii_shortcut(fast)
    return TextEncoder(tokenizer, max_length, fast, features, ascii, word_pieces(fast, max_length) if ascii else None)


def size_tokenizer_pool(threads: int) -> None:
    """Run the Rust tokenizer's batch calls on `threads` threads, like the forward pass's pools (cpu_threads).

    Its batch call splits a batch over rayon's pool, which is process-wide and built at the first batch call
    with RAYON_NUM_THREADS threads, or else one per core the process sees: each of several workers on one host
    would start a thread per core. Held to one thread, two workers on 2 cores tokenized a batch in about two
    thirds of the time (docs/batching.md, "Workers and threads on a CPU"). Call it before the process
    tokenizes anything: the first batch call fixes the pool for the process's life, so in a TorchServe worker
    (one model) the model's option decides; it overrides a RAYON_NUM_THREADS the worker inherited.
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)


def encode(encoder: TextEncoder, texts: Sequence[Instance]) -> list[Encoding]:
    """Tokenize texts and pairs, capping each at the encoder's max_length tokens and flagging those that were cut.

    A pair is joined as the tokenizer joins two sequences (`[CLS] a [SEP] b [SEP]`, token types 0 then 1 for
    BERT) and cut longest first, as transformers' pipeline does with `truncation=True`.
    With a Rust tokenizer: one batch call that skips character offsets (`encode_batch_fast`: nothing here
    uses them, and they cost about a fifth of the call), a text cut at the cap being one that left tokens
    over. For a BERT tokenizer, the ASCII texts and pairs are normalized here, then split into words and each
    word's WordPiece ids looked up (handlers/word_pieces.py; where the tokenizer's pairs cannot be, its ASCII
    pairs go through a copy without the normalizer, handlers/ascii_normalization.py); the others through the
    whole tokenizer. The same ids and flags as the Hugging Face wrapper's call (tests/inprocess/
    test_tokenization.py), at 2.6 to 8 times its speed on the benchmark's texts, which matters on a GPU where
    tokenizing a batch costs about as long as its forward pass (docs/benchmarks.md, "Tokenization").
    """
    if not texts:
        return []
    if encoder.fast is None:
        return _encode_through_the_tokenizer(encoder.tokenizer, texts, encoder.max_length)
    inputs = [(t.text, t.text_pair) if isinstance(t, TextPair) else t for t in texts]
    if encoder.ascii is None:
        return _encodings(encoder.fast.encode_batch_fast(inputs), encoder.features)
    normalized = [_normalized(encoder.ascii, item) for item in inputs]
    by_index: dict[int, Encoding] = {}
    words = encoder.words
    if words is not None:
        for i, item in enumerate(normalized):
            if isinstance(item, str):
                ids, cut = words.encode(item)
                by_index[i] = _word_encoding(ids, None, cut, encoder.features)
            elif item is not None and words.pair is not None:
                by_index[i] = _word_encoding(*words.encode_pair(*item), encoder.features)
    short = [i for i, item in enumerate(normalized) if item is not None and i not in by_index]
    whole = [i for i, item in enumerate(normalized) if item is None]
    if short:
        encoded = encoder.ascii.tokenizer.encode_batch_fast([normalized[i] for i in short])
        by_index.update(zip(short, _encodings(encoded, encoder.features)))
    if whole:
        encoded = encoder.fast.encode_batch_fast([inputs[i] for i in whole])
        by_index.update(zip(whole, _encodings(encoded, encoder.features)))
    return [by_index[i] for i in range(len(texts))]


def _normalized(shortcut: AsciiShortcut, item: str | tuple[str, str]) -> str | tuple[str, str] | None:
    """A text, or both texts of a pair, normalized by the ASCII shortcut; None unless every one of them takes it."""
    if isinstance(item, str):
        return shortcut.normalize(item)
    first, second = shortcut.normalize(item[0]), shortcut.normalize(item[1])
    return None if first is None or second is None else (first, second)


def _encodings(encoded: Sequence[Any], features: tuple[str, ...]) -> list[Encoding]:
    """The Rust tokenizer's encodings as the pipeline's: the ids the model takes, and whether tokens were left over."""
    if features == ("input_ids", "token_type_ids"):
        return [Encoding({"input_ids": e.ids, "token_type_ids": e.type_ids}, bool(e.overflowing)) for e in encoded]
    return [Encoding({"input_ids": e.ids}, bool(e.overflowing)) for e in encoded]


def _word_encoding(ids: list[int], types: list[int] | None, cut: bool, features: tuple[str, ...]) -> Encoding:
    """An encoding from word-by-word ids and token types (a single text's: None, all 0, as the Rust call gives)."""
    if features == ("input_ids", "token_type_ids"):
        return Encoding({"input_ids": ids, "token_type_ids": [0] * len(ids) if types is None else types}, cut)
    return Encoding({"input_ids": ids}, cut)


def _encode_through_the_tokenizer(tokenizer: Any, texts: Sequence[Instance], max_length: int) -> list[Encoding]:
    """A tokenizer without a Rust one: the single texts in one call and the pairs in another (the wrapper takes
    either in a call, not both), back in order."""
    singles = [i for i, t in enumerate(texts) if not isinstance(t, TextPair)]
    pairs = [i for i, t in enumerate(texts) if isinstance(t, TextPair)]
    by_index: dict[int, Encoding] = {}
    if singles:
        encoded = _capped_call(tokenizer, max_length, [texts[i] for i in singles])
        by_index.update(zip(singles, encoded))
    if pairs:
        firsts = [texts[i].text for i in pairs]  # type: ignore[union-attr] - pairs only
        seconds = [texts[i].text_pair for i in pairs]  # type: ignore[union-attr]
        by_index.update(zip(pairs, _capped_call(tokenizer, max_length, firsts, seconds)))
    return [by_index[i] for i in range(len(texts))]


def _capped_call(tokenizer: Any, max_length: int, texts: list, pairs: list | None = None) -> list[Encoding]:
    """Tokenizing to max_length + 1 tells which items are over the cap without a second full pass; only those are
    tokenized again at the cap, so the special tokens stay correct for any model family."""

    def call(rows: list[int], limit: int):
        second = {} if pairs is None else {"text_pair": [pairs[i] for i in rows]}
        return tokenizer([texts[i] for i in rows], **second, truncation=True, max_length=limit,
                         return_attention_mask=False)  # fmt: skip

    everything = list(range(len(texts)))
    probe = call(everything, max_length + 1)
    rows = [{key: probe[key][i] for key in probe} for i in everything]
    over = [i for i, row in enumerate(rows) if len(row["input_ids"]) > max_length]
    if over:
        capped = call(over, max_length)
        for j, i in enumerate(over):
            rows[i] = {key: capped[key][j] for key in capped}
    over_set = set(over)
    return [Encoding(row, i in over_set) for i, row in enumerate(rows)]


def collate(encodings: Sequence[Encoding], pad_token_id: int, multiple: int, limit: int) -> dict[str, np.ndarray]:
    """Right-pad a group to its longest item (rounded up to `multiple`, never past `limit`): int64 arrays.

    Shared by every forward pass (PyTorch takes them with torch.from_numpy, ONNX Runtime as they are).
    """
    width = padded_width(max(e.length for e in encodings), multiple, limit)
    shape = (len(encodings), width)
    batch = {
        key: np.full(shape, pad_token_id if key == "input_ids" else 0, dtype=np.int64) for key in encodings[0].features
    }
    batch["attention_mask"] = np.zeros(shape, dtype=np.int64)
    for row, e in enumerate(encodings):
        for key, values in e.features.items():
            batch[key][row, : len(values)] = values
        batch["attention_mask"][row, : e.length] = 1
    return batch
