"""The forward pass in PyTorch: the backend for GPUs (float16) and for checkpoints that do not export to ONNX.

Its twin for CPUs is handlers/onnx_forward.py; both take encodings and return the head's scores
(class probabilities for most checkpoints: handlers/scores.py), so validation, planning, fault
isolation and metrics (handlers/pipeline.py) are the same whichever backend an archive holds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from handlers.batching import padded_width
from handlers.cuda_graphs import GraphedPasses, bucket_ladder
from handlers.options import HandlerOptions
from handlers.scores import SOFTMAX, apply
from handlers.tokenization import Encoding, collate


def select_device(gpu_id: int | None) -> torch.device:
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class TorchForward:
    """A Hugging Face sequence classifier in eval mode on one device; called once per micro-batch."""

    def __init__(self, model: torch.nn.Module, device: torch.device, options: HandlerOptions, pad_token_id: int,
                 token_limit: int, graphs: GraphedPasses | None = None, scores: str = SOFTMAX) -> None:  # fmt: skip
        self.model = model
        self.scores = scores
        self.device = device
        self.device_type = device.type
        self._options = options
        self._pad_token_id = pad_token_id
        self._token_limit = token_limit
        self.graphs = graphs
        dtype = next(model.parameters()).dtype
        self.description = f"PyTorch {torch.__version__} on {device} ({dtype}, {torch.get_num_threads()} threads)"
        if graphs is not None:
            self.description += f"; {graphs.description}"

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        """Float32 scores (handlers/scores.py), one row per encoding, in order."""
        arrays = collate(encodings, self._pad_token_id, self._options.pad_to_multiple_of, self._token_limit)
        if self.graphs is not None:
            with torch.inference_mode():
                replayed = self.graphs(arrays)
            if replayed is not None:
                return replayed
        batch = {key: torch.from_numpy(value) for key, value in arrays.items()}
        if self.device.type == "cuda":
            batch = {k: v.pin_memory().to(self.device, non_blocking=True) for k, v in batch.items()}
        elif self.device.type != "cpu":
            batch = {k: v.to(self.device) for k, v in batch.items()}
        try:
            with torch.inference_mode():
                logits = self.model(**batch).logits
                return apply(logits.float(), self.scores).cpu().numpy()
        except torch.cuda.OutOfMemoryError:
            # Give the cached blocks back before the pipeline bisects and retries smaller groups.
            torch.cuda.empty_cache()
            raise


def load_torch_forward(
    model_dir: Path, options: HandlerOptions, gpu_id: int | None, pad_token_id: int, token_limit: int,
    input_names: Sequence[str] = ("input_ids", "attention_mask"), max_rows: int = 1, scores: str = SOFTMAX,
) -> TorchForward:  # fmt: skip
    """The checkpoint on GPU `gpu_id` (None: the CPU), its logits read through `scores` (handlers/scores.py).
    With `cuda_graphs` on a GPU, passes of up to `max_rows` texts are captured as CUDA graphs over
    `input_names` (the collated inputs: handlers/tokenization.collate)."""
    from transformers import AutoModelForSequenceClassification

    device = select_device(gpu_id)
    if device.type == "cpu":
        torch.set_num_threads(options.cpu_threads or len(os.sched_getaffinity(0)))
    elif device.type == "cuda":
        # A worker serves one GPU (TorchServe's gpu_id): make it this process's current device, so streams and
        # CUDA graphs, which take the current device, are on the model's GPU on a host with several.
        torch.cuda.set_device(device)
        if options.cuda_memory_fraction:
            torch.cuda.set_per_process_memory_fraction(options.cuda_memory_fraction, device)
    dtype = select_dtype(options.dtype, device)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
    model.to(device).eval()
    graphs = None
    if options.cuda_graphs and device.type == "cuda":
        widest = padded_width(min(options.max_length, token_limit), options.pad_to_multiple_of, token_limit)
        graphs = GraphedPasses(model, device, bucket_ladder(max_rows, widest), input_names, pad_token_id, scores)
    return TorchForward(model, device, options, pad_token_id, token_limit, graphs, scores)
