"""The handler in-process: a tiny BERT, the MiniLM tokenizer and TorchServe's own Context class."""

from __future__ import annotations

import json
import logging

import pytest

from handlers.bert_handler import STREAM_NEXT_HEADER
from tests.answers import assert_same_answer
from tests.rejection_cases import REJECTED_BODIES
from tests.support import JSON, TEXT, expected_alone, statuses
from tooling.inprocess import load_handler, make_context, set_batch


def run(handler, context, items):
    data = set_batch(context, items)
    out = handler.handle(data, context)
    assert len(out) == len(items)
    return [json.loads(o) for o in out], statuses(context, len(items))


@pytest.fixture
def context(unpacked_model_dir):
    return make_context(unpacked_model_dir)


def test_mixed_batch_answers_every_item_by_index(loaded_handler, unpacked_model_dir, context):
    # Every rejection case of the shared table, each between two valid texts, all in one batch.
    valid = [f"valid review {i}: " + "quite nice " * (i % 5) for i in range(len(REJECTED_BODIES) + 1)]
    items, expected = [], []
    for i, text in enumerate(valid):
        body, content_type = (json.dumps({"text": text}).encode(), JSON) if i % 2 else (text.encode(), TEXT)
        items.append((body, content_type))
        expected.append(text)
        if i < len(REJECTED_BODIES):
            body, content_type, status, kind = REJECTED_BODIES[i]
            items.append((body, content_type))
            expected.append((status, kind))
    bodies, codes = run(loaded_handler, context, items)
    alone = dict(zip(valid, expected_alone(loaded_handler, unpacked_model_dir, valid)))
    for index, (want, body, code) in enumerate(zip(expected, bodies, codes)):
        if isinstance(want, tuple):
            assert (code, body["type"]) == want, (index, body)
            assert body["code"] == code and body["message"]
        else:
            assert code == 200, (index, body)
            assert_same_answer(body, alone[want])
            assert sum(body["scores"].values()) == pytest.approx(1.0, abs=1e-5)
            assert body["score"] == max(body["scores"].values())


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
    options = {"overlength": "reject", "max_length": 16, "warmup": False}
    handler = load_handler(unpacked_model_dir, options)
    context = make_context(unpacked_model_dir, options)
    bodies, codes = run(
        handler, context, [(b"one two three four five six seven eight nine ten " * 3, TEXT), (b"fits easily", TEXT)]
    )
    assert codes == [422, 200]
    assert bodies[0]["type"] == "TooManyTokens"


def test_max_length_is_clipped_to_the_model_maximum(unpacked_model_dir):
    handler = load_handler(unpacked_model_dir, {"max_length": 100_000, "warmup": False})
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
    assert "[METRICS]bert_forward_passes_total.Count:1|" in emitted
    assert "[METRICS]HandlerTime.Milliseconds:" in emitted  # TorchServe's own, which BaseHandler.handle would emit
    for stage in ("validation", "tokenization", "forward", "response"):
        assert f"Stage:{stage}" in emitted


def test_the_handler_emits_only_metrics_that_metrics_yaml_declares(unpacked_model_dir):
    from handlers.bert_handler import BertSequenceClassifierHandler

    # TorchServe's metrics cache adds an undeclared metric on first use; the frontend then drops
    # it from /metrics without a word. So after real traffic the cache must hold nothing new.
    # One context for initialize() and handle(), as in TorchServe's worker: the handler keeps its cache.
    context = make_context(unpacked_model_dir, {"warmup": False})
    handler = BertSequenceClassifierHandler()
    handler.initialize(context)
    declared = set(context.metrics.cache_keys())
    items = [(b"fine", TEXT), (b"", TEXT), (b'{"txt": 1}', JSON), (("long " * 400).encode(), TEXT)]
    run(handler, context, items)
    assert set(context.metrics.cache_keys()) == declared


