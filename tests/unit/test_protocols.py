"""Reading KServe v1/v2 and plain bodies into instances, and shaping each request's answer: pure functions."""

from __future__ import annotations

import pytest

from handlers.decoding import Document
from handlers.instances import TextPair
from handlers.options import HandlerOptions
from handlers.pipeline import regroup, validate
from handlers.protocols import KSERVE_V1, KSERVE_V2, PREDICTIONS, V2_OUTPUTS, parse_request, read_request
from handlers.rejection import Rejection
from handlers.responses import ModelIdentity, Prediction, success_answer
from tests.kserve_cases import MALFORMED, v1, v2
from tests.request_shapes import grpc, raw_body

LIMIT = HandlerOptions().max_instances
LABELS = ("negative", "positive")


def settle(body):
    """parse + the pipeline's per-instance validation + a made-up prediction per valid instance, then the answer."""
    request = parse_request(Document(body), LIMIT)
    texts, rejected = validate([request])
    predictions = {key: Prediction([0.25, 0.75], False) for key in texts}
    return request, regroup([request], predictions, rejected, ModelIdentity("bert"), LABELS)[0]


def test_the_route_read_from_the_headers_decides_which_parameter_is_the_text():
    # A `text` parameter beside the body "a" (TorchServe 0.12 drops /predictions/NAME's query parameters, but should
    # one arrive): read_request reads the route once and the decoding follows it: on /predictions the body is the
    # text; the same parameters in a gRPC input map (or /invocations?text=b, which has no route header) by name.
    item, headers = raw_body(b"a", "text/plain")
    assert read_request({**item, "text": b"b"}, headers, 1000, 64).instances == ("a",)
    assert read_request(*grpc({"body": b"a", "text": b"b"}), 1000, 64).instances == ("b",)


def test_plain_text_and_plain_json_are_one_instance():
    assert parse_request("a text", LIMIT).instances == ("a text",)
    request = parse_request(Document({"text": "json text", "instances": "ignored"}), LIMIT)
    assert (request.protocol, request.instances) == (PREDICTIONS, ("json text",))


def test_v1_instances_are_strings_or_text_objects_in_order():
    request = parse_request(Document({"instances": ["one", {"text": "two", "x": 1}, "three"]}), LIMIT)
    assert (request.protocol, request.instances, request.error) == (KSERVE_V1, ("one", "two", "three"), None)


def test_v2_texts_and_id():
    request = parse_request(Document(v2("a", "b", request_id="abc")), LIMIT)
    assert (request.protocol, request.instances, request.request_id) == (KSERVE_V2, ("a", "b"), "abc")
    column = {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "b"]}]}
    assert parse_request(Document(column), LIMIT).instances == ("a", "b")
    # The protocol's nested form of the same tensor: data as its shape.
    nested = {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a"], ["b"]]}]}
    assert parse_request(Document(nested), LIMIT).instances == ("a", "b")


def test_a_request_of_exactly_max_instances_is_read_whole_in_every_format():
    """The limit is the most a request may carry, not one past it: 413 TooManyInstances is for LIMIT + 1 (MALFORMED)."""
    texts = [f"text {i}" for i in range(LIMIT)]
    for body in ({"instances": texts}, v2(*texts)):
        request = parse_request(Document(body), LIMIT)
        assert request.error is None and request.instances == tuple(texts), request.error


def test_pairs_in_every_format_in_order():
    assert parse_request(Document({"text": "q", "text_pair": "p"}), LIMIT).instances == (TextPair("q", "p"),)
    v1_pairs = parse_request(Document({"instances": [{"text": "q", "text_pair": "p"}, "alone"]}), LIMIT)
    assert (v1_pairs.protocol, v1_pairs.instances) == (KSERVE_V1, (TextPair("q", "p"), "alone"))
    texts = {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["q1", "q2"]}
    pairs = {"name": "text_pair", "shape": [2], "datatype": "BYTES", "data": ["p1", "p2"]}
    for inputs in ([texts, pairs], [pairs, texts]):  # matched by name, whichever comes first
        request = parse_request(Document({"id": "r", "inputs": inputs}), LIMIT)
        assert request.instances == (TextPair("q1", "p1"), TextPair("q2", "p2")) and request.request_id == "r"


@pytest.mark.parametrize(("name", "body", "status", "kind", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_answered_as_a_whole(name, body, status, kind, fragment):
    _, result = settle(body)
    assert (result.status, result.body["type"], result.body["code"]) == (status, kind, status)
    assert fragment in result.body["message"]


def test_v1_answer_has_one_prediction_per_instance_in_order():
    request = parse_request(Document(v1("a", "b")), LIMIT)
    results = [Prediction([0.9, 0.1], False), Prediction([0.2, 0.8], True)]
    result = success_answer(request, results, LABELS, ModelIdentity("bert"))
    assert result.status == 200
    assert result.body == {
        "predictions": [
            {"label": "negative", "score": 0.9, "scores": {"negative": 0.9, "positive": 0.1}, "truncated": False},
            {"label": "positive", "score": 0.8, "scores": {"negative": 0.2, "positive": 0.8}, "truncated": True},
        ]
    }


def test_v2_answer_is_an_open_inference_protocol_response():
    request = parse_request(Document(v2("a", "b", request_id="req-7")), LIMIT)
    results = [Prediction([0.9, 0.1], False), Prediction([0.2, 0.8], True)]
    body = success_answer(request, results, LABELS, ModelIdentity("bert", "2.0")).body
    assert body["model_name"] == "bert" and body["model_version"] == "2.0" and body["id"] == "req-7"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["label"] == {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["negative", "positive"]}
    assert outputs["score"] == {"name": "score", "datatype": "FP32", "shape": [2], "data": [0.9, 0.8]}
    assert outputs["probabilities"] == {
        "name": "probabilities",
        "datatype": "FP32",
        "shape": [2, 2],
        "data": [0.9, 0.1, 0.2, 0.8],
    }
    assert outputs["truncated"]["data"] == [False, True]
    unversioned = success_answer(parse_request(Document(v2("a")), LIMIT), results[:1], LABELS, ModelIdentity("bert"))
    assert "id" not in unversioned.body and "model_version" not in unversioned.body
    assert [o["name"] for o in body["outputs"]] == list(V2_OUTPUTS)  # none asked for: every one


def test_a_v2_request_naming_outputs_gets_those_alone():
    asked = {**v2("a", "b"), "outputs": [{"name": "score"}, {"name": "label", "parameters": {"binary_data": False}}]}
    request = parse_request(Document(asked), LIMIT)
    results = [Prediction([0.9, 0.1], False), Prediction([0.2, 0.8], True)]
    body = success_answer(request, results, LABELS, ModelIdentity("bert")).body
    assert [o["name"] for o in body["outputs"]] == ["label", "score"]
    assert parse_request(Document({**v2("a"), "outputs": []}), LIMIT).outputs == V2_OUTPUTS  # none named: all


def test_a_failed_instance_names_itself_and_fails_only_its_request():
    request = parse_request(Document(v2("a", "b", "c")), LIMIT)
    failed = Rejection(500, "InferenceFailed", "the model failed on this item")
    predictions = {(0, 0): Prediction([0.5, 0.5], False)}
    result = regroup([request], predictions, {(0, 1): failed, (0, 2): failed}, ModelIdentity("bert"), LABELS)[0]
    assert (result.status, result.body["type"]) == (500, "InferenceFailed")
    assert result.body["message"].startswith("inputs[0].data[1]: ")
    assert result.instance == "inputs[0].data[1]"
