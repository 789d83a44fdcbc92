"""What the latency budget gives TorchServe, printed as shell assignments to `eval` (scripts/serve.sh).

    eval "$(python -m scripts.latency_budget --device cpu --units 2 --workers 2 --batch-size 8 [--budget-ms 1000])"
    # LATENCY_BUDGET_MS=1000  THROUGHPUT_RPS=180  BATCH_SIZE=8  JOB_QUEUE_SIZE=66

BATCH_SIZE is the one asked for, or smaller when the budget is shorter than five batch times
(tooling/latency_budget.py, admission); a note on standard error says so.

--throughput-rps replaces the measured figure for the device (tooling/latency_budget.py).
"""

from __future__ import annotations

import argparse
import sys

from tooling.cli_arguments import positive_float, positive_int
from tooling.latency_budget import DEFAULT_BUDGET_MS, admission, batch_time_ms, machine_throughput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-ms", type=positive_int, default=DEFAULT_BUDGET_MS)
    parser.add_argument("--device", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--units", type=positive_int, required=True, help="CPU cores or GPUs")
    parser.add_argument("--workers", type=positive_int, required=True)
    parser.add_argument("--batch-size", type=positive_int, required=True)
    parser.add_argument("--throughput-rps", type=positive_float, help="measured requests/s (default: the device's)")
    args = parser.parse_args(argv)
    throughput = args.throughput_rps or machine_throughput(args.device, args.units)
    try:
        result = admission(args.budget_ms, throughput, args.workers, args.batch_size)
    except ValueError as exc:
        print(f"latency_budget: {exc}", file=sys.stderr)
        return 2
    print(f"LATENCY_BUDGET_MS={result.budget_ms}")
    print(f"THROUGHPUT_RPS={result.throughput_rps:g}")
    print(f"BATCH_SIZE={result.batch_size}")
    if result.batch_size < args.batch_size:
        took = batch_time_ms(args.batch_size, throughput, args.workers)
        note = (f"latency_budget: a {result.budget_ms} ms budget leaves room for batches of {result.batch_size}, "
                f"not {args.batch_size} (a batch takes {took:.0f} ms at {throughput:g} req/s)")  # fmt: skip
        print(note, file=sys.stderr)
    print(f"JOB_QUEUE_SIZE={result.job_queue_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
