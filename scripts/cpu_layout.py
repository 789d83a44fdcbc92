"""How many workers serve an archive on this host's CPUs, for scripts/serve.sh, as shell assignments to `eval`.

    eval "$(python -m scripts.cpu_layout model_store/bert.mar [--workers W])"
    # CPUS=<the CPUs a worker may use>  WORKERS=<W, or as many as they hold>
    # LAYOUT_NOTE='<a line to print, or empty>'  LAYOUT_WARNING='<a line for standard error, or empty>'

The CPUs are those the handler counts (handlers/cpu_quota.py: the affinity, capped by a cgroup's CPU quota); the
workers, unless given, as many as they hold at the archive's cpu_threads each (tooling/cpu_layout.py): one per CPU
for the demo archive's one thread, the layout measured fastest, and one for an archive whose workers each take every
CPU (cpu_threads 0), said in the note with the option that gives one per CPU. Workers that put more threads than
CPUs (given so, or one of an archive whose cpu_threads is more than the CPUs) are kept, with the warning: PyTorch's
thread pools collapse then (docs/batching.md, "Workers and threads on a CPU").
"""

from __future__ import annotations

import argparse
import shlex
import sys

from handlers.cpu_quota import usable_cpus
from tooling.cli_arguments import existing_file, positive_int
from tooling.cpu_layout import Layout, cpu_layout
from tooling.model_archive import NotAnArchive


def shell(layout: Layout) -> str:
    """The layout as the shell assignments serve.sh evaluates, each value quoted."""
    values = {"CPUS": layout.cpus, "WORKERS": layout.workers, "LAYOUT_NOTE": layout.note,
              "LAYOUT_WARNING": layout.warning}  # fmt: skip
    return "\n".join(f"{name}={shlex.quote(str(value))}" for name, value in values.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=existing_file)
    parser.add_argument("--workers", type=positive_int, help="as given (serve.sh's WORKERS)")
    args = parser.parse_args(argv)
    try:
        layout = cpu_layout(args.archive, usable_cpus(), args.workers)
    except (NotAnArchive, ValueError) as exc:  # not an archive, or handler options its workers would refuse
        parser.error(str(exc))
    print(shell(layout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
