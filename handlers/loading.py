"""Loading an unpacked archive once, at worker start: tokenizer, labels, limits and the forward pass.

The result is an immutable value the handler keeps for its lifetime; nothing per batch lives on it.
This is the one loader: the handler, the ONNX export's checks (tooling/onnx_export.py) and the
benchmark's ceilings (tooling/bench/ceilings.py) all serve a model through it, so what they
measure is what the handler serves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from handlers.batching import BucketCosts, CheapestPasses, PassPlanner, TokenBudget
from handlers.cpu_quota import usable_cpus
from handlers.onnx_forward import ONNX_FILE, load_onnx_forward
from handlers.options import ONNX_ONLY, HandlerOptions
from handlers.scores import SOFTMAX, score_function
from handlers.tokenization import Encoding, TextEncoder, model_token_limit, size_tokenizer_pool, text_encoder

Forward = Callable[[Sequence[Encoding]], np.ndarray]  # float32 scores (handlers/scores.py), one row per encoding


class ModelLoadFailed(Exception):
    """This worker cannot serve the model; the message names the cause (and its fix, where the cause does).

    Deliberately not a RuntimeError: TorchServe 0.12's worker files any load-time RuntimeError whose
    message mentions CUDA under "Load model ... cuda OOM" and answers "System out of memory", so a
    refused ONNX archive on a GPU worker or a driver mismatch read as out-of-memory. An exception of
    another type is logged as it is, with its traceback ("Backend worker process died."), and the
    registration fails at once. A real out-of-memory is raised as itself.
    """


@dataclass(frozen=True)
class LoadedTokenizer:
    """What tokenizing and planning a model's passes need, without its weights (the benchmark's planning
    statistics and tokenization timings read only this)."""

    tokenizer: Any
    config: Any  # the checkpoint's config.json, as transformers reads it
    encoder: TextEncoder  # texts -> token ids at max_length (handlers/tokenization.encode)
    token_limit: int  # the longest sequence the model can embed
    threads: int  # the Rust tokenizer's pool (handlers/tokenization.size_tokenizer_pool)


@dataclass(frozen=True)
class LoadedModel:
    tokenizer: Any
    encoder: TextEncoder  # texts -> token ids at max_length (handlers/tokenization.encode)
    forward: Forward
    labels: tuple[str, ...]
    scores: str  # what the head's logits become: softmax, sigmoid or none (handlers/scores.py)
    options: HandlerOptions  # with every "auto" resolved for the device
    max_length: int  # token cap per text: the option, clipped to what the model can embed
    token_limit: int  # the longest sequence the model can embed
    model_type: str
    backend: str  # "pytorch" or "onnxruntime"
    description: str  # one line for the load log
    bucket_costs: BucketCosts | None = None  # CUDA graphs' measured pass times (handlers/cuda_graphs.py); else None

    @functools.cached_property
    def planner(self) -> PassPlanner:
        """How a batch becomes passes: by the graphs' measured costs where options left max_batch_tokens at 0 for
        them (HandlerOptions.for_device), else within the token budget. Built at its first batch, then kept: it
        follows from fields that never change (a replaced model builds its own)."""
        multiple, limit = self.options.pad_to_multiple_of, self.token_limit
        if self.options.max_batch_tokens:
            return TokenBudget(self.options.max_batch_tokens, multiple, limit)
        if self.bucket_costs is None:
            raise ValueError("max_batch_tokens 0 plans by CUDA graphs' measured costs, and this model has no graphs")
        return CheapestPasses(self.bucket_costs, multiple, limit)


def label_names(id2label: Mapping[int, str] | None, num_labels: int) -> list[str]:
    """Label names in class-index order; falls back to LABEL_i where the config has none."""
    id2label = id2label or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(num_labels)]


def backend_of(model_dir: Path) -> str:
    """An archive holding model.onnx is served by ONNX Runtime; any other by PyTorch."""
    return "onnxruntime" if (Path(model_dir) / ONNX_FILE).is_file() else "pytorch"


def refuse_unembeddable_vocabulary(vocabulary: int, embeddings: int, source: str) -> None:
    """Refuse a model whose tokenizer can produce ids it cannot embed: `vocabulary` ids (len(tokenizer), added
    tokens included) against `embeddings` rows (read from `source`). A text with such a token indexes past the
    embedding table: on a GPU a device-side assert, after which the worker's CUDA context is lost for good."""
    if vocabulary > embeddings:
        raise ModelLoadFailed(
            f"the tokenizer can produce {vocabulary} token ids (len(tokenizer), added tokens included) but the "
            f"model embeds {embeddings} ({source}): a text holding one of the {vocabulary - embeddings} ids past "
            "the embedding table cannot be answered, and on a GPU it ends the worker. Resize the embeddings to "
            "the tokenizer (model.resize_token_embeddings(len(tokenizer)), then fine-tune and save the checkpoint "
            "again) or fix the tokenizer (remove the tokens added after the model was trained)."
        )


