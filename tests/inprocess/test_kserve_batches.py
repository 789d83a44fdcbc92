"""KServe v1/v2 requests mixed with plain ones in one batch, through the handler in-process (TorchServe's Context)."""

from __future__ import annotations

import json
import logging

import pytest

from tests.kserve_cases import MALFORMED, v1, v2
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
