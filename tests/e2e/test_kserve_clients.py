"""The Open Inference Protocol's and KServe's own clients against a real TorchServe.

tritonclient.http sends its v2 JSON with no Content-Type; the kserve SDK sends application/json
unless told otherwise. On a KServe route the handler must read the body as that protocol whatever
the Content-Type says, and answer each instance exactly as /predictions answers its text alone.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.e2e.test_kserve_protocols import alone
from tests.support import JSON

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
@pytest.mark.parametrize("binary_data", [False, True], ids=["json-tensors", "binary-tensors"])
def test_tritonclient_http_v2(torchserve, shared_model, expected, content_type, binary_data):
    """binary_data=True is tritonclient's default: the texts travel after the JSON header in the binary tensor
    extension, and the client asks for its outputs that way too (the answer's JSON outputs serve it as well)."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary_data)
        outputs = [triton.InferRequestedOutput(name, binary_data=binary_data) for name in ("label", "score")]
        result = client.infer(shared_model, [text], outputs=outputs, headers=_headers(torchserve, content_type))
    finally:
        client.close()
    labels = result.as_numpy("label")
    assert labels is not None, result.get_response()
    labels = [value.decode() if isinstance(value, bytes) else value for value in labels.tolist()]
    _assert_instance_by_instance(labels, result.as_numpy("score").tolist(), expected)
    # The archive's version (make_archive's 1.0), as TorchServe's own v2 envelope answers it.
    assert (result.get_response()["model_name"], result.get_response()["model_version"]) == (shared_model, "1.0")


@pytest.mark.parametrize("content_type", [JSON, *CONTENT_TYPES[1:]], ids=["sdk-default", "empty", "text-plain"])
@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_kserve_sdk_rest_client(torchserve, shared_model, expected, protocol, content_type):
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    async def infer():
        client = InferenceRESTClient(RESTConfig(protocol=protocol, timeout=60))
        headers = _headers(torchserve, content_type)
        if protocol == "v1":
            data = {"instances": TEXTS}
        else:
            tensor = InferInput("text", [len(TEXTS)], "BYTES", data=TEXTS)
            data = InferRequest(shared_model, [tensor], request_id="sdk-1")
        try:
            return await client.infer(torchserve.inference_url, data, model_name=shared_model, headers=headers)
        finally:
            await client._client.aclose()

    result = asyncio.run(infer())
    if protocol == "v1":
        predictions = result["predictions"]
        _assert_instance_by_instance([p["label"] for p in predictions], [p["score"] for p in predictions], expected)
    else:
        outputs = {output.name: output for output in result.outputs}
        labels = [value.decode() if isinstance(value, bytes) else value for value in outputs["label"].data]
        _assert_instance_by_instance(labels, list(outputs["score"].data), expected)
        assert result.id == "sdk-1"


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
