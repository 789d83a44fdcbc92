"""The forward pass in PyTorch: the backend for GPUs (float16) and for checkpoints that do not export to ONNX.

Its twin for CPUs is handlers/onnx_forward.py; both take encodings and return the head's scores
(class probabilities for most checkpoints: handlers/scores.py), so validation, planning, fault
isolation and metrics (handlers/pipeline.py) are the same whichever backend an archive holds.

On a GPU, two kinds of failure are not an item's own, and are not left to bisection:
- an out-of-memory error gives the cached blocks back before it reaches bisection, which then retries
  smaller groups and answers 507 only for an item that cannot run alone;
- any other CUDA error ends the worker process (poisons_the_device, end_the_worker): after a device-side
  assert or an illegal address the process's CUDA context cannot be used again, every later pass fails,
  and TorchServe 0.12 restarts a worker only when its process ends, never for an exception.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from handlers.batching import padded_width
from handlers.cuda_graphs import GraphedPasses, bucket_ladder, require_capture_safe_transformers
from handlers.fault_isolation import is_out_of_memory
from handlers.loading import ModelLoadFailed, refuse_unembeddable_vocabulary
from handlers.options import HandlerOptions
from handlers.scores import SOFTMAX, apply
from handlers.tokenization import Encoding, collate

logger = logging.getLogger(__name__)

# The worker's exit status after a CUDA error (sysexits' EX_SOFTWARE). Not 137: TorchServe 0.12 reads a
# worker that ended with 137 (a SIGKILL, as the kernel's OOM killer sends) as out of memory: the batch it held
# is answered 507 (tests/e2e/test_reliability.py), which would blame memory for a CUDA error.
CUDA_ERROR_EXIT_CODE = 70
# What the README says each CUDA build of torch needs from the host (NVIDIA's release notes).
DRIVER_REQUIREMENTS = (
    "PyPI's torch 2.13.0 (its CUDA 13.0 build) needs NVIDIA driver R580 or newer; the cuda image's CUDA 12.8 "
    "build 570.26 or newer"
)


def select_device(gpu_id: int | None) -> torch.device:
    """The device TorchServe gave this worker: GPU `gpu_id`, or the CPU for None.

    A worker given a GPU that torch cannot use is refused rather than run on the CPU in float32: that
    service would be many times slower than the one asked for, with nothing in its answers to tell."""
    if gpu_id is None:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ModelLoadFailed(
            f"TorchServe assigned this worker GPU {gpu_id}, but torch {torch.__version__} "
            f"({f'built for CUDA {torch.version.cuda}' if torch.version.cuda else 'a CPU-only build'}) "
            "sees no CUDA device; refusing to run on the CPU in its place. "
            f"{DRIVER_REQUIREMENTS} (nvidia-smi shows the host's). Install a torch built for CUDA and for "
            "this driver, update the driver, check CUDA_VISIBLE_DEVICES, or serve on the CPU "
            "(number_of_gpu=0 in config.properties)."
        )
    visible = torch.cuda.device_count()
    if not 0 <= gpu_id < visible:
        raise ModelLoadFailed(
            f"TorchServe assigned this worker GPU {gpu_id}, but torch sees {visible} CUDA device(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); set number_of_gpu in "
            "config.properties to the GPUs this process can see, or make CUDA_VISIBLE_DEVICES list them."
        )
    return torch.device(f"cuda:{gpu_id}")


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def poisons_the_device(exc: BaseException) -> bool:
    """A CUDA error other than out-of-memory: the worker must end (handlers/fault_isolation.is_out_of_memory
    keeps its per-item 507). torch 2.8 and later raise torch.AcceleratorError for every failed CUDA call
    (c10_cuda_check_implementation), with the CUDA error code; older ones a RuntimeError saying "CUDA error".
    Which errors leave the context usable (an invalid launch configuration) and which do not (a device-side
    assert, an illegal address) is not told by the exception itself; a fresh worker is right for both."""
    if is_out_of_memory(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and "CUDA error" in str(exc)


def end_the_worker(exc: BaseException, device: torch.device) -> NoReturn:
    """Log one critical line and end this process, so that TorchServe starts a fresh worker in its place
    (the batch in flight is answered 500 "Worker died."). os._exit: an exception, or SystemExit, would be
    caught by the pipeline or TorchServe's worker loop, and the poisoned worker would go on answering."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    logger.critical(
        "CUDA error on %s (%s: %s): this process's CUDA context cannot be trusted again; ending the worker "
        "(exit %d) so that TorchServe starts a fresh one",
        device,
        type(exc).__name__,
        message,
        CUDA_ERROR_EXIT_CODE,
    )
    logging.shutdown()  # os._exit skips the interpreter's own flushing: the line must reach the log first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CUDA_ERROR_EXIT_CODE)


