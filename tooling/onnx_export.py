"""A Hugging Face sequence classifier -> `model.onnx` for ONNX Runtime, checked against PyTorch before it is used.

    export_checkpoint(checkpoint, out_dir)                    # fp32: refuses if any probability moves > 1e-4
    export_checkpoint(checkpoint, out_dir, quantize="int8")   # + dynamic int8: refuses below 99 % label agreement

The graph takes the tokenizer's arrays (input_ids, attention_mask and, where the model uses them,
token_type_ids) with dynamic batch and sequence axes, and returns the head's scores (softmax
probabilities for most checkpoints; sigmoid or raw values where the config says so: handlers/scores.py),
so the handler's ONNX forward pass (handlers/onnx_forward.py) needs no post-processing. It is exported with
torch.onnx's dynamo exporter: the TorchScript exporter traced the attention mask of the example batch
as a constant here and gave wrong answers for padded batches (max difference 0.94), which is exactly
what the parity check is for. The fp32 graph then gets ONNX Runtime's transformer fusions where they
keep parity; int8 quantizes the graph as exported. Parity and agreement run through the handler's own
code (encode, collate, TorchForward, OnnxForward), so what is checked is what will be served. The
numbers measured are written into the graph's metadata and logged by the worker when it loads the model.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from handlers.instances import Instance, TextPair
from handlers.loading import LoadedModel, load_model
from handlers.onnx_forward import EXPORT_METADATA_KEY, ONNX_FILE
from handlers.options import HandlerOptions
from handlers.scores import RAW, SIGMOID, SOFTMAX, apply
from handlers.tokenization import TextEncoder
from tooling.log_filters import without_message

PARITY_TOLERANCE = 1e-4
DEFAULT_MIN_AGREEMENT = 0.99
QUANTIZATIONS = ("int8",)
OPSET = 18
# A demo checkpoint is recognised by the stamp tooling/demo_model.py writes beside it.
DEMO_STAMP = "training-stamp.json"
# Texts per forward pass in the checks: mixed lengths in one batch, so padding and the attention mask are exercised.
CHECK_BATCH = 8
# The PyTorch weights a Hugging Face checkpoint may hold: an ONNX checkpoint folder leaves them out.
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)

# Fixed texts for the parity check (and agreement when no labelled set is given): short, long,
# non-ASCII, punctuation-only and over the token cap, so every padding and truncation path is
# run; fixed_texts() adds a sample of the project's reviews for breadth.
EDGE_TEXTS = (
    "great",
    "The staff were rude and the room was dirty.",
    "I absolutely love this product, it works perfectly.",
    "Not bad at all, though the ending dragged a little.",
    "¡Qué desastre! 服务很差 — never again 😡",
    "?!...",
    "ok " * 3,
    "The software crashed twice during the update, support never answered my emails, and the refund took "
    "three weeks. On the other hand the new interface is clean and fast once it finally works.",
)


# Pairs of texts (handlers/instances.py): the second text's token types reach the graph only through these.
EDGE_PAIRS = (
    TextPair("is breakfast included", "Breakfast is served daily from seven and is included in every rate."),
    TextPair("¿hay aparcamiento?", "Parking is free in the garage — 停车免费."),
    TextPair("ok " * 300, "a second text the longest-first cut leaves whole"),
)
CORPUS_SAMPLE_EVERY = 4


def fixed_texts() -> list[str]:
    """The edge texts, one text far over any token cap, and every 4th review of data/ (about 110 texts)."""
    from tooling.corpus import read_examples

    reviews = [text for _, _, text in read_examples()][::CORPUS_SAMPLE_EVERY]
    return [*EDGE_TEXTS, " ".join(EDGE_TEXTS) * 8, *reviews]


def parity_inputs() -> list[Instance]:
    """What parity is checked on: the fixed texts and the edge pairs."""
    return [*fixed_texts(), *EDGE_PAIRS]


class ExportFailed(RuntimeError):
    """The checkpoint could not be exported to ONNX (the message says which step failed)."""


class ParityError(ExportFailed):
    """The exported graph's probabilities differ from PyTorch's by more than the tolerance."""


class AgreementTooLow(ExportFailed):
    """The quantized graph changes too many labels against PyTorch."""


@dataclass(frozen=True)
class EvalSet:
    """Texts to compare labels on; `labels` (indices) when the set is labelled, for accuracy."""

    name: str
    texts: list[str]
    labels: list[int] | None = None


@dataclass
class ExportRecord:
    """What the export measured; written into model.onnx's metadata and printed."""

    model_type: str
    exporter: str
    opset: int
    quantization: str  # "none" or "int8"
    scores: str  # the score function baked into the graph (handlers/scores.py); the handler checks it at load
    parity_texts: int
    parity_max_abs_diff: float  # fp32 graph vs PyTorch, over the fixed texts
    eval_set: str
    eval_texts: int
    agreement: float  # labels of the packed graph equal to PyTorch's, over the eval set
    max_abs_diff: float  # packed graph vs PyTorch, over the eval set
    accuracy_pytorch: float | None = None
    accuracy_onnx: float | None = None
    min_agreement: float | None = None
    fusions: dict[str, int] = field(default_factory=dict)  # ONNX Runtime fusions applied to the fp32 graph
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        graph = f" ({describe_fusions(self.fusions)})" if self.fusions else ""
        text = (
            f"{self.model_type} {self.quantization if self.quantization != 'none' else 'fp32'}{graph}, "
            f"parity max |dp| {self.parity_max_abs_diff:.1e} on {self.parity_texts} texts; "
            f"on {self.eval_set} ({self.eval_texts} texts): "
            # A regression head has no labels: its agreement (one column's argmax) would always read 100 %.
            + (f"label agreement {100 * self.agreement:.1f}%, " if self.scores != RAW else "")
            + f"max |dp| {self.max_abs_diff:.1e}"
        )
        if self.accuracy_pytorch is not None and self.accuracy_onnx is not None:
            text += f", accuracy {self.accuracy_onnx:.4f} (PyTorch {self.accuracy_pytorch:.4f})"
        return text

    def metadata(self) -> str:
        return json.dumps({**asdict(self), "summary": self.summary}, sort_keys=True)


