"""The handler in-process: a tiny BERT, the MiniLM tokenizer and TorchServe's own Context class."""

from __future__ import annotations

import json
import logging

import pytest

from tests.support import statuses
from tooling.inprocess import make_context, set_batch

TEXT = "text/plain"
JSON = "application/json"


def run(handler, context, items):
    data = set_batch(context, items)
    out = handler.handle(data, context)
    assert len(out) == len(items)
    return [json.loads(o) for o in out], statuses(context, len(items))


@pytest.fixture
def context(unpacked_model_dir):
    return make_context(unpacked_model_dir)


def test_mixed_batch_answers_every_item_by_index(loaded_handler, context):
    items = [
        (b"a lovely day at the beach", TEXT),
        (b"", TEXT),
        (b'{"text": "json works too", "lang": "en"}', JSON),
        (b'{"nope": "no text"}', JSON),
        (b"\xff\xfe", TEXT),
        (b'{"text": 7}', JSON),
        (b"[1, 2", JSON),
        (b"[1, 2]", JSON),
        (b"x" * (64 * 1024 + 1), TEXT),
        ("the last valid item 😀".encode(), TEXT),
    ]
    bodies, codes = run(loaded_handler, context, items)
    assert codes == [200, 400, 200, 400, 400, 400, 400, 400, 413, 200]
    expected_types = {
        1: "EmptyText",
        3: "MissingField",
        4: "InvalidUTF8",
        5: "WrongType",
        6: "MalformedJSON",
        7: "NotAnObject",
        8: "PayloadTooLarge",
    }
    for index, kind in expected_types.items():
        assert bodies[index]["type"] == kind
        assert bodies[index]["code"] == codes[index]
    for index in (0, 2, 9):
        body = bodies[index]
        assert body["label"] in ("negative", "positive")
        assert set(body["scores"]) == {"negative", "positive"}
        assert body["score"] == pytest.approx(max(body["scores"].values()))
        assert sum(body["scores"].values()) == pytest.approx(1.0, abs=1e-5)
        assert body["truncated"] is False


def test_results_keep_request_order_and_batched_equals_single(loaded_handler, unpacked_model_dir):
    texts = [
        "short",
        "a somewhat longer sentence about a hotel room with a view of the sea",
        "medium length review of a film",
        "word " * 120,
        "ok",
    ]
    batch_context = make_context(unpacked_model_dir)
    batched, _ = run(loaded_handler, batch_context, [(t.encode(), TEXT) for t in texts])
    for text, together in zip(texts, batched):
        alone, _ = run(loaded_handler, make_context(unpacked_model_dir), [(text.encode(), TEXT)])
        assert alone[0]["label"] == together["label"]
        for label in alone[0]["scores"]:
            assert together["scores"][label] == pytest.approx(alone[0]["scores"][label], abs=1e-4)
    # distinct inputs give distinct scores, so a swap of results would be visible above
    assert len({round(b["score"], 6) for b in batched}) == len(texts)


def test_batch_of_only_invalid_items(loaded_handler, context):
    bodies, codes = run(loaded_handler, context, [(b"", TEXT), (b"{}", JSON)])
    assert codes == [400, 400]
    assert [b["type"] for b in bodies] == ["EmptyText", "MissingField"]


def test_overlong_text_is_truncated_and_flagged(loaded_handler, context):
    long_text = "great " * 1000
    bodies, codes = run(loaded_handler, context, [(long_text.encode(), TEXT), (b"short one", TEXT)])
    assert codes == [200, 200]
    assert bodies[0]["truncated"] is True
    assert bodies[1]["truncated"] is False


def test_text_at_exactly_the_token_limit_is_not_truncated(loaded_handler, context):
    # 254 single-token words + [CLS] + [SEP] = 256 tokens = max_length
    bodies, codes = run(loaded_handler, context, [(("a " * 254).encode(), TEXT), (("a " * 255).encode(), TEXT)])
    assert codes == [200, 200]
    assert [b["truncated"] for b in bodies] == [False, True]


def test_reject_policy_answers_422_for_overlong_text(unpacked_model_dir):
    from handlers.bert_handler import BertSequenceClassifierHandler

    options = {"overlength": "reject", "max_length": 16, "warmup": False}
    handler = BertSequenceClassifierHandler()
    handler.initialize(make_context(unpacked_model_dir, options))
    context = make_context(unpacked_model_dir, options)
    bodies, codes = run(
        handler, context, [(b"one two three four five six seven eight nine ten " * 3, TEXT), (b"fits easily", TEXT)]
    )
    assert codes == [422, 200]
    assert bodies[0]["type"] == "TooManyTokens"


