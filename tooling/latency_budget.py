"""The one overload knob, the latency budget: how long a request may wait for its answer.

The operator states the budget (LATENCY_BUDGET_MS for scripts/serve.sh, --latency-budget-ms for the
cluster configuration); everything TorchServe 0.12 needs is derived from it here, once:

- job_queue_size, the frontend's per-model queue (a count): as many requests as the workers can
  finish within half the budget, so that a request admitted at the tail of a full queue is still
  answered in time and every request beyond it is refused at once (503) instead of timing out.
- the deadline a proxy stamps on each request it forwards (handlers/deadline.py): arrival + budget.

What TorchServe 0.12 offers and this does not use, and why (docs/reliability.md, "Overload"):
clientTimeoutInMills drops an expired request without answering it at all (the client's connection
stays open until the client gives up) and never checks the first request of a batch;
useJobTicket admits a request only while a worker is idle, one per idle worker, which leaves no
queue to form batches from.
"""

from __future__ import annotations

from dataclasses import dataclass

# The default budget: one second. Measured on 2 cores with 2 s clients (docs/benchmarks.md, "Overload"), as
# serve.sh ships it: 86-91 % of saturation answered in time at 2x overload, 72-74 % at 4x (the load generator
# and the refusals take the rest of the two cores), nothing computed for a client who had left.
DEFAULT_BUDGET_MS = 1000

# Measured throughput of the default archive at its default layout and batching, per unit of the
# machine (docs/benchmarks.md): on CPU 180.2 req/s on 2 cores (ONNX fp32, one one-thread worker per
# core, batch 8); on a GPU 8,757 req/s on one H100 (BERT-base, not the demo archive: float16, 8 workers,
# batch 128, 1,024 clients; docs/benchmarks.md#gpu, docs/bench-gpu/benchmark.json). A different model or
# machine passes its own measured figure (THROUGHPUT_RPS, --throughput-rps).
CPU_RPS_PER_CORE = 90.0
GPU_RPS_PER_GPU = 8_757.0

# The wait model (admission): a request at the tail of a full queue waits at most this share of the
# budget, and besides the queue ahead of it, this many batch times (the one in progress, half done on
# average, then its own).
WAIT_SHARE = 0.5
BATCHES_IN_FLIGHT = 1.5


@dataclass(frozen=True)
class Admission:
    """What the budget gives TorchServe for one model on one server."""

    budget_ms: int
    throughput_rps: float
    batch_size: int  # the largest batch the budget leaves room for, at most the one asked for
    job_queue_size: int


def machine_throughput(device: str, units: int) -> float:
    """The measured requests/s of the default archive on `units` CPU cores (device "cpu") or GPUs ("gpu")."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    return units * (GPU_RPS_PER_GPU if device == "gpu" else CPU_RPS_PER_CORE)


def admission(budget_ms: int, throughput_rps: float, workers: int, batch_size: int) -> Admission:
    """The batch size and the queue that answer a request admitted at the tail of a full queue within half the budget.

    Under sustained overload the queue is always full, so every admitted request waits the whole
    queue: the requests ahead drain at the throughput, the batches in the workers when it arrives are
    half done on average, and its own batch then takes a whole batch time. That wait is held to half
    the budget, the other half being headroom for what varies: a batch of long texts, and the
    throughput lost under overload itself (refusing costs the frontend CPU). Measured on 2 cores with
    the whole budget instead: the median answer took 0.8 of it, and at 4x a quarter to a half of the
    computed requests finished after their client had given up. A longer queue adds only waiting,
    never throughput, once it keeps the workers fed: so never less than one full batch per worker,
    which the workers draw their batches from (a queue of 1 at 2x load served 61 % of saturation).

    That floor alone waits 2.5 batch times (a batch per worker queued, the one in progress half done,
    its own), so a budget shorter than five batch times also gets smaller batches: on 2 CPU cores a
    batch of 8 takes about 90 ms, and a 300 ms budget was mostly spent before its batch began
    (docs/benchmarks.md, "Overload"). The default budgets leave the batch as asked.
    """
    if budget_ms <= 0 or throughput_rps <= 0 or workers < 1 or batch_size < 1:
        raise ValueError("budget, throughput, workers and batch size must be positive")
    wait_s = budget_ms / 1000 * WAIT_SHARE
    # The queue's floor (one batch per worker) is one batch time, so the floor alone waits 1 + 1.5 batch times.
    size = max(1, min(batch_size, int(wait_s / (1 + BATCHES_IN_FLIGHT) * throughput_rps / workers)))
    return Admission(budget_ms, throughput_rps, size, queue_size(budget_ms, throughput_rps, workers, size))


def queue_size(budget_ms: int, throughput_rps: float, workers: int, batch_size: int) -> int:
    """The job_queue_size for this batch size as it is (admission() also caps the batch size; see there)."""
    wait_s = budget_ms / 1000 * WAIT_SHARE
    return max(workers * batch_size, int(throughput_rps * wait_s - BATCHES_IN_FLIGHT * workers * batch_size))


def batch_time_ms(batch_size: int, throughput_rps: float, workers: int) -> float:
    """How long one worker takes over a batch at its share of the throughput."""
    return 1000 * batch_size * workers / throughput_rps
