"""One TorchServe batch, answered.

requests -> instances -> validation -> encoding -> plan -> forward -> regroup -> answers.

Each step is a function that takes what the previous one returned; nothing is stored
between batches. Every instance of every request is validated on its own; the valid
instances of the whole batch share one length-aware plan and the same fault isolation;
each request gets exactly one answer, by index, and one bad request never fails another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handlers import rejection
from handlers.batching import padded_tokens, plan_micro_batches
from handlers.decoding import decode_request
from handlers.fault_isolation import run_isolating_faults
from handlers.loading import LoadedModel
from handlers.options import HandlerOptions
from handlers.protocols import ParsedRequest, parse_request
from handlers.rejection import Rejection
from handlers.responses import Answer, Prediction, answer
from handlers.tokenization import Encoding, encode
from handlers.validation import validate_text

logger = logging.getLogger(__name__)

InstanceKey = tuple[int, int]  # (request index in the batch, instance position in the request)


@dataclass(frozen=True)
class BatchOutcome:
    """Answers by request index, and what the metrics report about the batch."""

    answers: list[Answer]
    forward_passes: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)


# ---- the steps --------------------------------------------------------------------------------------


def read_requests(
    items: Sequence[Any], headers: Sequence[Mapping[str, Any] | None], options: HandlerOptions
) -> list[ParsedRequest]:
    """Each request's body decoded and read as its format: instances, or an error for the whole request."""
    return [
        parse_request(decode_request(item, item_headers, options.max_bytes), options.max_instances)
        for item, item_headers in zip(items, headers)
    ]


def validate(requests: Sequence[ParsedRequest]) -> dict[InstanceKey, str | Rejection]:
    """Every instance of every request checked on its own (text rules that need no tokenizer)."""
    return {
        (r, p): instance if isinstance(instance, Rejection) else validate_text(instance)
        for r, request in enumerate(requests)
        if request.error is None
        for p, instance in enumerate(request.instances)
    }


def servable(outcomes: Mapping[InstanceKey, Any]) -> dict[InstanceKey, Any]:
    """The outcomes of requests none of whose instances failed so far: only those are worth more work."""
    failed = {r for (r, _), outcome in outcomes.items() if isinstance(outcome, Rejection)}
    return {key: outcome for key, outcome in outcomes.items() if key[0] not in failed}


def encode_texts(model: LoadedModel, texts: Mapping[InstanceKey, str]) -> dict[InstanceKey, Encoding | Rejection]:
    """Token ids with the cap; under `overlength: reject`, a text over the cap is refused instead."""
    keys = list(texts)
    encodings = encode(model.tokenizer, [texts[k] for k in keys], model.max_length)
    reject = model.options.overlength == "reject"
    return {
        key: rejection.too_many_tokens(model.max_length) if reject and encoding.truncated else encoding
        for key, encoding in zip(keys, encodings)
    }


def plan(model: LoadedModel, encodings: Mapping[InstanceKey, Encoding]) -> list[list[InstanceKey]]:
    """Instances of the whole batch grouped into forward passes within the padded-token budget."""
    keys = list(encodings)
    lengths = [encodings[k].length for k in keys]
    groups = plan_micro_batches(lengths, model.options.max_batch_tokens, model.options.pad_to_multiple_of)
    return [[keys[position] for position in group] for group in groups]


def run_forward(
    model: LoadedModel, groups: Sequence[Sequence[InstanceKey]], encodings: Mapping[InstanceKey, Encoding],
    texts: Mapping[InstanceKey, str],
) -> dict[InstanceKey, Prediction | Rejection]:  # fmt: skip
    """One forward pass per group; a failing pass is bisected down to the instances that fail alone."""

    def run(subset: Sequence[InstanceKey]):
        inject_test_fault(model.options, [texts[k] for k in subset])
        return model.forward([encodings[k] for k in subset])

    def describe(subset: Sequence[InstanceKey]) -> str:
        longest = max(encodings[k].length for k in subset)
        return f"a group of {len(subset)} items (longest {longest} tokens, requests {sorted({r for r, _ in subset})})"

    results: dict[InstanceKey, Prediction | Rejection] = {}
    for group in groups:
        for key, row in run_isolating_faults(run, group, describe).items():
            results[key] = row if isinstance(row, Rejection) else Prediction(row.tolist(), encodings[key].truncated)
    return results


def regroup(
    requests: Sequence[ParsedRequest], outcomes: Mapping[InstanceKey, Prediction | Rejection | Any], model_name: str,
    labels: Sequence[str],
) -> list[Answer]:  # fmt: skip
    """Each request's instance results, in order, turned into its one answer."""
    answers = []
    for r, request in enumerate(requests):
        results = [outcomes.get((r, p), _NOT_RUN) for p in range(len(request.instances))]
        answers.append(answer(request, results, labels, model_name))
    return answers


# An instance skipped because another instance of its request already failed; never
# reaches a client, since that request is answered with the earlier failure.
_NOT_RUN = rejection.internal_error()


def inject_test_fault(options: HandlerOptions, texts: Sequence[str]) -> None:
    """The test-only fault hook (handler options fault_marker / fault_kind / fault_delay_s)."""
    if not options.fault_marker or not any(options.fault_marker in text for text in texts):
        return
    if options.fault_delay_s:
        time.sleep(options.fault_delay_s)
    elif options.fault_kind == "oom":
        raise MemoryError("injected out of memory (handler option fault_marker)")
    else:
        raise RuntimeError("injected fault (handler option fault_marker)")


# ---- the whole batch ----------------------------------------------------------------------------------


def answer_batch(
    items: Sequence[Any], headers: Sequence[Mapping[str, Any] | None], model: LoadedModel, model_name: str
) -> BatchOutcome:
    """Every request of the batch answered by index. Never raises for a request's content."""
    clock = _StageClock()
    requests = read_requests(items, headers, model.options)
    outcomes: dict[InstanceKey, Any] = validate(requests)
    clock.lap("validation")

    forward_passes = real = padded = 0
    try:
        texts = servable(outcomes)
        outcomes.update(encode_texts(model, texts))
        clock.lap("tokenization")
        encodings = servable(outcomes)
        groups = plan(model, encodings)
        outcomes.update(run_forward(model, groups, encodings, texts))
        clock.lap("forward")
        lengths = [encodings[k].length for k in encodings]
        positions = {key: i for i, key in enumerate(encodings)}
        forward_passes, real = len(groups), sum(lengths)
        padded = padded_tokens(lengths, [[positions[k] for k in g] for g in groups],
                               model.options.pad_to_multiple_of, model.token_limit)  # fmt: skip
    except Exception:
        # A bug in a shared step: requests already answered keep their answer, the rest get 500.
        logger.exception("handler failed on a batch of %d requests", len(items))
        for key, outcome in servable(outcomes).items():
            if not isinstance(outcome, Prediction):
                outcomes[key] = rejection.internal_error()
    answers = regroup(requests, outcomes, model_name, model.labels)
    clock.lap("response")
    return BatchOutcome(answers, forward_passes, real, padded, clock.laps)


class _StageClock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = 1000 * (now - self._last)
        self._last = now
