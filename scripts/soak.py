"""Soak: steady mixed traffic against a private TorchServe; reports failures and worker memory.

    python -m scripts.soak --minutes 30            # the full soak (not part of CI)
    python -m scripts.soak --short                 # ~1 minute, run by the test suite

Traffic mixes valid texts of many lengths with invalid requests (empty, bad JSON,
invalid UTF-8, oversized), each with a known expected status. A request "fails"
when its status differs from the expected one or it raises. Worker RSS is read
after a warm-up and again at the end. --short exits non-zero if anything failed
or RSS grew by more than --max-rss-growth-mb (default 64 MB).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

from scripts.random_model import build_random_classifier
from scripts.torchserve_process import TorchServe

WORDS = [
    "the",
    "a",
    "room",
    "film",
    "staff",
    "great",
    "terrible",
    "service",
    "slow",
    "fast",
    "clean",
    "dirty",
    "loved",
    "hated",
    "would",
    "return",
    "never",
    "again",
]


def make_request(rng: random.Random) -> tuple[bytes, str, int]:
    """One request and the status it must get."""
    kind = rng.random()
    if kind < 0.80:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 300)))
        if rng.random() < 0.5:
            return json.dumps({"text": text, "id": rng.random()}).encode(), "application/json", 200
        return text.encode(), "text/plain", 200
    if kind < 0.85:
        return b"   ", "text/plain", 400
    if kind < 0.90:
        return b'{"text": ', "application/json", 400
    if kind < 0.95:
        return b"\xff\xfe bad bytes", "text/plain", 400
    return b"x" * (64 * 1024 + 1), "text/plain", 413


def worker_rss_mb(server: TorchServe, model: str) -> float:
    pids = [w["pid"] for w in server.describe(model)[0]["workers"]]
    return sum(psutil.Process(pid).memory_info().rss for pid in pids) / 2**20


def drive(server: TorchServe, model: str, seconds: float, clients: int, seed: int) -> tuple[int, list[str]]:
    failures: list[str] = []
    sent = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        nonlocal sent
        rng = random.Random(seed * 1000 + n)
        session = requests.Session()
        url = f"{server.inference_url}/predictions/{model}"
        auth = server.auth("inference")  # read the key file once per client, not per request
        while time.monotonic() < deadline:
            body, content_type, expected = make_request(rng)
            headers = {"Content-Type": content_type, **auth}
            try:
                status = session.post(url, data=body, headers=headers, timeout=60).status_code
                problem = None if status == expected else f"status {status}, expected {expected}"
            except requests.RequestException as exc:
                problem = type(exc).__name__
            with lock:
                sent += 1
                if problem:
                    failures.append(problem)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent, failures


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows up even when piped
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--short", action="store_true", help="40 s of traffic after a 10 s warm-up, then assert")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint to serve (default: a tiny random BERT)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--workdir", type=Path, help="where the private server keeps its files (default: a temp dir)")
    args = parser.parse_args(argv)

    from scripts.archive_model import build_archive

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
