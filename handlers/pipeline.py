"""One TorchServe batch, answered.

requests -> instances -> validation -> encoding -> plan -> forward -> regroup -> answers;
a request past its deadline (handlers/deadline.py) is answered at once, before it is read.

Each step is a function that takes what the previous one returned; nothing is stored
between batches but the worker's forward pass pace (handlers/deadline.PassPace), which the
handler owns and hands in. Every instance of every request is validated on its own; the valid
instances of the whole batch share one length-aware plan and the same fault isolation;
each request gets exactly one answer, by index, and one bad request never fails another.

Each stage hands on a mapping of its own type (texts, then encodings, then predictions),
keyed by instance; every instance a stage refuses goes into one `rejected` mapping instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from handlers import rejection
from handlers.deadline import DEADLINE_HEADER, PassPace, read_deadline, refusal, refused_requests
from handlers.decoding import ROUTE_KSERVE, route_of
from handlers.fault_isolation import run_isolating_faults
from handlers.instances import Instance
from handlers.loading import LoadedModel
from handlers.options import HandlerOptions
from handlers.protocols import PREDICTIONS, ParsedRequest, read_request
from handlers.rejection import Rejection
from handlers.responses import Answer, ModelIdentity, Prediction, error_answer, success_answer
from handlers.tokenization import Encoding, encode
from handlers.validation import validate_instance

logger = logging.getLogger(__name__)

InstanceKey = tuple[int, int]  # (request index in the batch, instance position in the request)
Rejected = dict[InstanceKey, Rejection]
T = TypeVar("T")


@dataclass(frozen=True)
class BatchOutcome:
    """Answers by request index, and what the metrics report about the batch."""

    answers: list[Answer]
    forward_passes: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The forward passes of a batch, and the tokens they compute (real, and with padding)."""

    groups: list[list[InstanceKey]]
    real_tokens: int = 0
    padded_tokens: int = 0


# ---- the steps --------------------------------------------------------------------------------------


def read_requests(
    items: Sequence[Any],
    headers: Sequence[Mapping[str, Any] | None],
    deadlines: Sequence[float | Rejection | None],
    options: HandlerOptions,
    now_ms: float,
) -> list[ParsedRequest]:
    """Each request's body decoded and read as its format: instances, or an error for the whole request.
    A request past its deadline at `now_ms` (each request's header as read_deadline read it; handlers/
    deadline.py) is not even decoded."""
    parsed = []
    for item, item_headers, deadline in zip(items, headers, deadlines):
        refused = refusal(deadline, now_ms)
        if refused is not None:
            on_kserve = route_of(item_headers) == ROUTE_KSERVE
            parsed.append(ParsedRequest(PREDICTIONS, error=refused, kserve_route=on_kserve))
            continue
        try:
            parsed.append(read_request(item, item_headers, options.max_bytes, options.max_instances))
        except Exception:  # a bug in reading one request must not cost its neighbours theirs
            logger.exception("reading request %d of the batch failed; it gets 500", len(parsed))
            on_kserve = route_of(item_headers) == ROUTE_KSERVE  # its 500 in the form its client reads
            parsed.append(ParsedRequest(PREDICTIONS, error=rejection.internal_error(), kserve_route=on_kserve))
    return parsed


def validate(requests: Sequence[ParsedRequest]) -> tuple[dict[InstanceKey, Instance], Rejected]:
    """Every instance of every request checked on its own (text rules that need no tokenizer):
    (valid instances: texts and pairs, rejected instances). An instance the format could not read is rejected
    as it is."""
    texts: dict[InstanceKey, Instance] = {}
    rejected: Rejected = {}
    for r, request in enumerate(requests):
        if request.error is not None:
            continue
        for p, instance in enumerate(request.instances):
            checked = instance if isinstance(instance, Rejection) else validate_instance(instance)
            if isinstance(checked, Rejection):
                rejected[(r, p)] = checked
            else:
                texts[(r, p)] = checked
    return texts, rejected


def servable(values: Mapping[InstanceKey, T], rejected: Mapping[InstanceKey, Rejection]) -> dict[InstanceKey, T]:
    """The values of requests none of whose instances was rejected so far: only those are worth more work."""
    failed = {r for r, _ in rejected}
    return {key: value for key, value in values.items() if key[0] not in failed}