def test_a_batchs_metric_lines_carry_no_request_ids(unpacked_model_dir, caplog):
    """TorchServe's add_metric writes every request id of the batch into each line (about 4.7 KB at batch 128)
    for the frontend to read and parse; a batch's figures belong to no one request (docs/metrics.md)."""
    from handlers.bert_handler import BertSequenceClassifierHandler

    context = make_context(unpacked_model_dir, {"warmup": False})  # one context, as in TorchServe's worker
    handler = BertSequenceClassifierHandler()
    handler.initialize(context)
    caplog.set_level(logging.INFO, logger="ts.metrics.caching_metric")
    run(handler, context, [(b"one", TEXT), (b"", TEXT), (b"three items here", TEXT)])
    lines = [m for m in caplog.messages if m.startswith("[METRICS]bert_")]
    assert len(lines) == 11  # six batch counts, one rejection, four stages
    assert not [line for line in lines if "req-" in line]


def test_a_metric_torchserve_refuses_never_touches_an_answer_and_is_named_in_the_log(
    unpacked_model_dir, tmp_path, caplog
):
    """A metrics.yaml out of step with the handler (here: an operator's copy that dropped the Reason dimension of
    bert_rejected_items_total) makes TorchServe refuse that metric on every rejection: the answers are as always,
    the other metrics still emitted for each batch, and TorchServe's own error line names the metric refused."""
    from handlers.bert_handler import BertSequenceClassifierHandler
    from tooling.paths import METRICS_CONFIG

    declared = METRICS_CONFIG.read_text()
    assert declared.count('[*model_name, *level, "Reason"]') == 1
    config = tmp_path / "metrics.yaml"
    config.write_text(declared.replace('[*model_name, *level, "Reason"]', "[*model_name, *level]"))
    context = make_context(unpacked_model_dir, {"warmup": False}, metrics_config=config)
    handler = BertSequenceClassifierHandler()
    handler.initialize(context)
    caplog.set_level(logging.INFO, logger="ts.metrics.caching_metric")
    items = [(b"a fine stay", TEXT), (b"", TEXT), (b"the room was dirty", TEXT)]
    for _ in range(2):
        bodies, codes = run(handler, context, items)
        assert codes == [200, 400, 200] and bodies[1]["type"] == "EmptyText"
    refused = [m for m in caplog.messages if "Failed to update metric with name:bert_rejected_items_total" in m]
    emitted = [m for m in caplog.messages if m.startswith("[METRICS]bert_batches_total.Count:1|")]
    assert len(refused) == 2 and len(emitted) == 2
    assert_same_answer(bodies[0], expected_alone(handler, unpacked_model_dir, ["a fine stay"])[0])


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


@pytest.mark.parametrize(
    ("fault_kind", "status", "kind"), [("error", 500, "InferenceFailed"), ("oom", 507, "OutOfMemory")]
)
def test_a_failing_forward_pass_fails_only_the_culprit(
    loaded_handler, unpacked_model_dir, caplog, fault_kind, status, kind
):
    # fault_kind "oom" raises MemoryError in the forward pass, as an exhausted allocator would.
    options = {"fault_marker": "POISON", "fault_kind": fault_kind, "warmup": False}
    handler = load_handler(unpacked_model_dir, options)
    texts = [f"item {i} of a mixed batch" + " and more" * i for i in range(7)]
    texts[4] = "item POISON"
    caplog.set_level(logging.WARNING, logger="handlers")
    bodies, codes = run(handler, make_context(unpacked_model_dir, options), [(t.encode(), TEXT) for t in texts])
    assert codes == [200, 200, 200, 200, status, 200, 200]
    assert bodies[4] == {"code": status, "type": kind, "message": bodies[4]["message"]}
    [failure] = [r.getMessage() for r in caplog.records if "forward pass failed" in r.getMessage()]
    assert "a group of 7 items" in failure
    assert ("out of memory" in failure) == (fault_kind == "oom")
    # The neighbours shared the failing pass, and still get exactly their answer alone.
    alone = expected_alone(loaded_handler, unpacked_model_dir, texts)
    for index in (0, 1, 2, 3, 5, 6):
        assert_same_answer(bodies[index], alone[index])


def test_forward_failure_is_logged_once_with_the_batch_shape(unpacked_model_dir, caplog):
    options = {"fault_marker": "POISON", "warmup": False}
    handler = load_handler(unpacked_model_dir, options)
    context = make_context(unpacked_model_dir, options)
    caplog.set_level(logging.INFO)
    run(handler, context, [(b"fine one", TEXT), (b"POISON here", TEXT), (b"fine two", TEXT), (b"fine 3", TEXT)])
    failures = [r.getMessage() for r in caplog.records if "forward pass failed" in r.getMessage()]
    assert len(failures) == 1
    assert "a group of 4 items" in failures[0] and "POISON" not in caplog.text