# ---- evaluation sets ----------------------------------------------------------------------------------


def read_eval_tsv(path: Path, label_names: Sequence[str]) -> EvalSet:
    """`label<TAB>text` rows; a label is one of the model's label names or its index."""
    texts, labels = [], []
    with Path(path).open(encoding="utf-8", newline="") as f:
        for number, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 2:
                raise ExportFailed(f"{path}:{number}: expected label<TAB>text")
            label, text = row[0].strip(), "\t".join(row[1:])
            if label in label_names:
                labels.append(list(label_names).index(label))
            elif label.isascii() and label.isdigit() and len(label) < 10 and int(label) < len(label_names):
                labels.append(int(label))
            else:
                raise ExportFailed(f"{path}:{number}: label {label!r} is not one of {list(label_names)}")
            texts.append(text)
    if not texts:
        raise ExportFailed(f"{path}: no labelled rows")
    return EvalSet(f"{Path(path).name}", texts, labels)


def default_eval_set(checkpoint: Path, eval_tsv: Path | None, label_names: Sequence[str]) -> EvalSet:
    """--eval-tsv if given; the held-out split for the demo model; otherwise the fixed texts (agreement only)."""
    if eval_tsv is not None:
        return read_eval_tsv(eval_tsv, label_names)
    if (Path(checkpoint) / DEMO_STAMP).is_file():
        from tooling.corpus import LABELS, held_out_examples

        if tuple(label_names) == LABELS:
            examples = held_out_examples()
            return EvalSet("the demo model's held-out reviews", [t for t, _ in examples], [y for _, y in examples])
    return EvalSet("the fixed check texts", fixed_texts())


# ---- running both sides -----------------------------------------------------------------------------


def probabilities(forward: Callable, encoder: TextEncoder, texts: Sequence[Instance]) -> np.ndarray:
    """Class probabilities for `texts` through the handler's encode and a forward pass, CHECK_BATCH at a time."""
    from handlers.tokenization import encode

    encodings = encode(encoder, list(texts))
    rows = [forward(encodings[i : i + CHECK_BATCH]) for i in range(0, len(encodings), CHECK_BATCH)]
    return np.concatenate(rows).astype(np.float32)


