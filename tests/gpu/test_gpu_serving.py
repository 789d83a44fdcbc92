"""The GPU path through a real TorchServe on a CUDA host: float16 answers, several workers per GPU,
a worker killed on the GPU, and TorchServe's GPU system metrics.

Marked gpu: skipped, with the reason shown, where torch sees no CUDA device (CI has none). Run them
on a GPU host with `.venv/bin/python -m pytest -m gpu`.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from tests.answers import assert_same_answer, candidate_texts, distinguishable_texts
from tooling.torchserve import TorchServe

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

# The issue's bar for float16 against float32: every probability within 2e-2.
FP16_TOLERANCE = 2e-2
# float32 on the GPU against float32 on the CPU (the in-process handler): their kernels reduce in other
# orders; on the H100 the tiny model's probabilities differed by up to 2.3e-4 (2026-11-23), so 1e-3.
FP32_TOLERANCE = 1e-3


def workers(server: TorchServe, model: str) -> list[dict]:
    return server.describe(model)[0]["workers"]


def load_lines(server: TorchServe, model: str) -> dict[str, str]:
    """Each of `model`'s workers' load line (handlers/bert_handler.py: "loaded ... max_batch_tokens=..."), by worker.

    Only this model's: TorchServe names a worker W-<port>-<model>_<version> in every line it logs for it, and the
    session's server logs other models' workers too. A line is copied into several of its logs: one per worker."""
    pattern = re.compile(rf"\bW-(\d+)-{re.escape(model)}_")
    lines: dict[str, str] = {}
    for line in server.log_text().splitlines():
        worker = pattern.search(line)
        if worker and "loaded " in line and "max_batch_tokens=" in line:
            lines.setdefault(worker.group(1), line)
    return lines


def assert_every_worker_loaded_on_the_gpu(server: TorchServe, model: str, cuda_graphs: bool = False) -> None:
    """Every worker said at load that it runs on CUDA (torch_forward's description: "PyTorch ... on cuda:N"), not on
    a CPU it fell back to; with `cuda_graphs`, that it captured them."""
    expected = len(workers(server, model))
    deadline = time.monotonic() + 10  # the frontend writes a worker's stdout to its logs a moment after READY
    while len(lines := load_lines(server, model)) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(lines) == expected, lines
    for line in lines.values():
        assert re.search(r"PyTorch \S+ on cuda:\d+ ", line), line
        assert ("CUDA graphs: " in line) == cuda_graphs, line


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_float16_on_the_gpu_answers_as_float32_does(torchserve, demo_checkpoint, make_archive, cuda_graphs):
    from transformers import AutoTokenizer

    from handlers.options import HandlerOptions
    from handlers.tokenization import text_encoder
    from handlers.torch_forward import load_torch_forward
    from tooling.corpus import LABELS, held_out_examples
    from tooling.onnx_export import fixed_texts, probabilities

    name = f"gpu-demo-{'graphs' if cuda_graphs else 'eager'}"
    archive = make_archive(demo_checkpoint, name, cuda_graphs=cuda_graphs)  # dtype auto: float16 on CUDA
    assert torchserve.register(archive, batch_size=32, max_batch_delay=5, initial_workers=2).status_code == 200
    try:
        assert all(worker["gpu"] for worker in workers(torchserve, name)), workers(torchserve, name)
        assert_every_worker_loaded_on_the_gpu(torchserve, name, cuda_graphs)
        texts = [text for text, _ in held_out_examples()] + fixed_texts()
        with ThreadPoolExecutor(max_workers=32) as pool:
            responses = list(pool.map(lambda t: torchserve.predict(name, t.encode(), "text/plain"), texts))
        assert [r.status_code for r in responses] == [200] * len(texts)
        served = np.array([[r.json()["scores"][label] for label in LABELS] for r in responses])
    finally:
        torchserve.unregister(name)

    tokenizer = AutoTokenizer.from_pretrained(demo_checkpoint)
    forward = load_torch_forward(demo_checkpoint, HandlerOptions().for_device("cpu"), None, 0, 512)
    fp32 = probabilities(forward, text_encoder(tokenizer, 256), texts)
    difference = np.abs(served - fp32).max(axis=1)
    print(f"\nfloat16 on the GPU against float32 on the CPU, {len(texts)} texts: max |dp| {difference.max():.2e}")
    assert difference.max() <= FP16_TOLERANCE
    # A label may differ only where float32 itself is within the tolerance of the boundary.
    margin = np.abs(fp32[:, 1] - 0.5)
    flipped = (served.argmax(-1) != fp32.argmax(-1)) & (margin > FP16_TOLERANCE)
    assert not flipped.any(), [texts[i][:60] for i in np.flatnonzero(flipped)]


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_each_request_gets_its_own_answer_with_several_workers_on_one_gpu(
    torchserve, tiny_checkpoint, make_archive, loaded_handler, unpacked_model_dir, cuda_graphs
):
    # float32 on the GPU, so answers compare with the CPU's alone at a tolerance finer than their spacing.
    separation = 3 * FP32_TOLERANCE
    # 100 texts 3e-3 apart (a thousand cannot be, in [0, 1]), each sent four times in a shuffled order.
    distinct, answers = distinguishable_texts(
        loaded_handler, unpacked_model_dir, islice(candidate_texts(), 5000), 100, separation
    )
    order = [i for i in range(len(distinct)) for _ in range(4)]
    random.Random(0).shuffle(order)
    texts, alone = [distinct[i] for i in order], [answers[i] for i in order]
    name = f"gpu-tiny-{'graphs' if cuda_graphs else 'eager'}"
    archive = make_archive(tiny_checkpoint, name, dtype="float32", cuda_graphs=cuda_graphs)
    assert torchserve.register(archive, batch_size=16, max_batch_delay=5, initial_workers=4).status_code == 200
    try:
        assert len(workers(torchserve, name)) == 4
        assert all(worker["gpu"] for worker in workers(torchserve, name))
        assert_every_worker_loaded_on_the_gpu(torchserve, name, cuda_graphs)  # and captured them, when asked to
        with ThreadPoolExecutor(max_workers=64) as pool:
            responses = list(pool.map(lambda t: torchserve.predict(name, t.encode(), "text/plain"), texts))
    finally:
        torchserve.unregister(name)
    for response, single in zip(responses, alone):
        assert response.status_code == 200, response.text
        assert_same_answer(response.json(), single, tolerance=FP32_TOLERANCE)


# A one-layer BERT 65,536 wide in its feed-forward layer that embeds 8,192 tokens: one text of 8,192
# tokens needs gigabytes of activations in float16, a short text a few megabytes; a cap between the two
# makes only the long text run out of memory.
WIDE_TOKENS = 8192
WIDE_CAP_BYTES = 512 * 2**20


def wide_checkpoint(out_dir: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from tooling.checkpoints import LABELS, minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True, model_max_length=WIDE_TOKENS)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=65536, max_position_embeddings=WIDE_TOKENS, id2label=LABELS,
                        label2id={v: k for k, v in LABELS.items()})  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_a_real_cuda_out_of_memory_is_isolated_to_the_item_that_needs_the_memory(
    torchserve, make_archive, tmp_path_factory
):
    import torch

    fraction = WIDE_CAP_BYTES / torch.cuda.get_device_properties(0).total_memory
    checkpoint = wide_checkpoint(tmp_path_factory.mktemp("wide") / "checkpoint")
    # One forward pass for the whole batch (no token budget split), so the culprit fails beside its neighbours.
    archive = make_archive(checkpoint, "gpu-oom", cuda_memory_fraction=fraction, max_length=WIDE_TOKENS,
                           max_batch_tokens=10**6)  # fmt: skip
    assert torchserve.register(archive, batch_size=8, max_batch_delay=2000, initial_workers=1).status_code == 200
    try:
        assert_every_worker_loaded_on_the_gpu(torchserve, "gpu-oom")
        neighbours = [f"short review number {i}, fine." for i in range(7)]
        culprit = "a " * (WIDE_TOKENS - 2)
        texts = [*neighbours[:3], culprit, *neighbours[3:]]
        with ThreadPoolExecutor(max_workers=len(texts)) as pool:
            together = list(pool.map(lambda t: torchserve.predict("gpu-oom", t.encode(), "text/plain"), texts))
        alone = [torchserve.predict("gpu-oom", t.encode(), "text/plain") for t in neighbours]
        after = torchserve.predict("gpu-oom", b"the worker serves after its out-of-memory", "text/plain")
    finally:
        torchserve.unregister("gpu-oom")
    assert together[3].status_code == 507, together[3].text
    assert together[3].json()["type"] == "OutOfMemory", together[3].text
    served = [r for i, r in enumerate(together) if i != 3]
    assert [r.status_code for r in served] == [200] * 7, [r.text for r in served]
    for response, single in zip(served, alone):
        assert single.status_code == 200
        assert response.json()["label"] == single.json()["label"]
        for label, score in single.json()["scores"].items():
            assert abs(response.json()["scores"][label] - score) <= 1e-3
    assert after.status_code == 200, after.text
    # The culprit failed inside a group with its neighbours, and bisection narrowed it down.
    failed_groups = re.findall(r"forward pass failed for a group of (\d+) items.*out of memory", torchserve.log_text())
    assert any(int(size) > 1 for size in failed_groups), failed_groups


def test_a_worker_killed_on_the_gpu_is_replaced_and_serves_again(torchserve, tiny_checkpoint, make_archive):
    archive = make_archive(tiny_checkpoint, "gpu-kill")
    assert torchserve.register(archive, batch_size=8, max_batch_delay=5).status_code == 200
    try:
        [worker] = workers(torchserve, "gpu-kill")
        assert worker["gpu"]
        assert_every_worker_loaded_on_the_gpu(torchserve, "gpu-kill")
        os.kill(worker["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            [replacement] = workers(torchserve, "gpu-kill")
            if replacement["pid"] != worker["pid"] and replacement["status"] == "READY":
                break
            time.sleep(0.5)
        else:
            pytest.fail("no replacement worker became READY within 120 s")
        assert replacement["gpu"]
        answers = [torchserve.predict("gpu-kill", f"after the kill {i}") for i in range(10)]
        assert [a.status_code for a in answers] == [200] * 10
    finally:
        torchserve.unregister("gpu-kill")


def test_the_gpu_system_metrics_reach_the_metrics_endpoint(model_store, tmp_path_factory):
    # TorchServe collects system metrics every metric_time_interval seconds (60 by default); GPU ones
    # need nvgpu and pynvml, which the set-up installs.
    server = TorchServe(tmp_path_factory.mktemp("gpu-metrics"), model_store, overrides={"metric_time_interval": "5"})
    server.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = server.metrics_text()
            if all(f"{name}{{" in text for name in ("GPUUtilization", "GPUMemoryUsed")):
                break
            time.sleep(1)
        else:
            pytest.fail("GPUUtilization/GPUMemoryUsed not on /metrics within 60 s:\n" + text[-2000:])
        assert "ModuleNotFoundError" not in server.log_text()
    finally:
        server.stop()