def test_an_answer_that_cannot_be_written_is_that_items_500_and_torchserve_sends_the_whole_batch(
    loaded_handler, context, monkeypatch
):
    """TorchServe encodes what handle() returns after it returns, outside any guard: one answer holding a
    string UTF-8 cannot write (a lone surrogate) or a NaN used to kill the worker, and every request of its
    batch with it. The handler encodes each answer itself; one that cannot be written is that item's 500."""
    from ts.protocol.otf_message_handler import create_predict_response

    import handlers.bert_handler as module
    from handlers.pipeline import BatchOutcome
    from handlers.responses import Answer

    def outcome(data, headers, served, identity, pace) -> BatchOutcome:
        bodies = [{"label": "ok"}, {"id": "\ud800"}, {"outputs": [{"data": [float("nan")]}]}, {"label": "fine"}]
        return BatchOutcome([Answer(200, body, kserve=index == 2) for index, body in enumerate(bodies)])

    monkeypatch.setattr(module, "answer_batch", outcome)
    data = set_batch(context, [(b"a", TEXT)] * 4)
    out = loaded_handler.handle(data, context)
    assert statuses(context, 4) == [200, 500, 500, 200]
    answers = [json.loads(body) for body in out]
    assert [answer.get("type") for answer in answers] == [None, "InternalError", "InternalError", None]
    assert "error" not in answers[1] and answers[2]["error"] == answers[2]["message"]  # a KServe answer's shape
    request_ids = {index: f"request-{index}" for index in range(4)}
    assert create_predict_response(out, request_ids, "Prediction success", 200, context)  # raised before


def test_when_answer_batch_raises_each_request_gets_500_in_its_own_routes_form(loaded_handler, context, monkeypatch):
    """The net under the pipeline answers every request 500 InternalError; one that came on a KServe route carries
    the message as `error` too, the protocols' error shape that tritonclient and KServe's client raise with."""
    from ts.context import RequestProcessor

    import handlers.bert_handler as module
    from tests.request_shapes import grpc, raw_body

    def broken(*args, **kwargs):
        raise RuntimeError("a bug under the pipeline's own guards")

    monkeypatch.setattr(module, "answer_batch", broken)
    data = set_batch(context, [(b"x", TEXT)] * 4)
    on_kserve = {key: value for key, value in raw_body(b"x")[1].items() if key != "url_path"}  # `explain` only
    routes = [on_kserve, raw_body(b"x")[1], grpc({"data": b"x"})[1], on_kserve]  # KServe, /predictions, gRPC
    for index, headers in enumerate(routes):
        context.request_processor[index] = RequestProcessor(headers)
    bodies = [json.loads(body) for body in loaded_handler.handle(data, context)]
    assert statuses(context, 4) == [500] * 4
    assert {body["type"] for body in bodies} == {"InternalError"}
    assert [body.get("error") == body["message"] for body in bodies] == [True, False, False, True]