def _served(checkpoint: Path, onnx_dir: Path | None = None) -> LoadedModel:
    """The checkpoint as the handler loads it on a CPU with the default options: PyTorch, or the graph in onnx_dir."""
    return load_model(checkpoint, HandlerOptions(), None, onnx_dir)


def served_probabilities(model: LoadedModel, texts: Sequence[Instance]) -> np.ndarray:
    return probabilities(model.forward, model.encoder, texts)


# ---- export -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _without_the_exporters_notices() -> Iterator[None]:
    """torch.onnx's exporter (torch 2.13) tells every export of any model, on stderr, that torchvision's operators are
    skipped (torchvision is not installed: BERT uses none), that its own pytree code calls a deprecated LeafSpec check,
    and that each dynamic axis given to several inputs keeps one name: seven warnings in README command 1's set-up
    (four of them torchvision's), about neither the model nor the export. Each is hidden by its own message; any
    other warning of the exporter still shows (tests/e2e/test_onnx_backend.py, the export's output)."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    with without_message(registration, "torchvision is not installed"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        warnings.filterwarnings("ignore", r"# The axis name: \w+ will not be used", UserWarning)
        yield


def _export_graph(checkpoint: Path, reference: LoadedModel, path: Path) -> list[str]:
    """torch.onnx (dynamo) export of model -> its scores (reference.scores); returns the graph's input names."""
    import inspect

    import torch
    from transformers import AutoModelForSequenceClassification

    # Eager attention exports to plain MatMul/Softmax, which _fuse_for_onnxruntime turns into Attention ops.
    model = AutoModelForSequenceClassification.from_pretrained(
        checkpoint, local_files_only=True, attn_implementation="eager"
    ).eval()
    accepted = set(inspect.signature(model.forward).parameters)
    example = reference.tokenizer(["an example input", "a second, longer example input text"], padding=True)
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in example and name in accepted]
    # RoBERTa-style models with one token type gain nothing from token_type_ids (all zeros).
    if "token_type_ids" in names and getattr(model.config, "type_vocab_size", 2) < 2:
        names.remove("token_type_ids")

    class Probabilities(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *arrays):
            return apply(self.model(**dict(zip(names, arrays))).logits.float(), reference.scores)

    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=reference.token_limit)
    args = tuple(torch.tensor(example[name], dtype=torch.long) for name in names)
    try:
        with _without_the_exporters_notices():
            program = torch.onnx.export(
                Probabilities().eval(),
                args,
                dynamo=True,
                input_names=names,
                output_names=["probabilities"],
                dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),),
                opset_version=OPSET,
                optimize=True,
                verbose=False,
            )
        program.save(str(path))
    except Exception as exc:  # any exporter failure becomes one clear refusal
        raise ExportFailed(
            f"{checkpoint}: torch.onnx could not export this {reference.model_type} model "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); archive it with --backend pytorch"
        ) from exc
    return names


