"""Instance results -> the status and JSON body each request gets, in its own format. Pure and torch-free.

A request is answered as a whole: 200 when every instance is served, otherwise one error
(which one: handlers/pipeline.first_rejection), naming its instance (`instances[2]: ...`,
`inputs[0].data[3]: ...`), in TorchServe's error shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from handlers.protocols import KSERVE_V1, KSERVE_V2, ParsedRequest
from handlers.rejection import Rejection


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
        return Answer(200, _v2_body(request, predictions, labels, model), kserve=True)
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
