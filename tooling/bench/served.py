"""Served cells: one private TorchServe; each backend archived once and registered at each batching setting in turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tooling.bench.answers import TOLERANCE, AnswerCheck, answers_alone, served_dtype
from tooling.bench.backends import PreparedBackend
from tooling.bench.device import release
from tooling.bench.gpu_sampler import GpuSampler
from tooling.bench.loadgen import closed_loop
from tooling.bench.scrape import cell_figures, gpu_figures, read_counters
from tooling.bench.server_cpu import server_cpu_cores

# Load before the measured cells of each registration, as a share of a cell (at most 2 s), at the largest client
# count the cells measure (warm_up_clients): the worker's first batches of each shape are slower (allocators, ONNX
# Runtime's first runs, cuBLAS's first calls), and a backend that met its full batches only inside a measured cell
# would be charged for them there, while CUDA graphs met every shape at capture, at load.
WARM_UP_SHARE = 0.5
WARM_UP_MAX_S = 2.0
# The handler's metrics reach /metrics through the worker's log stream, a moment after the answers: read once they
# count every answered request, waiting at most this long.
METRICS_SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Batching:
    batch_size: int
    max_batch_delay_ms: int

    @property
    def label(self) -> str:
        return f"batch_size={self.batch_size}" + (f", delay={self.max_batch_delay_ms}ms" if self.batch_size > 1 else "")


def batching_settings(batch_size: int, delays: Sequence[int], one_at_a_time: bool = True) -> list[Batching]:
    """batch_size=1 (one request at a time: the seed's baseline), then batch_size=B at each delay."""
    return [*([Batching(1, 0)] if one_at_a_time else []), *(Batching(batch_size, d) for d in delays)]


@dataclass(frozen=True)
class Layout:
    """How a model's CPU is split: `workers` worker processes, each with `threads` intra-op threads (0: all cores).
    0 workers: registered without initial_workers, so the server's default_workers_per_model decides."""

    workers: int
    threads: int

    @property
    def label(self) -> str:
        return f"{self.workers or 'default'}x{self.threads or 'all'}"


def gpu_layouts(value: str, threads: int = 0) -> list[Layout]:
    """'1,2,4,8' -> that many workers per GPU in turn, each with `threads` intra-op threads (0: every core)."""
    counts = [item.strip() for item in value.split(",")]
    if not counts or not all(c.isdigit() and int(c) > 0 for c in counts):
        raise ValueError(f"--gpu-workers is a comma-separated list of worker counts per GPU, got {value!r}")
    return [Layout(int(c), threads) for c in counts]


def parse_layouts(value: str) -> list[Layout]:
    """'1x0,2x1,0x1' -> one worker with every core, two workers with one thread each, the server's default
    number of one-thread workers (a registration with only url, batch_size and max_batch_delay)."""
    layouts = []
    for item in value.split(","):
        workers, sep, threads = item.strip().partition("x")
        if not sep or not workers.isdigit() or not threads.isdigit():
            raise ValueError(f"a layout is WORKERSxTHREADS (0 workers: the server's default; 0 threads: every core), "
                             f"got {item!r}")  # fmt: skip
        layouts.append(Layout(int(workers), int(threads)))
    return layouts


def describe_cell(cell: dict) -> str:
    return (
        f"{cell['backend']:<9} {cell['layout']:<5} {cell['config']:<24} c={cell['concurrency']:<3} "
        f"{cell['rps']:7.1f} req/s  p50 {cell['p50_ms']:7.1f} ms  p95 {cell['p95_ms']:7.1f} ms  "
        f"batch {cell['mean_batch_size']:.2f}  errors {cell['errors']}  server CPU: frontend "
        f"{cell['frontend_cpu_cores']:.2f} + workers {cell['workers_cpu_cores']:.2f} cores  client CPU "
        f"{100 * cell['client_cpu_fraction']:.0f}% of a core  answers wrong {cell['answers_wrong']} of "
        f"{cell['answers_checked']} (max |dp| {cell['answers_max_abs_diff']:.1e})"
        + (
            f"  GPU {cell['gpu_utilization_percent']:.0f}% {cell['gpu_memory_used_mb']:.0f} MB"
            if cell["gpu_utilization_percent"] is not None and cell["gpu_memory_used_mb"] is not None
            else ""
        )
    )


def counters_after(server, model: str, before: dict[str, float], answered: int) -> tuple[str, dict[str, float]]:
    """(/metrics text, the model's counters) once the handler has counted `answered` items since `before`, or
    METRICS_SETTLE_TIMEOUT_S later with what is there: a cell then shows the shortfall as handler_items."""
    deadline = time.monotonic() + METRICS_SETTLE_TIMEOUT_S
    while True:
        text = server.metrics_text()
        after = read_counters(text, model)
        if after["items"] >= before["items"] + answered or time.monotonic() > deadline:
            return text, after
        time.sleep(0.05)


def measure_cell(
    server, model: str, texts: Sequence[str], clients: int, duration: float, check: AnswerCheck | None = None
) -> dict:
    """One cell of closed-loop load, with what /metrics counted during it, and the server's CPU (frontend and
    workers, in cores) and the GPU's use during it."""
    url = f"{server.inference_url}/predictions/{model}"
    headers = {"Content-Type": "text/plain", **server.auth("inference")}
    before = read_counters(server.metrics_text(), model)
    with GpuSampler() as gpu, server_cpu_cores(server, model) as cores:
        cell = closed_loop(url, headers, texts, clients, duration, check)
    text, after = counters_after(server, model, before, cell["requests"])
    # NVML's samples of this cell where it can read the GPU; else TorchServe's last (once a minute) report.
    sampled = gpu.figures()
    reported = gpu_figures(text)
    gpu_cell = {key: sampled[key] if sampled[key] is not None else reported[key] for key in reported}
    gpu_cell["gpu_figures_from"] = "nvml" if sampled["gpu_utilization_percent"] is not None else "torchserve"
    return {**cell, "handler_items": after["items"] - before["items"], **cell_figures(before, after),
            "frontend_cpu_cores": cores["frontend"], "workers_cpu_cores": cores["workers"], **gpu_cell}  # fmt: skip


def warm_up_clients(concurrency: Sequence[int]) -> int:
    """Clients of the warm-up before a registration's cells: the most any of its cells has, so its batches are as
    full as the fullest cell's (batch_size rows where the clients fill them) before anything is measured."""
    return max(concurrency)


def reference_answers(
    backends: Sequence[PreparedBackend], texts: Sequence[str], handler_options: dict, device: str
) -> dict[str, list[dict]]:
    """Each backend's answers alone in float32 (tooling/bench/answers.answers_alone), by backend name, computed once
    per model folder: "pytorch" and "pytorch-graphs" serve one checkpoint, whose reference is the same (it takes
    the run's handler options, not the backend's own)."""
    by_folder: dict[Path, list[dict]] = {}
    for p in backends:
        if p.model_dir not in by_folder:
            by_folder[p.model_dir] = answers_alone(p.model_dir, texts, handler_options, device)
    return {p.name: by_folder[p.model_dir] for p in backends}


@dataclass(frozen=True)
class Registration:
    archive: str
    backend: str
    layout: Layout
    batching: Batching


def register_all(server, models: dict[str, Registration]) -> dict[str, float]:
    """Register every model at once under its own name: worker start-up is mostly single-threaded imports, so
    starting them side by side takes about half the time; an idle worker costs no CPU. Returns the seconds each
    registration took until its workers were loaded (side by side, so each includes the others' contention):
    what a worker start costs, CUDA graph capture included."""
    from concurrent.futures import ThreadPoolExecutor

    def register(item: tuple[str, Registration]) -> float:
        model, r = item
        started = time.monotonic()
        # One archive registered under several names, one per batching setting; 0 workers: the server's default.
        response = server.register(r.archive, r.batching.batch_size, r.batching.max_batch_delay_ms,
                                   initial_workers=r.layout.workers or None, timeout=600, model_name=model)  # fmt: skip
        if response.status_code != 200:
            raise RuntimeError(f"registering {model} failed: {response.text}")
        return time.monotonic() - started

    with ThreadPoolExecutor(max_workers=len(models)) as pool:
        return dict(zip(models, pool.map(register, models.items())))


def served_cells(
    backends: Sequence[PreparedBackend],
    texts: Sequence[str],
    workdir: Path,
    settings: dict[str, Sequence[Batching]],
    concurrency: Sequence[int],
    duration: float,
    handler_options: dict,
    progress: Callable[[str], None],
    layouts: Sequence[Layout] = (Layout(1, 0),),
    device: str = "cpu",
    measured: Callable[[list[dict]], None] = lambda cells: None,
) -> list[dict]:
    """Every layout x backend x its batching settings x client count, one model measured at a time so none
    competes; the models of one layout are registered together, then unregistered before the next layout.
    Every answer is checked against its text's answer alone (tooling/bench/answers.py). On cpu the server
    is told there is no GPU (number_of_gpu=0), so a GPU host's workers stay on the CPU when asked to.
    `measured` is given the cells so far after each one, before its progress line."""
    from tooling.archiving import pack_archive, write_model_config
    from tooling.torchserve import TorchServe, default_job_queue_size

    store = Path(workdir) / "store"
    archives = {}
    for threads in dict.fromkeys(layout.threads for layout in layouts):
        for p in backends:
            config = write_model_config(Path(workdir) / f"model-config-{p.name}-{threads}.yaml",
                                        **{**p.handler_options(handler_options), "cpu_threads": threads})  # fmt: skip
            archives[p.name, threads] = pack_archive(p.model_dir, f"bench-{p.name}-t{threads}", store, config).name
    option = str(handler_options.get("dtype", "auto"))
    dtypes = {p.name: served_dtype(option, device, p.backend.quantize) for p in backends}
    expected = reference_answers(backends, texts, handler_options, device)
    release(device)
    progress(f"answers alone in float32 on {device} for {len(texts)} texts; served as {dtypes}")
    cells = []
    progress(f"packed {len(archives)} archives; starting TorchServe")
    # A closed loop never has more requests in flight than clients: a queue that holds them all never
    # refuses one, so the cells measure capacity and latency, not the latency budget's shedding (which
    # scripts/overload.py measures). The launchers' default queue, sized for a CPU host's budget, would
    # refuse hundreds of clients with 503. The warm-up runs at the largest cell's clients (warm_up_clients).
    overrides = {"job_queue_size": str(max(default_job_queue_size(), *concurrency))}
    if device == "cpu":
        overrides["number_of_gpu"] = "0"
    with TorchServe(Path(workdir) / "server", store, overrides) as server:
        for layout in layouts:
            models = {
                f"bench-{p.name}-{layout.label}-b{b.batch_size}-d{b.max_batch_delay_ms}": Registration(
                    archives[p.name, layout.threads], p.name, layout, b
                )
                for p in backends
                for b in settings[p.name]
            }
            registration_s = register_all(server, models)
            workers = {model: len(server.describe(model)[0]["workers"]) for model in models}
            progress(f"registered {len(models)} models, {sorted(set(workers.values()))} worker(s) each, in "
                     + ", ".join(f"{model} {seconds:.1f} s" for model, seconds in registration_s.items()))  # fmt: skip
            for model, r in models.items():
                url = f"{server.inference_url}/predictions/{model}"
                headers = {"Content-Type": "text/plain", **server.auth("inference")}
                warm_up = min(WARM_UP_MAX_S, WARM_UP_SHARE * duration)
                warm_before = read_counters(server.metrics_text(), model)
                warm = closed_loop(url, headers, texts, warm_up_clients(concurrency), warm_up)
                counters_after(server, model, warm_before, warm["requests"])  # all in before the first cell reads
                for clients in concurrency:
                    check = AnswerCheck(expected[r.backend], TOLERANCE[dtypes[r.backend]])
                    cell = {
                        "backend": r.backend,
                        "layout": layout.label,
                        "workers": workers[model],  # as the server started them
                        "cpu_threads": layout.threads,
                        "config": r.batching.label,
                        "batch_size": r.batching.batch_size,
                        "max_batch_delay_ms": r.batching.max_batch_delay_ms,
                        "device": device,
                        "dtype": dtypes[r.backend],
                        "registration_s": registration_s[model],
                        **measure_cell(server, model, texts, clients, duration, check),
                    }
                    cells.append(cell)
                    # Kept before it is printed: a run stopped on seeing a cell's line has that cell on disk.
                    measured(list(cells))
                    progress(describe_cell(cell))
                server.unregister(model)
    return cells