def refuse_a_tokenizer_without_a_vocabulary(vocabulary: int, config: Any, model_dir: Path) -> None:
    """Refuse a tokenizer that knows less than half the ids the model embeds. A checkpoint saved without its
    tokenizer files is the case: transformers (5.x) then builds, without a word, a tokenizer of its config's
    family holding only the special tokens, which reads every word as [UNK], so every text of as many words
    gets the same answer. No real checkpoint's tokenizer is that much smaller than its embedding table (they
    are equal, or the table is padded by a few rows)."""
    embeddings = getattr(config, "vocab_size", None)
    if isinstance(embeddings, int) and vocabulary < embeddings / 2:
        raise ModelLoadFailed(
            f"{model_dir}: the tokenizer knows {vocabulary} token ids (len(tokenizer)) but the model embeds "
            f"{embeddings} (config.json vocab_size): the checkpoint's tokenizer files are missing (tokenizer.json, "
            "or vocab.txt / vocab.json and merges.txt / a sentencepiece .model, with tokenizer_config.json), so "
            "every word would be read as unknown. Save the tokenizer the model was trained with beside it: "
            "tokenizer.save_pretrained(folder)."
        )


def load_tokenizer(model_dir: Path, options: HandlerOptions) -> LoadedTokenizer:
    """The tokenizer and config of the checkpoint in `model_dir`, and the encoder at the option's token cap."""
    from transformers import AutoConfig, AutoTokenizer

    threads = options.cpu_threads or usable_cpus()
    size_tokenizer_pool(threads)  # before anything is tokenized: the first batch call fixes the pool
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    refuse_a_tokenizer_without_a_vocabulary(len(tokenizer), config, model_dir)
    token_limit = model_token_limit(tokenizer, config)
    encoder = text_encoder(tokenizer, min(options.max_length, token_limit))
    return LoadedTokenizer(tokenizer, config, encoder, token_limit, threads)


def load_model(
    model_dir: Path, options: HandlerOptions, gpu_id: int | None, onnx_dir: Path | None = None, batch_size: int = 1
) -> LoadedModel:
    """The model in `model_dir` (a checkpoint folder, or an ONNX one: model.onnx + tokenizer + config.json).

    `onnx_dir`: a folder holding a model.onnx to serve with model_dir's tokenizer and config in
    place of model_dir's own weights; the export checks each graph this way before packing it.
    `batch_size`: the most requests TorchServe hands over at once (the passes CUDA graphs are captured for).
    """
    model_dir = Path(model_dir)
    loaded = load_tokenizer(model_dir, options)
    tokenizer, config, encoder, token_limit = loaded.tokenizer, loaded.config, loaded.encoder, loaded.token_limit
    pad_token_id = tokenizer.pad_token_id or 0
    scores = score_function(getattr(config, "problem_type", None), config.num_labels)
    onnx_dir = Path(onnx_dir) if onnx_dir is not None else model_dir
    backend = backend_of(onnx_dir)
    forward: Any
    if backend == "onnxruntime":
        # The graph's embedding table has the checkpoint's rows (tooling/onnx_export.py exports it as it is):
        # the config says how many without reading the graph.
        if isinstance(getattr(config, "vocab_size", None), int):
            refuse_unembeddable_vocabulary(len(tokenizer), config.vocab_size, "config.json vocab_size")
        # A GPU worker either gets ONNX Runtime's CUDA provider or a clear refusal (in load_onnx_forward).
        options = options.for_device("cuda" if gpu_id is not None else "cpu", backend)
        token_types = getattr(config, "type_vocab_size", 0) >= 2  # BERT's segments; DistilBERT has none, RoBERTa one
        forward = load_onnx_forward(onnx_dir, options, gpu_id, pad_token_id, token_limit, scores, token_types)
    else:
        from handlers.torch_forward import load_torch_forward, select_device

        options = options.for_device(select_device(gpu_id).type, backend)
        # The inputs every pass is collated into (handlers/tokenization.collate): the encoder's, and the mask.
        input_names = (*encoder.features, "attention_mask")
        forward = load_torch_forward(
            model_dir, options, gpu_id, pad_token_id, token_limit, input_names, batch_size, scores, len(tokenizer)
        )
    graphs = getattr(forward, "graphs", None)
    # Said in the load log rather than passed over in silence: the option applies to PyTorch archives on a GPU.
    graphs_ignored = options.cuda_graphs and graphs is None
    # Likewise ONNX Runtime's own options set on an archive PyTorch serves: said, not passed over.
    onnx_ignored = [n for n in ONNX_ONLY if backend == "pytorch" and getattr(options, n) != getattr(HandlerOptions, n)]
    if options.fault_marker:
        from handlers.fault_injection import FaultInjectingForward

        forward = FaultInjectingForward(forward, tokenizer, options)
    description = f"{forward.description}; tokenizer {loaded.threads} thread(s): {encoder.description}"
    if scores != SOFTMAX:
        description += f"; scores: {scores} ({config.num_labels} label(s), problem_type {config.problem_type})"
    if graphs_ignored:
        description += "; cuda_graphs ignored: CUDA graphs need a PyTorch archive on a GPU"
    if onnx_ignored:
        description += f"; {', '.join(onnx_ignored)} ignored: ONNX Runtime's, and PyTorch serves this archive"
    return LoadedModel(
        tokenizer=tokenizer,
        encoder=encoder,
        forward=forward,
        labels=tuple(label_names(config.id2label, config.num_labels)),
        scores=scores,
        options=options,
        max_length=encoder.max_length,
        token_limit=token_limit,
        model_type=config.model_type,
        backend=backend,
        description=description,
        bucket_costs=None if graphs is None else graphs.costs,
    )
