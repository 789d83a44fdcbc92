"""Instance results -> the status and body each request gets, in its own format. Pure and torch-free.

A request is answered as a whole: 200 when every instance is served, otherwise one error
(which one: handlers/pipeline.first_rejection), naming its instance (`instances[2]: ...`,
`inputs[0].data[3]: ...`), in TorchServe's error shape. An Answer holds its body as JSON values;
encode_answer writes it: JSON, or, for a KServe v2 success asking for binary outputs, the binary
tensor extension's layout (handlers/binary_tensors.py). Errors are always JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from handlers.binary_tensors import BINARY_SIZE, RESPONSE_HEADER_LENGTH, tensor_bytes
from handlers.protocols import KSERVE_V1, KSERVE_V2, ParsedRequest
from handlers.rejection import Rejection

JSON_CONTENT = "application/json"
# A binary answer's type, as the binary data extension's own example answers: the body is no longer JSON as a whole.
# (tritonclient and KServe's REST client frame it by Inference-Header-Content-Length, not by this type.)
BINARY_CONTENT = "application/octet-stream"


@dataclass(frozen=True)
class Prediction:
    """What the model said about one instance."""

    probabilities: Sequence[float]
    truncated: bool


@dataclass(frozen=True)
class ModelIdentity:
    """The model a KServe v2 answer names: its name and, when its archive carries one, its version.

    While two versions serve under one name (scripts/update_model.py), or a fleet rolls from one
    archive to the next, `model_version` tells a v2 client which one answered."""

    name: str
    version: str | None = None


@dataclass(frozen=True)
class Answer:
    """The status and JSON body one request gets."""

    status: int
    body: dict[str, Any]
    rejection: Rejection | None = None  # set when status is an error
    instance: str = ""  # which instance the error names, for the log line
    kserve: bool = False  # a KServe request's (or one on a KServe route): its errors carry the `error` field
    binary_outputs: tuple[str, ...] = ()  # a KServe v2 success's outputs written in the binary tensor extension


@dataclass(frozen=True)
class EncodedAnswer:
    """An answer as it leaves: its bytes, its content type, and any other response header it needs."""

    body: bytes
    content_type: str = JSON_CONTENT
    headers: tuple[tuple[str, str], ...] = ()


def rejection_answer(reason: Rejection, instance: str = "", kserve: bool = False) -> Answer:
    """The error answer for `reason`; a KServe request's also carries the message as `error`, the error shape of
    both protocols, which their clients read (tritonclient raises with it)."""
    body = reason.body()
    if kserve:
        body["error"] = reason.message
    return Answer(reason.status, body, reason, instance, kserve)


def to_json(body: Mapping[str, object]) -> str:
    """Compact JSON; ValueError for a NaN or an infinity, which JSON cannot hold (a client would fail to read it)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def prediction_body(prediction: Prediction, labels: Sequence[str]) -> dict[str, Any]:
    """The object /predictions answers for one text (and each entry of a KServe v1 answer)."""
    probabilities = prediction.probabilities
    best = max(range(len(labels)), key=lambda i: probabilities[i])
    return {
        "label": labels[best],
        "score": float(probabilities[best]),
        "scores": {label: float(p) for label, p in zip(labels, probabilities)},
        "truncated": prediction.truncated,
    }


def error_answer(request: ParsedRequest, position: int | None, reason: Rejection) -> Answer:
    """The error answer to a request, naming the instance at `position` where the format has names.

    A KServe request's error (v1 or v2, or a body on a KServe route too broken to tell) carries the `error`
    field (rejection_answer); the other fields are TorchServe's, as for every other error."""
    name = request.instance_name(position) if position is not None else ""
    if name:
        reason = replace(reason, message=f"{name}: {reason.message}")
    kserve = request.kserve_route or request.protocol in (KSERVE_V1, KSERVE_V2)
    return rejection_answer(reason, name, kserve)


def success_answer(
    request: ParsedRequest, predictions: Sequence[Prediction], labels: Sequence[str], model: ModelIdentity
) -> Answer:
    """The 200 answer to a request, given a prediction for each of its instances (in order)."""
    if request.protocol == KSERVE_V1:
        return Answer(200, {"predictions": [prediction_body(p, labels) for p in predictions]}, kserve=True)
    if request.protocol == KSERVE_V2:
        body = _v2_body(request, predictions, labels, model)
        return Answer(200, body, kserve=True, binary_outputs=request.binary_outputs)
    return Answer(200, prediction_body(predictions[0], labels), kserve=request.kserve_route)


def _v2_body(
    request: ParsedRequest, predictions: Sequence[Prediction], labels: Sequence[str], model: ModelIdentity
) -> dict[str, Any]:
    bodies = [prediction_body(p, labels) for p in predictions]
    n = len(predictions)
    body: dict[str, Any] = {"model_name": model.name}
    if model.version is not None:
        body["model_version"] = model.version
    if request.request_id is not None:
        body["id"] = request.request_id
    outputs = [
        {"name": "label", "datatype": "BYTES", "shape": [n], "data": [b["label"] for b in bodies]},
        {"name": "score", "datatype": "FP32", "shape": [n], "data": [b["score"] for b in bodies]},
        {
            "name": "probabilities",
            "datatype": "FP32",
            "shape": [n, len(labels)],
            "data": [float(p) for prediction in predictions for p in prediction.probabilities],
        },
        # Not in the minimum, but what a v2 client needs to know a text was cut.
        {"name": "truncated", "datatype": "BOOL", "shape": [n], "data": [p.truncated for p in predictions]},
    ]
    body["outputs"] = [output for output in outputs if output["name"] in request.outputs]  # what it asked for
    return body


def encode_answer(answer: Answer) -> EncodedAnswer:
    """The answer's bytes: compact JSON, or, where outputs are asked for as binary, the binary tensor extension's
    layout: the JSON header, each such output with `parameters.binary_data_size` in place of its `data`, then
    their bytes in the order of `outputs`, the header's length in `Inference-Header-Content-Length`.

    ValueError when it cannot be written (a lone surrogate, a NaN in JSON, a value FP32 cannot hold): the caller
    answers that one request 500 instead."""
    if not answer.binary_outputs:
        return EncodedAnswer(to_json(answer.body).encode("utf-8"))
    outputs, blobs = [], []
    for output in answer.body["outputs"]:
        if output["name"] in answer.binary_outputs:
            blob = tensor_bytes(output["datatype"], output["data"])
            output = {key: value for key, value in output.items() if key != "data"}
            output["parameters"] = {BINARY_SIZE: len(blob)}
            blobs.append(blob)
        outputs.append(output)
    header = to_json({**answer.body, "outputs": outputs}).encode("utf-8")
    return EncodedAnswer(header + b"".join(blobs), BINARY_CONTENT, ((RESPONSE_HEADER_LENGTH, str(len(header))),))
