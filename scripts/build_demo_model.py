"""Fine-tune the pretrained MiniLM-L6 BERT into a 2-label sentiment classifier, on CPU, offline.

    python -m scripts.build_demo_model [--out build/demo-model] [--force]

Data: data/reviews_*.tsv (label, domain, text), written for this project. Every
fifth example of each (domain, label) group is held out; the script prints the
held-out accuracy and refuses to write a model below --min-accuracy. The output
is a standard Hugging Face checkpoint. A second run with the same data and
settings finds its stamp and does nothing.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
DEFAULT_OUT = REPO / "build" / "demo-model"
LABELS = ("negative", "positive")
HOLD_OUT_EVERY = 5


def read_examples(data_dir: Path = DATA) -> list[tuple[str, str, str]]:
    """(label, domain, text) rows from every data/reviews_*.tsv file."""
    rows = []
    for path in sorted(data_dir.glob("reviews_*.tsv")):
        with path.open(newline="", encoding="utf-8") as f:
            for label, domain, text in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                if label not in LABELS:
                    raise ValueError(f"{path}: unknown label {label!r}")
                rows.append((label, domain, text))
    return rows


def split(rows: list[tuple[str, str, str]]) -> tuple[list, list]:
    """Stratified split: every HOLD_OUT_EVERY-th example of each (domain, label) group is held out."""
    seen: dict[tuple[str, str], int] = {}
    train, held_out = [], []
    for label, domain, text in rows:
        n = seen.get((domain, label), 0)
        seen[(domain, label)] = n + 1
        (held_out if n % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1 else train).append((text, LABELS.index(label)))
    return train, held_out


def stamp_of(args: argparse.Namespace) -> str:
    digest = hashlib.sha256()
    for path in [*sorted(DATA.glob("reviews_*.tsv")), Path(__file__)]:
        digest.update(path.read_bytes())
    digest.update(json.dumps([args.epochs, args.lr, args.batch_size, args.seed]).encode())
    return digest.hexdigest()


def accuracy(model, tokenizer, examples: list[tuple[str, int]]) -> float:
    import torch

    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(examples), 64):
            chunk = examples[start : start + 64]
            batch = tokenizer([t for t, _ in chunk], padding=True, truncation=True, max_length=128, return_tensors="pt")
            predicted = model(**batch).logits.argmax(-1).tolist()
            correct += sum(int(p == y) for p, (_, y) in zip(predicted, chunk))
    return correct / len(examples)


def train(args: argparse.Namespace) -> float:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from scripts.random_model import minilm_dir

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)

    train_set, held_out = split(read_examples())
    source = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        source,
        local_files_only=True,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    print(f"training on {len(train_set)} examples, holding out {len(held_out)}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps_per_epoch = -(-len(train_set) // args.batch_size)
    total = steps_per_epoch * args.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
    order = list(range(len(train_set)))
    with tqdm(total=total, desc="fine-tuning", unit="step") as progress:
        for epoch in range(args.epochs):
            model.train()
            random.shuffle(order)
            for start in range(0, len(order), args.batch_size):
                chunk = [train_set[i] for i in order[start : start + args.batch_size]]
                batch = tokenizer(
                    [t for t, _ in chunk], padding=True, truncation=True, max_length=128, return_tensors="pt"
                )
                loss = model(**batch, labels=torch.tensor([y for _, y in chunk])).loss
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                progress.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
                progress.update()

    train_accuracy = accuracy(model, tokenizer, train_set)
    held_out_accuracy = accuracy(model, tokenizer, held_out)
    print(f"train accuracy {train_accuracy:.3f}; held-out accuracy {held_out_accuracy:.3f} ({len(held_out)} examples)")
    if held_out_accuracy < args.min_accuracy:
        sys.exit(f"held-out accuracy {held_out_accuracy:.3f} is below {args.min_accuracy}; not saving the model")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    return held_out_accuracy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument("--force", action="store_true", help="train even if the stamp says the model is current")
    args = parser.parse_args(argv)

    stamp_file = args.out / "training-stamp.json"
    stamp = stamp_of(args)
    if not args.force and stamp_file.exists() and json.loads(stamp_file.read_text()).get("stamp") == stamp:
        print(f"{args.out} is up to date; skipping training (use --force to retrain)")
        return
    held_out_accuracy = train(args)
    stamp_file.write_text(json.dumps({"stamp": stamp, "held_out_accuracy": held_out_accuracy}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
