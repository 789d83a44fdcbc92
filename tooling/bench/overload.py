"""Overload cells: open-loop arrivals at multiples of the saturation measured just before, per client timeout.

Setups, one private TorchServe each, the landed service's layout (batch 8, 2 ms, one one-thread worker
per core) and the default archive:
- "today": job_queue_size=100 (what config.properties held before the latency budget), clients without
  a deadline: the issue's reproduction.
- "budget B": the queue the budget B gives (tooling/latency_budget.py) at the throughput measured in this
  run; clients send their deadline (handlers/deadline.py, their scheduled send time plus their timeout),
  and, for contrast, clients that send none ("budget B, no deadline": the queue alone).
- "budget B, as serve.sh ships" (when asked for): the queue and batch scripts/serve.sh gives this host at
  budget B, from the throughput tooling/latency_budget.py ships per core rather than the one measured here:
  what the defaults do on this machine. Clients send their deadline.
Per cell, from the client (tooling/bench/openloop.py; the requests scheduled in the window after the
warm-up): offered, sent, answered in time, refused (by status and type), gave up, latency percentiles of
the answered, of every request and of the admitted ones (those not answered in time counting as beyond
the timeout), the refusals' own latency and the generator's send lag; from the handler's own counters
(bert_items_total, bert_rejected_items_total, over the whole cell): items computed (handed to the handler
and not refused by it) and how many of them nobody received (wasted, against the whole cell's answers);
and where the machine's CPU went while the arrivals ran (the whole cell): the model's workers, the rest
of the server (the frontend that queues, batches and refuses), and the load generator, each in cores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from handlers.handler_metrics import ITEMS, REJECTED
from tooling.bench.openloop import ARRIVALS, open_loop
from tooling.bench.overload_report import latency
from tooling.bench.scrape import HANDLER_MODEL_LABEL, read_until_still
from tooling.bench.server_cpu import server_cpu_cores
from tooling.cpu_layout import Layout
from tooling.prometheus import metric_value

# The queue config.properties held before the latency budget: the "today" setup.
TODAY_QUEUE = 100
# The load at which "nothing changes" is the target.
HALF_LOAD = 0.5
# The handler's metrics reach /metrics through the worker's log stream, a moment after the answers: read once two
# reads this far apart agree (how many items the handler was handed is not known to the client: a request its
# client gave up on may or may not have been admitted), waiting at most METRICS_SETTLE_TIMEOUT_S.
METRICS_SETTLE_S = 0.25
METRICS_SETTLE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Setup:
    label: str
    job_queue_size: int
    budget_ms: int | None  # None: no budget (today)
    batch_size: int
    comparison: bool = False  # a batch size the budget would not give: measured for contrast, no target
    shipped: bool = False  # derived as scripts/serve.sh derives it, from the shipped throughput
    throughput_rps: float | None = None  # the throughput its queue and batch were derived from (None: today's)


def handler_counts(server, model: str) -> tuple[float, float]:
    """(items handed to the handler, items it refused), from the handler's counters on /metrics."""
    text = server.metrics_text()
    return (metric_value(text, ITEMS, **{HANDLER_MODEL_LABEL: model}),
            metric_value(text, REJECTED, **{HANDLER_MODEL_LABEL: model}))  # fmt: skip


