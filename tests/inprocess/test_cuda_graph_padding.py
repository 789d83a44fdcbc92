"""What CUDA graphs rest on, through a real model on the CPU: a pass padded into a larger bucket
(handlers/cuda_graphs.pad_into) answers its real rows as the pass itself does, for BERT, DistilBERT and
RoBERTa. The graphs themselves need a GPU: tests/gpu/test_cuda_graphs.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.batching import Bucket
from handlers.cuda_graphs import pad_into
from handlers.loading import load_model
from handlers.options import HandlerOptions
from handlers.tokenization import collate, encode
from tooling.checkpoints import build_random_family_classifier

TEXTS = ["great", "the room was dirty and the staff were rude to us", "ok", "a calm, clean and quiet hotel " * 6]


@pytest.fixture(scope="module", params=["bert", "distilbert", "roberta"])
def served(request, tiny_checkpoint, tmp_path_factory):
    checkpoint = tiny_checkpoint
    if request.param != "bert":
        checkpoint = build_random_family_classifier(tmp_path_factory.mktemp(request.param) / "ckpt", request.param)
    return load_model(checkpoint, HandlerOptions(), None)


def probabilities(model, arrays) -> np.ndarray:
    with torch.inference_mode():
        logits = model(**{key: torch.from_numpy(value) for key, value in arrays.items()}).logits
    return logits.float().softmax(-1).numpy()


@pytest.mark.parametrize("count", [1, 3, 4])
def test_rows_and_columns_a_bucket_adds_leave_the_real_rows_answers_as_they_were(served, count):
    classifier = served.forward.model
    encodings = encode(served.encoder, TEXTS[:count])
    arrays = collate(encodings, served.tokenizer.pad_token_id or 0, 1, served.token_limit)
    rows, width = arrays["input_ids"].shape
    bucket = Bucket(rows + 3, width + 5)  # strictly larger both ways
    out = {key: np.empty((bucket.rows, bucket.width), dtype=np.int64) for key in arrays}
    pad_into(arrays, out, served.tokenizer.pad_token_id or 0)

    alone = probabilities(classifier, arrays)
    padded = probabilities(classifier, out)
    assert np.isfinite(padded).all()  # the filler rows too: a NaN there would mean a fully masked row
    np.testing.assert_allclose(padded[:rows], alone, atol=1e-5)


def test_cuda_graphs_asked_for_where_there_is_no_gpu_are_said_to_be_ignored(tiny_checkpoint):
    served = load_model(tiny_checkpoint, HandlerOptions(cuda_graphs=True), None, batch_size=8)
    assert served.forward.graphs is None
    assert "cuda_graphs ignored: CUDA graphs need a PyTorch archive on a GPU" in served.description
    assert "ignored" not in load_model(tiny_checkpoint, HandlerOptions(), None).description
