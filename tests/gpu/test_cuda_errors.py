"""A real CUDA error in the worker's forward pass ends the worker (handlers/torch_forward.end_the_worker), and a GPU
the process cannot see is refused at load.

The device-side assert is forced in the worker's handler in a process of its own (the in-process handler, as
TorchServe's worker drives it): every way a served archive could index past an embedding table is refused at load
or before the pass (tests/inprocess/test_torch_forward_failures.py), so the table is shrunk after load here.
That TorchServe replaces a worker whose process ended: tests/gpu/test_gpu_serving.py (a worker killed on the GPU).

Marked gpu: skipped, with the reason shown, where torch sees no CUDA device (CI has none).
"""

from __future__ import annotations

import textwrap

import pytest

from handlers.loading import ModelLoadFailed, load_model
from handlers.options import HandlerOptions
from handlers.torch_forward import CUDA_ERROR_EXIT_CODE
from tests.support import worker_ended

pytestmark = pytest.mark.gpu

TEXTS = ["the room was clean", "rude staff at the desk", "a quiet hotel by the sea", "fine"]

DEVICE_SIDE_ASSERT = textwrap.dedent(
    """
    import json, logging, sys
    import torch
    from tooling.inprocess import load_handler, make_context, set_batch

    logging.basicConfig(level=logging.INFO, stream=sys.stdout)  # as TorchServe's worker logs
    model_dir, texts = sys.argv[1], json.loads(sys.argv[2])
    options = {"dtype": "float32"}
    handler = load_handler(model_dir, options, gpu_id=0)

    def handle(texts):
        context = make_context(model_dir, options, gpu_id=0)
        handler.handle(set_batch(context, [(t.encode(), "text/plain") for t in texts]), context)
        return [context.get_response_status(i)[0] for i in range(len(texts))]

    print("BEFORE", handle(texts))
    model = handler.served.forward.model
    table = model.get_input_embeddings()
    # 8 rows: every real token id indexes past them, and the embedding kernel's bounds assert fires on the GPU.
    small = torch.nn.Embedding(8, table.embedding_dim).to(table.weight.device, table.weight.dtype)
    model.set_input_embeddings(small)
    print("AFTER", handle(texts))
    """
)


def test_a_device_side_assert_ends_the_worker_process_with_one_critical_line(unpacked_model_dir):
    status, output, critical = worker_ended(DEVICE_SIDE_ASSERT, unpacked_model_dir, TEXTS)
    assert f"BEFORE {[200] * len(TEXTS)}" in output, output[-3000:]  # the worker served on the GPU first
    assert status == CUDA_ERROR_EXIT_CODE, output[-3000:]
    assert "AFTER" not in output  # no answer after the context was poisoned: the process ended instead
    assert len(critical) == 1, output[-3000:]
    assert "CUDA error on cuda:0" in critical[0] and "CUDA error: " in critical[0], critical[0]


def test_a_gpu_the_process_cannot_see_is_refused_at_load(tiny_checkpoint):
    import torch

    missing = torch.cuda.device_count()  # one past the last visible GPU
    with pytest.raises(ModelLoadFailed, match=rf"GPU {missing}, but torch sees {missing} CUDA device"):
        load_model(tiny_checkpoint, HandlerOptions(), missing)
