"""The counters a served cell reads from /metrics before and after its load, and what their differences mean."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from handlers.handler_metrics import BATCHES, FORWARD_PASSES, ITEMS, PADDED_TOKENS, REAL_TOKENS, STAGE_MS
from tooling.prometheus import metric_value

# Label names, as the handler (handlers/handler_metrics.py) and TorchServe (metrics.yaml) write them.
HANDLER_MODEL_LABEL = "ModelName"
STAGE_LABEL = "Stage"
FRONTEND_MODEL_LABEL = "model_name"
# The handler's stages, in the order a batch passes through them.
STAGES = ("validation", "tokenization", "forward", "response")
# TorchServe's frontend counters: requests answered, microseconds from arrival to answer, and of those queued.
# prometheus-client's parser names every counter sample <name>_total (OpenMetrics), so the two
# latency counters, exposed without the suffix, are read with it.
FRONTEND_REQUESTS = "ts_inference_requests_total"
FRONTEND_QUEUE_US = "ts_queue_latency_microseconds_total"
FRONTEND_INFERENCE_US = "ts_inference_latency_microseconds_total"

_HANDLER_COUNTERS = {
    "items": ITEMS,
    "batches": BATCHES,
    "forward_passes": FORWARD_PASSES,
    "real_tokens": REAL_TOKENS,
    "padded_tokens": PADDED_TOKENS,
}
_FRONTEND_COUNTERS = {
    "requests": FRONTEND_REQUESTS,
    "queue_us": FRONTEND_QUEUE_US,
    "inference_us": FRONTEND_INFERENCE_US,
}


def read_counters(metrics_text: str, model: str) -> dict[str, float]:
    """Every counter a cell needs, summed over label values, for one model."""
    counters = {key: metric_value(metrics_text, name, **{HANDLER_MODEL_LABEL: model})
                for key, name in _HANDLER_COUNTERS.items()}  # fmt: skip
    for stage in STAGES:
        labels = {HANDLER_MODEL_LABEL: model, STAGE_LABEL: stage}
        counters[f"{stage}_ms"] = metric_value(metrics_text, STAGE_MS, **labels)
    for key, name in _FRONTEND_COUNTERS.items():
        counters[key] = metric_value(metrics_text, name, **{FRONTEND_MODEL_LABEL: model})
    return counters


T = TypeVar("T")


def read_until_still(
    read: Callable[[], T],
    still_s: float,
    timeout_s: float,
    ready: Callable[[T], bool] = lambda _: True,
    key: Callable[[T], Any] = lambda value: value,
) -> T:
    """read() until it is `ready` and two reads `still_s` apart agree (by `key`), or `timeout_s` later with the last
    read. The handler's counters reach /metrics through the worker's log stream, one line each, a moment after the
    answers: a read as soon as one counter is in can miss the others of the last batches."""
    deadline = time.monotonic() + timeout_s
    value = read()
    previous = None
    while time.monotonic() < deadline:
        if ready(value):
            if previous is not None and key(previous) == key(value):
                break
            previous = value
            time.sleep(still_s)
        else:
            previous = None
            time.sleep(0.05)
        value = read()
    return value


def _per(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def cell_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the handler and the frontend did during one cell: batch sizes, padding, and where the time went."""
    d = {key: after[key] - before[key] for key in after}
    figures = {
        "mean_batch_size": _per(d["items"], d["batches"]),
        "forward_passes_per_batch": _per(d["forward_passes"], d["batches"]),
        "padding_waste": _per(d["padded_tokens"], d["real_tokens"]),
        # Per batch, inside the handler (the worker's Python process).
        "handler_ms_per_batch": _per(sum(d[f"{s}_ms"] for s in STAGES), d["batches"]),
        # Per request, timed by the frontend from arrival to response (TorchServe's RestJob):
        # waiting in its queue (the batch delay included), then the worker round trip (the
        # batch's IPC and the handler). The rest of a client's latency is HTTP and the client.
        "frontend_queue_ms": _per(d["queue_us"], 1000 * d["requests"]),
        "worker_ms": _per(d["inference_us"] - d["queue_us"], 1000 * d["requests"]),
    }
    for stage in STAGES:
        figures[f"{stage}_ms_per_batch"] = _per(d[f"{stage}_ms"], d["batches"])
    return figures


# TorchServe's system metrics (metrics.yaml), one sample per GPU. TorchServe collects them once a minute
# (and not at all where its nvgpu import fails or there is no GPU), so a cell records the latest sample.
GPU_UTILIZATION = "GPUUtilization"
GPU_MEMORY_USED = "GPUMemoryUsed"


def _samples(metrics_text: str, name: str) -> list[float]:
    from prometheus_client.parser import text_string_to_metric_families

    return [s.value for family in text_string_to_metric_families(metrics_text) for s in family.samples
            if s.name == name]  # fmt: skip


def gpu_figures(metrics_text: str) -> dict[str, float | None]:
    """GPU utilisation (%, mean over GPUs) and memory used (MB, summed) as /metrics last reported them;
    None where the server reports none (a CPU host, or GPU metrics that failed): never a made-up 0."""
    utilization, memory = _samples(metrics_text, GPU_UTILIZATION), _samples(metrics_text, GPU_MEMORY_USED)
    return {
        "gpu_utilization_percent": sum(utilization) / len(utilization) if utilization else None,
        "gpu_memory_used_mb": sum(memory) if memory else None,
    }
