"""Overload benchmark: open-loop arrivals at multiples of the saturation measured just before, per client timeout.

    python -m scripts.overload --out docs/bench-overload --litserve-python /path/to/venv/bin/python
    python -m scripts.overload --quick              # a few minutes: checks the pipeline end to end

One run, one machine: the default archive (model_store/bert.mar, repacked with this checkout's
handlers) served by private TorchServes at the landed layout (batch 8, 2 ms, one worker per core).
First its saturation is measured (closed loop, 32 clients, in rounds until two agree within 10 %);
then each setup (tooling/bench/overload.py: today's queue of 100, each latency budget's queue and
batch size from that saturation with and without client deadlines, and each budget's queue and
batch as scripts/serve.sh ships them for the archive, from its layout of it (scripts/cpu_layout.py) and the
throughput tooling/latency_budget.py ships) takes
open-loop arrivals (constant and Poisson) at each multiple of it, each client giving up after its
timeout. Each cell's arrivals run for --warmup-s and then the --seconds of its window: the client's
figures count the requests scheduled in the window (tooling/bench/openloop.py). Per cell it also
records where the CPU went (workers, frontend, load generator). At the end the saturation is
measured again on a fresh server of the first layout. LitServe, serving the same model and pipeline
from a venv of its own, takes the same load for contrast. Writes overload.json (every figure),
overload.md (what each figure counts, tables, targets) and overload.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import requests

from handlers.cpu_quota import usable_cpus
from tooling.bench.corpus import build_corpus
from tooling.bench.loadgen import closed_loop, readings_until_stable
from tooling.bench.openloop import open_loop
from tooling.bench.overload import TODAY_QUEUE, Setup, describe, run_setup, setups
from tooling.bench.overload_report import evaluate, legend, plot, table, targets_table
from tooling.bench.report import machine
from tooling.bench.server_cpu import server_cpu_cores
from tooling.cli_arguments import (
    existing_file,
    list_of,
    non_negative_float,
    output_folder,
    positive_float,
    positive_int,
)
from tooling.cpu_layout import Layout, cpu_layout
from tooling.latency_budget import DEFAULT_BUDGET_MS, machine_throughput
from tooling.paths import MODEL_STORE, REPO
from tooling.termination import exit_on_sigterm

MODEL = "overload"
BATCH_SIZE = 8
MAX_BATCH_DELAY_MS = 2
SATURATION_CLIENTS = 32


def budgets_or_none(value: str) -> list[int]:
    """--shipped-budgets: milliseconds, comma-separated, or '' for none."""
    return list_of(positive_int)(value) if value else []


def serve_sh_layout(archive: Path) -> Layout:
    """What scripts/serve.sh starts for `archive` on this host's CPUs (scripts/cpu_layout.py): its CPUs (the affinity,
    capped by a cgroup's CPU quota), passed as --units, and its workers: one a CPU for the demo archive's one thread,
    fewer for an archive whose workers take more threads."""
    return cpu_layout(archive, usable_cpus())


def unpack(archive: Path, into: Path) -> tuple[Path, Path]:
    """(model folder, model-config.yaml) of an archive: what it serves, with the options it was built with."""
    with zipfile.ZipFile(archive) as mar:
        for name in mar.namelist():
            if name.startswith("model/") or name == "model-config.yaml":
                mar.extract(name, into)
    return into / "model", into / "model-config.yaml"


def start_torchserve(workdir: Path, store: Path, queue: int, batch_size: int, progress):
    from tooling.torchserve import TorchServe

    server = TorchServe(workdir, store, overrides={"job_queue_size": str(queue)}).start()
    try:
        response = server.register(f"{MODEL}.mar", batch_size, MAX_BATCH_DELAY_MS, initial_workers=None)
        if response.status_code != 200:
            raise RuntimeError(f"registering failed: {response.text}")
        server.wait_until_ready(MODEL)
    except BaseException:  # a SIGTERM included: never leave a server behind
        server.stop()
        raise
    workers = len(server.describe(MODEL)[0]["workers"])
    progress(f"TorchServe up: job_queue_size={queue}, batch_size={batch_size}, {workers} workers")
    return server, workers


def warm_up(url: str, headers: dict, texts, seconds: float = 8.0) -> None:
    """Every worker's first batches of each shape are slow (ONNX Runtime's first runs): load them before measuring."""
    closed_loop(url, headers, texts, 16, seconds)


def stable_saturation(url: str, headers: dict, texts, seconds: float, progress) -> float:
    """Closed-loop requests/s, measured in rounds until two in a row agree within 10 % (at most 6): the last. A
    fresh server speeds up over its first minute, and a first reading alone was half the one taken at the end."""

    def measure(_round: int) -> float:
        rps = closed_loop(url, headers, texts, SATURATION_CLIENTS, seconds)["rps"]
        progress(f"  closed loop, {SATURATION_CLIENTS} clients: {rps:.1f} req/s")
        return rps

    return readings_until_stable(measure).values[-1]


def saturation_again(workdir: Path, store: Path, texts, seconds: float, progress) -> dict:
    """The closed-loop saturation measured again at the end, on a fresh server with the first setup's layout:
    other load on a shared machine moves it, and this shows by how much. (On the last setup's server a short
    budget's small queue would refuse the closed loop's 32 clients, and the figure would mean nothing.)"""
    server, _ = start_torchserve(workdir, store, TODAY_QUEUE, BATCH_SIZE, progress)
    try:
        url = f"{server.inference_url}/predictions/{MODEL}"
        headers = {"Content-Type": "text/plain", **server.auth("inference")}
        warm_up(url, headers, texts)
        result = closed_loop(url, headers, texts, SATURATION_CLIENTS, seconds)
    finally:
        server.stop()
    progress(f"saturation at the end: {result['rps']:.1f} req/s")
    return result


def wait_idle(url: str, headers: dict, body: str, limit_s: float = 120.0) -> None:
    """Until a lone request is answered quickly: LitServe's queue has no bound and no drop, so what the clients
    gave up on is still computed after a cell, and the next cell must not start behind it."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        started = time.monotonic()
        with contextlib.suppress(requests.RequestException):
            requests.post(url, data=body, headers=headers, timeout=limit_s)
        if time.monotonic() - started < 0.2:
            return
        time.sleep(0.2)