def encode_texts(
    model: LoadedModel, texts: Mapping[InstanceKey, Instance]
) -> tuple[dict[InstanceKey, Encoding], Rejected]:
    """Token ids with the cap; under `overlength: reject`, a text over the cap is refused instead.

    An encoding the tokenizer could not cut to the cap (a pair under a cap smaller than its special tokens: four
    for RoBERTa's `<s>a</s></s>b</s>`) is refused whatever `overlength` says: the cap bounds what one item may
    cost a pass, and the CUDA graphs are captured up to it."""
    keys = list(texts)
    encodings = encode(model.encoder, [texts[k] for k in keys])
    reject_cut = model.options.overlength == "reject"
    kept, refused = {}, {}
    for key, e in zip(keys, encodings):
        if e.length > model.max_length or (reject_cut and e.truncated):
            refused[key] = rejection.too_many_tokens(model.max_length)
        else:
            kept[key] = e
    return kept, refused


def plan(model: LoadedModel, encodings: Mapping[InstanceKey, Encoding]) -> Plan:
    """Instances of the whole batch grouped into forward passes by the model's planner (handlers/batching.py),
    with the tokens those passes compute."""
    return passes(model, planned_groups(model, encodings), encodings)


def planned_groups(model: LoadedModel, encodings: Mapping[InstanceKey, Encoding]) -> list[list[InstanceKey]]:
    """The forward passes the model's planner makes of the batch's instances (what plan counts, uncounted: a batch
    counts the passes that ran, after them)."""
    keys = list(encodings)
    groups = model.planner.groups([encodings[k].length for k in keys])
    return [[keys[position] for position in group] for group in groups]


def passes(
    model: LoadedModel, groups: Sequence[Sequence[InstanceKey]], encodings: Mapping[InstanceKey, Encoding]
) -> Plan:
    """The forward passes `groups` make, and the tokens they compute (real, and with padding)."""
    groups = [list(group) for group in groups if group]
    lengths = {key: encodings[key].length for group in groups for key in group}
    planner = model.planner
    padded = sum(planner.computed_tokens(len(group), max(lengths[k] for k in group)) for group in groups)
    return Plan(groups=groups, real_tokens=sum(lengths.values()), padded_tokens=padded)


def run_forward(
    model: LoadedModel, groups: Sequence[Sequence[InstanceKey]], encodings: Mapping[InstanceKey, Encoding],
    deadlines: Mapping[int, float] | None = None, pace: PassPace | None = None,
) -> tuple[dict[InstanceKey, Prediction], Rejected, list[list[InstanceKey]]]:  # fmt: skip
    """One forward pass per group; a failing pass is bisected down to the instances that fail alone.
    Before each pass, the requests (by index into `deadlines`) that the batch would answer after their deadline,
    at the worker's `pace` with the passes still to come, are dropped (handlers/deadline.in_time), each request
    whole: returns the predictions, the rejected instances, and the groups that ran."""
    pace = pace or PassPace()
    deadlines = deadlines or {}
    pass_ms: list[float] = []  # each call's time, within the group in hand

    def run(subset: Sequence[InstanceKey]):
        started = time.perf_counter()  # a duration: immune to the wall clock being stepped
        rows = model.forward([encodings[k] for k in subset])
        # Only a pass that ran is the pace: one refused before it ran (UnembeddableTokenTypes) took no time.
        pass_ms.append(1000 * (time.perf_counter() - started))
        return rows

    def describe(subset: Sequence[InstanceKey]) -> str:
        longest = max(encodings[k].length for k in subset)
        return f"a group of {len(subset)} items (longest {longest} tokens, requests {sorted({r for r, _ in subset})})"

    predictions: dict[InstanceKey, Prediction] = {}
    rejected: Rejected = {}
    ran = []
    too_late: set[int] = set()  # requests refused for their deadline: none of their instances is worth a pass
    # Of those, the ones refused for the pace alone, not yet late when refused: only they say the pace may be too high.
    refused_for_pace: set[int] = set()

    def request_of(key: InstanceKey) -> int:
        return key[0]

    def deadline_of(key: InstanceKey) -> float | None:
        return deadlines.get(key[0])

    for i, planned in enumerate(groups):
        if deadlines:
            to_come = [[key for key in keys if key[0] not in too_late] for keys in groups[i:]]
            now_ms = 1000 * time.time()
            refused = refused_requests(to_come, request_of, deadline_of, now_ms, pace.ms)
            too_late |= refused
            refused_for_pace |= {r for r in refused if deadlines[r] >= now_ms}
        group = []
        for key in planned:
            if key[0] in too_late:
                rejected[key] = rejection.deadline_exceeded(DEADLINE_HEADER, None)
            else:
                group.append(key)
        if not group:
            continue
        ran.append(group)
        rows = run_isolating_faults(run, group, describe)
        # One pass's time, the longest the group took: a bisected group's retries added up would refuse the
        # next requests for a failure that was not theirs.
        if pass_ms:
            pace.observe(max(pass_ms))
        pass_ms.clear()
        for key, row in rows.items():
            if isinstance(row, Rejection):
                rejected[key] = row
            else:
                predictions[key] = Prediction(row.tolist(), encodings[key].truncated)
    # A batch that ran no pass because the pace refused its requests measured nothing, and the estimate may be why;
    # a batch whose items were all invalid, or already late, says nothing about the pace and leaves it as it is.
    if refused_for_pace and not ran:
        pace.ran_nothing()
    return predictions, rejected, ran


