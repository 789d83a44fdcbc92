"""How many workers serve an archive on a number of CPUs, from its cpu_threads: one rule for scripts/serve.sh (through
scripts/cpu_layout.py), the local fleet's replicas (tooling/fleet.py), a pod (scripts/kserve_layout.py) and a new
version an update registers (tooling/model_update.py).

Never more threads than CPUs: two PyTorch workers of every core each served 14-23 requests/s on 2 cores, against
122-136 for one and 160-164 for two of one thread (docs/batching.md, "Workers and threads on a CPU").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from handlers.options import HandlerOptions
from tooling.model_archive import handler_options


def cpu_workers(options: HandlerOptions, cpus: int) -> int:
    """Workers for `cpus` CPUs: as many as they hold at the archive's cpu_threads each; one for cpu_threads 0, whose
    worker runs as many threads as the CPUs it may use."""
    threads = options.cpu_threads
    return max(1, cpus // threads) if threads > 0 else 1


def cpu_cores_used(options: HandlerOptions, workers: int, cpus: int) -> int:
    """The CPUs `workers` of the archive keep busy, for the queue's throughput: workers x cpu_threads, at most `cpus`;
    all of them for cpu_threads 0 (each worker as many threads as the CPUs it may use)."""
    threads = options.cpu_threads or cpus
    return max(1, min(cpus, workers * threads))


@dataclass(frozen=True)
class Layout:
    """An archive's workers on `cpus` CPUs, and what is worth saying of them."""

    cpus: int
    workers: int
    threads: int  # each worker's
    busy: int  # the CPUs the workers keep busy (cpu_cores_used), for the queue's throughput
    note: str = ""  # why fewer workers than CPUs, and the archive option that gives one per CPU
    warning: str = ""  # more threads than CPUs, and the fix


def _unset_workers(fit: int) -> str:
    return f"leave WORKERS unset for {fit}"


def cpu_layout(
    archive: Path, cpus: int, workers: int | None = None, fewer: Callable[[int], str] = _unset_workers
) -> Layout:
    """The layout of `archive` on `cpus` CPUs: `workers` if given, else as many as they hold (cpu_workers). `fewer`
    says how given workers become the `fit` ones, for the warning (serve.sh's WORKERS by default). Raises NotAnArchive,
    or ValueError for handler options its workers would refuse."""
    options = handler_options(archive)
    threads = options.cpu_threads or cpus
    fit = cpu_workers(options, cpus)
    chosen = fit if workers is None else workers
    busy = cpu_cores_used(options, chosen, cpus)
    if chosen * threads > cpus:
        crowded_anyway = workers is None or fit * threads > cpus  # cpu_threads more than the CPUs
        fix = f"archive it with cpu_threads {cpus} or less" if crowded_anyway else fewer(fit)
        return Layout(cpus, chosen, threads, busy, warning=(
            f"{chosen} worker(s) of {threads} threads each on {cpus} CPUs: more threads than CPUs, which cost a "
            f"PyTorch archive 6-9x its requests/s; {fix} (docs/batching.md)"))  # fmt: skip
    note = ""
    if workers is None and fit < cpus:
        every = ": every CPU" if options.cpu_threads == 0 else ""
        note = (f"{archive.name}'s workers run {threads} threads each (its cpu_threads {options.cpu_threads}{every}), "
                f"so {fit} on {cpus} CPUs; archived with --handler-option cpu_threads=1 it runs one per CPU, the "
                "layout measured fastest (docs/checkpoints.md)")  # fmt: skip
    return Layout(cpus, chosen, threads, busy, note=note)
