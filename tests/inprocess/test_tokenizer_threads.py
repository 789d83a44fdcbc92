"""The Rust tokenizer's thread pool follows the handler's cpu_threads, as the forward pass's pools do.

Its batch call runs on rayon's process-wide pool, which starts all its threads when the process's first
batch call builds it. Each case runs in a fresh process (the pool is fixed for a process's life) that loads
a checkpoint through the one loader and counts the threads the first batch call starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from handlers.cpu_quota import usable_cpus

REPO = Path(__file__).resolve().parents[2]

FIRST_BATCH_THREADS = """
import os, sys
from pathlib import Path
from handlers.loading import load_model
from handlers.options import HandlerOptions
from handlers.tokenization import encode

served = load_model(Path(sys.argv[1]), HandlerOptions(cpu_threads=int(sys.argv[2])), None)
before = set(os.listdir("/proc/self/task"))  # thread ids: a loading thread that exits meanwhile is not counted
encode(served.encoder, ["a review of a quiet hôtel room"] * 64)  # not ASCII: the Rust call, not word by word
print(len(set(os.listdir("/proc/self/task")) - before))
print(served.description)
"""


def first_batch_threads(checkpoint: Path, cpu_threads: int, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Threads the first batch call starts in a fresh process, and the load's description."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH_THREADS, str(checkpoint), str(cpu_threads)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    started, description = done.stdout.strip().splitlines()[-2:]
    return int(started), description


@pytest.mark.parametrize("cpu_threads", [1, 3])
def test_the_tokenizer_starts_cpu_threads_threads_whatever_the_worker_inherited(tiny_checkpoint, cpu_threads):
    """TorchServe's workers inherit the frontend's environment; the model's option is the one setting."""
    started, description = first_batch_threads(
        tiny_checkpoint, cpu_threads, env={**os.environ, "RAYON_NUM_THREADS": "5"}
    )
    assert started == cpu_threads
    assert f"tokenizer {cpu_threads} thread(s)" in description


def test_by_default_the_tokenizer_starts_one_thread_per_usable_cpu(tiny_checkpoint):
    started, description = first_batch_threads(tiny_checkpoint, 0)
    assert started == usable_cpus()
    assert f"tokenizer {usable_cpus()} thread(s)" in description
