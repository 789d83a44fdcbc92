"""Soak: steady mixed traffic against a private TorchServe; reports failures and worker memory.

    python -m scripts.soak --minutes 30            # the full soak (not part of CI)
    python -m scripts.soak --short                 # ~1 minute, run by the test suite

--short exits non-zero if anything failed or worker RSS grew by more than
--max-rss-growth-mb (default 64 MB). The traffic itself is tooling/soak.py.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from tooling.archiving import build_archive
from tooling.checkpoints import build_random_classifier
from tooling.soak import drive, worker_rss_mb
from tooling.torchserve import TorchServe


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows up even when piped
    # A SIGTERM (a CI timeout) unwinds through the `with TorchServe` below, which stops the server.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--short", action="store_true", help="40 s of traffic after a 10 s warm-up, then assert")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint to serve (default: a tiny random BERT)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--workdir", type=Path, help="where the private server keeps its files (default: a temp dir)")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    checkpoint = args.checkpoint or build_random_classifier(workdir / "tiny", "tiny")
    store = workdir / "store"
    build_archive(checkpoint, name="soak", export_path=store)
    seconds = 40.0 if args.short else args.minutes * 60
    with TorchServe(workdir / "server", store) as server:
        response = server.register("soak.mar", batch_size=8, max_batch_delay=5)
        if response.status_code != 200:
            print(response.text)
            return 1
        drive(server, "soak", 10.0, args.clients, seed=1)  # warm-up: allocator pools, caches
        start_rss = worker_rss_mb(server, "soak")
        print(f"soaking for {seconds:.0f}s with {args.clients} clients; worker RSS at start {start_rss:.1f} MB")
        outcome: list = []
        traffic = threading.Thread(target=lambda: outcome.extend(drive(server, "soak", seconds, args.clients, seed=2)))
        traffic.start()
        started = time.monotonic()
        # A leak grows steadily; warm-up growth levels off. Samples over time tell them apart.
        while traffic.is_alive():
            traffic.join(timeout=max(5.0, seconds / 10))
            if traffic.is_alive():
                print(f"  t={time.monotonic() - started:5.0f}s  worker RSS {worker_rss_mb(server, 'soak'):.1f} MB")
        sent, failures = outcome
        end_rss = worker_rss_mb(server, "soak")
    growth = end_rss - start_rss
    print(f"requests: {sent}, {sent / seconds:.1f}/s")
    print(f"failed requests: {len(failures)}" + (f" ({sorted(set(failures))[:5]})" if failures else ""))
    print(f"worker RSS: start {start_rss:.1f} MB, end {end_rss:.1f} MB, RSS growth {growth:+.1f} MB")
    if args.short and (failures or growth > args.max_rss_growth_mb):
        print(f"FAIL: expected no failures and RSS growth under {args.max_rss_growth_mb} MB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
