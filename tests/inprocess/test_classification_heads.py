"""Heads other than the two-label softmax answer as transformers' own text-classification pipeline reads them.

A regression head answers its raw value, a one-output head (a cross-encoder's) and a multi-label head a
sigmoid per label (handlers/scores.py); before, every head went through a softmax, and a one-output head
answered 1.0 to every text. The reference is `transformers.pipeline("text-classification")` on the same
checkpoint, which picks the function from the config by the same rule; the handler is checked against it
through PyTorch in-process, through an exported ONNX graph, and through a real TorchServe.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from handlers.loading import load_model
from handlers.onnx_forward import EXPORT_METADATA_KEY, ONNX_FILE, OnnxBackendError
from handlers.options import HandlerOptions
from tests.support import run_transformers_pipeline, statuses
from tooling.checkpoints import HEADS, build_random_classifier
from tooling.inprocess import load_handler, make_context, set_batch, unpacked_layout

TEXTS = [
    "The room was spotless and the staff were kind.",
    "Delivery took three weeks and the box arrived crushed.",
    "ok",
    "I was charged twice for one order and nobody answers the phone.",
    "¡Qué desastre! never again",
]
# The handler and the pipeline run the same weights on the same tokens; batching moves a float32 score by ~1e-7.
TOLERANCE = 1e-5
ONNX_TOLERANCE = 1e-4  # the export's own parity bar (tooling/onnx_export.py)
EXPECTED_FUNCTION = {"regression": "none", "one-label": "sigmoid", "multi-label": "sigmoid"}


@pytest.fixture(scope="module", params=sorted(HEADS))
def head_checkpoint(request, tmp_path_factory):
    return request.param, build_random_classifier(tmp_path_factory.mktemp(request.param) / "ckpt", head=request.param)


def pipeline_scores(checkpoint, texts: list[str]) -> list[dict[str, float]]:
    """transformers' text-classification pipeline, every label's score, its own function_to_apply by default."""
    return [
        {row["label"]: row["score"] for row in rows}
        for rows in run_transformers_pipeline(checkpoint, texts, top_k=None)
    ]


def handler_answers(handler, model_dir, texts: list[str]) -> list[dict]:
    """One batch of /predictions requests, plus an empty body in the middle that must be refused on its own."""
    context = make_context(model_dir)
    items = [(text.encode(), "text/plain") for text in texts]
    items.insert(2, (b"", "text/plain"))
    answers = [json.loads(out) for out in handler.handle(set_batch(context, items), context)]
    assert statuses(context, len(items)) == [200, 200, 400] + [200] * (len(texts) - 2)
    return answers[:2] + answers[3:]


def assert_answers_match(answers: list[dict], expected: list[dict[str, float]], tolerance: float) -> None:
    for answer, scores in zip(answers, expected, strict=True):
        assert set(answer["scores"]) == set(scores), (answer, scores)
        for label, score in scores.items():
            assert answer["scores"][label] == pytest.approx(score, abs=tolerance), (label, answer, scores)
        best = max(scores, key=scores.get)
        assert (answer["label"], answer["score"]) == (best, pytest.approx(scores[best], abs=tolerance))


def test_each_head_is_read_as_the_transformers_pipeline_reads_it(head_checkpoint, tmp_path):
    head, checkpoint = head_checkpoint
    model_dir = unpacked_layout(checkpoint, tmp_path / "unpacked")
    handler = load_handler(model_dir)
    assert handler.served.scores == EXPECTED_FUNCTION[head]
    answers = handler_answers(handler, model_dir, TEXTS)
    assert_answers_match(answers, pipeline_scores(checkpoint, TEXTS), TOLERANCE)
    if head == "one-label":
        # The defect this guards against: a softmax over one output is 1.0 whatever the text.
        assert len({round(a["score"], 6) for a in answers}) == len(TEXTS) and max(a["score"] for a in answers) < 1
    if head == "multi-label":
        assert any(abs(sum(a["scores"].values()) - 1) > 0.05 for a in answers)  # labels no longer share one unit


@pytest.fixture(scope="module")
def exported_head(head_checkpoint, tmp_path_factory):
    from tooling.onnx_export import export_checkpoint

    head, checkpoint = head_checkpoint
    exported = tmp_path_factory.mktemp(f"onnx-{head}") / "model"
    record = export_checkpoint(checkpoint, exported, progress=lambda _: None)
    return head, checkpoint, exported, record


def test_an_exported_graph_bakes_in_the_heads_function_and_answers_as_pytorch(exported_head, tmp_path):
    head, checkpoint, exported, record = exported_head
    assert record.scores == EXPECTED_FUNCTION[head]
    assert ("label agreement" in record.summary) == (head != "regression")  # a regression head has no labels
    model_dir = unpacked_layout(exported, tmp_path / "unpacked")
    handler = load_handler(model_dir)
    assert (handler.served.backend, handler.served.scores) == ("onnxruntime", EXPECTED_FUNCTION[head])
    assert_answers_match(handler_answers(handler, model_dir, TEXTS), pipeline_scores(checkpoint, TEXTS), ONNX_TOLERANCE)


def test_a_graph_whose_baked_function_is_not_the_configs_is_refused_at_load(exported_head, tmp_path):
    import onnx

    head, _, exported, _ = exported_head
    stale = tmp_path / "stale"
    shutil.copytree(exported, stale)
    graph = onnx.load(str(stale / ONNX_FILE))
    (entry,) = [p for p in graph.metadata_props if p.key == EXPORT_METADATA_KEY]
    record = json.loads(entry.value)
    del record["scores"]  # as an export from before the record named its function: a softmax
    entry.value = json.dumps(record)
    onnx.save(graph, str(stale / ONNX_FILE))
    with pytest.raises(OnnxBackendError, match=f"returns softmax scores but the checkpoint's config asks for "
                                               f"{EXPECTED_FUNCTION[head]}"):  # fmt: skip
        load_model(exported, HandlerOptions(), None, onnx_dir=stale)


def test_int8_refuses_a_regression_head_before_exporting(tmp_path):
    from tooling.onnx_export import ExportFailed, export_checkpoint

    checkpoint = build_random_classifier(tmp_path / "ckpt", head="regression")
    with pytest.raises(ExportFailed, match="regression head"):
        export_checkpoint(checkpoint, tmp_path / "out", quantize="int8", progress=lambda _: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_multi_label_archive_answers_through_torchserve_in_every_protocol(torchserve, make_archive, tmp_path_factory):
    checkpoint = build_random_classifier(tmp_path_factory.mktemp("served-multi-label") / "ckpt", head="multi-label")
    name = "tiny-multi-label"
    assert torchserve.register(make_archive(checkpoint, name), batch_size=4, max_batch_delay=5).status_code == 200
    try:
        expected = pipeline_scores(checkpoint, TEXTS)
        single = torchserve.predict(name, TEXTS[0])
        assert single.status_code == 200, single.text
        assert_answers_match([single.json()], expected[:1], TOLERANCE)

        request = {"inputs": [{"name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}]}
        v2 = torchserve.post(f"/v2/models/{name}/infer", json.dumps(request), "application/json")
        assert v2.status_code == 200, v2.text
        outputs = {o["name"]: o for o in v2.json()["outputs"]}
        labels = sorted(HEADS["multi-label"]["id2label"].items())
        assert outputs["probabilities"]["shape"] == [len(TEXTS), len(labels)]
        served = np.array(outputs["probabilities"]["data"]).reshape(len(TEXTS), len(labels))
        wanted = np.array([[scores[name] for _, name in labels] for scores in expected])
        np.testing.assert_allclose(served, wanted, atol=TOLERANCE)
    finally:
        torchserve.unregister(name)