def litserve_cells(python: str, model_dir: Path, options: Path, workers: int, texts, saturation: float,
                   multiples, timeouts, seconds: float, warmup_s: float, progress) -> list[dict]:  # fmt: skip
    from tooling.torchserve import free_port

    port = free_port()
    command = [python, "-m", "tooling.bench.litserve_app", "--model-dir", str(model_dir), "--options", str(options),
               "--port", str(port), "--workers", str(workers), "--batch-size", str(BATCH_SIZE),
               "--batch-timeout", str(MAX_BATCH_DELAY_MS / 1000)]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    cells = []
    try:
        for _ in range(240):
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/predict"
        headers = {"Content-Type": "application/json"}
        bodies = [json.dumps({"text": text}) for text in texts]
        warm_up(url, headers, bodies)
        progress(f"LitServe up: {workers} workers, unbounded queue")
        for timeout_s in timeouts:
            for multiple in multiples:
                result = open_loop(url, headers, bodies, multiple * saturation, seconds, timeout_s, "constant",
                                   warmup_s=warmup_s)  # fmt: skip
                wait_idle(url, headers, bodies[0])
                cell = {"server": "litserve", "setup": "unbounded queue", "timeout_s": timeout_s,
                        "arrivals": "constant", "multiple": multiple, "budget_ms": None, "deadline_header": False,
                        **result.summary()}  # fmt: skip
                cell["goodput_share"] = cell["goodput_rps"] / saturation
                cells.append(cell)
                progress(describe(cell))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    return cells


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=existing_file, default=MODEL_STORE / "bert.mar")
    parser.add_argument("--out", type=output_folder, default=Path("build/bench-overload"))
    parser.add_argument("--multiples", type=list_of(positive_float), default=[0.5, 1.0, 1.5, 2.0, 4.0])
    parser.add_argument(
        "--timeouts", type=list_of(positive_float), default=[0.3, 1.0, 2.0], help="client timeouts, seconds"
    )
    parser.add_argument("--seconds", type=positive_float, default=4.0, help="each cell's counted window of arrivals")
    parser.add_argument("--warmup-s", type=non_negative_float, default=1.0,
                        help="arrivals before each cell's window, not counted: the queue fills")  # fmt: skip
    parser.add_argument("--saturation-seconds", type=positive_float, default=4.0, help="per round of the measurement")
    parser.add_argument("--litserve-python", help="an interpreter with litserve installed (its own venv)")
    parser.add_argument("--litserve-timeouts", type=list_of(positive_float), default=[0.3, 1.0])
    parser.add_argument(
        "--budget-batch-sizes",
        type=list_of(positive_int),
        default=[],
        help="also run each budget at these batch sizes (default: only at the layout's)",
    )
    parser.add_argument(
        "--shipped-budgets",
        type=budgets_or_none,
        default=None,
        help="run these budgets (ms) also with the queue and batch scripts/serve.sh ships for this host, from the "
        "throughput tooling/latency_budget.py ships (default: every budget; '' for none)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 loads, 2 timeouts, 0.5 s warm-up + 1.5 s cells, shipped: the default budget only",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.multiples, args.timeouts, args.seconds, args.saturation_seconds = [0.5, 2.0], [0.3, 1.0], 1.5, 3.0
        args.warmup_s, args.litserve_timeouts = 0.5, [1.0]
        if args.shipped_budgets is None:
            args.shipped_budgets = [DEFAULT_BUDGET_MS]
    budgets = [round(1000 * t) for t in args.timeouts]
    shipped_budgets = budgets if args.shipped_budgets is None else args.shipped_budgets
    if not set(shipped_budgets) <= set(budgets):
        parser.error(f"--shipped-budgets must be among the budgets the timeouts give: {budgets}")
    progress = print
    load_before = os.getloadavg()
    started = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="overload-"))
    try:
        from tooling.archiving import pack_archive

        model_dir, options = unpack(args.archive, workdir / "unpacked")
        store = workdir / "store"
        pack_archive(model_dir, MODEL, store, options)
        texts = build_corpus(200)
        shipped_layout = serve_sh_layout(args.archive)
        cells: list[dict] = []
        saturation = workers = 0
        saturation_after: dict = {}
        saturation_cpu: dict = {}
        plan: list[Setup] = [Setup("today", TODAY_QUEUE, None, BATCH_SIZE)]
        index = 0
        while index < len(plan):
            setup = plan[index]
            server, workers = start_torchserve(
                workdir / f"server-{index}", store, setup.job_queue_size, setup.batch_size, progress
            )
            try:
                url = f"{server.inference_url}/predictions/{MODEL}"
                headers = {"Content-Type": "text/plain", **server.auth("inference")}
                warm_up(url, headers, texts)
                if index == 0:
                    with server_cpu_cores(server, MODEL) as cores:
                        saturation = stable_saturation(url, headers, texts, args.saturation_seconds, progress)
                    saturation_cpu = {"workers": cores["workers"], "frontend": cores["frontend"]}
                    progress(f"saturation: {saturation:.1f} req/s ({SATURATION_CLIENTS} clients, closed loop); "
                             f"CPU cores: workers {saturation_cpu['workers']:.2f}, "
                             f"frontend {saturation_cpu['frontend']:.2f}")  # fmt: skip
                    if workers != shipped_layout.workers:
                        progress(f"note: {workers} workers, where scripts/serve.sh would start "
                                 f"{shipped_layout.workers}: the shipped setups' queues are derived for serve.sh's "
                                 "count")  # fmt: skip
                    plan += setups(saturation, budgets, workers, BATCH_SIZE, args.budget_batch_sizes,
                                   shipped_budgets, shipped_layout)[1:]  # fmt: skip
                cells += run_setup(server, MODEL, setup, texts, saturation, args.multiples, args.timeouts,
                                   args.seconds, DEFAULT_BUDGET_MS, progress, args.warmup_s)  # fmt: skip
            finally:
                server.stop()
            index += 1
        saturation_after = saturation_again(workdir / "server-end", store, texts, args.saturation_seconds, progress)
        if args.litserve_python:
            cells += litserve_cells(args.litserve_python, model_dir, options, workers, texts, saturation,
                                    args.multiples, args.litserve_timeouts, args.seconds, args.warmup_s,
                                    progress)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "machine": machine(),
        "command": "python -m scripts.overload " + " ".join(argv if argv is not None else sys.argv[1:]),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "minutes": (time.time() - started) / 60,
        "saturation_rps": saturation,
        "saturation_at_the_end_rps": saturation_after.get("rps"),
        "saturation_cpu_cores": saturation_cpu,
        "workers": workers,
        "batch_size": BATCH_SIZE,
        "max_batch_delay_ms": MAX_BATCH_DELAY_MS,
        "default_budget_ms": DEFAULT_BUDGET_MS,
        # Each cell's arrivals: the warm-up, then the window its client figures count (cells' window_s).
        "warmup_s": args.warmup_s,
        "window_seconds": args.seconds,
        # What scripts/serve.sh passes scripts/latency_budget.py on this host (the "as serve.sh ships" setups).
        "shipped": {
            "device": "cpu",
            "units": shipped_layout.cpus,
            "workers": shipped_layout.workers,
            "batch_size": BATCH_SIZE,
            "throughput_rps": machine_throughput("cpu", shipped_layout.cpus),
            "budgets_ms": shipped_budgets,
        },
        "cells": cells,
    }
    targets = evaluate(cells, DEFAULT_BUDGET_MS)
    report["targets"] = targets
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.json").write_text(json.dumps(report, indent=1))
    title = (f"{machine()}; saturation {saturation:.0f} req/s (at the end: "
             f"{saturation_after.get('rps', float('nan')):.0f}); load average {load_before[0]:.1f} before, "
             f"{report['load_average_after'][0]:.1f} after; CPU cores at saturation: workers "
             f"{saturation_cpu.get('workers', math.nan):.2f}, "
             f"frontend {saturation_cpu.get('frontend', math.nan):.2f}")  # fmt: skip
    per_core = saturation / saturation_cpu["workers"] if saturation_cpu.get("workers") else math.nan
    lines = [f"# Overload: {title}", "", f"Command: `{report['command']}`", "", *legend(cells), "",
             *table(cells, per_core), "", "Targets (the p99 target: the p99 admitted column):", "",
             *targets_table(targets), ""]  # fmt: skip
    (args.out / "overload.md").write_text("\n".join(lines))
    plot(cells, saturation, args.out / "overload.png", title)
    print("\n".join(lines))
    print(f"wrote {args.out}/overload.json, overload.md, overload.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
