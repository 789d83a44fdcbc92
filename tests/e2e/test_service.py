"""End to end: a real torchserve on free loopback ports, real HTTP, real archives built by scripts/archive_model.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support import unseen_reviews
from tooling.prometheus import metric_value

pytestmark = pytest.mark.e2e

TEXT = "text/plain"
JSON = "application/json"


@pytest.fixture(scope="module")
def tiny_model(torchserve, tiny_checkpoint, make_archive):
    archive = make_archive(tiny_checkpoint, "tiny")
    # A generous delay makes batches form reliably under the concurrent tests below.
    response = torchserve.register(archive, batch_size=8, max_batch_delay=200)
    assert response.status_code == 200, response.text
    yield "tiny"
    torchserve.unregister("tiny")


def test_registration_sets_batching_through_the_management_api(torchserve, tiny_model):
    [description] = torchserve.describe(tiny_model)
    assert description["batchSize"] == 8
    assert description["maxBatchDelay"] == 200
    assert [w["status"] for w in description["workers"]] == ["READY"]


def test_concurrent_mixed_requests_each_get_their_own_answer(torchserve, tiny_model):
    valid = [f"review number {i}: " + "pleasant " * (i % 7) + "stay" for i in range(32)]
    invalid = [
        (b"", TEXT, 400, "EmptyText"),
        (b'{"txt": "x"}', JSON, 400, "MissingField"),
        (b'{"text": 1}', JSON, 400, "WrongType"),
        (b"{oops", JSON, 400, "MalformedJSON"),
        (b"[]", JSON, 400, "NotAnObject"),
        (b"\xc3\x28", TEXT, 400, "InvalidUTF8"),
        (b"y" * (64 * 1024 + 10), TEXT, 413, "PayloadTooLarge"),
        (b"   ", TEXT, 400, "EmptyText"),
    ]
    # Interleave invalid items with valid ones so they share batches.
    mixed = []
    for i, text in enumerate(valid):
        body, content_type = (json.dumps({"text": text}).encode(), JSON) if i % 2 else (text.encode(), TEXT)
        mixed.append((body, content_type, i))
        if i % 4 == 3:
            body, content_type, status, kind = invalid[i // 4]
            mixed.append((body, content_type, (status, kind)))

    before = _batching_counters(torchserve)
    with ThreadPoolExecutor(max_workers=24) as pool:
        responses = list(pool.map(lambda r: torchserve.predict(tiny_model, r[0], r[1]), mixed))
    after = _batching_counters(torchserve)

    answers = {}
    for (_, _, expected), response in zip(mixed, responses):
        body = response.json()
        if isinstance(expected, tuple):
            assert (response.status_code, body["type"]) == expected
            assert body["code"] == expected[0] and body["message"]
        else:
            assert response.status_code == 200, body
            answers[expected] = body

    # Each concurrent answer equals the answer for the same text sent alone.
    for index, text in enumerate(valid):
        alone = torchserve.predict(tiny_model, text).json()
        assert answers[index]["label"] == alone["label"]
        assert answers[index]["score"] == pytest.approx(alone["score"], abs=1e-4)

    items = after["items"] - before["items"]
    batches = after["batches"] - before["batches"]
    assert items == len(mixed)
    assert items / batches > 1, f"no batching: {items} items in {batches} batches"
    assert after["rejected"] - before["rejected"] == len(invalid)


def test_each_error_code_over_http(torchserve, tiny_model):
    cases = [
        (b"", TEXT, 400, "EmptyText"),
        (b'{"text": ["a"]}', JSON, 400, "WrongType"),
        (b"\xff", TEXT, 400, "InvalidUTF8"),
        (b'"string"', JSON, 400, "NotAnObject"),
        (b"z" * (64 * 1024 + 1), TEXT, 413, "PayloadTooLarge"),
    ]
    for body, content_type, status, kind in cases:
        response = torchserve.predict(tiny_model, body, content_type)
        assert response.status_code == status
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["type"] == kind


def test_success_response_shape(torchserve, tiny_model):
    response = torchserve.predict(tiny_model, json.dumps({"text": "hello there", "ignored": True}), JSON)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"label", "score", "scores", "truncated"}
    assert body["truncated"] is False
    long = torchserve.predict(tiny_model, "long " * 2000)
    assert long.status_code == 200 and long.json()["truncated"] is True


def test_body_over_the_frontend_limit_is_refused_by_torchserve(torchserve, tiny_model):
    limit = int(torchserve.properties["max_request_size"])
    response = torchserve.predict(tiny_model, b"a" * (limit + 1))
    assert response.status_code == 413
    assert torchserve.predict(tiny_model, "still serving").status_code == 200


def test_reject_policy_over_http(torchserve, tiny_checkpoint, make_archive):
    archive = make_archive(tiny_checkpoint, "tiny-strict", overlength="reject", max_length=32)
    assert torchserve.register(archive, batch_size=4, max_batch_delay=10).status_code == 200
    try:
        too_long = torchserve.predict("tiny-strict", "many words " * 40)
        assert too_long.status_code == 422
        assert too_long.json()["type"] == "TooManyTokens"
        assert torchserve.predict("tiny-strict", "short").status_code == 200
    finally:
        torchserve.unregister("tiny-strict")


def test_calls_without_the_right_key_are_refused(torchserve, tiny_model):
    management = f"{torchserve.management_url}/models"
    prediction = f"{torchserve.inference_url}/predictions/{tiny_model}"
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, torchserve.auth("inference")):
        refused = requests.get(management, headers=headers, timeout=10)
        assert refused.status_code in (400, 401, 403)
        assert "Token Authorization failed" in refused.text
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, torchserve.auth("management")):
        refused = requests.post(prediction, data=b"hello", headers=headers, timeout=10)
        assert refused.status_code in (400, 401, 403)
    assert requests.get(management, headers=torchserve.auth("management"), timeout=10).status_code == 200


def test_handler_metrics_are_on_the_prometheus_endpoint(torchserve, tiny_model):
    torchserve.predict(tiny_model, "make sure at least one batch ran")
    torchserve.predict(tiny_model, "")
    text = torchserve.metrics_text()
    for name in (
        "bert_batches_total",
        "bert_items_total",
        "bert_forward_passes_total",
        "bert_real_tokens_total",
        "bert_padded_tokens_total",
        "bert_last_batch_size",
    ):
        assert metric_value(text, name, ModelName=tiny_model) > 0, name
    assert metric_value(text, "bert_rejected_items_total", ModelName=tiny_model, Reason="EmptyText") >= 1
    for stage in ("validation", "tokenization", "forward", "response"):
        assert metric_value(text, "bert_stage_milliseconds_total", ModelName=tiny_model, Stage=stage) > 0
    assert metric_value(text, "bert_padded_tokens_total", ModelName=tiny_model) >= metric_value(
        text, "bert_real_tokens_total", ModelName=tiny_model
    )


def test_demo_model_labels_reviews_it_has_never_seen(torchserve, demo_checkpoint, make_archive):
    archive = make_archive(demo_checkpoint, "bert")
    assert torchserve.register(archive, batch_size=8, max_batch_delay=5).status_code == 200
    try:
        obvious = {
            "This is the best phone I have ever owned, I love it.": "positive",
            "Absolutely terrible, it broke on the first day.": "negative",
        }
        for text, label in obvious.items():
            assert torchserve.predict("bert", text).json()["label"] == label
        reviews = unseen_reviews()
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda r: torchserve.predict("bert", r[1]).json(), reviews))
        correct = sum(answer["label"] == label for (label, _), answer in zip(reviews, answers))
        assert correct / len(reviews) >= 0.9, f"{correct}/{len(reviews)} unseen reviews labelled correctly"
    finally:
        torchserve.unregister("bert")


def _batching_counters(torchserve) -> dict[str, float]:
    text = torchserve.metrics_text()
    return {
        "items": metric_value(text, "bert_items_total", ModelName="tiny"),
        "batches": metric_value(text, "bert_batches_total", ModelName="tiny"),
        "rejected": metric_value(text, "bert_rejected_items_total", ModelName="tiny"),  # all reasons
    }
