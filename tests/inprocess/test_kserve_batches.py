"""KServe v1/v2 requests mixed with plain ones in one batch, through the handler in-process (TorchServe's Context)."""

from __future__ import annotations

import json
import logging
import struct

import numpy as np
import pytest

from tests.kserve_cases import MALFORMED, v1, v2
from tests.request_shapes import raw_body
from tests.support import JSON, TEXT, expected_alone, statuses
from tooling.inprocess import load_handler, make_context, set_batch


def run(handler, context, items):
    out = handler.handle(set_batch(context, items), context)
    assert len(out) == len(items)
    return [json.loads(o) for o in out], statuses(context, len(items))


def as_json(body) -> tuple[bytes, str]:
    return json.dumps(body).encode(), JSON


def scores_of(body) -> list[float]:
    """The score of each instance, whatever the format of the answer."""
    if "predictions" in body:
        return [p["score"] for p in body["predictions"]]
    if "outputs" in body:
        return next(o["data"] for o in body["outputs"] if o["name"] == "score")
    return [body["score"]]


def test_mixed_formats_in_one_batch_each_get_their_own_answer(loaded_handler, unpacked_model_dir):
    texts = ["a quiet room with a view", "dreadful food", "the staff were kind", "never again", "fine", "ok then"]
    items = [
        (texts[0].encode(), TEXT),
        as_json(v1(texts[1], {"text": texts[2]})),
        as_json(v2(texts[3], texts[4], texts[5], request_id="batch-7")),
        as_json(v1("good", "")),  # an empty instance fails its request only
        as_json({"inputs": [{"name": "text", "shape": [9], "datatype": "BYTES", "data": ["x"]}]}),
        as_json({"text": texts[5]}),
    ]
    context = make_context(unpacked_model_dir)
    bodies, codes = run(loaded_handler, context, items)
    assert codes == [200, 200, 200, 400, 400, 200]
    alone = [a["score"] for a in expected_alone(loaded_handler, unpacked_model_dir, texts)]
    assert scores_of(bodies[0]) == pytest.approx([alone[0]], abs=1e-4)
    assert scores_of(bodies[1]) == pytest.approx(alone[1:3], abs=1e-4)
    assert scores_of(bodies[2]) == pytest.approx(alone[3:6], abs=1e-4)
    assert scores_of(bodies[5]) == pytest.approx([alone[5]], abs=1e-4)
    assert bodies[2]["id"] == "batch-7" and (bodies[2]["model_name"], bodies[2]["model_version"]) == ("tiny", "1.0")
    assert bodies[3]["type"] == "EmptyText" and bodies[3]["message"].startswith("instances[1]: ")
    assert bodies[4]["type"] == "MalformedRequest"


