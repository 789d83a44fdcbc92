"""In-process ceilings over the benchmark's texts, no server: what the model and the handler can do alone.

plain loop   tokenize, pad to the longest, forward, softmax: the Hugging Face loop for PyTorch, the same
             loop around the ONNX Runtime session for the ONNX backends. No validation, no planning. At batch B
             in arrival order and sorted by length (what padding costs a GPU, where a pass is one launch).
On cuda every model is loaded on GPU 0 and each timer stops after torch.cuda.synchronize().
handler      this project's handler through TorchServe's own Context (tooling.inprocess), at batch B, with
             pad-to-longest (an unlimited token budget) and with length-aware micro-batches.
Each is timed over the texts twice, after a short warm-up: the first pass (`texts_per_s`, what the targets
use) meets most shapes for the first time in its process, the second (`second_pass_texts_per_s`) none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from handlers.instances import TextPair
from handlers.loading import LoadedModel, load_model, load_tokenizer
from handlers.options import HandlerOptions
from handlers.tokenization import TextEncoder, encode, text_encoder
from handlers.word_pieces import CACHED_WORDS, word_pieces
from tooling.bench.backends import PreparedBackend
from tooling.bench.corpus import other_words, with_every_word_new
from tooling.bench.device import gpu_id_of, release, synchronize
from tooling.bench.loadgen import percentile_ms
from tooling.inprocess import load_handler, make_context, set_batch, unpacked_layout

WARM_UP_TEXTS = 16
# A token budget no batch reaches: every batch is one forward pass padded to its longest text.
UNLIMITED_TOKENS = 10**9


ORDERS = ("arrival", "length")


def _served(
    prepared: PreparedBackend, options: HandlerOptions, device: str = "cpu", batch_size: int = 1
) -> LoadedModel:
    """The backend's model exactly as the handler loads it (handlers/loading.py), on `device`, for TorchServe's
    `batch_size`."""
    return load_model(prepared.model_dir, options, gpu_id_of(device), batch_size=batch_size)


def length_sorted(texts: Sequence[str], lengths: Sequence[int]) -> list[str]:
    """The texts shortest first (stable: equal lengths keep arrival order), so each chunk pads little."""
    return [text for _, _, text in sorted(zip(lengths, range(len(texts)), texts))]


def plain_loop(
    prepared: PreparedBackend,
    texts: Sequence[str],
    batch_size: int,
    options: HandlerOptions,
    device: str = "cpu",
    order: str = "arrival",
) -> dict:
    """Tokenize each chunk padded to its longest text, run it, take the softmax; texts/s and time per batch.
    `order` "length": the texts sorted by token length first (the sort itself is not timed)."""
    model = _served(prepared, options, device)
    tokenizer, max_length = model.tokenizer, model.max_length
    if order == "length":
        lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]
        texts = length_sorted(texts, lengths)
    dtype = prepared.backend.quantize or "float32"
    if prepared.backend.onnx:
        from handlers.onnx_forward import OnnxForward

        assert isinstance(model.forward, OnnxForward)
        session = model.forward.session
        inputs = {i.name for i in session.get_inputs()}

        def run(chunk: list[str]) -> None:
            batch = tokenizer(chunk, padding="longest", truncation=True, max_length=max_length, return_tensors="np")
            session.run(None, {name: batch[name].astype("int64") for name in inputs})

    else:
        import torch

        from handlers.torch_forward import TorchForward

        assert isinstance(model.forward, TorchForward)
        classifier = model.forward.model
        on = next(classifier.parameters()).device
        dtype = str(next(classifier.parameters()).dtype).removeprefix("torch.")

        def run(chunk: list[str]) -> None:
            batch = tokenizer(chunk, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
            with torch.inference_mode():
                classifier(**batch.to(on)).logits.softmax(-1).float().cpu()  # the probabilities, on the host

    # First runs of each shape are slow (allocators, kernels): at least one full batch.
    for i in range(0, max(WARM_UP_TEXTS, batch_size), batch_size):
        run(list(texts[i : i + batch_size]))
    synchronize(device)
    chunks = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    first, second = (timed_pass(run, chunks, device) for _ in range(2))
    return {
        "kind": "loop",
        "device": device,
        "dtype": dtype,
        "order": order,
        "batch_size": batch_size,
        "texts_per_s": len(texts) / sum(first),
        "ms_per_text": 1000 * sum(first) / len(texts),
        "p50_ms_per_batch": percentile_ms(first, 50),
        **second_pass(len(texts), second),
    }


def timed_pass(run: Callable[[list], object], batches: Sequence[list], device: str = "cpu") -> list[float]:
    """Seconds each batch took through `run`, the device synchronized before each timer stops."""
    times = []
    for batch in batches:
        started = time.perf_counter()
        run(batch)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return times


def second_pass(texts: int, times: Sequence[float]) -> dict:
    """The same batches timed again: every shape in them has run once in this process. On the H100 a first
    run of a shape cost tens of milliseconds more (docs/benchmarks.md, "GPU"); the first pass is what a
    freshly started worker meets, the second what a long-running one does."""
    return {"second_pass_texts_per_s": texts / sum(times), "second_pass_p50_ms_per_batch": percentile_ms(times, 50)}


def plan_statistics(model: LoadedModel, texts: Sequence[str], batch_size: int) -> dict:
    """Padding waste and passes of the plan the handler makes for these batches: the served model's own planning
    (handlers/pipeline.plan, with its planner: by measured cost under CUDA graphs), so the figures are what its
    metrics report, not a copy of its rules. Called on a model already loaded: nothing more is loaded for it."""
    from handlers.pipeline import plan

    real = padded = passes = batches = 0
    for i in range(0, len(texts), batch_size):
        encodings = encode(model.encoder, list(texts[i : i + batch_size]))
        planned = plan(model, {(position, 0): e for position, e in enumerate(encodings)})
        passes += len(planned.groups)
        batches += 1
        real += planned.real_tokens
        padded += planned.padded_tokens
    return {"padding_waste": padded / real, "forward_passes_per_batch": passes / batches}


def planning_of(max_batch_tokens: int) -> str:
    """What a resolved budget plans: one pass per batch, length-sorted cuts within it, or by measured cost
    (0: CUDA graphs, handlers/options.HandlerOptions.for_device)."""
    if max_batch_tokens == 0:
        return "measured_cost"
    return "pad_to_longest" if max_batch_tokens >= UNLIMITED_TOKENS else "length_aware"


def handler_ceiling(
    prepared: PreparedBackend, texts: Sequence[str], batch_size: int, handler_options: dict, device: str = "cpu"
) -> dict:
    """The handler in-process at batch B: decoding, validation, tokenization, planning, forward, JSON.
    Its answers are on the host, so its forward pass has synchronized the GPU before each batch returns."""
    batches = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    with tempfile.TemporaryDirectory(prefix="bench-unpacked-") as tmp:
        model_dir = unpacked_layout(prepared.model_dir, Path(tmp))
        handler = load_handler(model_dir, handler_options, gpu_id_of(device), batch_size)
        context = make_context(model_dir, handler_options, gpu_id=gpu_id_of(device), batch_size=batch_size)
        run = functools.partial(_handle, handler, context)
        for batch in batches[: max(1, WARM_UP_TEXTS // batch_size)]:  # warm-up
            run(batch)
        first, second = (timed_pass(run, batches, device) for _ in range(2))
        served: LoadedModel = handler.served
        planned = plan_statistics(served, texts, batch_size)
        budget = served.options.max_batch_tokens  # as the handler resolved it for the device and backend
        del run, handler, served
    gc.collect()
    return {
        "kind": "handler",
        "device": device,
        "batch_size": batch_size,
        "max_batch_tokens": budget,
        "planning": planning_of(budget),
        "texts_per_s": len(texts) / sum(first),
        **second_pass(len(texts), second),
        **planned,
    }


def _handle(handler, context, texts: list[str]) -> None:
    handler.handle(set_batch(context, [(t.encode(), "text/plain") for t in texts]), context)


def ceilings(
    backends: Sequence[PreparedBackend],
    texts: Sequence[str],
    batch_size: int,
    handler_options: dict,
    progress: Callable[[str], None],
    device: str = "cpu",
    measured: Callable[[list[dict]], None] = lambda rows: None,
    failed: Callable[[dict], None] | None = None,
) -> list[dict]:
    """For each backend: the plain loop at batch 1 and B (at B in arrival order and length-sorted), the handler
    at batch B without and with planning (its max_batch_tokens as the handler resolves it for that backend).
    `measured` is given the rows so far after each backend. With `failed`, a backend whose ceilings raise (a CUDA
    graph capture that fails in this process) is reported to it as {"stage": "ceilings", "backend", "error"},
    its rows dropped, and the next backend measured; without it the error propagates."""
    rows = []
    for prepared in backends:
        try:
            rows.extend(_backend_ceilings(prepared, texts, batch_size, handler_options, progress, device))
            release(device)
        except Exception as error:
            if failed is None:
                raise
            traceback.print_exc()
            progress(f"ceiling {prepared.name}: FAILED: {error_text(error)}")
            failed({"stage": "ceilings", "backend": prepared.name, "error": error_text(error)})
            with contextlib.suppress(Exception):  # a GPU left in an error state refuses this too: recorded above
                release(device)
        measured(list(rows))
    return rows


def error_text(error: BaseException) -> str:
    """An exception as a results file records it: its type and message, e.g. "RuntimeError: CUDA error: ..."."""
    return f"{type(error).__name__}: {error}"


def _backend_ceilings(
    prepared: PreparedBackend,
    texts: Sequence[str],
    batch_size: int,
    handler_options: dict,
    progress: Callable[[str], None],
    device: str,
) -> list[dict]:
    rows = []
    options = prepared.options(handler_options, device)
    backend_options = prepared.handler_options(handler_options)
    loops = [(1, "arrival")] + ([(batch_size, "arrival"), (batch_size, "length")] if batch_size > 1 else [])
    if prepared.backend.handler_options:
        loops = []  # the plain loop takes no handler option: the same loop as the backend's plain twin
    for b, order in loops:
        row = {"backend": prepared.name, **plain_loop(prepared, texts, b, options, device, order)}
        rows.append(row)
        progress(f"ceiling {prepared.name}: plain loop, batch {b}, {order} order: {row['texts_per_s']:.1f} texts/s")
    for budget in (UNLIMITED_TOKENS, options.max_batch_tokens):
        row = {
            "backend": prepared.name,
            **handler_ceiling(prepared, texts, batch_size, {**backend_options, "max_batch_tokens": budget}, device),
        }
        rows.append(row)
        progress(
            f"ceiling {prepared.name}: handler, batch {batch_size}, {row['planning']} (max_batch_tokens "
            f"{budget}): {row['texts_per_s']:.1f} texts/s, padded/real tokens {row['padding_waste']:.2f}"
        )
    return rows


def sweep_max_batch_tokens(
    prepared: PreparedBackend,
    texts: Sequence[str],
    batch_size: int,
    handler_options: dict,
    budgets: Sequence[int],
    device: str = "cpu",
) -> list[dict]:
    """The handler ceiling at each token budget: the measurement behind the max_batch_tokens default."""
    rows = []
    for budget in budgets:
        options = {**prepared.handler_options(handler_options), "max_batch_tokens": budget}
        rows.append({"backend": prepared.name, **handler_ceiling(prepared, texts, batch_size, options, device)})
    return rows


def worst_batch_seconds(
    prepared: PreparedBackend,
    batch_size: int,
    tokens: int,
    options: HandlerOptions,
    device: str = "cpu",
    repeats: int = 3,
) -> list[float]:
    """Forward time of a full batch at the token cap through the backend's forward pass: what responseTimeout covers."""

    model = _served(prepared, options, device, batch_size)
    forward = model.forward
    # Compute does not depend on which tokens: one text cut at the cap, batch_size times.
    cap = text_encoder(model.tokenizer, min(tokens, model.token_limit))
    batch = encode(cap, ["review " * (2 * tokens)] * batch_size)
    forward(batch)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        forward(batch)
        times.append(time.perf_counter() - started)
    return times


