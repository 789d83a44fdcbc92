"""Pairs of texts (handlers/instances.py): a cross-encoder's query and passage, NLI's premise and hypothesis.

Each pair is answered as transformers' text-classification pipeline answers `{"text": ..., "text_pair": ...}`
on the same checkpoint, in a batch that mixes pairs, single texts and refused instances in every format;
through the handler in-process and through a real TorchServe (`/predictions` and tritonclient's v2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support import JSON, TEXT, run_transformers_pipeline, statuses
from tooling.checkpoints import build_random_classifier, build_random_family_classifier
from tooling.inprocess import load_handler, make_context, set_batch, unpacked_layout

QUERY = "what is the refund policy"
PASSAGES = [
    "Refunds are issued within 14 days of purchase for unused items.",
    "The hotel has a rooftop pool and a quiet garden.",
    "Unused items can be returned for a full refund; shipping is not refunded.",
]
LONG_PASSAGE = "Our returns desk is open on weekdays and answers every message. " * 60  # far past the 256 cap
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    """A one-output BERT classifier, as a cross-encoder reranker is (read through a sigmoid: handlers/scores.py)."""
    checkpoint = build_random_classifier(tmp_path_factory.mktemp("cross-encoder") / "ckpt", head="one-label")
    model_dir = unpacked_layout(checkpoint, tmp_path_factory.mktemp("unpacked"))
    return checkpoint, model_dir, load_handler(model_dir)


def pipeline_pair_scores(checkpoint, pairs: list[tuple[str, str]]) -> list[float]:
    """transformers' text-classification pipeline on {"text", "text_pair"} inputs, cut longest first at the handler's
    cap of 256 tokens."""
    inputs = [{"text": a, "text_pair": b} for a, b in pairs]
    return [row["score"] for row in run_transformers_pipeline(checkpoint, inputs, truncation=True, max_length=256)]


def test_pairs_in_every_format_are_answered_as_the_pipeline_answers_them_beside_single_texts(cross_encoder):
    checkpoint, model_dir, handler = cross_encoder
    v2 = {"inputs": [{"name": "text_pair", "datatype": "BYTES", "shape": [2], "data": PASSAGES[1:]},
                     {"name": "text", "datatype": "BYTES", "shape": [2], "data": [QUERY, QUERY]}]}  # fmt: skip
    items = [
        (json.dumps({"text": QUERY, "text_pair": PASSAGES[0]}).encode(), JSON),  # /predictions, a pair
        (QUERY.encode(), TEXT),  # a single text beside it
        (json.dumps({"instances": [{"text": QUERY, "text_pair": PASSAGES[2]}, PASSAGES[2]]}).encode(), JSON),
        (json.dumps({"text": QUERY, "text_pair": "  "}).encode(), JSON),  # refused alone
        (json.dumps(v2).encode(), JSON),
        (json.dumps({"text": QUERY, "text_pair": LONG_PASSAGE}).encode(), JSON),
    ]
    context = make_context(model_dir)
    out = [json.loads(body) for body in handler.handle(set_batch(context, items), context)]
    assert statuses(context, len(items)) == [200, 200, 200, 400, 200, 200]
    assert out[3]["type"] == "EmptyText" and "text_pair" in out[3]["message"]

    pairs = [(QUERY, passage) for passage in (PASSAGES[0], PASSAGES[2], PASSAGES[1], PASSAGES[2], LONG_PASSAGE)]
    expected = pipeline_pair_scores(checkpoint, pairs)
    served = [
        out[0]["score"],
        out[2]["predictions"][0]["score"],
        *next(o["data"] for o in out[4]["outputs"] if o["name"] == "score"),
        out[5]["score"],
    ]
    np.testing.assert_allclose(served, expected, atol=TOLERANCE)
    assert out[5]["truncated"] is True and out[0]["truncated"] is False
    # A pair is not its texts run together: the tokenizer's separator and token types make it a pair.
    singles = [out[1]["score"], out[2]["predictions"][1]["score"]]
    assert all(abs(s - p) > 1e-4 for s in singles for p in served)


def test_an_onnx_archive_the_default_on_cpus_answers_pairs_as_the_pipeline_does(cross_encoder, tmp_path):
    # The graph takes token_type_ids (tooling/onnx_export.py), so the second text keeps its token type.
    from tooling.onnx_export import export_checkpoint

    checkpoint, _, _ = cross_encoder
    export_checkpoint(checkpoint, tmp_path / "onnx", progress=lambda _: None)
    model_dir = unpacked_layout(tmp_path / "onnx", tmp_path / "unpacked")
    handler = load_handler(model_dir)
    assert handler.served.backend == "onnxruntime"
    bodies = [json.dumps({"text": QUERY, "text_pair": passage}).encode() for passage in PASSAGES]
    context = make_context(model_dir)
    out = [json.loads(body) for body in handler.handle(set_batch(context, [(b, JSON) for b in bodies]), context)]
    expected = pipeline_pair_scores(checkpoint, [(QUERY, passage) for passage in PASSAGES])
    np.testing.assert_allclose([o["score"] for o in out], expected, atol=1e-4)  # the export's own parity bar


def test_a_pair_the_tokenizer_cannot_cut_to_the_cap_is_refused_alone(tmp_path):
    # RoBERTa joins a pair with four special tokens (<s> a </s></s> b </s>): under a cap of 3 neither the
    # tokenizer nor its wrapper can cut it, and serving it would run past the cap the options set.
    checkpoint = build_random_family_classifier(tmp_path / "roberta", "roberta")
    model_dir = unpacked_layout(checkpoint, tmp_path / "unpacked")
    handler = load_handler(model_dir, {"max_length": 3})
    context = make_context(model_dir, {"max_length": 3})
    items = [(b"a fine stay", TEXT), (json.dumps({"text": "a", "text_pair": "b"}).encode(), JSON), (b"ok", TEXT)]
    out = [json.loads(body) for body in handler.handle(set_batch(context, items), context)]
    assert statuses(context, 3) == [200, 422, 200]
    assert out[1]["type"] == "TooManyTokens"


@pytest.mark.e2e
def test_a_cross_encoder_scores_pairs_through_torchserve_and_tritonclient(cross_encoder, torchserve, make_archive):
    import tritonclient.http as triton

    checkpoint, _, _ = cross_encoder
    name = "tiny-cross-encoder"
    assert torchserve.register(make_archive(checkpoint, name), batch_size=8, max_batch_delay=5).status_code == 200
    try:
        expected = pipeline_pair_scores(checkpoint, [(QUERY, p) for p in PASSAGES])
        one = torchserve.predict(name, json.dumps({"text": QUERY, "text_pair": PASSAGES[0]}), JSON)
        assert one.status_code == 200, one.text
        assert one.json()["score"] == pytest.approx(expected[0], abs=TOLERANCE)

        client = triton.InferenceServerClient(url=torchserve.inference_url.removeprefix("http://"))
        try:
            inputs = []
            for input_name, column in (("text", [QUERY] * len(PASSAGES)), ("text_pair", PASSAGES)):
                tensor = triton.InferInput(input_name, [len(column)], "BYTES")
                tensor.set_data_from_numpy(np.array(column, dtype=object), binary_data=False)
                inputs.append(tensor)
            outputs = [triton.InferRequestedOutput("score", binary_data=False)]
            result = client.infer(name, inputs, outputs=outputs, headers=torchserve.auth("inference"))
        finally:
            client.close()
        np.testing.assert_allclose(result.as_numpy("score").tolist(), expected, atol=TOLERANCE)
    finally:
        torchserve.unregister(name)
