"""KServe v1 and v2 (Open Inference Protocol) over real HTTP, batch-safe, mixed with /predictions traffic.

Runs against two servers: the test TorchServe with the model registered through the
management API, and a TorchServe started from exactly the generated KServe/cluster
configuration (tests/e2e/conftest.py::kserve_config_server).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.kserve_cases import MALFORMED, v1, v2
from tests.support import JSON, metrics_once, settled_metrics
from tooling.prometheus import metric_value

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["registered", "kserve-config"])
def served(request, torchserve):
    """(server, model name) for each way of running the model."""
    if request.param == "kserve-config":
        return request.getfixturevalue("kserve_config_server")
    return torchserve, request.getfixturevalue("shared_model")


def post(server, path: str, body) -> tuple[int, dict]:
    response = server.post(path, json.dumps(body) if not isinstance(body, bytes) else body, JSON)
    return response.status_code, response.json()


def routes(model: str) -> dict[str, str]:
    return {"v1": f"/v1/models/{model}:predict", "v2": f"/v2/models/{model}/infer", "plain": f"/predictions/{model}"}


def explanation_routes(model: str) -> dict[str, str]:
    return {"v1": f"/v1/models/{model}:explain", "v2": f"/v2/models/{model}/explain", "plain": f"/explanations/{model}"}


NOT_EXPLAINED = (501, "ExplanationNotSupported", "answers predictions, not explanations")


def alone(server, model: str, texts: list[str]) -> dict[str, dict]:
    """The answer for each text sent alone to /predictions, one request at a time."""
    answers = {}
    for text in dict.fromkeys(texts):
        response = server.predict(model, text)
        assert response.status_code == 200, response.text
        answers[text] = response.json()
    return answers


def test_concurrent_mixed_protocols_are_answered_instance_by_instance(served):
    server, model = served
    paths = routes(model)
    rng = random.Random(11)
    words = [
        "room",
        "staff",
        "food",
        "clean",
        "dirty",
        "loud",
        "quiet",
        "lovely",
        "awful",
        "slow",
        "fast",
        "kind",
        "rude",
    ]
    requests = []  # (path, body, texts or None, expected status/type for bad ones)
    for i in range(96):
        texts = [f"{i}-{k} " + " ".join(rng.choices(words, k=rng.randint(1, 30))) for k in range(rng.randint(1, 5))]
        kind = i % 3
        if kind == 0:
            requests.append((paths["plain"], {"text": texts[0]}, texts[:1], None))
        elif kind == 1:
            requests.append((paths["v1"], v1(*texts), texts, None))
        else:
            requests.append((paths["v2"], v2(*texts, request_id=f"req-{i}"), texts, None))
        if i % 8 == 7:  # bad requests interleaved, so they share batches with good ones
            _name, body, status, kind_, fragment = MALFORMED[(i // 8) % len(MALFORMED)]
            path = paths["v2"] if "inputs" in body else paths["v1"]
            requests.append((path, body, None, (status, kind_, fragment)))
        if i % 12 == 5:  # an explanation asked for, on each route in turn: refused alone, its batch answered
            route = ("plain", "v1", "v2")[(i // 12) % 3]
            body = {"plain": {"text": texts[0]}, "v1": v1(*texts), "v2": v2(*texts)}[route]
            requests.append((explanation_routes(model)[route], body, None, NOT_EXPLAINED))

    before = _counters(settled_metrics(server, model), model)
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda r: post(server, r[0], r[1]), requests))
    # The handler's counters reach /metrics through the worker's log stream, after the answers: wait for them
    # before the requests sent one at a time below add to them.
    after = _counters(metrics_once(server, model, {"bert_items_total": before["items"] + len(requests)}), model)

    expected = alone(server, model, [t for _, _, texts, _ in requests if texts for t in texts])
    checked = 0
    for (path, body, texts, bad), (status, answer) in zip(requests, results):
        if bad is not None:
            assert (status, answer["type"]) == bad[:2], (path, body, answer)
            assert bad[2] in answer["message"]
            continue
        assert status == 200, (path, answer)
        if path.startswith("/v1/"):
            got = [(p["label"], p["score"]) for p in answer["predictions"]]
        elif path.startswith("/v2/"):
            outputs = {o["name"]: o for o in answer["outputs"]}
            assert answer["id"] == body["id"] and (answer["model_name"], answer["model_version"]) == (model, "1.0")
            assert outputs["label"]["shape"] == [len(texts)] and outputs["probabilities"]["shape"] == [len(texts), 2]
            got = list(zip(outputs["label"]["data"], outputs["score"]["data"]))
        else:
            got = [(answer["label"], answer["score"])]
        assert len(got) == len(texts)
        for (label, score), text in zip(got, texts):
            assert label == expected[text]["label"]
            assert score == pytest.approx(expected[text]["score"], abs=1e-4)
            checked += 1
    assert checked > 150
    items, batches = after["items"] - before["items"], after["batches"] - before["batches"]
    print(f"\n{len(requests)} requests, {checked} instances checked; {items:.0f} requests in {batches:.0f} batches")
    assert items == len(requests)
    assert 0 < batches < items, f"no batch held more than one request: {items:.0f} requests in {batches:.0f} batches"


@pytest.mark.parametrize(("name", "body", "status", "kind", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_malformed_request_gets_its_4xx(served, name, body, status, kind, fragment):
    server, model = served
    path = routes(model)["v2" if "inputs" in body else "v1"]
    code, answer = post(server, path, body)
    assert (code, answer["code"], answer["type"]) == (status, status, kind)
    assert fragment in answer["message"]


def test_each_explanation_route_is_refused_501_naming_the_prediction_routes(served):
    """This handler has no explainer: a prediction answered on an explanation route would pass for an explanation."""
    server, model = served
    bodies = {"plain": {"text": "a lovely room"}, "v1": v1("a lovely room"), "v2": v2("a lovely room")}
    for route, path in explanation_routes(model).items():
        code, answer = post(server, path, bodies[route])
        assert (code, answer["code"], answer["type"]) == (501, *NOT_EXPLAINED[:2]), (path, answer)
        assert "/predictions/NAME, /v1/models/NAME:predict or /v2/models/NAME/infer" in answer["message"]
        assert answer.get("error") == (answer["message"] if route != "plain" else None), answer  # KServe's field
        code, answer = post(server, routes(model)[route], bodies[route])  # the same body where it is predicted
        assert code == 200, (route, answer)


def test_a_body_that_is_not_json_on_a_kserve_route(served):
    server, model = served
    code, answer = post(server, routes(model)["v1"], b'{"instances": ["unterminated"')
    assert (code, answer["type"]) == (400, "MalformedJSON")


def _counters(text: str, model: str) -> dict[str, float]:
    """The handler's item and batch counters for `model`, from /metrics text."""
    return {
        "items": metric_value(text, "bert_items_total", ModelName=model),
        "batches": metric_value(text, "bert_batches_total", ModelName=model),
    }
