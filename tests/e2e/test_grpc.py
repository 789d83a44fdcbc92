"""TorchServe's gRPC inference API (inference.proto's Predictions), driven with TorchServe's own .proto files.

TorchServe 0.12's GRPCJob.response ignores the status the handler sets for an item: a rejected
item arrives as a successful call (StatusCode.OK) whose prediction is the error JSON. These tests
pin that down, so docs/calling.md's advice (check the body's "code") stays true, and prove that answers
over gRPC equal those over HTTP, that items of a batch stay independent, and that the inference
key is required.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import empty_pb2

from tests.grpc_client import compile_protos
from tests.support import SHARED_MODEL, metrics_once, settled_metrics
from tooling.prometheus import metric_value

pytestmark = pytest.mark.e2e

MODEL = SHARED_MODEL
LIMIT = 64 * 1024  # the handler's default max_bytes


@pytest.fixture(scope="module")
def protos(tmp_path_factory):
    return compile_protos(tmp_path_factory.mktemp("grpc_generated"))


@pytest.fixture(scope="module")
def model(shared_model):
    return shared_model


@pytest.fixture(scope="module")
def channel(torchserve):
    with grpc.insecure_channel(f"127.0.0.1:{torchserve.ports['grpc_i']}") as channel:
        # TorchServe answers HTTP /ping before its gRPC servers listen: wait for the port.
        grpc.channel_ready_future(channel).result(timeout=60)
        yield channel


@pytest.fixture(scope="module")
def stub(protos, channel):
    return protos["inference_pb2_grpc"].InferenceAPIsServiceStub(channel)


def bearer(torchserve, api: str = "inference") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {torchserve.keys()[api]}"),)


def predict(stub, protos, torchserve, inputs: dict[str, bytes], model: str = MODEL) -> dict:
    """One Predictions call; the answer is always a successful call, so the body says what happened."""
    request = protos["inference_pb2"].PredictionsRequest(model_name=model, input=inputs)
    response = stub.Predictions(request, metadata=bearer(torchserve), timeout=60)
    return json.loads(response.prediction)


def batching(text: str) -> tuple[float, float]:
    """(items, batches) the handler counted for MODEL, from /metrics text."""
    return metric_value(text, "bert_items_total", ModelName=MODEL), metric_value(
        text, "bert_batches_total", ModelName=MODEL
    )


def test_ping_with_the_inference_key(stub, protos, torchserve):
    health = stub.Ping(empty_pb2.Empty(), metadata=bearer(torchserve), timeout=10)
    assert "Healthy" in health.health


def test_concurrent_mixed_calls_answer_as_http_does(stub, protos, torchserve, model):
    texts = [f"grpc review {i}: " + "quiet clean room " * (i % 5) + "friendly staff" for i in range(24)]
    invalid = [
        ({"data": b""}, b"", 400, "EmptyText"),
        ({"data": b"   \n"}, b"   \n", 400, "EmptyText"),
        ({"data": b"\xc3\x28"}, b"\xc3\x28", 400, "InvalidUTF8"),
        ({"data": b"z" * (LIMIT + 1)}, b"z" * (LIMIT + 1), 413, "PayloadTooLarge"),
        ({"input": b"a text under a name the handler does not read"}, None, 400, "MissingField"),
        ({}, b"", 400, "EmptyText"),
    ]
    calls = []  # (inputs, expected): expected is a text index, or (http body, status, type)
    for i, text in enumerate(texts):
        name = "text" if i % 3 == 0 else "data"
        calls.append(({name: text.encode()}, i))
        if i % 4 == 3:
            inputs, http_body, status, kind = invalid[(i // 4) % len(invalid)]
            calls.append((inputs, (http_body, status, kind)))

    before = batching(settled_metrics(torchserve, MODEL))
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda call: predict(stub, protos, torchserve, call[0]), calls))
    # The handler's counters reach /metrics through the worker's log stream, after the answers: wait for them.
    after = metrics_once(torchserve, MODEL, {"bert_items_total": before[0] + len(calls)})
    items, batches = (now - start for now, start in zip(batching(after), before))
    assert items == len(calls) and 0 < batches < items, f"no batching: {items} items in {batches} batches"
    with ThreadPoolExecutor(max_workers=16) as pool:
        over_http = list(pool.map(lambda text: torchserve.predict(model, text.encode()), texts))

    for (_, expected), answer in zip(calls, answers):
        if isinstance(expected, int):
            http = over_http[expected]
            assert http.status_code == 200, http.text
            assert answer["label"] == http.json()["label"]
            assert answer["scores"] == pytest.approx(http.json()["scores"], abs=1e-4)
            continue
        http_body, status, kind = expected
        # The call succeeded; its body is the error, with the code HTTP would have answered.
        assert set(answer) == {"code", "type", "message"}, answer
        assert (answer["code"], answer["type"]) == (status, kind)
        assert answer["message"]
        if http_body is not None:
            http = torchserve.predict(model, http_body)
            assert (http.status_code, http.json()) == (status, answer)


def test_a_text_pair_input_makes_a_pair_as_json_does_over_http(stub, protos, torchserve, model):
    query, passage = "is parking free", "Guests park for free in the garage under the hotel."
    over_http = torchserve.predict(model, json.dumps({"text": query, "text_pair": passage}), "application/json")
    assert over_http.status_code == 200, over_http.text
    for name in ("text", "data"):
        answer = predict(stub, protos, torchserve, {name: query.encode(), "text_pair": passage.encode()})
        assert answer["scores"] == pytest.approx(over_http.json()["scores"], abs=1e-4)
    assert predict(stub, protos, torchserve, {"data": query.encode()})["scores"] != answer["scores"]
    refused = predict(stub, protos, torchserve, {"data": query.encode(), "text_pair": b"\xff"})
    assert (refused["code"], refused["type"]) == (400, "InvalidUTF8") and "text_pair" in refused["message"]
    # An input named `body` (TorchServe's name for an HTTP body) beside the text is not the text, nor drops the pair.
    beside = {"body": b"Awful, dirty room.", "text": query.encode(), "text_pair": passage.encode()}
    assert predict(stub, protos, torchserve, beside)["scores"] == pytest.approx(over_http.json()["scores"], abs=1e-4)


def test_a_rejected_item_is_a_successful_call_carrying_the_error(stub, protos, torchserve, model):
    """What docs/calling.md tells gRPC clients: no RpcError; parse the body, and a "code" key means refused."""
    request = protos["inference_pb2"].PredictionsRequest(model_name=model, input={"data": b""})
    response, call = stub.Predictions.with_call(request, metadata=bearer(torchserve), timeout=60)
    assert call.code() == grpc.StatusCode.OK
    assert json.loads(response.prediction) == {
        "code": 400,
        "type": "EmptyText",
        "message": "text is empty or whitespace only",
    }


@pytest.mark.parametrize("key", [None, "wrong-key", "management"])
def test_token_authorization_holds_over_grpc(stub, protos, torchserve, model, key):
    if key is None:
        metadata = ()
    elif key == "management":
        metadata = bearer(torchserve, "management")  # a real key, but not the inference one
    else:
        metadata = (("authorization", f"Bearer {key}"),)
    request = protos["inference_pb2"].PredictionsRequest(model_name=model, input={"data": b"hello"})
    with pytest.raises(grpc.RpcError) as refused:
        stub.Predictions(request, metadata=metadata, timeout=30)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Token Authorization failed" in refused.value.details()


def test_stream_predictions_gets_one_answer_and_leaves_every_worker_and_neighbour_alone(
    stub, protos, torchserve, model
):
    """TorchServe 0.12's GRPCJob.response reads the `ts_stream_next` header of each StreamPredictions answer and threw
    without it (a NullPointerException): the frontend dropped the worker, and the call and every request of its batch
    got "Worker died.". The handler marks each gRPC answer the last of its stream: one answer, the stream ends, and
    the same workers serve on, the Predictions calls batched beside the streams answered as usual."""
    pids = sorted(worker["pid"] for worker in torchserve.describe(model)[0]["workers"])
    pb2 = protos["inference_pb2"]
    texts = [
        f"stream {i}: the room was {'lovely and quiet' if i % 2 else 'dirty and loud'}".encode() for i in range(12)
    ]

    def streamed(text: bytes) -> list[dict]:
        request = pb2.PredictionsRequest(model_name=model, input={"data": text})
        return [json.loads(reply.prediction) for reply in stub.StreamPredictions(request, metadata=bearer(torchserve))]

    with ThreadPoolExecutor(max_workers=16) as pool:
        streams = [pool.submit(streamed, text) for text in texts]
        calls = [pool.submit(predict, stub, protos, torchserve, {"data": text}, model) for text in texts]
        streams, calls = [f.result(timeout=60) for f in streams], [f.result(timeout=60) for f in calls]
    for text, stream, call in zip(texts, streams, calls):
        assert len(stream) == 1, (text, stream)
        assert stream[0]["label"] == call["label"], text
        assert stream[0]["scores"] == pytest.approx(call["scores"], abs=1e-4), text
    assert sorted(worker["pid"] for worker in torchserve.describe(model)[0]["workers"]) == pids, "a worker was replaced"
