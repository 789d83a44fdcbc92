"""Overload through a real TorchServe: late requests are refused before the model, and shedding never mixes answers.

Speed under overload lives in the benchmark (scripts/overload.py, docs/benchmarks.md "Overload"); these
tests assert what a client receives and what the handler's own counters say it computed.
"""

from __future__ import annotations

import json
import os
import threading
import time

import psutil
import pytest
import requests

from handlers.deadline import DEADLINE_HEADER
from tests.answers import TOLERANCE, assert_same_answer, candidate_texts, distinguishable_texts
from tests.support import batches_received, metrics_once, wait_until
from tooling.bench.loadgen import closed_loop
from tooling.bench.openloop import open_loop
from tooling.bench.server_cpu import server_cpu_cores
from tooling.prometheus import metric_value

pytestmark = [pytest.mark.e2e]

HOLD = "HOLDWORKER"
LATE_TEXT = "a review that waited too long for its turn"


def counters(text: str, model: str) -> dict[str, float]:
    """The handler's counters for `model`, from /metrics text."""
    return {
        "items": metric_value(text, "bert_items_total", ModelName=model),
        "forward_passes": metric_value(text, "bert_forward_passes_total", ModelName=model),
        "late": metric_value(text, "bert_rejected_items_total", ModelName=model, Reason="DeadlineExceeded"),
    }


def admitted(server, model: str) -> float:
    """Requests for `model` the frontend has taken in (TorchServe counts each as it arrives)."""
    return metric_value(server.metrics_text(), "ts_inference_requests_total", model_name=model)


def deadline_in(seconds: float) -> dict[str, str]:
    return {DEADLINE_HEADER: str(int(1000 * (time.time() + seconds)))}


def test_a_request_past_its_deadline_is_answered_503_and_never_reaches_the_model(
    torchserve, tiny_checkpoint, make_archive
):
    model = "tiny-deadline"
    archive = make_archive(tiny_checkpoint, model, fault_marker=HOLD, fault_delay_s=2.0)
    # One item per batch: each request's batch is its own, so the counters attribute every forward pass.
    assert torchserve.register(archive, batch_size=1, max_batch_delay=1).status_code == 200
    try:
        headers = {"Content-Type": "text/plain", **torchserve.auth("inference")}
        url = f"{torchserve.inference_url}/predictions/{model}"
        before = counters(torchserve.metrics_text(), model)
        received = batches_received(torchserve, model)
        blocker = threading.Thread(target=torchserve.predict, args=(model, f"{HOLD} holds the worker"))
        blocker.start()
        # The worker has taken the blocker's batch: it holds it for two seconds from now.
        wait_until(lambda: batches_received(torchserve, model) > received, 30, f"{model}'s worker to take the blocker")
        # Both queue behind the held worker (FIFO, one worker) for about two seconds, whenever they arrive.
        late, patient = {}, {}
        senders = [
            threading.Thread(target=lambda: late.update(r=requests.post(
                url, data=LATE_TEXT, headers={**headers, **deadline_in(0.5)}, timeout=60))),
            threading.Thread(target=lambda: patient.update(r=requests.post(
                url, data="a patient review", headers={**headers, **deadline_in(60)}, timeout=60))),
        ]  # fmt: skip
        arrived = admitted(torchserve, model)
        for index, sender in enumerate(senders, start=1):  # the late request first: refused; the patient one served
            sender.start()
            wait_until(
                lambda n=arrived + index: admitted(torchserve, model) >= n, 30, f"sender {index} to reach {model}"
            )
        for thread in [blocker, *senders]:
            thread.join()
        # The handler's counters reach /metrics through the worker's log stream, after the answers: the patient
        # request's batch counts its forward pass after its item, so both are waited for.
        after = counters(
            metrics_once(
                torchserve,
                model,
                {"bert_items_total": before["items"] + 3, "bert_forward_passes_total": before["forward_passes"] + 2},
            ),
            model,
        )

        assert late["r"].status_code == 503, late["r"].text
        body = late["r"].json()
        assert body["type"] == "DeadlineExceeded" and "not computed" in body["message"]
        assert patient["r"].status_code == 200, patient["r"].text
        # Three requests reached the handler; only the blocker and the patient one reached the model.
        assert after["items"] - before["items"] == 3
        assert after["forward_passes"] - before["forward_passes"] == 2
        assert after["late"] - before["late"] == 1
        log = torchserve.log_text()
        assert "rejected item: reason=DeadlineExceeded status=503 index=0 request_id=" in log
        assert LATE_TEXT not in log
    finally:
        torchserve.unregister(model)


def test_under_a_2x_open_loop_burst_every_admitted_answer_is_its_own(
    torchserve, shared_model, loaded_handler, unpacked_model_dir
):
    texts, alone = distinguishable_texts(loaded_handler, unpacked_model_dir, candidate_texts(), 200, 3 * TOLERANCE)
    url = f"{torchserve.inference_url}/predictions/{shared_model}"
    headers = {"Content-Type": "text/plain", **torchserve.auth("inference")}
    saturation = closed_loop(url, headers, texts, 16, 1.5)["rps"]
    rate = 2 * saturation
    # Bounded: at most 600 requests, whatever this machine's speed.
    with server_cpu_cores(torchserve, shared_model) as cores:
        result = open_loop(url, headers, texts, rate, min(2.0, 600 / rate), 10.0, "poisson", deadline=True,
                           keep_bodies=True)  # fmt: skip
    answered = [o for o in result.outcomes if o.status == 200]
    assert answered, f"nothing answered at {rate:.0f} req/s: {result.summary()}"
    for outcome in answered:
        assert_same_answer(json.loads(outcome.body), alone[outcome.index % len(texts)])
    others = {o.status for o in result.outcomes if o.status != 200}
    assert others <= {503}, result.summary()  # shed (queue full, deadline passed): never an error or a hang
    assert set(result.refused) <= {"503 ServiceUnavailableException", "503 DeadlineExceeded"}, result.refused
    # The benchmark's CPU split (where the cores went under overload): both the model's workers (computing) and the
    # frontend (queueing, batching, refusing) used CPU, and together no more than the cores there were over the same
    # seconds, however busy the machine: each process's CPU time is read in 1/100 s ticks (one of rounding each)
    # and a moment before the clock starts (a few milliseconds, on every core).
    workers_s, frontend_s = cores["workers"] * cores["seconds"], cores["frontend"] * cores["seconds"]
    assert workers_s > 0 and frontend_s > 0, cores
    processes = 1 + len(psutil.Process(torchserve.process.pid).children(recursive=True))
    available = len(os.sched_getaffinity(0))
    assert workers_s + frontend_s <= available * (cores["seconds"] + 0.05) + 0.01 * processes, (available, cores)