def first_rejection(request: ParsedRequest, rejected: Mapping[int, Rejection]) -> tuple[int | None, Rejection] | None:
    """Which error a request is answered with, given its rejected instances by position; None if none.

    The one precedence rule: an error in the request as sent (the body, or an instance its format
    cannot read) wins over what a later stage (validation, the token cap, the model) found, even at
    a later position; within a stage, the first position wins.
    """
    problem = request.first_problem()
    if problem is not None:
        return problem
    if not rejected:
        return None
    position = min(rejected)
    return position, rejected[position]


def regroup(
    requests: Sequence[ParsedRequest], predictions: Mapping[InstanceKey, Prediction], rejected: Rejected,
    identity: ModelIdentity, labels: Sequence[str],
) -> list[Answer]:  # fmt: skip
    """Each request's instance results, in order, turned into its one answer."""
    by_request: dict[int, dict[int, Rejection]] = {}
    for (r, p), reason in rejected.items():
        by_request.setdefault(r, {})[p] = reason
    answers = []
    for r, request in enumerate(requests):
        problem = first_rejection(request, by_request.get(r, {}))
        if problem is not None:
            answers.append(error_answer(request, *problem))
            continue
        served = [predictions.get((r, p)) for p in range(len(request.instances))]
        if any(prediction is None for prediction in served):
            # Not one of the pipeline's outcomes: never answer a request with a prediction missing.
            answers.append(error_answer(request, None, rejection.internal_error()))
            continue
        answers.append(success_answer(request, served, labels, identity))  # type: ignore[arg-type] - no None left
    return answers


# ---- the whole batch ----------------------------------------------------------------------------------


def answer_batch(
    items: Sequence[Any], headers: Sequence[Mapping[str, Any] | None], model: LoadedModel, identity: ModelIdentity,
    pace: PassPace | None = None,
) -> BatchOutcome:  # fmt: skip
    """Every request of the batch answered by index. Never raises for a request's content. `pace`: the worker's
    forward pass time so far, which the deadline check reads and this batch's passes update (none: unknown)."""
    clock = _StageClock()
    read = [read_deadline(h) for h in headers]  # each header parsed once, for both checks
    requests = read_requests(items, headers, read, model.options, 1000 * time.time())
    deadlines = {r: d for r, d in enumerate(read) if isinstance(d, float)}
    texts, rejected = validate(requests)
    clock.lap("validation")

    predictions: dict[InstanceKey, Prediction] = {}
    counted = Plan([])  # what the metrics report: the plan, once its passes have run
    try:
        encodings, refused = encode_texts(model, servable(texts, rejected))
        rejected.update(refused)
        clock.lap("tokenization")
        encodings = servable(encodings, rejected)
        groups = planned_groups(model, encodings)
        predictions, failed, ran = run_forward(model, groups, encodings, deadlines, pace)
        rejected.update(failed)
        clock.lap("forward")
        counted = passes(model, ran, encodings)
    except Exception:
        # A bug in a shared step: requests already answered keep their answer, the rest get 500.
        logger.exception("a shared step (tokenization, planning or the forward pass) failed on a batch of %d "
                         "requests; the requests not yet answered get 500", len(items))  # fmt: skip
        for key in servable(texts, rejected):
            if key not in predictions:
                rejected[key] = rejection.internal_error()
    answers = regroup(requests, predictions, rejected, identity, model.labels)
    clock.lap("response")
    return BatchOutcome(answers, len(counted.groups), counted.real_tokens, counted.padded_tokens, clock.laps)


class _StageClock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = 1000 * (now - self._last)
        self._last = now
