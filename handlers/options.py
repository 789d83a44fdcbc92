"""Handler options, read from the ``handler:`` section of the archive's model-config.yaml.

Every option has a default that serves; the table in docs/checkpoints.md documents them.
Unknown keys and wrong types fail the model load loudly rather than being ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from handlers.cpu_quota import usable_cpus

OVERLENGTH_POLICIES = ("truncate", "reject")
ONNX_ONLY = ("onnx_inter_op_threads", "onnx_spinning")  # options only ONNX Runtime reads (handlers/onnx_forward.py)
FAULT_KINDS = ("error", "oom")
DTYPES = ("auto", "float32", "float16", "bfloat16")
CUDA_BATCH_TOKENS = 128 * 512  # the auto token budget on CUDA: 128 texts at BERT's 512 tokens


@dataclass(frozen=True)
class HandlerOptions:
    # Folder inside the archive that holds the Hugging Face checkpoint.
    model_subdir: str = "model"
    # Largest request body the handler accepts, in bytes (413 above it).
    max_bytes: int = 64 * 1024
    # Most texts one KServe v1/v2 request may carry (413 TooManyInstances above it).
    max_instances: int = 64
    # Token cap per text; clipped to the model's own maximum at load time.
    max_length: int = 256
    # What to do with texts over max_length: "truncate" (200, truncated=true) or "reject" (422).
    overlength: str = "truncate"
    # Padded-token budget of one forward pass; a batch over it is split into
    # length-sorted micro-batches. 0 = auto: on CPU 256 with PyTorch and 64 with ONNX
    # Runtime, where compute grows with every padded token and ONNX Runtime's cost per
    # pass is small (both measured best in docs/benchmarks.md); on CUDA CUDA_BATCH_TOKENS,
    # one pass for any batch of up to 128 texts: a padded batch runs in parallel and each
    # extra pass costs kernel launches (on the H100, BERT-base at batch 128 did 4,303 texts/s
    # in one pass against 1,821 split at 8,192 tokens; docs/benchmarks.md, "GPU", and
    # docs/bench-gpu/first-run-one-client-process.md). With cuda_graphs, auto plans by cost instead:
    # no budget, the length-sorted cuts whose captured shapes' measured pass times add up to the least
    # (handlers/batching.CheapestPasses); a budget set here is kept there too.
    max_batch_tokens: int = 0
    # Pad sequence length up to a multiple of this. 0 = auto: 8 on CUDA (tensor cores),
    # 1 on CPU (where padding is pure extra work).
    pad_to_multiple_of: int = 0
    # Weights dtype: "auto" = float16 on CUDA, float32 on CPU.
    dtype: str = "auto"
    # CPU threads per worker, in each of its pools; 0 = the CPUs this process may use at once: its
    # affinity, capped by its cgroup's CPU quota (a pod's CPU limit; handlers/cpu_quota.py). The
    # forward pass's intra-op pool (PyTorch's, ONNX Runtime's intra_op_num_threads) and the Rust
    # tokenizer's batch pool (handlers/tokenization.size_tokenizer_pool).
    cpu_threads: int = 0
    # ONNX Runtime only (archives holding model.onnx). Inter-op threads: 1 runs the graph's
    # nodes one after another (sequential mode); more runs independent branches in parallel.
    # BERT's graph is a chain, so more was slower where measured (docs/benchmarks.md).
    onnx_inter_op_threads: int = 1
    # ONNX Runtime only: let idle intra-op threads spin-wait for the next op instead of sleeping.
    # Off by default: spinning burns CPU that the frontend, other workers or a container's CPU
    # quota need, and with one thread per worker (the faster layout) it gains nothing
    # (docs/benchmarks.md).
    onnx_spinning: bool = False
    # CUDA only: the share of the GPU's memory this worker's PyTorch allocator may hold (0 = no cap).
    # Several workers share one GPU (docs/benchmarks.md, "GPU"); with a cap, a batch too large for
    # this worker's share fails here as an out-of-memory error, which bisection narrows to the item
    # that needs it (507 for that item alone), instead of taking memory its neighbours need. Set it to
    # about 1 / workers per GPU, less the CUDA context (about 0.5 GiB per worker, outside the cap).
    cuda_memory_fraction: float = 0.0
    # CUDA only, PyTorch archives: replay each forward pass from a CUDA graph captured at load, one per
    # padded shape up to TorchServe's batch_size and max_length (handlers/cuda_graphs.py), instead of
    # launching its kernels one by one, and plan passes by each shape's pass time measured at load
    # (max_batch_tokens above). Off by default: it costs the capture's time and GPU memory at every worker
    # start, yours to measure for your checkpoint; the GPU set-up turns it on for the demo (docs/benchmarks.md,
    # "CUDA graphs").
    cuda_graphs: bool = False
    # Run one forward pass at load time so the first request is not slow.
    warmup: bool = True
    # Test-only fault hook (handlers/fault_injection.py, wrapped around the forward pass at load):
    # a forward pass holding an item whose text has this word raises (fault_kind "error": a
    # RuntimeError; "oom": an out-of-memory error), or, with fault_delay_s > 0, stalls that many
    # seconds instead. Empty, the default, disables it; never set it in production.
    fault_marker: str = ""
    fault_kind: str = "error"
    fault_delay_s: float = 0.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> HandlerOptions:
        raw = dict(raw or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            # A misspelt option would otherwise be a lookup through the docs: the nearest known name, where one is.
            hints = [f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, 1))
                     else name for name in unknown]  # fmt: skip
            raise ValueError(f"unknown handler option(s): {', '.join(hints)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            default = getattr(cls, name)
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not expected:
                raise ValueError(f"handler option {name!r} must be {expected.__name__}, got {value!r}")
            values[name] = value
        options = cls(**values)
        options.check()
        return options

    def check(self) -> None:
        if self.overlength not in OVERLENGTH_POLICIES:
            raise ValueError(f"overlength must be one of {OVERLENGTH_POLICIES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}")
        if self.fault_kind not in FAULT_KINDS:
            raise ValueError(f"fault_kind must be one of {FAULT_KINDS}")
        for name in ("max_bytes", "max_length", "max_instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_batch_tokens", "pad_to_multiple_of"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (auto) or positive")
        if self.max_length < 3:
            raise ValueError("max_length must leave room for the special tokens")
        if self.onnx_inter_op_threads < 1:
            raise ValueError("onnx_inter_op_threads must be at least 1")
        if not 0.0 <= self.cuda_memory_fraction <= 1.0:
            raise ValueError("cuda_memory_fraction must be between 0 (no cap) and 1")
        if self.cpu_threads < 0 or self.fault_delay_s < 0:
            raise ValueError("cpu_threads and fault_delay_s must not be negative")

    def for_device(self, device_type: str, backend: str = "pytorch") -> HandlerOptions:
        """These options with every "auto" (0) resolved for a device type ("cpu", "cuda", ...) and a
        backend ("pytorch" or "onnxruntime", as handlers/loading.py names them), but max_batch_tokens
        under CUDA graphs: 0 there means planned by the graphs' measured costs (LoadedModel.planner)."""
        cuda = device_type == "cuda"
        cpu_tokens = 64 if backend == "onnxruntime" else 256
        # Left at 0 where CUDA graphs will be captured: their planner (handlers/batching.CheapestPasses) needs none.
        by_cost = cuda and self.cuda_graphs and backend == "pytorch"
        return replace(
            self,
            max_batch_tokens=self.max_batch_tokens or (0 if by_cost else CUDA_BATCH_TOKENS if cuda else cpu_tokens),
            pad_to_multiple_of=self.pad_to_multiple_of or (8 if cuda else 1),
            cpu_threads=self.cpu_threads or usable_cpus(),
        )