def test_max_length_is_clipped_to_the_model_maximum(unpacked_model_dir):
    from handlers.bert_handler import BertSequenceClassifierHandler

    handler = BertSequenceClassifierHandler()
    handler.initialize(make_context(unpacked_model_dir, {"max_length": 100_000, "warmup": False}))
    assert handler.served.max_length == 512


def test_rejected_items_are_logged_with_reason_index_and_request_id_but_not_text(loaded_handler, context, caplog):
    secret = "SECRET-MARKER-3f1c"
    caplog.set_level(logging.INFO)
    run(loaded_handler, context, [(f"valid {secret}".encode(), TEXT), (f'{{"no_text": "{secret}"}}'.encode(), JSON)])
    rejected = [r.getMessage() for r in caplog.records if "rejected item" in r.getMessage()]
    assert rejected == ["rejected item: reason=MissingField status=400 index=1 request_id=req-1"]
    assert secret not in caplog.text


def test_handler_metrics_are_emitted_through_torchserve(loaded_handler, context, caplog):
    caplog.set_level(logging.INFO, logger="ts.metrics.caching_metric")
    run(loaded_handler, context, [(b"one", TEXT), (b"", TEXT), (b"three items here", TEXT)])
    emitted = caplog.text
    assert "[METRICS]bert_batches_total.Count:1|" in emitted
    assert "[METRICS]bert_items_total.Count:3|" in emitted
    assert "[METRICS]bert_last_batch_size.Count:3|" in emitted
    assert "bert_rejected_items_total.Count:1|#ModelName:tiny,Level:Model,Reason:EmptyText" in emitted
    for stage in ("validation", "tokenization", "forward", "response"):
        assert f"Stage:{stage}" in emitted


def test_handle_never_raises_and_fills_every_slot(loaded_handler, context, monkeypatch):
    import handlers.pipeline as module

    def broken(*args, **kwargs):
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(module, "encode", broken)
    bodies, codes = run(loaded_handler, context, [(b"fine", TEXT), (b"", TEXT)])
    assert codes == [500, 400]
    assert [b["type"] for b in bodies] == ["InternalError", "EmptyText"]


def test_odd_items_from_the_frontend_are_answered(loaded_handler, context):
    data = set_batch(context, [(b"ok", TEXT), (b"ok", TEXT), (b"ok", TEXT)])
    data[1] = {}  # no body parameter at all
    data[2] = {"data": "form field text"}  # multipart field, pre-decoded
    out = loaded_handler.handle(data, context)
    assert statuses(context, 3) == [200, 400, 200]
    assert json.loads(out[1])["type"] == "EmptyText"


def test_fault_in_forward_pass_fails_only_the_culprit(unpacked_model_dir):
    from handlers.bert_handler import BertSequenceClassifierHandler

    options = {"fault_marker": "POISON", "warmup": False}
    handler = BertSequenceClassifierHandler()
    handler.initialize(make_context(unpacked_model_dir, options))
    context = make_context(unpacked_model_dir, options)
    items = [(f"item {i}".encode(), TEXT) for i in range(7)]
    items[4] = (b"item POISON", TEXT)
    bodies, codes = run(handler, context, items)
    assert codes == [200, 200, 200, 200, 500, 200, 200]
    assert bodies[4]["type"] == "InferenceFailed"


def test_forward_failure_is_logged_once_with_the_batch_shape(unpacked_model_dir, caplog):
    from handlers.bert_handler import BertSequenceClassifierHandler

    options = {"fault_marker": "POISON", "warmup": False}
    handler = BertSequenceClassifierHandler()
    handler.initialize(make_context(unpacked_model_dir, options))
    context = make_context(unpacked_model_dir, options)
    caplog.set_level(logging.INFO)
    run(handler, context, [(b"fine one", TEXT), (b"POISON here", TEXT), (b"fine two", TEXT), (b"fine 3", TEXT)])
    failures = [r.getMessage() for r in caplog.records if "forward pass failed" in r.getMessage()]
    assert len(failures) == 1
    assert "a group of 4 items" in failures[0] and "POISON" not in caplog.text