@pytest.mark.parametrize(("name", "body", "status", "kind", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_beside_a_valid_one(loaded_handler, unpacked_model_dir, name, body, status, kind, fragment):
    context = make_context(unpacked_model_dir)
    bodies, codes = run(loaded_handler, context, [as_json(v1("before")), as_json(body), (b"after", TEXT)])
    assert codes == [200, status, 200]
    assert bodies[1]["type"] == kind and fragment in bodies[1]["message"]


def test_token_budget_counts_instances_not_requests(unpacked_model_dir, caplog):
    # Five 40-token instances in ONE request: with a 64-token budget no two can share a pass.
    handler = load_handler(unpacked_model_dir, {"max_batch_tokens": 64, "warmup": False})
    context = make_context(unpacked_model_dir, {"max_batch_tokens": 64})
    caplog.set_level(logging.INFO, logger="ts.metrics.caching_metric")
    bodies, codes = run(handler, context, [as_json(v1(*["word " * 38] * 5))])
    assert codes == [200] and len(bodies[0]["predictions"]) == 5
    assert "[METRICS]bert_forward_passes_total.Count:5|" in caplog.text
    assert "[METRICS]bert_real_tokens_total.Count:200|" in caplog.text


def test_a_failing_instance_fails_its_request_only(unpacked_model_dir, caplog):
    options = {"fault_marker": "POISON", "warmup": False}
    handler = load_handler(unpacked_model_dir, options)
    context = make_context(unpacked_model_dir, options)
    caplog.set_level(logging.INFO)
    items = [as_json(v1("fine", "also fine")), as_json(v2("ok", "POISON here", "ok too")), (b"plain", TEXT)]
    bodies, codes = run(handler, context, items)
    assert codes == [200, 500, 200]
    assert bodies[1]["type"] == "InferenceFailed" and bodies[1]["message"].startswith("inputs[0].data[1]: ")
    rejected = [r.getMessage() for r in caplog.records if "rejected item" in r.getMessage()]
    assert rejected == [
        "rejected item: reason=InferenceFailed status=500 index=1 request_id=req-1 instance=inputs[0].data[1]"
    ]
    assert "POISON" not in caplog.text


# ---- binary outputs: per item, through TorchServe's own worker message ------------------------------------------


def tritonclient_request(texts: list[str], outputs=None) -> tuple[bytes, dict]:
    """(body, the headers the worker hands the handler) for tritonclient.http's infer on the v2 route: binary inputs,
    and the outputs it asks for (None, its default: every output, binary)."""
    import tritonclient.http as triton

    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    body, json_size = triton.InferenceServerClient.generate_request_body([tensor], outputs, request_id="t1")
    _, headers = raw_body(body)  # tritonclient sends no Content-Type
    headers = {key: value for key, value in headers.items() if key != "url_path"}  # the v2 route: `explain` only
    headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def worker_replies(message: bytes, n: int) -> list[tuple[str, int, dict[str, str], bytes]]:
    """TorchServe 0.12's worker message (ts/protocol/otf_message_handler.create_predict_response), read back as
    the frontend reads it: (content type, status, headers, body) per item, each of which it puts on that item's
    own HTTP reply (RestJob.responseInference)."""
    offset = 0

    def integer() -> int:
        nonlocal offset
        (value,) = struct.unpack_from("!i", message, offset)
        offset += 4
        return value

    def blob() -> bytes:
        nonlocal offset
        length = integer()
        offset += length
        return message[offset - length : offset]

    integer(), blob()  # the batch's code and message
    replies = []
    for _ in range(n):
        blob()  # request id
        content_type, status, _phrase = blob().decode(), integer(), blob()
        headers = {blob().decode(): blob().decode() for _ in range(integer())}
        replies.append((content_type, status, headers, blob()))
    assert integer() == -1 and offset == len(message)  # the end of the batch's list
    return replies


def test_binary_outputs_are_answered_per_item_beside_json_ones(loaded_handler, unpacked_model_dir):
    """tritonclient's default asks for every output as binary: that item's reply is the extension's layout, with its
    own content type and Inference-Header-Content-Length, while its neighbours in the batch stay JSON."""
    import tritonclient.http as triton
    from ts.context import RequestProcessor
    from ts.protocol.otf_message_handler import create_predict_response

    texts = ["a quiet room with a view", "dreadful food", "the staff were kind"]
    binary = tritonclient_request(texts[:2])
    mixed = tritonclient_request(
        texts[1:], [triton.InferRequestedOutput("label", binary_data=False), triton.InferRequestedOutput("score")]
    )
    items = [binary[0], json.dumps(v2(*texts, request_id="j1")).encode(), mixed[0], texts[2].encode(), b"{}"]
    context = make_context(unpacked_model_dir)
    data = set_batch(context, [(item, None) for item in items])
    on_v2 = {key: value for key, value in raw_body(b"")[1].items() if key != "url_path"}
    for index, headers in enumerate([binary[1], on_v2, mixed[1], {"body": {"content-type": TEXT}}, on_v2]):
        context.request_processor[index] = RequestProcessor(headers)
    out = loaded_handler.handle(data, context)
    replies = worker_replies(create_predict_response(out, context.request_ids, "Prediction success", 200, context), 5)
    assert [status for _, status, _, _ in replies] == [200, 200, 200, 200, 400]
    alone = {t: a for t, a in zip(texts, expected_alone(loaded_handler, unpacked_model_dir, texts))}

    content_type, _, headers, body = replies[0]
    assert content_type == "application/octet-stream" and headers["content-type"] == content_type
    result = triton.InferResult.from_response_body(body, header_length=int(headers["Inference-Header-Content-Length"]))
    assert result.as_numpy("label").tolist() == [alone[t]["label"].encode() for t in texts[:2]]  # bytes, as Triton
    assert result.as_numpy("score").tolist() == pytest.approx([alone[t]["score"] for t in texts[:2]], abs=1e-4)
    assert result.as_numpy("truncated").tolist() == [False, False]
    assert result.get_response()["id"] == "t1"

    content_type, _, headers, body = replies[2]  # label asked for as JSON, score left to binary_data's default
    assert content_type == "application/octet-stream"
    result = triton.InferResult.from_response_body(body, header_length=int(headers["Inference-Header-Content-Length"]))
    assert result.as_numpy("label").tolist() == [alone[t]["label"] for t in texts[1:]]
    assert result.as_numpy("score").tolist() == pytest.approx([alone[t]["score"] for t in texts[1:]], abs=1e-4)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["label", "score"]

    for index in (1, 3, 4):  # the JSON v2 answer, the plain one and the error: JSON, no extension header
        content_type, _, headers, body = replies[index]
        # The plain one has no HTTP header, as over gRPC: marked the last answer of its stream (bert_handler.py).
        expected = {"content-type", "ts_stream_next"} if index == 3 else {"content-type"}
        assert (content_type, set(headers)) == ("application/json", expected), index
        json.loads(body)
    assert json.loads(replies[1][3])["outputs"][0]["data"] == [alone[t]["label"] for t in texts]
