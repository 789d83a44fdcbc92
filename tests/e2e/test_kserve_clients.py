"""The Open Inference Protocol's and KServe's own clients against a real TorchServe.

tritonclient.http sends its v2 JSON with no Content-Type; the kserve SDK sends application/json
unless told otherwise. On a KServe route the handler must read the body as that protocol whatever
the Content-Type says, and answer each instance exactly as /predictions answers its text alone.
Outputs asked for as binary (tritonclient's default) come back in the binary tensor extension, as
Triton answers them: a BYTES output reads back as bytes, and as str only when asked for as JSON.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.e2e.test_kserve_protocols import alone
from tests.support import JSON, metrics_once, settled_metrics
from tooling.prometheus import metric_value

pytestmark = pytest.mark.e2e

TEXTS = ["the room was lovely and the staff kind", "awful, dirty and loud", '{"text": "json-looking text"}']
# None: what the client sends by default; "": an empty header; text/plain: a wrong one.
CONTENT_TYPES = [None, "", "text/plain"]


@pytest.fixture(scope="module")
def expected(torchserve, shared_model) -> dict[str, dict]:
    return alone(torchserve, shared_model, TEXTS)


def _headers(server, content_type: str | None) -> dict[str, str]:
    headers = dict(server.auth("inference"))
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


def _assert_instance_by_instance(labels, scores, expected: dict[str, dict]) -> None:
    assert len(labels) == len(scores) == len(TEXTS)
    for label, score, text in zip(labels, scores, TEXTS):
        assert label == expected[text]["label"], text
        assert score == pytest.approx(expected[text]["score"], abs=1e-4), text


@pytest.mark.parametrize("content_type", CONTENT_TYPES, ids=["no-content-type", "empty", "text-plain"])
@pytest.mark.parametrize("binary_data", [False, True, None], ids=["json-tensors", "binary-tensors", "client-defaults"])
def test_tritonclient_http_v2(torchserve, shared_model, expected, content_type, binary_data):
    """binary_data=True: the texts travel after the JSON header in the binary tensor extension, and the outputs
    named come back that way. None: tritonclient's defaults, binary inputs and no output named, which asks for
    every output as binary (`parameters.binary_data_output`). False: JSON both ways."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary_data is not False)
        outputs = None
        if binary_data is not None:
            outputs = [triton.InferRequestedOutput(name, binary_data=binary_data) for name in ("label", "score")]
        result = client.infer(shared_model, [text], outputs=outputs, headers=_headers(torchserve, content_type))
    finally:
        client.close()
    labels = result.as_numpy("label")
    assert labels is not None, result.get_response()
    labels = labels.tolist()
    binary = binary_data is not False
    # As Triton answers: a binary BYTES output is bytes to the client, a JSON one str.
    assert all(isinstance(label, bytes if binary else str) for label in labels), labels
    labels = [label.decode() for label in labels] if binary else labels
    _assert_instance_by_instance(labels, result.as_numpy("score").tolist(), expected)
    named = [output["name"] for output in result.get_response()["outputs"]]
    assert named == (["label", "score", "probabilities", "truncated"] if binary_data is None else ["label", "score"])
    for output in result.get_response()["outputs"]:
        assert ("data" in output) != binary and ("binary_data_size" in output.get("parameters", {})) == binary
    # The archive's version (make_archive's 1.0), as TorchServe's own v2 envelope answers it.
    assert (result.get_response()["model_name"], result.get_response()["model_version"]) == (shared_model, "1.0")