# The handler's tokenization as a worker meets it: as it is, newly loaded, after many other words.
HANDLER_WAYS = ("handler", "handler_empty_cache", "handler_full_cache")
TOKENIZATION_WAYS = (*HANDLER_WAYS, "rust_batch_call", "rust_whole_tokenizer", "wrapper_two_passes")


def remember_other_words(encoder: TextEncoder) -> TextEncoder:
    """`encoder` after traffic of as many other words as its word path remembers (tooling/bench/corpus.other_words),
    sent through the handler's own call a hundred words a text: a worker whose words changed."""
    filler = other_words(CACHED_WORDS)
    for start in range(0, len(filler), 100):
        encode(encoder, [" ".join(filler[start : start + 100])])
    return encoder


def tokenization_speed(
    model_dir: Path, texts: Sequence[str], batch_sizes: Sequence[int], options: HandlerOptions | None = None,
    rounds: int = 5,
) -> list[dict]:  # fmt: skip
    """Microseconds per text of the handler's tokenization (handlers/tokenization.encode: where the tokenizer is
    BERT's, ASCII texts normalized in Python and single ones tokenized word by word, each word's pieces remembered)
    against the ways before it, alternated round by round at each batch size; the median round. The ways: `handler`;
    `handler_empty_cache`, the same with nothing remembered at the start of each round (a new worker);
    `handler_full_cache`, with as many other words remembered as it keeps (a worker that met many words, none of
    these: tooling/bench/corpus.other_words); `rust_batch_call`, the Rust tokenizer's batch call without BERT's
    normalizer (the handler until the words were remembered); `rust_whole_tokenizer`, that call with its own
    normalizer; `wrapper_two_passes`, the Hugging Face wrapper's call (the path a tokenizer without a Rust one still
    takes). On three corpora: `texts` (`corpus` "benchmark"), the same texts with every word new ("every_word_new",
    tooling/bench/corpus.with_every_word_new), and pairs of them, each text with the next ("pairs"). `options` as
    the archive's: cpu_threads sizes the tokenizer's pool (the process's first load fixes it)."""
    encoder = load_tokenizer(model_dir, options or HandlerOptions()).encoder  # the handler's; no weights needed
    max_length = encoder.max_length

    def newly_loaded() -> TextEncoder:
        return dataclasses.replace(encoder, words=word_pieces(encoder.fast, max_length))

    ways: dict[str, Callable[[], TextEncoder]] = {
        "handler": lambda: encoder,
        "handler_empty_cache": newly_loaded,
        "handler_full_cache": lambda: remember_other_words(newly_loaded()),
        "rust_batch_call": lambda: dataclasses.replace(encoder, words=None),
        "rust_whole_tokenizer": lambda: dataclasses.replace(encoder, ascii=None, words=None),
        "wrapper_two_passes": lambda: TextEncoder(encoder.tokenizer, encoder.max_length),
    }
    rows = []
    pairs = [TextPair(texts[i], texts[(i + 1) % len(texts)]) for i in range(len(texts))]  # a cross-encoder's
    corpora = (("benchmark", list(texts)), ("every_word_new", with_every_word_new(list(texts))), ("pairs", pairs))
    for corpus, corpus_texts in corpora:
        for batch_size in batch_sizes:
            chunks = [corpus_texts[i : i + batch_size] for i in range(0, len(corpus_texts), batch_size)]
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(rounds):
                for name, way in ways.items():
                    this_round = way()  # built before the clock starts: a new cache is built at a worker's load
                    started = time.perf_counter()
                    for chunk in chunks:
                        encode(this_round, chunk)
                    times[name].append(1e6 * (time.perf_counter() - started) / len(corpus_texts))
            row = {"corpus": corpus, "batch_size": batch_size}
            row.update({f"{name}_us_per_text": statistics.median(t) for name, t in times.items()})
            before = row["rust_batch_call_us_per_text"]
            for name in HANDLER_WAYS:
                row[f"{name}_speed_up_over_rust_batch_call"] = before / row[f"{name}_us_per_text"]
            rows.append(row)
    return rows