def wait_drained(server, model: str, limit_s: float) -> None:
    """Until the frontend's queue for `model` is empty and the batches in the workers have had time to finish."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status = server.describe(model)[0].get("jobQueueStatus", {})
        if not status.get("pendingRequests"):
            break
        time.sleep(0.1)
    time.sleep(0.3)


def settled_handler_counts(server, model: str) -> tuple[float, float]:
    """handler_counts once two reads METRICS_SETTLE_S apart agree, or after METRICS_SETTLE_TIMEOUT_S."""
    return read_until_still(lambda: handler_counts(server, model), METRICS_SETTLE_S, METRICS_SETTLE_TIMEOUT_S)


def measure_cell(
    server, model: str, texts: Sequence[str], rate: float, seconds: float, timeout_s: float,
    arrivals: str, deadline: bool, warmup_s: float = 0.0,
) -> dict:  # fmt: skip
    url = f"{server.inference_url}/predictions/{model}"
    headers = {"Content-Type": "text/plain", **server.auth("inference")}
    items_before, refused_before = handler_counts(server, model)
    with server_cpu_cores(server, model) as cores:
        result = open_loop(url, headers, texts, rate, seconds, timeout_s, arrivals, deadline, warmup_s=warmup_s)
    wait_drained(server, model, limit_s=30.0)
    items_after, refused_after = settled_handler_counts(server, model)
    summary = result.summary()
    return {
        **summary,
        **work_figures(summary, items_after - items_before, refused_after - refused_before),
        "workers_cpu_cores": cores["workers"],
        "frontend_cpu_cores": cores["frontend"],
    }


def work_figures(summary: dict, handed: float, refused_by_handler: float) -> dict:
    """Items handed to the handler, computed (handed and not refused by it), and computed for nobody (wasted): the
    handler's counters cover the whole cell (warm-up, window and drain), so they are held to the whole schedule's
    answers in time, not to the window's."""
    computed = handed - refused_by_handler
    wasted = max(0.0, computed - summary["whole_schedule"]["answered_in_time"])
    return {
        "handed_to_handler": handed,
        "computed": computed,
        "wasted": wasted,
        "wasted_share": wasted / computed if computed else 0.0,
    }


def shipped_setup(budget_ms: int, units: int, workers: int, batch_size: int) -> Setup:
    """The queue and batch scripts/serve.sh gives a CPU host at this budget, derived as it derives them:
    scripts/latency_budget.py with serve.sh's inputs on CPU (--device cpu --units CPUS --workers WORKERS
    --batch-size 8, no THROUGHPUT_RPS; `units` and `workers` its layout of the archive, scripts/cpu_layout.py), so
    from the throughput tooling/latency_budget.py ships per core, not from the saturation measured in this run."""
    from tooling.latency_budget import admission, machine_throughput

    throughput = machine_throughput("cpu", units)
    given = admission(budget_ms, throughput, workers, batch_size)
    label = f"budget {budget_ms} ms, as serve.sh ships"
    return Setup(label, given.job_queue_size, budget_ms, given.batch_size, shipped=True, throughput_rps=throughput)


def setups(
    saturation_rps: float, budgets_ms: Sequence[int], workers: int, batch_size: int, batch_sizes: Sequence[int] = (),
    shipped_budgets_ms: Sequence[int] = (), shipped_layout: Layout | None = None,
) -> list[Setup]:  # fmt: skip
    """Today's setup, then one per budget with the batch size and queue the budget gives (tooling/latency_budget.py),
    again at each of `batch_sizes` (a comparison: the same budget's queue for that batch size), and, for each of
    `shipped_budgets_ms`, as scripts/serve.sh ships it with `shipped_layout`, its layout of the archive on this
    host's CPUs (shipped_setup)."""
    from tooling.latency_budget import admission, queue_size

    derived = []
    for budget in budgets_ms:
        given = admission(budget, saturation_rps, workers, batch_size)
        derived.append(
            Setup(f"budget {budget} ms", given.job_queue_size, budget, given.batch_size, throughput_rps=saturation_rps)
        )
        for size in (b for b in batch_sizes if b != given.batch_size):
            queue = queue_size(budget, saturation_rps, workers, size)
            derived.append(Setup(f"budget {budget} ms, batch {size}", queue, budget, size, comparison=True,
                                 throughput_rps=saturation_rps))  # fmt: skip
        if budget in shipped_budgets_ms:
            if shipped_layout is None:
                raise ValueError("the shipped setups need serve.sh's layout of the archive (shipped_layout)")
            derived.append(shipped_setup(budget, shipped_layout.cpus, shipped_layout.workers, batch_size))
    return [Setup("today", TODAY_QUEUE, None, batch_size), *derived]


