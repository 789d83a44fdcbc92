"""Served cells: one private TorchServe; each backend archived once and registered at each batching setting in turn."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tooling.bench.answers import TOLERANCE, AnswerCheck, answers_alone, served_dtype
from tooling.bench.backends import PreparedBackend
from tooling.bench.device import release
from tooling.bench.gpu_sampler import GpuSampler
from tooling.bench.loadgen import closed_loop
from tooling.bench.scrape import cell_figures, gpu_figures, read_counters, read_until_still
from tooling.bench.server_cpu import server_cpu_cores

# Load before the measured cells of each registration, as a share of a cell (at most 2 s of load, plus the time its
# clients take to start and finish), at enough clients to fill every worker's batches (warm_up_clients): the
# worker's first batches of each shape are slower (allocators, ONNX Runtime's first runs, cuBLAS's first calls),
# and a backend that met its full batches only inside a measured cell would be charged for them there, while CUDA
# graphs met every shape at capture, at load.
WARM_UP_SHARE = 0.5
WARM_UP_MAX_S = 2.0
# TorchServe's default startupTimeout is 120 s a worker. The benchmark registers a layout's models side by side
# (register_all): at 8 GPU workers that is 24 workers starting at once on the host's cores, 8 of them capturing a
# CUDA graph for each batch shape. Every archive it builds says 600 s in its model-config.yaml (TorchServe 0.12's
# ModelConfig reads `startupTimeout` from the archive, over the server's default); the registration's HTTP
# request waits a little longer than that, so TorchServe's own answer comes first.
STARTUP_TIMEOUT_S = 600
REGISTRATION_REQUEST_TIMEOUT_S = STARTUP_TIMEOUT_S + 120
# After a failed registration, how long to wait for its worker's exception in model_log.log (the frontend copies
# the worker's output there apart from its answer to the registration).
LOAD_FAILURE_CAUSE_WAIT_S = 15.0
# The part of model_log.log each layout wrote is copied to the run's output (copy_model_log) at most this big: its
# head (the workers' loads, a failed capture's traceback) and its tail (what came last), the middle cut.
MODEL_LOG_HEAD_BYTES = 1 << 20
MODEL_LOG_TAIL_BYTES = 3 << 20
# The handler's metrics reach /metrics through the worker's log stream, a moment after the answers: read once they
# count every answered request, waiting at most this long.
METRICS_SETTLE_TIMEOUT_S = 30.0
# ... and once no counter has moved for this long: each counter of a batch is a log line of its own.
METRICS_STILL_S = 0.2


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
    """(/metrics text, the model's counters) once the handler has counted `answered` items since `before` and no
    counter moved for METRICS_STILL_S, or METRICS_SETTLE_TIMEOUT_S later with what is there: a cell then shows the
    shortfall as handler_items. Read as soon as the items were in, a cell of 59 one-text batches once counted 57
    forward passes: a batch's counters arrive one log line each."""

    def read() -> tuple[str, dict[str, float]]:
        text = server.metrics_text()
        return text, read_counters(text, model)

    return read_until_still(
        read,
        METRICS_STILL_S,
        METRICS_SETTLE_TIMEOUT_S,
        ready=lambda read_: read_[1]["items"] >= before["items"] + answered,
        key=lambda read_: read_[1],
    )


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


def warm_up_clients(concurrency: Sequence[int], batch_size: int, workers: int) -> int:
    """Clients of the warm-up before a registration's cells: enough to fill every worker's batches twice over
    (2 x batch_size x workers), so each has run its fullest batch shapes (batch_size rows where the clients fill
    them) before anything is measured, and never more than the fullest cell has. More clients than that only
    lengthen the queue, and start (and drain) more client processes: at 1,024 clients a 2 s warm-up of a
    one-worker batch_size=1 registration took 15-20 s."""
    return max(1, min(max(concurrency), 2 * batch_size * max(1, workers)))


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


def model_load_failure(log_text: str, model: str) -> str | None:
    """The exception `model`'s workers printed last in model_log.log text, or None. Each worker's lines carry its
    thread's name, W-<port>-<model>_<version>..., so one model's failure is told from its neighbours'."""
    from tooling.torchserve import load_failure_cause

    return load_failure_cause("\n".join(line for line in log_text.splitlines() if f"-{model}_" in line))


def register_all(server, models: dict[str, Registration]) -> tuple[dict[str, float], dict[str, str]]:
    """Register every model at once under its own name: worker start-up is mostly single-threaded imports, so
    starting them side by side takes about half the time; an idle worker costs no CPU. Returns the seconds each
    registration took until its workers were loaded (side by side, so each includes the others' contention):
    what a worker start costs, CUDA graph capture included; and, for each model that did not register, why:
    TorchServe's answer and its worker's own exception from model_log.log (TorchServe says only "Failed to start
    workers"). A failed model is unregistered; the others are kept."""
    from concurrent.futures import ThreadPoolExecutor

    log = Path(server.log_dir) / "model_log.log"
    log_start = log.stat().st_size if log.is_file() else 0

    def register(item: tuple[str, Registration]) -> float | str:
        model, r = item
        started = time.monotonic()
        try:
            # One archive registered under several names, one per batching setting; 0 workers: the server's
            # default.
            response = server.register(r.archive, r.batching.batch_size, r.batching.max_batch_delay_ms,
                                       initial_workers=r.layout.workers or None,
                                       timeout=REGISTRATION_REQUEST_TIMEOUT_S, model_name=model)  # fmt: skip
        except (OSError, TimeoutError) as error:  # requests' errors (no answer in time), workers never READY
            return f"{type(error).__name__}: {error}"
        if response.status_code != 200:
            try:
                message = response.json()["message"]  # TorchServe's error body: {"code", "type", "message"}
            except (ValueError, KeyError, TypeError):
                message = response.text.strip()
            return f"HTTP {response.status_code}: {message}"
        return time.monotonic() - started

    pool = ThreadPoolExecutor(max_workers=len(models))
    try:
        outcomes = dict(zip(models, pool.map(register, models.items())))
    finally:
        # Not waited for when this unwinds (a SIGTERM mid-registration): the server stops next, which ends the
        # registrations' requests.
        pool.shutdown(wait=False, cancel_futures=True)
    seconds = {model: outcome for model, outcome in outcomes.items() if not isinstance(outcome, str)}
    failures = {}
    for model, answer in outcomes.items():
        if isinstance(answer, str):
            cause = _wait_for_load_failure(log, log_start, model)
            failures[model] = f"registering {model} failed: {answer}" + (
                f"; the worker's error: {cause}" if cause else "; no worker error in model_log.log"
            )
            with contextlib.suppress(OSError):  # recorded already; the server stops at the run's end anyway
                server.unregister(model)  # whatever TorchServe kept of it (404 where it kept nothing)
    return seconds, failures


def _wait_for_load_failure(log: Path, start: int, model: str) -> str | None:
    deadline = time.monotonic() + LOAD_FAILURE_CAUSE_WAIT_S
    while True:
        cause = model_load_failure(_log_since(log, start), model) if log.is_file() else None
        if cause is not None or time.monotonic() > deadline:
            return cause
        time.sleep(0.25)


def _log_since(log: Path, start: int) -> str:
    with log.open("rb") as text:
        text.seek(start if log.stat().st_size >= start else 0)  # 0: log4j rolled it over
        return text.read().decode("utf-8", errors="replace")


def copy_model_log(log: Path, start: int, target: Path) -> Path | None:
    """What `log` gained from byte `start` on (all of it, where log4j rolled it over meanwhile), copied to
    `target`: at most MODEL_LOG_HEAD_BYTES of its head and MODEL_LOG_TAIL_BYTES of its tail, a line in between
    saying how much was cut. None where there is no log."""
    if not log.is_file():
        return None
    with log.open("rb") as source:
        size = log.stat().st_size
        start = start if size >= start else 0
        length = size - start
        source.seek(start)
        if length <= MODEL_LOG_HEAD_BYTES + MODEL_LOG_TAIL_BYTES:
            data = source.read(length)
        else:
            head = source.read(MODEL_LOG_HEAD_BYTES)
            source.seek(size - MODEL_LOG_TAIL_BYTES)
            cut = length - MODEL_LOG_HEAD_BYTES - MODEL_LOG_TAIL_BYTES
            data = head + f"\n[... {cut} bytes of model_log.log cut here ...]\n".encode() + source.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


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
    failed: Callable[[dict], None] | None = None,
    logs_to: Path | None = None,
) -> list[dict]:
    """Every layout x backend x its batching settings x client count, one model measured at a time so none
    competes; the models of one layout are registered together, then unregistered before the next layout.
    Every answer is checked against its text's answer alone (tooling/bench/answers.py). On cpu the server
    is told there is no GPU (number_of_gpu=0), so a GPU host's workers stay on the CPU when asked to.
    `measured` is given the cells so far after each one, before its progress line. With `failed`, a model whose
    registration fails is reported to it ({"stage": "registration", "backend", "layout", "config", "model",
    "error"}, the error with its worker's own exception) and its cells skipped, the other models and layouts
    measured; without it the first failure raises. With `logs_to`, what model_log.log gained during each layout
    (the workers' loads, tracebacks and log lines) is copied there as model_log-<layout>.log, however the layout
    ends (copy_model_log: a few MB at most)."""
    from tooling.archiving import pack_archive, write_model_config
    from tooling.torchserve import TorchServe, default_job_queue_size

    store = Path(workdir) / "store"
    archives = {}
    for threads in dict.fromkeys(layout.threads for layout in layouts):
        for p in backends:
            config = write_model_config(Path(workdir) / f"model-config-{p.name}-{threads}.yaml",
                                        {"startupTimeout": STARTUP_TIMEOUT_S},
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
    # refuse hundreds of clients with 503. The warm-up runs at most at the largest cell's clients (warm_up_clients).
    overrides = {"job_queue_size": str(max(default_job_queue_size(), *concurrency))}
    if device == "cpu":
        overrides["number_of_gpu"] = "0"
    with TorchServe(Path(workdir) / "server", store, overrides) as server:
        log = Path(server.log_dir) / "model_log.log"
        for layout in layouts:
            log_start = log.stat().st_size if log.is_file() else 0
            try:
                _layout_cells(server, layout, backends, archives, settings, texts, concurrency, duration, expected,
                              dtypes, device, cells, measured, failed, progress)  # fmt: skip
            finally:  # a failure, a SIGTERM: what the workers logged is kept before the work directory goes
                if logs_to is not None:
                    copy_model_log(log, log_start, Path(logs_to) / f"model_log-{layout.label}.log")
    return cells


def _layout_cells(
    server, layout: Layout, backends, archives, settings, texts, concurrency, duration, expected, dtypes, device,
    cells: list[dict], measured, failed, progress,
) -> None:  # fmt: skip
    """One layout of served_cells: its models registered together, then measured one at a time."""
    models = {
        f"bench-{p.name}-{layout.label}-b{b.batch_size}-d{b.max_batch_delay_ms}": Registration(
            archives[p.name, layout.threads], p.name, layout, b
        )
        for p in backends
        for b in settings[p.name]
    }
    registration_s, failures = register_all(server, models)
    for model, error in failures.items():
        r = models[model]
        progress(f"FAILED: {error}")
        if failed is None:
            raise RuntimeError(error)
        failed({"stage": "registration", "backend": r.backend, "layout": layout.label, "config": r.batching.label,
                "model": model, "error": error})  # fmt: skip
    workers = {model: len(server.describe(model)[0]["workers"]) for model in registration_s}
    took = ", ".join(f"{model} {seconds:.1f} s" for model, seconds in registration_s.items())
    progress(f"registered {len(registration_s)} of {len(models)} models, {sorted(set(workers.values()))} "
             f"worker(s) each, in {took}")  # fmt: skip
    for model, r in models.items():
        if model in failures:
            continue
        url = f"{server.inference_url}/predictions/{model}"
        headers = {"Content-Type": "text/plain", **server.auth("inference")}
        warm_up = min(WARM_UP_MAX_S, WARM_UP_SHARE * duration)
        warm_before = read_counters(server.metrics_text(), model)
        clients = warm_up_clients(concurrency, r.batching.batch_size, workers[model])
        warm = closed_loop(url, headers, texts, clients, warm_up)
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