def test_a_binary_answer_that_cannot_be_written_is_that_items_json_500(loaded_handler, context, monkeypatch):
    """A KServe v2 answer asking for binary outputs is written in the binary tensor extension's layout; one that
    cannot be (here a label UTF-8 cannot hold) is that item's 500, in JSON with no extension header, while the
    others of the batch keep theirs."""
    import handlers.bert_handler as module
    from handlers.pipeline import BatchOutcome
    from handlers.responses import Answer

    def outputs(label: str) -> dict:
        return {
            "model_name": "tiny",
            "outputs": [{"name": "label", "datatype": "BYTES", "shape": [1], "data": [label]}],
        }

    def outcome(data, headers, served, identity, pace) -> BatchOutcome:
        binary = {"kserve": True, "binary_outputs": ("label",)}
        answers = [Answer(200, outputs("ok"), **binary), Answer(200, outputs("\ud800"), **binary), Answer(200, {})]
        return BatchOutcome(answers)

    monkeypatch.setattr(module, "answer_batch", outcome)
    out = loaded_handler.handle(set_batch(context, [(b"a", TEXT)] * 3), context)
    assert statuses(context, 3) == [200, 500, 200]
    # Bare handler calls carry no HTTP header, as gRPC's do: their answers are marked the last of a stream, too.
    headers = [
        {k: v for k, v in context.get_response_headers(index).items() if k != STREAM_NEXT_HEADER} for index in range(3)
    ]
    length = int(headers[0]["Inference-Header-Content-Length"])
    assert headers[0] == {"content-type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}
    assert json.loads(out[0][:length])["outputs"][0]["parameters"] == {"binary_data_size": 6}
    assert out[0][length:] == b"\x02\x00\x00\x00ok"
    assert headers[1] == headers[2] == {"content-type": "application/json"}
    failed = json.loads(out[1])
    assert (failed["type"], failed["error"]) == ("InternalError", failed["message"])


def test_the_handler_hands_its_batches_the_workers_pace_which_they_measure(unpacked_model_dir):
    """The deadline check before a batch's first pass reads the pace the batches before measured (handlers/
    deadline.PassPace): the handler keeps it and hands it in. With a pace of a minute a pass, a request due in ten
    seconds is refused uncomputed; one without a deadline is answered."""
    import time

    from ts.context import RequestProcessor

    handler = load_handler(unpacked_model_dir)
    context = make_context(unpacked_model_dir)
    assert handler.pace.ms == 0.0
    run(handler, context, [(b"one", TEXT), (b"two words", TEXT)])
    assert handler.pace.ms > 0.0  # the batch's pass was timed into it
    handler.pace.ms = 60_000.0
    data = set_batch(context, [(b"due in ten seconds", TEXT), (b"no deadline", TEXT)])
    due = str(int(1000 * time.time()) + 10_000)
    context.request_processor[0] = RequestProcessor({"body": {"content-type": TEXT}, "X-Request-Deadline": due})
    bodies = [json.loads(b) for b in handler.handle(data, context)]
    assert statuses(context, 2) == [503, 200], bodies
    assert bodies[0]["type"] == "DeadlineExceeded" and "would end after it" in bodies[0]["message"]


def test_each_grpc_answer_is_marked_the_last_of_its_stream_and_no_http_answer_is(loaded_handler, context):
    """TorchServe 0.12's GRPCJob.response reads `ts_stream_next` on every StreamPredictions answer and, without it,
    throws: the frontend dropped the worker and every request of its batch. Each gRPC answer, refused ones too, says
    "false" (the stream's last); an HTTP answer carries none (RestJob would turn its reply into a chunked stream)."""
    from ts.context import RequestProcessor

    from tests.request_shapes import grpc, raw_body

    shapes = [grpc({"data": b"a quiet room"}), raw_body(b"a quiet room", TEXT), grpc({"data": b""})]
    set_batch(context, [(b"-", TEXT)] * len(shapes))  # request ids and metrics, as the worker sets them
    context.request_processor = [RequestProcessor(headers) for _, headers in shapes]  # each request's own headers
    out = loaded_handler.handle([item for item, _ in shapes], context)
    assert statuses(context, 3) == [200, 200, 400]
    assert json.loads(out[0]) == json.loads(out[1])  # the same text, answered alike
    assert [context.get_response_headers(i).get(STREAM_NEXT_HEADER) for i in range(3)] == ["false", None, "false"]


def test_a_describe_call_gets_the_description_and_one_that_fails_gets_none_never_an_exception(
    loaded_handler, context, monkeypatch
):
    """A management describe call (`describe: True`, alone in its batch) is answered with the worker's description;
    should describing fail, handle() still answers, with nothing (TorchServe then shows no customizedMetadata)."""
    from ts.context import RequestProcessor

    import handlers.bert_handler as module

    def describe_call() -> list:
        set_batch(context, [(b"", None)])
        context.request_processor = [RequestProcessor({"describe": "True"})]
        return loaded_handler.handle([{}], context)

    [body] = describe_call()
    described = json.loads(body)
    assert described["labels"] == list(loaded_handler.served.labels) and described["backend"] == "pytorch"
    assert statuses(context, 1) == [200]

    def broken(served, identity):
        raise RuntimeError("a bug in describing")

    monkeypatch.setattr(module, "describe", broken)
    assert describe_call() == [b""]
