"""CUDA graphs for the PyTorch forward pass: one graph captured per padded shape at load, replayed per pass.

Why: on a GPU, BERT's forward pass at serving sizes is bound by kernel launches, not arithmetic. On the
H100 the eager pass of one text took 21.9 ms in the handler, and BERT-base at batch 128 did 13,051
texts/s eager against 26,436 when each shape's kernels were replayed from a graph (docs/benchmarks.md,
"GPU"; ../shared/notes/gpu-facts.md). A graph's shapes are fixed, so each pass is padded up to the
captured shape (a bucket: rows x width) that holds it at the least cost (each bucket's pass is timed once
captured: handlers/batching.BucketCosts; plan_by_cost plans the passes by those times): the extra columns
are masked and the extra rows are answered and dropped. A BERT row never attends to another row, so neither changes the
real rows' answers (tests/inprocess/test_cuda_graph_padding.py checks that on the CPU, and the gpu tests
through the graphs themselves).

A pass no bucket holds (more rows than the largest batch, or wider than the token cap) runs eagerly.
Nothing here changes what a pass is for the pipeline: the same rows in, the same probabilities out,
in order, so validation, bisection, the truncation flag and regrouping are untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from handlers.batching import Bucket, BucketCosts
from handlers.loading import ModelLoadFailed
from handlers.scores import SOFTMAX, apply

# Widths (tokens) captured, up to the token cap: steps of about 1.5x keep the padding a bucket adds
# under half of a pass while needing few graphs. Multiples of 8, for the tensor cores.
WIDTH_LADDER = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Replays before each capture, on a side stream: cuBLAS and the allocator set themselves up outside the graph.
WARM_UP_RUNS = 2
# Timed passes per bucket once all are captured; the fastest is its cost: the others' extra time is the host's or
# another worker's (several share a GPU while they start), not the bucket's.
TIMED_RUNS = 3


def require_capture_safe_transformers() -> None:
    """Refuse `cuda_graphs` where transformers' attention masks cannot be captured.

    BERT's SDPA mask asks whether a mask is all ones (torch.all(mask == 1), read on the host: a
    synchronization, which no CUDA graph capture allows) unless transformers sees that the stream is
    capturing. Releases that see it have transformers.utils.import_utils.is_cuda_stream_capturing, which
    masking_utils' tracing check calls (read in 5.0.0 and 5.23.0); 4.57.1's BERT reads the mask with no such
    check, and has no such function. Asked of the feature, not of a version number.
    """
    try:
        from transformers.utils.import_utils import is_cuda_stream_capturing  # noqa: F401 - only its presence
    except ImportError:
        import transformers

        raise ModelLoadFailed(
            f"cuda_graphs: true needs a transformers whose attention masks can be captured in a CUDA graph "
            f"(transformers.utils.import_utils.is_cuda_stream_capturing, which BERT's masks check before they "
            f"read a mask on the host; 5.0 and later have it), and this worker has transformers "
            f"{transformers.__version__}, which reads the mask inside the capture. Install transformers 5.0 or "
            "newer (pip install 'transformers>=5,<6'), or set cuda_graphs: false to serve without the graphs."
        ) from None


def bucket_ladder(max_rows: int, max_width: int) -> list[Bucket]:
    """Every shape to capture: rows in powers of two up to `max_rows`, widths from WIDTH_LADDER up to
    `max_width`; both maxima are buckets themselves, so every pass within them has one."""
    rows = sorted({min(2**i, max_rows) for i in range(max_rows.bit_length() + 1)})
    widths = sorted({w for w in WIDTH_LADDER if w < max_width} | {max_width})
    return [Bucket(r, w) for r in rows for w in widths]


def pad_into(arrays: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], pad_token_id: int) -> None:
    """Write a collated pass (handlers/tokenization.collate: rows x width) into a bucket's larger arrays.

    Extra columns are padding, masked out. Extra rows are a lone pad token with its mask on: a row
    with no token attended to at all can come out of the attention kernels as NaN; this one is
    ordinary, and dropped.
    """
    rows, width = arrays["input_ids"].shape
    for key, target in out.items():
        target.fill(pad_token_id if key == "input_ids" else 0)
        target[:rows, :width] = arrays[key]
    out["attention_mask"][rows:, 0] = 1


@dataclass
class _Graph:
    replay: Callable[[], None]
    host: dict[str, np.ndarray]  # pinned host arrays the pass is padded into
    copy_in: Callable[[], None]  # host -> the graph's static inputs on the GPU
    probabilities: object  # the graph's static output: a (rows, labels) float32 tensor of scores


class GraphedPasses:
    """Forward passes replayed from CUDA graphs, one per bucket, sharing one memory pool
    (one pass runs at a time, so the largest bucket's activations serve them all)."""

    def __init__(self, model, device, buckets: Sequence[Bucket], input_names: Sequence[str], pad_token_id: int,
                 scores: str = SOFTMAX) -> None:  # fmt: skip
        import torch

        started = time.perf_counter()
        self.buckets = sorted(buckets)
        self._pad_token_id = pad_token_id
        self._graphs: dict[Bucket, _Graph] = {}
        pool = torch.cuda.graph_pool_handle()
        # Largest first: the pool grows to its activations once and the smaller graphs reuse that memory.
        for bucket in sorted(self.buckets, key=lambda b: b.rows * b.width, reverse=True):
            try:
                self._graphs[bucket] = _capture(model, device, bucket, input_names, pad_token_id, pool, scores)
            except torch.cuda.OutOfMemoryError:
                raise  # as itself: the worker's share of the GPU (cuda_memory_fraction) is too small for the bucket
            except Exception as exc:
                # Refused, not served eagerly in silence: the option was asked for, and a slower service is a surprise.
                raise RuntimeError(f"capturing the CUDA graph for passes of {bucket.rows} x {bucket.width} tokens "
                                   f"failed ({type(exc).__name__}: {exc}); set cuda_graphs: false to serve without "
                                   "them") from exc  # fmt: skip
        self.capture_s = time.perf_counter() - started
        self.costs = BucketCosts({bucket: self._timed(bucket) for bucket in self.buckets})

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Float32 scores (handlers/scores.py) for the collated pass, in order; None when no bucket holds it.
        `arrays` has the inputs the graphs were captured with (handlers/tokenization.collate's keys)."""
        rows, width = arrays["input_ids"].shape
        bucket = self.costs.holding(rows, width)
        return None if bucket is None else self._replay(bucket, arrays)

    def _replay(self, bucket: Bucket, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        graph = self._graphs[bucket]
        pad_into(arrays, graph.host, self._pad_token_id)
        graph.copy_in()
        graph.replay()
        rows = arrays["input_ids"].shape[0]
        return graph.probabilities[:rows].cpu().numpy()  # type: ignore[index] - a tensor; .cpu() waits for it

    def _timed(self, bucket: Bucket) -> float:
        """Seconds the fastest of TIMED_RUNS passes filling `bucket` took, the way a served pass goes: padded in,
        copied, replayed and read back. Of pad tokens, attended, token type 0: ids every model embeds (a 1 would
        index past RoBERTa's one token type: a device-side assert), and every row read back, which waits for it."""
        shape = (bucket.rows, bucket.width)
        fill = {"input_ids": self._pad_token_id, "attention_mask": 1}
        full = {name: np.full(shape, fill.get(name, 0), dtype=np.int64) for name in self._graphs[bucket].host}
        times = []
        for _ in range(TIMED_RUNS):
            started = time.perf_counter()
            self._replay(bucket, full)
            times.append(time.perf_counter() - started)
        return min(times)

    @property
    def description(self) -> str:
        largest = max(self.buckets)
        shapes = f"{len(self.buckets)} buckets up to {largest.rows} x {largest.width}"
        return f"CUDA graphs: {shapes}, captured in {self.capture_s:.1f} s, {self.costs.description}"


def _capture(model, device, bucket: Bucket, input_names: Sequence[str], pad_token_id: int, pool, scores: str
             ) -> _Graph:  # fmt: skip
    import torch

    shape = (bucket.rows, bucket.width)
    host_tensors = {name: torch.zeros(shape, dtype=torch.int64).pin_memory() for name in input_names}
    static = {name: torch.zeros(shape, dtype=torch.int64, device=device) for name in input_names}
    host = {name: tensor.numpy() for name, tensor in host_tensors.items()}
    # Captured on a pass of padding rows only (see pad_into); what a pass computes depends on the inputs
    # copied in before each replay, not on these.
    pad_into({name: np.zeros((0, 0), dtype=np.int64) for name in input_names}, host, pad_token_id)

    def copy_in() -> None:
        for name, tensor in host_tensors.items():
            static[name].copy_(tensor, non_blocking=True)

    def run():
        return apply(model(**static).logits.float(), scores)

    copy_in()
    with torch.inference_mode():
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_RUNS):
                run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            probabilities = run()
    torch.cuda.synchronize(device)
    return _Graph(graph.replay, host, copy_in, probabilities)