def cells_for(
    setup: Setup, timeouts_s: Sequence[float], multiples: Sequence[float], default_budget_ms: int
) -> list[tuple[float, bool, str, list[float]]]:
    """(client timeout, deadline header, arrivals, loads) for each group of cells a setup runs."""
    half = [m for m in multiples if m == HALF_LOAD]
    if setup.budget_ms is None:
        # Today's layout at every load with constant arrivals, and with Poisson arrivals at half load: the
        # reference for "at 0.5x nothing changes" is measured with the same arrivals as the cell it is held to.
        return [(t, False, "constant", list(multiples)) for t in timeouts_s] + [
            (t, False, "poisson", half) for t in timeouts_s if half
        ]
    matching = [t for t in timeouts_s if round(1000 * t) == setup.budget_ms]
    groups = [(t, True, arrivals, list(multiples)) for t in matching for arrivals in ARRIVALS]
    if not setup.shipped:  # the queue alone, for contrast: once per budget is enough
        groups += [(t, False, "constant", list(multiples)) for t in matching]
    if setup.budget_ms == default_budget_ms:
        # The default budget with clients that wait longer than it: the same promise must hold.
        longer = [t for t in timeouts_s if 1000 * t > setup.budget_ms]
        groups += [(t, True, arrivals, list(multiples)) for t in longer for arrivals in ARRIVALS]
    return groups


def run_setup(
    server, model: str, setup: Setup, texts: Sequence[str], saturation_rps: float, multiples: Sequence[float],
    timeouts_s: Sequence[float], seconds: float, default_budget_ms: int, progress: Callable[[str], None],
    warmup_s: float = 0.0,
) -> list[dict]:  # fmt: skip
    cells = []
    for timeout_s, deadline, arrivals, loads in cells_for(setup, timeouts_s, multiples, default_budget_ms):
        for multiple in loads:
            figures = measure_cell(
                server, model, texts, multiple * saturation_rps, seconds, timeout_s, arrivals, deadline, warmup_s
            )
            cell = {
                "server": "torchserve",
                "setup": setup.label + ("" if deadline or setup.budget_ms is None else ", no deadline"),
                "job_queue_size": setup.job_queue_size,
                "batch_size": setup.batch_size,
                "comparison": setup.comparison,
                "shipped": setup.shipped,
                "queue_from_rps": setup.throughput_rps,
                "budget_ms": setup.budget_ms,
                "deadline_header": deadline,
                "timeout_s": timeout_s,
                "arrivals": arrivals,
                "multiple": multiple,
                **figures,
            }
            cell["goodput_share"] = cell["goodput_rps"] / saturation_rps
            cells.append(cell)
            progress(describe(cell))
    return cells


def describe(cell: dict) -> str:
    refused = ", ".join(f"{k}: {v}" for k, v in sorted(cell["refused"].items())) or "none"
    computed = ""
    if "computed" in cell:
        computed = f"computed {cell['computed']:.0f}, wasted {100 * cell['wasted_share']:.0f}%"
    lag = f" send lag p99 {cell['send_lag_p99_ms']:.0f} ms (unreliable)" if cell.get("send_lag_unreliable") else ""
    return (
        f"{cell['server']:<10} {cell['setup']:<28} t={cell['timeout_s']}s {cell['arrivals']:<8} "
        f"{cell['multiple']}x: offered {cell['offered']} ({cell['offered_rps']:.0f}/s, sent "
        f"{cell.get('sent_rps', float('nan')):.0f}/s) goodput {cell['goodput_rps']:.0f}/s "
        f"({100 * cell['goodput_share']:.0f}%) p50/p99 answered {cell['p50_ms']:.0f}/{cell['p99_ms']:.0f} ms, all "
        f"{latency(cell, 'all_p50_ms')}/{latency(cell, 'all_p99_ms')}, admitted {latency(cell, 'admitted_p99_ms')} "
        f"gave up {cell['gave_up']} refused [{refused}] {computed}{lag}"
    )