@pytest.mark.parametrize("content_type", [JSON, *CONTENT_TYPES[1:]], ids=["sdk-default", "empty", "text-plain"])
@pytest.mark.parametrize("protocol", ["v1", "v2", "v2-binary-outputs"])
def test_kserve_sdk_rest_client(torchserve, shared_model, expected, protocol, content_type):
    """v2-binary-outputs asks for every output as binary (`binary_data_output`): the SDK frames the answer by its
    Inference-Header-Content-Length (InferResponse.from_bytes) and hands the texts back as str either way."""
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    reply_headers: dict[str, str] = {}

    async def infer():
        client = InferenceRESTClient(RESTConfig(protocol=protocol.split("-")[0], timeout=60))
        headers = _headers(torchserve, content_type)
        if protocol == "v1":
            data = {"instances": TEXTS}
        else:
            tensor = InferInput("text", [len(TEXTS)], "BYTES", data=TEXTS)
            parameters = {"binary_data_output": True} if protocol == "v2-binary-outputs" else None
            data = InferRequest(shared_model, [tensor], request_id="sdk-1", parameters=parameters)
        try:
            return await client.infer(
                torchserve.inference_url, data, model_name=shared_model, headers=headers, response_headers=reply_headers
            )
        finally:
            await client._client.aclose()

    result = asyncio.run(infer())
    if protocol == "v1":
        predictions = result["predictions"]
        _assert_instance_by_instance([p["label"] for p in predictions], [p["score"] for p in predictions], expected)
    else:
        outputs = {output.name: output for output in result.outputs}
        _assert_instance_by_instance(outputs["label"].data, list(outputs["score"].data), expected)
        assert result.id == "sdk-1"
    binary = protocol == "v2-binary-outputs"
    assert reply_headers["content-type"] == ("application/octet-stream" if binary else JSON)
    assert ("inference-header-content-length" in reply_headers) == binary


@pytest.mark.parametrize("route", ["v1", "v2"])
@pytest.mark.parametrize("content_type", [None, "text/plain", JSON])
def test_a_kserve_route_never_answers_in_the_predictions_format(torchserve, shared_model, route, content_type):
    """A body that is no v1/v2 envelope is refused on a KServe route, whatever the Content-Type."""
    path = f"/v1/models/{shared_model}:predict" if route == "v1" else f"/v2/models/{shared_model}/infer"
    for body in (b"just a text", json.dumps({"text": "a plain JSON body"}).encode()):
        response = torchserve.post(path, body, content_type)
        assert response.status_code == 400, response.text
        assert response.json()["type"] in {"MalformedRequest", "MalformedJSON"}, response.text
        assert "label" not in response.json()


def test_predictions_route_keeps_reading_the_content_type(torchserve, shared_model, expected):
    """On /predictions, a body without Content-Type is still the text itself, even one that looks like JSON."""
    text = TEXTS[2]
    response = torchserve.post(f"/predictions/{shared_model}", text.encode(), None)
    assert response.status_code == 200, response.text
    assert response.json()["label"] == expected[text]["label"]
    assert response.json()["score"] == pytest.approx(expected[text]["score"], abs=1e-4)


def test_torchserve_serves_no_open_inference_health_or_metadata_route(torchserve, shared_model):
    """A limit of TorchServe 0.12's frontend, pinned so that a fix shows up (docs/calling.md): of the Open Inference
    Protocol it routes only /infer; readiness is read from /ping and the management API instead."""
    import tritonclient.http as triton

    model = f"/v2/models/{shared_model}"
    for path in ("/v2/health/live", "/v2/health/ready", f"{model}/ready", model, f"/v1/models/{shared_model}"):
        response = torchserve.session.get(f"{torchserve.inference_url}{path}", headers=torchserve.auth("inference"))
        assert (response.status_code, response.json()["type"]) == (404, "ResourceNotFoundException"), path
    # Nor a version in the path (tritonclient's model_version=, KServe v1's /versions/): the unversioned routes answer.
    v2_body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a room"]}]}
    v1_body = {"instances": ["a room"]}
    for path, body in (
        (f"{model}/versions/1.0/infer", v2_body),
        (f"/v1/models/{shared_model}/versions/1.0:predict", v1_body),
        (f"{model}/infer", v2_body),
    ):
        response = torchserve.post(path, json.dumps(body), "application/json")
        versioned = "/versions/" in path
        assert response.status_code == (404 if versioned else 200), (path, response.text)
    client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
    try:
        headers = torchserve.auth("inference")
        assert not client.is_server_live(headers=headers) and not client.is_model_ready(shared_model, headers=headers)
    finally:
        client.close()
    # What to read instead: the frontend's ping, and the model's workers on the management API.
    assert torchserve.ping().status_code == 200
    assert torchserve.model_ready(shared_model)