def _quantize_int8(source: Path, target: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    # The dynamo exporter's value_info records one transposed weight with its old shape, which
    # the quantizer's strict shape inference rejects; the shapes are inferred again from the graph.
    del model.graph.value_info[:]
    # Dynamic quantization of the MatMul weights (per output channel); activations are
    # quantized on the fly, embeddings, LayerNorm and softmax stay float32.
    # onnxruntime advises, on the root logger, pre-processing first (quant_pre_process): tried, it gained nothing here
    # and its shape inference fails on the dynamo graph (docs/benchmarks.md, "No pre-processing before quantizing"),
    # so the advice is not taken and its line is not printed.
    with without_message(logging.getLogger(), "Please consider to run pre-processing before quantization"):
        quantize_dynamic(
            model, str(target), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
        )


def _write_metadata(path: Path, record: ExportRecord) -> None:
    import onnx

    model = onnx.load(str(path))
    entries = {p.key: p.value for p in model.metadata_props}
    entries[EXPORT_METADATA_KEY] = record.metadata()
    del model.metadata_props[:]
    for key, value in entries.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def _copy_without_weights(checkpoint: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in checkpoint.iterdir():
        # Only PyTorch reads the weights; an ONNX checkpoint folder leaves them out.
        if item.is_file() and item.name not in WEIGHT_FILES and item.name != ONNX_FILE:
            shutil.copy2(item, out_dir / item.name)


def _decisions(scores: np.ndarray, function: str) -> np.ndarray:
    """What a client reads off each row: the top label under softmax; each label's yes or no (p > 0.5) under sigmoid."""
    return scores > 0.5 if function == SIGMOID else scores.argmax(-1)[:, None]


def _agreement(reference: np.ndarray, candidate: np.ndarray, function: str) -> float:
    """The share of rows whose decisions are all the same (int8's check; no regression head gets here)."""
    return float(np.mean((_decisions(reference, function) == _decisions(candidate, function)).all(-1)))


def _accuracy(probs: np.ndarray, labels: Sequence[int] | None, function: str) -> float | None:
    """Top-label accuracy on a labelled set, for a softmax head (the only kind whose rows have one label)."""
    if labels is None or function != SOFTMAX:
        return None
    return float(np.mean(probs.argmax(-1) == np.asarray(labels)))


def check_parity(reference: np.ndarray, candidate: np.ndarray, tolerance: float = PARITY_TOLERANCE) -> float:
    """The largest probability difference; raises ParityError above `tolerance`."""
    difference = float(np.abs(reference - candidate).max())
    if not difference <= tolerance:  # NaN fails too
        row = int(np.abs(reference - candidate).max(axis=-1).argmax())
        raise ParityError(
            f"the exported ONNX model differs from PyTorch by {difference:.2e} (> {tolerance:.0e}) on check text "
            f"#{row}; refusing to pack it. Archive this checkpoint with --backend pytorch."
        )
    return difference


def check_agreement(agreement: float, minimum: float, what: str) -> None:
    if agreement < minimum:
        raise AgreementTooLow(
            f"{what}: {100 * agreement:.1f}% of labels agree with PyTorch, below the required "
            f"{100 * minimum:.1f}%; refusing to pack it. Pack fp32 (no --quantize), or accept the loss "
            f"explicitly with --min-agreement."
        )


def _fuse_for_onnxruntime(source: Path, target: Path) -> dict[str, int]:
    """ONNX Runtime's transformer fusions (Attention, SkipLayerNormalization, BiasGelu) by onnxscript's rewriter.

    The dynamo exporter's graph has attention as plain MatMul/Softmax, which onnxruntime.transformers'
    optimizer does not recognise (it fused no attention here); onnxscript's ORT fusions do, and the
    fused demo model ran 1.17x faster (docs/benchmarks.md). Returns the fused operators in the graph, by type.
    """
    from collections import Counter

    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = onnx_ir.load(str(source))
    model, _ = optimize_for_ort(model)
    onnx_ir.save(model, str(target))
    return dict(Counter(node.op_type for node in model.graph if node.domain == "com.microsoft"))


def _fp32_graph(raw: Path, work: Path, check: Callable[[Path], float], progress: Callable[[str], None]):
    """(path, fusions, parity) of the fp32 graph to pack: fused where the fusions keep parity, else as exported."""
    fused = work / "fused" / ONNX_FILE
    fused.parent.mkdir()
    try:
        fusions = _fuse_for_onnxruntime(raw, fused)
        return fused, fusions, check(fused)
    except Exception as exc:  # noqa: BLE001 - the fusions are an optimization: any failure keeps the checked export
        progress(f"graph fusions skipped ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        return raw, {}, check(raw)


def export_checkpoint(
    checkpoint: Path,
    out_dir: Path,
    quantize: str | None = None,
    eval_tsv: Path | None = None,
    min_agreement: float = DEFAULT_MIN_AGREEMENT,
    progress: Callable[[str], None] = print,
    export_cache: Path | None = None,
) -> ExportRecord:
    """Write an ONNX checkpoint folder to `out_dir`: model.onnx + tokenizer + config.json, no PyTorch weights.

    Steps: export (dynamo) -> parity of the export against PyTorch on the fixed texts -> fp32: ONNX
    Runtime's fusions, kept if they hold parity too; int8: dynamic quantization of the export (faster
    here than quantizing the fused graph, whose attention weights stay float) -> labels and accuracy
    on the evaluation set -> the record into the graph's metadata. Raises ParityError (a probability
    off by more than 1e-4), AgreementTooLow (int8 below `min_agreement`) or ExportFailed; nothing is
    written to out_dir unless every check passed. `export_cache`: a file for the raw export, reused
    when it exists (the benchmark exports each checkpoint once for fp32 and int8).
    """
    if quantize not in (None, *QUANTIZATIONS):
        raise ExportFailed(f"unknown quantization {quantize!r}; expected one of {QUANTIZATIONS}")
    checkpoint = Path(checkpoint).resolve()
    reference = _served(checkpoint)  # PyTorch: the checkpoint as the handler serves it
    if quantize and reference.scores == RAW:
        # int8 is accepted on label agreement, and a regression head has no labels to agree on.
        raise ExportFailed("int8 is checked by label agreement and this checkpoint is a regression head (problem_type "
                           "regression: raw scores, no labels); pack it fp32 (no --quantize)")  # fmt: skip
    eval_set = default_eval_set(checkpoint, eval_tsv, reference.labels)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        work = Path(tmp)
        raw = work / "exported" / ONNX_FILE
        raw.parent.mkdir()
        started = time.perf_counter()
        if export_cache is not None and Path(export_cache).is_file():
            shutil.copy2(export_cache, raw)
        else:
            _export_graph(checkpoint, reference, raw)
            if export_cache is not None:
                shutil.copy2(raw, export_cache)
        seconds["export"] = time.perf_counter() - started

        parity_texts = parity_inputs()
        expected = served_probabilities(reference, parity_texts)

        def check(path: Path) -> float:
            return check_parity(expected, served_probabilities(_served(checkpoint, path.parent), parity_texts))

        parity = check(raw)
        progress(f"parity: the exported graph vs PyTorch, max |difference| {parity:.2e} on {len(parity_texts)} texts")
        started = time.perf_counter()
        if quantize == "int8":
            packed, fusions = work / "int8" / ONNX_FILE, {}
            packed.parent.mkdir()
            _quantize_int8(raw, packed)
        else:
            packed, fusions, parity = _fp32_graph(raw, work, check, progress)
            progress(f"fp32 graph: {describe_fusions(fusions)}, max |difference| {parity:.2e}")
        seconds["optimize"] = time.perf_counter() - started

        started = time.perf_counter()
        packed_model = _served(checkpoint, packed.parent)
        # The fixed texts' reference is already known.
        known = parity_texts[: len(eval_set.texts)] == eval_set.texts  # the fixed texts lead the parity inputs
        truth = expected[: len(eval_set.texts)] if known else served_probabilities(reference, eval_set.texts)
        candidate = served_probabilities(packed_model, eval_set.texts)
        seconds["evaluate"] = time.perf_counter() - started
        record = ExportRecord(
            model_type=reference.model_type,
            exporter="torch.onnx dynamo",
            opset=OPSET,
            quantization=quantize or "none",
            scores=reference.scores,
            parity_texts=len(parity_texts),
            parity_max_abs_diff=parity,
            eval_set=eval_set.name,
            eval_texts=len(eval_set.texts),
            agreement=_agreement(truth, candidate, reference.scores),
            max_abs_diff=float(np.abs(truth - candidate).max()),
            accuracy_pytorch=_accuracy(truth, eval_set.labels, reference.scores),
            accuracy_onnx=_accuracy(candidate, eval_set.labels, reference.scores),
            min_agreement=min_agreement if quantize else None,
            fusions=fusions,
            seconds={k: round(v, 2) for k, v in seconds.items()},
        )
        progress(f"{'int8' if quantize else 'fp32'} ONNX: {record.summary}")
        if quantize:
            check_agreement(record.agreement, min_agreement, f"the {quantize} model on {eval_set.name}")
        _write_metadata(packed, record)
        _copy_without_weights(checkpoint, Path(out_dir))
        shutil.copy2(packed, Path(out_dir) / ONNX_FILE)
    return record


def describe_fusions(fusions: dict[str, int]) -> str:
    return "fused " + ", ".join(f"{n} {k}" for k, n in fusions.items()) if fusions else "as exported"
