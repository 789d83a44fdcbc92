"""Soak traffic: steady mixed requests against a private TorchServe, failures and worker memory.

scripts/soak.py is the command line. Traffic mixes valid texts of many lengths with invalid requests (empty, bad JSON,
invalid UTF-8, oversized), each with a known expected status. A request "fails"
when its status differs from the expected one or it raises. Worker RSS is read
after a warm-up and again at the end. --short exits non-zero if anything failed
or RSS grew by more than --max-rss-growth-mb (default 64 MB).
"""

from __future__ import annotations

import json
import random
import threading
import time

import psutil
import requests

from handlers.options import HandlerOptions
from tooling.torchserve import TorchServe

MAX_BYTES = HandlerOptions().max_bytes

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
    return b"x" * (MAX_BYTES + 1), "text/plain", 413


def drive_open_loop(
    server: TorchServe, model: str, seconds: float, rate: float, seed: int
) -> tuple[int, list[str], list[tuple[float, float]], list[float]]:
    """The same mix arriving open-loop at `rate` per second (Poisson), whatever the answers: (sent, failures,
    (sent at, seconds from its scheduled arrival) of each valid request answered 200, each request's send lag in
    seconds). A request fails as in drive(), or when it is not answered within 60 s."""
    from tooling.bench.openloop import open_loop_payloads

    rng = random.Random(seed)
    mix = [make_request(rng) for _ in range(2000)]
    payloads = [(body, {"Content-Type": content_type}) for body, content_type, _ in mix]
    url = f"{server.inference_url}/predictions/{model}"
    result = open_loop_payloads(url, server.auth("inference"), payloads, rate, seconds, 60.0, "poisson", seed=seed)
    failures, latencies = [], []
    for outcome in result.outcomes:
        expected = mix[outcome.index % len(mix)][2]
        if outcome.status != expected:
            failures.append(f"status {outcome.status}, expected {expected}")
        elif expected == 200:
            latencies.append((outcome.sent_at, outcome.seconds))
    return result.offered, failures, latencies, [outcome.lag for outcome in result.outcomes]


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