def test_tritonclient_reads_the_error_of_a_refused_instance(torchserve, shared_model):
    """A v2 error carries `error`, the protocol's shape, so the client raises with the handler's own message."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array(["a fine stay", "   "], dtype=object))  # binary, the client's default
        with pytest.raises(InferenceServerException) as raised:
            client.infer(shared_model, [text], headers=torchserve.auth("inference"))
    finally:
        client.close()
    assert raised.value.status() == "400"
    assert raised.value.message() == "inputs[0].data[1]: text is empty or whitespace only"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_is_refused_with_415_naming_the_encoding(torchserve, shared_model, algorithm):
    """TorchServe's frontend has no request decompressor: a body tritonclient compressed reaches the handler as it
    was sent. It is refused as what it is, never read as garbled JSON."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array(["a fine stay"], dtype=object))
        with pytest.raises(InferenceServerException) as raised:
            client.infer(
                shared_model, [text], headers=torchserve.auth("inference"), request_compression_algorithm=algorithm
            )
    finally:
        client.close()
    assert raised.value.status() == "415"
    assert raised.value.message().startswith(f"Content-Encoding '{algorithm}' is not supported")


def test_concurrent_binary_and_json_answers_keep_their_own_headers_within_a_batch(torchserve, shared_model, expected):
    """Per-item reply headers, through a real TorchServe: requests asking for binary outputs, for JSON ones and for
    a mix share batches, and each reply carries its own Content-Type and Inference-Header-Content-Length (or none),
    read back by tritonclient's own parser."""
    import requests
    import tritonclient.http as triton

    def request_body(kind: str, texts: list[str]) -> tuple[bytes, dict[str, str]]:
        tensor = triton.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=kind != "json")
        outputs = {
            "binary": None,  # the client's default: every output binary
            "json": [triton.InferRequestedOutput(name, binary_data=False) for name in ("label", "score")],
            "mixed": [triton.InferRequestedOutput("label", binary_data=False), triton.InferRequestedOutput("score")],
        }[kind]
        body, json_size = triton.InferenceServerClient.generate_request_body([tensor], outputs)
        headers = dict(torchserve.auth("inference"))
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        return (body.encode() if isinstance(body, str) else body), headers

    kinds = ["binary", "json", "mixed"]
    calls = [(kinds[i % 3], [TEXTS[(i + j) % len(TEXTS)] for j in range(1 + i % 3)]) for i in range(24)]
    url = f"{torchserve.inference_url}/v2/models/{shared_model}/infer"

    def post(call):
        body, headers = request_body(*call)
        return requests.post(url, data=body, headers=headers, timeout=60)

    def items_and_batches(text: str) -> tuple[float, float]:
        return tuple(
            metric_value(text, name, ModelName=shared_model) for name in ("bert_items_total", "bert_batches_total")
        )

    before = items_and_batches(settled_metrics(torchserve, shared_model))
    with ThreadPoolExecutor(max_workers=16) as pool:
        replies = list(pool.map(post, calls))
    after = items_and_batches(metrics_once(torchserve, shared_model, {"bert_items_total": before[0] + len(calls)}))
    items, batches = (now - then for now, then in zip(after, before))
    assert items == len(calls) and 0 < batches < items, f"no batching: {items} items in {batches} batches"
    for (kind, texts), reply in zip(calls, replies):
        assert reply.status_code == 200, reply.text
        length = reply.headers.get("Inference-Header-Content-Length")
        if kind == "json":
            assert (reply.headers["Content-Type"], length) == (JSON, None)
        else:
            assert reply.headers["Content-Type"] == "application/octet-stream" and int(length) < len(reply.content)
        result = triton.InferResult.from_response_body(
            reply.content, header_length=None if length is None else int(length)
        )
        labels = result.as_numpy("label").tolist()
        assert all(isinstance(label, bytes if kind == "binary" else str) for label in labels), (kind, labels)
        labels = [label.decode() if isinstance(label, bytes) else label for label in labels]
        assert labels == [expected[text]["label"] for text in texts]
        assert result.as_numpy("score").tolist() == pytest.approx([expected[text]["score"] for text in texts], abs=1e-4)
