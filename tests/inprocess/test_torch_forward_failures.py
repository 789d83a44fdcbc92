"""What the PyTorch forward pass refuses at load, and what it does with a failure that is not one item's own,
through the real loader (handlers/loading.py) on tiny checkpoints built by tooling/checkpoints.py.

On this CPU host: a worker TorchServe gave a GPU that torch cannot see is refused, not served on the CPU; a
tokenizer with ids past the model's embedding table is refused; a pair on a model without a second token type
fails alone before the pass; an out-of-memory error frees the failed pass before the cache is emptied and is
still answered 507; and a CUDA error ends the worker process. The same on a GPU: tests/gpu/test_cuda_errors.py.
"""

from __future__ import annotations

import gc
import shutil
import textwrap
import weakref
from pathlib import Path

import pytest
import torch

from handlers.fault_isolation import run_isolating_faults
from handlers.instances import TextPair
from handlers.loading import ModelLoadFailed, load_model
from handlers.options import HandlerOptions
from handlers.rejection import Rejection
from handlers.tokenization import encode
from handlers.torch_forward import CUDA_ERROR_EXIT_CODE, UnembeddableTokenTypes
from tests.support import worker_ended
from tooling.inprocess import load_handler

ADDED_TOKENS = ["<hotel>", "<room>"]
TEXTS = ["the room was clean", "rude staff at the desk", "a quiet <hotel> by the sea", "fine"]


def with_added_tokens(checkpoint: Path, out_dir: Path, resize: bool = False) -> Path:
    """A copy of `checkpoint` whose tokenizer has ADDED_TOKENS, as after tokenizer.add_tokens() without the model's
    embeddings following; with `resize`, the embeddings resized to the tokenizer (the refusal's fix)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    shutil.copytree(checkpoint, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    tokenizer.add_tokens(ADDED_TOKENS)
    tokenizer.save_pretrained(out_dir)
    if resize:
        model = AutoModelForSequenceClassification.from_pretrained(out_dir, local_files_only=True)
        model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(out_dir)
    return out_dir


# ---- a GPU worker torch cannot serve on a GPU ------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here: GPU 0 is served, not refused")
def test_a_worker_given_a_gpu_that_torch_cannot_see_is_refused_not_served_on_the_cpu(tiny_checkpoint):
    with pytest.raises(ModelLoadFailed) as refused:
        load_model(tiny_checkpoint, HandlerOptions(), 0)
    message = str(refused.value)
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    assert f"GPU 0, but torch {torch.__version__} ({built}) sees no CUDA device" in message
    assert "refusing to run on the CPU" in message
    assert "R580" in message and "570.26" in message  # the drivers each CUDA build of torch needs


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU here: GPU 0 is served, not refused")
def test_the_handler_refuses_the_gpu_worker_with_the_cause_as_torchserve_logs_it(unpacked_model_dir):
    with pytest.raises(ModelLoadFailed, match=r"cannot load tiny on GPU 0: ModelLoadFailed: .* sees no CUDA device"):
        load_handler(unpacked_model_dir, gpu_id=0)


# ---- token ids the model cannot embed ---------------------------------------------------------------------


def test_a_tokenizer_with_ids_past_the_embedding_table_is_refused_at_load(tiny_checkpoint, tmp_path):
    checkpoint = with_added_tokens(tiny_checkpoint, tmp_path / "added")
    with pytest.raises(ModelLoadFailed) as refused:
        load_model(checkpoint, HandlerOptions(), None)
    message = str(refused.value)
    assert "can produce 30524 token ids" in message and "model embeds 30522" in message
    assert "model.get_input_embeddings().num_embeddings" in message
    assert "resize_token_embeddings" in message and "fix the tokenizer" in message


def test_the_same_tokenizer_with_its_embeddings_resized_is_served(tiny_checkpoint, tmp_path):
    checkpoint = with_added_tokens(tiny_checkpoint, tmp_path / "resized", resize=True)
    served = load_model(checkpoint, HandlerOptions(), None)
    scores = served.forward(encode(served.encoder, TEXTS))  # TEXTS[2] holds an added token's id
    assert scores.shape == (len(TEXTS), 2)


def test_an_onnx_archive_is_refused_by_its_config_before_its_graph_is_read(tiny_checkpoint, tmp_path):
    """The ONNX check reads config.json's vocab_size; the graph here is an empty file, so a refusal that names the
    vocabulary came before ONNX Runtime read it, and the unchanged checkpoint fails on the graph instead."""
    graph_dir = tmp_path / "onnx"
    graph_dir.mkdir()
    (graph_dir / "model.onnx").write_bytes(b"")
    checkpoint = with_added_tokens(tiny_checkpoint, tmp_path / "added")
    with pytest.raises(ModelLoadFailed, match=r"30524 token ids .* model embeds 30522 \(config.json vocab_size\)"):
        load_model(checkpoint, HandlerOptions(), None, onnx_dir=graph_dir)
    with pytest.raises(Exception) as other:
        load_model(tiny_checkpoint, HandlerOptions(), None, onnx_dir=graph_dir)
    assert not isinstance(other.value, ModelLoadFailed)


def test_a_pair_on_a_model_with_one_token_type_fails_alone_before_the_pass(tmp_path):
    """A BERT tokenizer marks a pair's second text with token type 1; a model with type_vocab_size 1 has no row for
    it (on a GPU: a device-side assert). The pass is refused on the host, so bisection answers the pair alone."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from tooling.checkpoints import LABELS, SIZES, minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, type_vocab_size=1, id2label=LABELS, **SIZES["tiny"])
    BertForSequenceClassification(config).eval().save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    served = load_model(tmp_path / "ckpt", HandlerOptions(), None)
    items = [*TEXTS[:2], TextPair("is the pool open", "the pool opens at nine"), TEXTS[3]]
    encodings = encode(served.encoder, items)
    with pytest.raises(UnembeddableTokenTypes, match=r"token type 1 .* embeds 1 type"):
        served.forward(encodings)
    answers = run_isolating_faults(lambda group: served.forward([encodings[i] for i in group]), range(len(items)))
    assert [isinstance(answers[i], Rejection) for i in range(len(items))] == [False, False, True, False]


