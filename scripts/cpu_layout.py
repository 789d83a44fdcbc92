"""How many workers serve an archive on this host's CPUs, for scripts/serve.sh, as shell assignments to `eval`.

    eval "$(python -m scripts.cpu_layout model_store/bert.mar [--workers W])"
    # CPUS=<the CPUs a worker may use>  WORKERS=<W, or as many as they hold>  THREADS=<each worker's>
    # LAYOUT_NOTE='<a line to print, or empty>'  LAYOUT_WARNING='<a line for standard error, or empty>'

The CPUs are those the handler counts (handlers/cpu_quota.py: the affinity, capped by a cgroup's CPU quota); the
workers, unless given, as many as they hold at the archive's cpu_threads each (tooling/model_archive.cpu_workers):
one per CPU for the demo archive's one thread, the layout measured fastest, and one for an archive whose workers
each take every CPU (cpu_threads 0), said in the note with the option that gives one per CPU. Workers that put
more threads than CPUs (given so, or one of an archive whose cpu_threads is more than the CPUs) are kept, with the
warning: PyTorch's thread pools collapse then (docs/batching.md, "Workers and threads on a CPU").
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from handlers.cpu_quota import usable_cpus
from tooling.cli_arguments import existing_file, positive_int
from tooling.model_archive import NotAnArchive, cpu_workers, handler_options


@dataclass(frozen=True)
class Layout:
    cpus: int
    workers: int
    threads: int  # each worker's
    note: str = ""
    warning: str = ""

    def shell(self) -> str:
        values = {"CPUS": self.cpus, "WORKERS": self.workers, "THREADS": self.threads, "LAYOUT_NOTE": self.note,
                  "LAYOUT_WARNING": self.warning}  # fmt: skip
        return "\n".join(f"{name}={shlex.quote(str(value))}" for name, value in values.items())


def cpu_layout(archive: Path, cpus: int, workers: int | None = None) -> Layout:
    """The layout of `archive` on `cpus` CPUs, with `workers` if given."""
    options = handler_options(archive)
    threads = options.cpu_threads or cpus
    fit = cpu_workers(options, cpus)
    chosen = fit if workers is None else workers
    if chosen * threads > cpus:
        fix = f"leave WORKERS unset for {fit}" if workers is not None else f"archive it with cpu_threads {cpus} or less"
        return Layout(cpus, chosen, threads, warning=(
            f"{chosen} worker(s) of {threads} threads each on {cpus} CPUs: more threads than CPUs, which cost a "
            f"PyTorch archive 6-9x its requests/s; {fix} (docs/batching.md)"))  # fmt: skip
    note = ""
    if workers is None and fit < cpus:
        every = ": every CPU" if options.cpu_threads == 0 else ""
        note = (f"{archive.name}'s workers run {threads} threads each (its cpu_threads {options.cpu_threads}{every}), "
                f"so {fit} on {cpus} CPUs; archived with --handler-option cpu_threads=1 it runs one per CPU, the "
                "layout measured fastest (docs/checkpoints.md)")  # fmt: skip
    return Layout(cpus, chosen, threads, note=note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=existing_file)
    parser.add_argument("--workers", type=positive_int, help="as given (serve.sh's WORKERS)")
    args = parser.parse_args(argv)
    try:
        layout = cpu_layout(args.archive, usable_cpus(), args.workers)
    except (NotAnArchive, ValueError) as exc:  # not an archive, or handler options its workers would refuse
        parser.error(str(exc))
    print(layout.shell())
    return 0


if __name__ == "__main__":
    sys.exit(main())
