"""Any Hugging Face sequence-classification checkpoint, not only BERT: DistilBERT and RoBERTa."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from handlers.tokenization import model_token_limit
from tests.support import statuses
from tooling.checkpoints import build_random_family_classifier
from tooling.inprocess import load_handler, make_context, set_batch, unpacked_layout

FAMILIES = ["distilbert", "roberta"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_checkpoint(request, tmp_path_factory):
    return request.param, build_random_family_classifier(tmp_path_factory.mktemp(request.param) / "ckpt", request.param)


def test_handler_serves_other_model_families(family_checkpoint, tmp_path):
    family, checkpoint = family_checkpoint
    model_dir = unpacked_layout(checkpoint, tmp_path / "unpacked")
    handler = load_handler(model_dir)
    assert handler.served.model_type == family
    assert handler.served.max_length == 256 and handler.served.token_limit == 512

    texts = ["a fine stay", "the room was dirty and loud", "ok " * 600]
    context = make_context(model_dir)
    items = [(texts[0].encode(), "text/plain"), (b"", "text/plain"), (texts[1].encode(), "text/plain"),
             (json.dumps({"text": texts[2]}).encode(), "application/json")]  # fmt: skip
    out = [json.loads(o) for o in handler.handle(set_batch(context, items), context)]
    assert statuses(context, 4) == [200, 400, 200, 200]
    assert out[3]["truncated"] is True
    for index, text in ((0, texts[0]), (2, texts[1])):
        alone_context = make_context(model_dir)
        [single] = handler.handle(set_batch(alone_context, [(text.encode(), "text/plain")]), alone_context)
        assert json.loads(single)["score"] == pytest.approx(out[index]["score"], abs=1e-4)


def test_roberta_s_positions_after_the_padding_index_leave_two_fewer_tokens():
    """RoBERTa's position ids start after its padding index: of 514 positions, 512 tokens. A tokenizer that declares
    no length (transformers' 1e30) must not let a pass run past the positions (an index error, every text 500)."""
    unset = SimpleNamespace(model_max_length=int(1e30))
    assert model_token_limit(unset, SimpleNamespace(model_type="roberta", max_position_embeddings=514)) == 512
    assert model_token_limit(unset, SimpleNamespace(model_type="bert", max_position_embeddings=512)) == 512
    assert model_token_limit(SimpleNamespace(model_max_length=128), SimpleNamespace(model_type="bert",
                             max_position_embeddings=512)) == 128  # fmt: skip
    assert model_token_limit(unset, SimpleNamespace()) == 512  # nothing declared: BERT's


@pytest.mark.e2e
def test_other_model_families_archive_and_serve(family_checkpoint, torchserve, make_archive):
    family, checkpoint = family_checkpoint
    name = f"tiny-{family}"
    assert torchserve.register(make_archive(checkpoint, name), batch_size=4, max_batch_delay=5).status_code == 200
    try:
        response = torchserve.predict(name, "The hotel was lovely.")
        assert response.status_code == 200
        assert response.json()["label"] in ("negative", "positive")
        assert torchserve.predict(name, "").status_code == 400
    finally:
        torchserve.unregister(name)