def test_the_capture_check_applies_where_the_graphs_do_only(tiny_checkpoint, monkeypatch):
    """cuda_graphs on a CPU worker is ignored (and said so), so a transformers without the capture check
    (handlers/cuda_graphs.require_capture_safe_transformers) refuses no CPU worker."""
    import transformers.utils.import_utils

    monkeypatch.delattr(transformers.utils.import_utils, "is_cuda_stream_capturing")
    served = load_model(tiny_checkpoint, HandlerOptions(cuda_graphs=True), None)
    assert "cuda_graphs ignored" in served.description


def test_onnx_runtimes_options_on_an_archive_pytorch_serves_are_said_to_be_ignored(tiny_checkpoint):
    """As cuda_graphs on an archive the graphs cannot serve: the load log names what does nothing here."""
    served = load_model(tiny_checkpoint, HandlerOptions(onnx_spinning=True, onnx_inter_op_threads=2), None)
    assert "onnx_inter_op_threads, onnx_spinning ignored: ONNX Runtime's, and PyTorch serves" in served.description
    assert "ignored" not in load_model(tiny_checkpoint, HandlerOptions(), None).description


# ---- out of memory --------------------------------------------------------------------------------------


def test_an_out_of_memory_empties_the_cache_after_the_failed_pass_is_freed_and_is_still_answered_507(
    tiny_checkpoint, monkeypatch
):
    """PyTorch's FAQ: inside `except OutOfMemoryError` the traceback holds the failed pass's frames, and so its
    tensors, and empty_cache() can give none of them back. The pass here holds a tensor as the failing model would
    hold its activations; empty_cache must run once that tensor is gone."""
    served = load_model(tiny_checkpoint, HandlerOptions(), None)
    held: list[weakref.ref] = []
    alive_at_empty_cache: list[bool] = []

    def out_of_memory(*args, **kwargs):
        activations = torch.empty(1024)  # a local of the failing frame, as a layer's outputs are
        held.append(weakref.ref(activations))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

    monkeypatch.setattr(served.forward.model, "forward", out_of_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: alive_at_empty_cache.append(held[-1]() is not None))
    encodings = encode(served.encoder, TEXTS)
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"Tried to allocate 2\.00 GiB") as raised:
        served.forward(encodings)
    assert alive_at_empty_cache == [False]
    # Raised anew, outside the handler: nothing chains it to the failed pass's traceback.
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    del raised
    gc.collect()
    answers = run_isolating_faults(lambda group: served.forward([encodings[i] for i in group]), range(len(TEXTS)))
    assert {answers[i].type for i in range(len(TEXTS))} == {"OutOfMemory"}  # type: ignore[union-attr]


# ---- a CUDA error ends the worker ---------------------------------------------------------------------------

# The worker's handler, in a process of its own: the CUDA error must end that process, with one critical line.
ENDS_THE_WORKER = textwrap.dedent(
    """
    import json, logging, sys
    import torch
    from tooling.inprocess import load_handler, make_context, set_batch

    logging.basicConfig(level=logging.INFO, stream=sys.stdout)  # as TorchServe's worker logs
    model_dir, texts = sys.argv[1], json.loads(sys.argv[2])
    handler = load_handler(model_dir)

    def device_side_assert(*args, **kwargs):
        raise torch.AcceleratorError(
            "CUDA error: device-side assert triggered\\nCUDA kernel errors might be asynchronously reported"
        )

    handler.served.forward.model.forward = device_side_assert
    context = make_context(model_dir)
    handler.handle(set_batch(context, [(t.encode(), "text/plain") for t in texts]), context)
    print("ANSWERED: the worker went on serving")
    """
)


def test_a_cuda_error_ends_the_worker_process_with_one_critical_line_instead_of_answering(unpacked_model_dir):
    """torch.AcceleratorError is what a failed CUDA call raises (torch 2.8 and later); raised by the model here, on
    the CPU, it takes the same way out of the forward pass a real one takes on a GPU."""
    status, output, critical = worker_ended(ENDS_THE_WORKER, unpacked_model_dir, TEXTS)
    assert status == CUDA_ERROR_EXIT_CODE, output[-3000:]
    assert "ANSWERED" not in output
    assert len(critical) == 1, output[-3000:]
    assert "AcceleratorError: CUDA error: device-side assert triggered" in critical[0]
    assert "ending the worker" in critical[0] and "TorchServe starts a fresh one" in critical[0]