class UnembeddableTokenTypes(ValueError):
    """A pass holds token types the model has no embedding for (a pair of texts, token type 1, on a model with
    type_vocab_size 1). Raised before the pass runs: bisection answers each such item 500, and the GPU never
    indexes past the table (a device-side assert, which would end the worker)."""


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
        # How many token types the model embeds; None where it takes none (DistilBERT) or the config does not say.
        types = getattr(getattr(model, "config", None), "type_vocab_size", None)
        self._token_types = types if isinstance(types, int) and types > 0 else None
        self.graphs = graphs
        dtype = next(model.parameters()).dtype
        self.description = f"PyTorch {torch.__version__} on {device} ({dtype}, {torch.get_num_threads()} threads)"
        if graphs is not None:
            self.description += f"; {graphs.description}"

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        """Float32 scores (handlers/scores.py), one row per encoding, in order."""
        arrays = collate(encodings, self._pad_token_id, self._options.pad_to_multiple_of, self._token_limit)
        types = arrays.get("token_type_ids")
        if types is not None and self._token_types is not None and types.max() >= self._token_types:
            raise UnembeddableTokenTypes(
                f"token type {int(types.max())} in this pass (a pair of texts), but the model embeds "
                f"{self._token_types} type(s) (type_vocab_size)"
            )
        out_of_memory = None
        try:
            return self._run(arrays)
        except torch.cuda.OutOfMemoryError as exc:
            out_of_memory = str(exc)
        except Exception as exc:
            if poisons_the_device(exc):
                end_the_worker(exc, self.device)
            raise
        # Out of the except block: there the exception's traceback still holds the failed pass's frames and so
        # its activations, and empty_cache() could give none of them back (PyTorch FAQ, "My out of memory
        # exception handler can't allocate memory"). Raised anew, as the same class, so that bisection still
        # answers 507 for an item that cannot run alone (handlers/fault_isolation.is_out_of_memory).
        torch.cuda.empty_cache()
        raise torch.cuda.OutOfMemoryError(out_of_memory)

    def _run(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
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
        with torch.inference_mode():
            logits = self.model(**batch).logits
            return apply(logits.float(), self.scores).cpu().numpy()


def load_torch_forward(
    model_dir: Path, options: HandlerOptions, gpu_id: int | None, pad_token_id: int, token_limit: int,
    input_names: Sequence[str] = ("input_ids", "attention_mask"), max_rows: int = 1, scores: str = SOFTMAX,
    vocabulary: int | None = None,
) -> TorchForward:  # fmt: skip
    """The checkpoint on GPU `gpu_id` (None: the CPU), its logits read through `scores` (handlers/scores.py).
    With `cuda_graphs` on a GPU, passes of up to `max_rows` texts are captured as CUDA graphs over
    `input_names` (the collated inputs: handlers/tokenization.collate). `vocabulary`: how many token ids the
    tokenizer can produce (len(tokenizer)); a model that embeds fewer is refused
    (handlers/loading.refuse_unembeddable_vocabulary)."""
    from transformers import AutoModelForSequenceClassification

    device = select_device(gpu_id)
    graphed = options.cuda_graphs and device.type == "cuda"
    if graphed:
        require_capture_safe_transformers()  # before the weights load: the refusal needs none of them
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
    if vocabulary is not None:
        refuse_unembeddable_vocabulary(
            vocabulary, model.get_input_embeddings().num_embeddings, "model.get_input_embeddings().num_embeddings"
        )
    model.to(device).eval()
    graphs = None
    if graphed:
        widest = padded_width(min(options.max_length, token_limit), options.pad_to_multiple_of, token_limit)
        graphs = GraphedPasses(model, device, bucket_ladder(max_rows, widest), input_names, pad_token_id, scores)
    return TorchForward(model, device, options, pad_token_id, token_limit, graphs, scores)
