"""handlers/pipeline.py end to end, without a model: a word tokenizer and a numpy forward pass that fails on demand.

Everything the pipeline does of its own is real here (decoding, the formats, validation, the token cap,
the length-aware plan, bisection of a failing pass, regrouping, the answers and their precedence); only
the tokenizer and the forward pass are stand-ins, so each test says exactly what reached the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from handlers.batching import Bucket, BucketCosts
from handlers.deadline import PassPace
from handlers.loading import LoadedModel
from handlers.options import HandlerOptions
from handlers.pipeline import answer_batch
from handlers.responses import ModelIdentity
from handlers.tokenization import Encoding, TextEncoder

CLS, SEP = 1, 2
POISON, OOM = "poison", "exhausted"  # words that make any forward pass holding them fail
LABELS = ("negative", "positive")
TOKEN_LIMIT = 16


class WordTokenizer:
    """One id per whitespace-separated word between [CLS] and [SEP], capped like a Hugging Face tokenizer."""

    pad_token_id = 0

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}

    def word_id(self, word: str) -> int:
        return self.vocabulary.setdefault(word.lower(), 3 + len(self.vocabulary))

    def __call__(self, texts: Sequence[str], truncation: bool, max_length: int, return_attention_mask: bool):
        rows = []
        for text in texts:
            words = [self.word_id(w) for w in text.split()]
            rows.append([CLS, *words[: max_length - 2], SEP])
        return {"input_ids": rows}


class FakeForward:
    """Probabilities that depend only on an item's own ids; raises when a pass holds a poisoned word."""

    description = "numpy stand-in"

    def __init__(self, tokenizer: WordTokenizer) -> None:
        self.tokenizer = tokenizer
        self.passes: list[list[tuple[int, ...]]] = []  # the ids of every item of every pass, in call order

    def alone(self, text: str, max_length: int) -> list[float]:
        """What this forward pass says about one text on its own (its first max_length tokens)."""
        [ids] = self.tokenizer([text], truncation=True, max_length=max_length, return_attention_mask=False)["input_ids"]
        return self.row(ids).tolist()

    @staticmethod
    def row(ids: Sequence[int]) -> np.ndarray:
        positive = 1 / (1 + np.exp(-(sum(i * (k + 1) for k, i in enumerate(ids)) % 11 - 5)))
        return np.array([1 - positive, positive], dtype=np.float32)

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        ids = [tuple(e.features["input_ids"]) for e in encodings]
        self.passes.append(ids)
        held = {i for row in ids for i in row}
        if self.tokenizer.vocabulary.get(OOM) in held:
            raise MemoryError("out of memory")
        if self.tokenizer.vocabulary.get(POISON) in held:
            raise RuntimeError("poisoned pass")
        return np.stack([self.row(row) for row in ids])


def make_model(**options) -> tuple[LoadedModel, FakeForward]:
    tokenizer = WordTokenizer()
    tokenizer.word_id(POISON), tokenizer.word_id(OOM)
    forward = FakeForward(tokenizer)
    resolved = replace(HandlerOptions(max_length=8).for_device("cpu"), **options)
    model = LoadedModel(
        tokenizer=tokenizer,
        encoder=TextEncoder(tokenizer, min(resolved.max_length, TOKEN_LIMIT)),  # no Rust tokenizer: the wrapper's call
        forward=forward,
        labels=LABELS,
        scores="softmax",
        options=resolved,
        max_length=min(resolved.max_length, TOKEN_LIMIT),
        token_limit=TOKEN_LIMIT,
        model_type="fake",
        backend="numpy",
        description=forward.description,
    )
    return model, forward


def poison_id(model: LoadedModel) -> int:
    return model.tokenizer.vocabulary[POISON]


def text(body: str) -> tuple[dict, dict]:
    return {"body": body.encode()}, {"content-type": "text/plain"}


def as_json(document: object) -> tuple[dict, dict]:
    return {"body": json.dumps(document).encode()}, {"content-type": "application/json"}


def run(model: LoadedModel, *requests: tuple[dict, dict]):
    items, headers = zip(*requests)
    return answer_batch(list(items), list(headers), model, ModelIdentity("fake"))


def scores(answer) -> list[float]:
    return [answer.body["scores"][label] for label in LABELS]


# ---- order and isolation ------------------------------------------------------------------------------


def test_each_request_gets_its_own_answer_in_order_across_length_sorted_micro_batches():
    # A budget of 12 padded tokens forces several passes, grouped by length, not by arrival.
    model, forward = make_model(max_batch_tokens=12)
    texts = ["a much longer text of seven words", "short", "two words", "a text of five words", "one"]
    outcome = run(model, *(text(t) for t in texts))
    assert len(forward.passes) == outcome.forward_passes > 1
    assert [a.status for a in outcome.answers] == [200] * len(texts)
    for answer, sent in zip(outcome.answers, texts):
        assert scores(answer) == pytest.approx(forward.alone(sent, model.max_length))


def test_a_poisoned_item_is_bisected_out_and_fails_alone():
    model, forward = make_model()
    texts = [f"ordinary review number {i}" for i in range(8)]
    texts[5] = "a poison pill"
    outcome = run(model, *(text(t) for t in texts))
    statuses = [a.status for a in outcome.answers]
    assert statuses == [200] * 5 + [500] + [200] * 2
    assert outcome.answers[5].body["type"] == "InferenceFailed"
    # The whole batch ran once, failed, and was halved until the poisoned item ran alone.
    assert len(forward.passes[0]) == 8
    assert sorted(len(p) for p in forward.passes if poison_id(model) in {i for row in p for i in row}) == [1, 2, 4, 8]
    assert len(forward.passes) <= 1 + 2 * 3
    for index in (0, 4, 6):
        assert scores(outcome.answers[index]) == pytest.approx(forward.alone(texts[index], model.max_length))


def test_an_item_out_of_memory_alone_is_507_and_its_neighbours_are_served():
    model, _ = make_model()
    outcome = run(model, text("fine"), text("memory exhausted here"), text("also fine"))
    assert [a.status for a in outcome.answers] == [200, 507, 200]
    assert outcome.answers[1].body["type"] == "OutOfMemory"


def test_a_request_with_a_rejected_instance_never_reaches_the_model():
    model, forward = make_model()
    outcome = run(model, as_json({"instances": ["   ", "poison"]}), text("fine"))
    assert (outcome.answers[0].status, outcome.answers[0].body["type"]) == (400, "EmptyText")
    assert outcome.answers[0].body["message"].startswith("instances[0]: ")
    assert outcome.answers[1].status == 200
    seen = {i for p in forward.passes for row in p for i in row}
    assert poison_id(model) not in seen


# ---- truncation -------------------------------------------------------------------------------------------


def test_a_text_over_the_cap_is_cut_and_flagged():
    model, forward = make_model()
    long = " ".join(f"w{i}" for i in range(20))
    outcome = run(model, text(long), text("short text"))
    assert [a.body["truncated"] for a in outcome.answers] == [True, False]
    assert max(len(row) for p in forward.passes for row in p) == model.max_length
    assert scores(outcome.answers[0]) == pytest.approx(forward.alone(long, model.max_length))


def test_under_overlength_reject_a_text_over_the_cap_is_422_alone():
    model, forward = make_model(overlength="reject")
    long = " ".join(f"w{i}" for i in range(20))
    outcome = run(model, text("short text"), as_json({"instances": ["fine", long]}))
    assert outcome.answers[0].status == 200
    assert (outcome.answers[1].status, outcome.answers[1].body["type"]) == (422, "TooManyTokens")
    assert outcome.answers[1].body["message"].startswith("instances[1]: ")
    assert all(len(p) == 1 for p in forward.passes)  # only the plain request's text was run


# ---- which error a request gets ---------------------------------------------------------------------------


def test_an_instance_the_format_cannot_read_wins_over_an_earlier_invalid_text():
    model, _ = make_model()
    [answer] = run(model, as_json({"instances": ["", 5, "ok"]})).answers
    assert (answer.status, answer.body["type"], answer.instance) == (400, "WrongType", "instances[1]")


def test_an_invalid_text_ends_its_request_before_the_token_cap():
    model, forward = make_model(overlength="reject")
    long = " ".join(f"w{i}" for i in range(20))
    [answer] = run(model, as_json({"instances": ["fine", long, ""]})).answers
    assert (answer.body["type"], answer.instance) == ("EmptyText", "instances[2]")
    assert forward.passes == []


def test_among_the_model_s_failures_the_first_position_wins():
    model, _ = make_model()
    [answer] = run(model, as_json({"instances": ["ok", "poison", "memory exhausted"]})).answers
    assert (answer.status, answer.body["type"], answer.instance) == (500, "InferenceFailed", "instances[1]")


def test_a_request_level_error_wins_over_everything():
    model, forward = make_model(max_instances=2)
    [answer] = run(model, as_json({"instances": ["", "poison", "x"]})).answers
    assert (answer.status, answer.body["type"]) == (413, "TooManyInstances")
    assert forward.passes == []


# ---- what the metrics are told, and a bug in a shared step ---------------------------------------------------


def test_the_outcome_reports_the_plan_that_ran():
    model, forward = make_model(max_batch_tokens=12)
    texts = ["one two three four five six", "a", "b c"]
    outcome = run(model, *(text(t) for t in texts))
    lengths = [len(t.split()) + 2 for t in texts]
    assert outcome.real_tokens == sum(lengths) == sum(len(row) for p in forward.passes for row in p)
    assert outcome.padded_tokens == sum(len(p) * max(len(row) for row in p) for p in forward.passes)
    assert outcome.forward_passes == len(forward.passes)
    assert set(outcome.stage_ms) == {"validation", "tokenization", "forward", "response"}


def test_with_measured_bucket_costs_the_passes_are_the_cheapest_plan_and_counted_at_their_buckets_size():
    """CUDA graphs' planning (max_batch_tokens 0 with measured costs: handlers/batching.CheapestPasses) through the
    pipeline: the passes are the ones the costs make cheapest, each answer is its text's own, in order, and the
    metrics count what the buckets compute. Here a pass of 4 rows costs as much as 2 passes of 1: shorts together."""
    costs = BucketCosts({Bucket(1, 4): 1.0, Bucket(4, 4): 2.0, Bucket(1, 8): 1.2, Bucket(4, 8): 4.0})
    model, forward = make_model(max_batch_tokens=0)
    model = replace(model, bucket_costs=costs)
    texts = ["a long text of six words", "short", "two words", "a text of five words", "one"]
    outcome = run(model, *(text(t) for t in texts))
    assert [len(p) for p in forward.passes] == [3, 1, 1]  # the three short ones share a 4 x 4 pass
    assert {len(row) for row in forward.passes[0]} <= {3, 4}
    assert [a.status for a in outcome.answers] == [200] * len(texts)
    for answer, sent in zip(outcome.answers, texts):
        assert scores(answer) == pytest.approx(forward.alone(sent, model.max_length))
    assert outcome.padded_tokens == 4 * 4 + 1 * 8 + 1 * 8


def test_without_measured_costs_a_budget_of_0_is_refused_rather_than_guessed():
    model, _ = make_model(max_batch_tokens=0)
    with pytest.raises(ValueError, match="measured costs"):
        model.planner  # noqa: B018 - the property is what is tested


def test_a_failing_tokenizer_answers_500_and_keeps_earlier_answers():
    model, forward = make_model()

    def broken(*args, **kwargs):
        raise ValueError("tokenizer bug")

    model = replace(model, encoder=replace(model.encoder, tokenizer=broken))
    outcome = run(model, text("fine"), text("   "), as_json({"instances": ["a", "b"]}))
    assert [(a.status, a.body["type"]) for a in outcome.answers] == [
        (500, "InternalError"),
        (400, "EmptyText"),
        (500, "InternalError"),
    ]
    assert forward.passes == [] and outcome.forward_passes == 0


def test_a_bug_after_the_passes_leaves_every_request_its_answer(monkeypatch):
    """A shared step failing once the passes have run (here: counting the plan for the metrics) costs no request its
    answer: every one computed is sent, and the metrics count no pass rather than a wrong one."""
    import handlers.pipeline as pipeline

    def broken(*args):
        raise ValueError("a bug in counting the passes")

    monkeypatch.setattr(pipeline, "passes", broken)
    model, forward = make_model()
    outcome = run(model, text("fine"), text("   "), as_json({"instances": ["a", "b"]}))
    assert [a.status for a in outcome.answers] == [200, 400, 200] and forward.passes
    assert scores(outcome.answers[0]) == pytest.approx(forward.alone("fine", model.max_length))
    assert outcome.forward_passes == 0


def test_a_request_whose_prediction_went_missing_is_answered_500_and_its_neighbours_are_served(monkeypatch):
    """Never a partial answer: should a step lose one instance's prediction (a bug; no outcome of the pipeline does
    it), its request gets 500, the other requests their answers."""
    import handlers.pipeline as pipeline

    forward_pass = pipeline.run_forward

    def losing_one(*args, **kwargs):
        predictions, rejected, ran = forward_pass(*args, **kwargs)
        del predictions[(1, 1)]
        return predictions, rejected, ran

    monkeypatch.setattr(pipeline, "run_forward", losing_one)
    model, _ = make_model()
    outcome = run(model, text("fine"), as_json({"instances": ["a", "b"]}), text("also fine"))
    assert [a.status for a in outcome.answers] == [200, 500, 200]
    assert outcome.answers[1].body["type"] == "InternalError"


# ---- deadlines (handlers/deadline.py) ----------------------------------------------------------------


class TickingForward(FakeForward):
    """Each forward pass takes `tick` seconds of a fake clock: a deadline can pass between two passes."""

    def __init__(self, tokenizer: WordTokenizer, clock: list[float], tick: float) -> None:
        super().__init__(tokenizer)
        self.clock, self.tick = clock, tick

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        self.clock[0] += self.tick
        return super().__call__(encodings)


def ticking_model(monkeypatch, tick: float, **options) -> tuple[LoadedModel, TickingForward, list[float]]:
    """A model whose passes take `tick` s of a fake clock, which both the wall clock and the timers read."""
    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    model, _ = make_model(**options)
    forward = TickingForward(model.tokenizer, clock, tick)
    return replace(model, forward=forward), forward, clock


def with_deadline(body: str, deadline_s: float) -> tuple[dict, dict]:
    return {"body": body.encode()}, {"content-type": "text/plain", "X-Request-Deadline": str(int(1000 * deadline_s))}


def run_paced(model: LoadedModel, pace: PassPace, *requests: tuple[dict, dict]):
    items, headers = zip(*requests)
    return answer_batch(list(items), list(headers), model, ModelIdentity("fake"), pace)


def test_a_request_its_own_pass_would_answer_in_time_but_its_batch_would_not_is_dropped(monkeypatch):
    """Every answer leaves when the batch's last pass ends (TorchServe sends them together): a request in the first
    of three passes, with room for one, would be answered late. The worker's pace, measured on the batch before,
    says so before the first pass."""
    model, forward, clock = ticking_model(monkeypatch, tick=100.0, max_batch_tokens=6)  # a pass per text below
    pace = PassPace()

    def batch():
        start = clock[0]
        # Shortest first: "a" would run first, from +0 to +100 s, in time for its deadline; the batch ends at +300.
        return start, run_paced(model, pace, with_deadline("a", start + 150), text("b c d"), text("one two three four"))

    # A new worker knows no pace: it computes the request, whose answer then leaves after its deadline.
    start, first = batch()
    assert [a.status for a in first.answers] == [200, 200, 200] and clock[0] - start == 300
    # The next batch's check knows a pass takes 100 s: two passes end at +200, past the deadline, so it is not run.
    forward.passes.clear()
    start, second = batch()
    assert [a.status for a in second.answers] == [503, 200, 200]
    assert second.answers[0].body["type"] == "DeadlineExceeded"
    assert "would end after it" in second.answers[0].body["message"]
    assert len(forward.passes) == second.forward_passes == 2 and clock[0] - start == 200
    assert {len(row) for p in forward.passes for row in p} == {5, 6}  # "a" (3 tokens) never ran


def three_passes_room_for_two(monkeypatch):
    """Three requests with the same deadline, each a pass of its own taking 100 s, at a pace the batches before
    measured as 100 s, with room for two passes: (outcome, forward, pace, seconds the batch took)."""
    model, forward, clock = ticking_model(monkeypatch, tick=100.0, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(100_000.0)  # ms
    start = clock[0]
    outcome = run_paced(model, pace, *(with_deadline(t, start + 250) for t in ("a", "b c d", "one two three")))
    return outcome, forward, pace, clock[0] - start


def test_the_passes_that_answer_the_most_requests_in_time_run_and_the_others_are_refused(monkeypatch):
    """Two of the three run, in time. A check that wanted every pass to end in time would have refused all three."""
    outcome, forward, _, took = three_passes_room_for_two(monkeypatch)
    assert sorted(a.status for a in outcome.answers) == [200, 200, 503]
    assert len(forward.passes) == 2 and took == 200


def test_refusals_beside_passes_that_ran_leave_the_pace_those_passes_measured(monkeypatch):
    """The estimate comes down only when a batch ran no pass (the next test): a batch whose passes ran measured the
    pace, and the refusals beside them are that measurement's, not a sign that it is too high."""
    outcome, forward, pace, _ = three_passes_room_for_two(monkeypatch)
    assert sorted(a.status for a in outcome.answers) == [200, 200, 503] and len(forward.passes) == 2
    assert pace.ms == 100_000.0


def test_a_request_is_refused_whole_none_of_its_instances_computed(monkeypatch):
    """A KServe request with two instances in different passes, room for two passes of three, one of them a
    request without a deadline: its pass runs, and either of the other request's passes alone would be in time,
    but the request is answered only whole, so neither is computed."""
    model, forward, clock = ticking_model(monkeypatch, tick=100.0, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(100_000.0)
    start = clock[0]
    deadline = {"X-Request-Deadline": str(int(1000 * (start + 250)))}
    two = ({"body": json.dumps({"instances": ["a", "one two three"]}).encode()}, {"explain": "False", **deadline})
    outcome = run_paced(model, pace, two, text("b c d"))
    assert [a.status for a in outcome.answers] == [503, 200]
    assert outcome.answers[0].body["type"] == "DeadlineExceeded" and "error" in outcome.answers[0].body
    assert [len(p) for p in forward.passes] == [1] and clock[0] - start == 100


def test_a_request_kept_only_in_part_is_set_aside_and_the_choice_made_again(monkeypatch):
    """Room for one pass of three: the fullest holds two instances of a request whose third is in another pass, so
    that request cannot be answered whole. Set aside, it leaves the choice to the pass it did not fill: the other
    request's, which alone is in time. Refusing both, as a first choice by instances would, runs nothing."""
    model, forward, clock = ticking_model(monkeypatch, tick=100.0, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(100_000.0)
    start = clock[0]
    deadline = {"X-Request-Deadline": str(int(1000 * (start + 150)))}
    three = (
        {"body": json.dumps({"instances": ["a", "b", "one two three four"]}).encode()},
        {"explain": "False", **deadline},
    )
    alone = ({"body": b"c d e"}, {"content-type": "text/plain", **deadline})
    outcome = run_paced(model, pace, three, alone)
    assert [a.status for a in outcome.answers] == [503, 200]
    assert [len(p) for p in forward.passes] == [1] and clock[0] - start == 100


def test_a_pace_too_high_to_let_any_request_through_comes_down_and_the_worker_serves_again(monkeypatch):
    """Only a pass measures the pace; a batch refused whole measures nothing. Each batch that ran no pass lowers the
    estimate, so a pace a hundred times too high (a stalled pass) stops refusing within a few dozen batches."""
    model, forward, clock = ticking_model(monkeypatch, tick=0.1, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(10_000.0)  # ms: a hundred passes' worth
    statuses = []
    for _ in range(40):
        outcome = run_paced(model, pace, with_deadline("a", clock[0] + 1.0))  # room for ten passes
        statuses.append(outcome.answers[0].status)
        if statuses[-1] == 200:
            break
    assert statuses[-1] == 200 and set(statuses[:-1]) == {503}, statuses
    assert pace.ms < 1000.0 and len(forward.passes) == 1


@pytest.mark.parametrize("refused_before_the_plan", ["invalid", "already late"])
def test_a_batch_refused_before_its_passes_were_chosen_leaves_the_pace_as_it_is(monkeypatch, refused_before_the_plan):
    """Only a refusal the pace made says the pace may be too high. A batch whose one item is invalid, or already
    late when read, never reached the choice: lowering the pace for it would let the next batch through requests
    whose answers then come late (ten such batches took a 200 ms pace to 21 ms)."""
    model, forward, clock = ticking_model(monkeypatch, tick=0.2, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(200.0)
    for _ in range(10):
        body, offset = ("   ", 60.0) if refused_before_the_plan == "invalid" else ("a", -1.0)
        outcome = run_paced(model, pace, with_deadline(body, clock[0] + offset))
        assert outcome.answers[0].status in (400, 503) and not forward.passes
    assert pace.ms == 200.0


def test_a_request_that_fell_late_while_its_batch_was_tokenized_leaves_the_pace_as_it_is(monkeypatch):
    """In time when read, past its deadline at the check before the passes: refused for the clock, not for the pace,
    so the batch that ran no pass says nothing about the pace either (as the test above, one step later)."""
    model, forward, clock = ticking_model(monkeypatch, tick=0.2, max_batch_tokens=6)
    tokenize = model.encoder.tokenizer

    def slow(*args, **kwargs):
        clock[0] += 1.0  # a second tokenizing: the deadline below passes meanwhile
        return tokenize(*args, **kwargs)

    model = replace(model, encoder=replace(model.encoder, tokenizer=slow))
    pace = PassPace()
    pace.observe(200.0)
    outcome = run_paced(model, pace, with_deadline("a", clock[0] + 0.5))
    assert outcome.answers[0].body["type"] == "DeadlineExceeded" and not forward.passes
    assert pace.ms == 200.0


def test_a_batch_whose_requests_are_all_in_time_makes_no_choice_before_its_passes(monkeypatch):
    """The choice of passes costs passes x instances before every pass: on 128 passes it took longer than the passes.
    When every pass ends in time there is nothing to choose, and it is not made."""
    import handlers.deadline as deadline

    choices = []
    choose = deadline.in_time
    monkeypatch.setattr(deadline, "in_time", lambda *args: choices.append(1) or choose(*args))
    model, forward, clock = ticking_model(monkeypatch, tick=0.001, max_batch_tokens=6)  # a pass per text below
    pace = PassPace()
    pace.observe(1.0)
    texts = ["one two three four"] * 32
    body = {"body": json.dumps({"instances": texts}).encode()}
    headers = {"explain": "False", "X-Request-Deadline": str(int(1000 * (clock[0] + 60)))}
    outcome = run_paced(model, pace, (body, headers))
    assert outcome.answers[0].status == 200 and len(forward.passes) == 32
    assert choices == []


def test_a_pass_that_failed_is_not_the_pace(monkeypatch):
    """A pass that fails at once (a pair refused on a one-token-type model before the pass) takes next to no time:
    counted, it would pull the pace down and let through requests whose answers then come late."""
    model, forward, _ = ticking_model(monkeypatch, tick=0.001, max_batch_tokens=6)
    pace = PassPace()
    pace.observe(100_000.0)
    outcome = run_paced(model, pace, text(POISON))
    assert [a.status for a in outcome.answers] == [500] and forward.passes
    assert pace.ms == 100_000.0


def test_the_pace_after_a_bisected_group_is_one_pass_not_the_retries_added_up(monkeypatch):
    """A poisoned item in the first group costs several passes; the next group's request, whose deadline leaves
    room for one pass, is still served: the bisection's retries are not its pace."""
    model, forward, clock = ticking_model(monkeypatch, tick=100.0, max_batch_tokens=12)
    start = clock[0]
    in_time_for_one_pass = with_deadline("one two three four", start + 650)
    outcome = run(model, text("a"), text("b"), text(POISON), text("c"), in_time_for_one_pass)
    first_group = [len(p) for p in forward.passes[:-1]]
    assert first_group[0] == 4 and len(first_group) > 2, forward.passes  # bisected: the next starts at +500 s or later
    assert [a.status for a in outcome.answers] == [200, 200, 500, 200, 200]
    assert clock[0] - start <= 650  # and it did end in time


def test_a_request_already_past_its_deadline_is_refused_before_its_body_is_read():
    """The refusal comes before decoding: a late request whose body would be refused (not UTF-8, or empty) gets
    DeadlineExceeded, not the decoding or validation error the per-pass check would leave it with."""
    model, forward = make_model()
    past = time.time() - 1
    late_invalid = ({"body": b"\xff\xfe not utf-8"}, with_deadline("", past)[1])
    outcome = run(model, late_invalid, with_deadline("", past), text("on time"))
    assert [a.status for a in outcome.answers] == [503, 503, 200]
    assert {outcome.answers[i].body["type"] for i in (0, 1)} == {"DeadlineExceeded"}
    assert len(forward.passes) == 1


# ---- a request that cannot be read -------------------------------------------------------------------


def test_a_request_whose_reading_raises_gets_500_alone(monkeypatch):
    """A bug in reading one request (here: the reader raising on its body) costs that request, not the batch."""
    import handlers.pipeline as pipeline

    read = pipeline.read_request

    def raising_on_one(item, *args):
        if item["body"] == b"raise":
            raise ValueError("a reader bug")
        return read(item, *args)

    monkeypatch.setattr(pipeline, "read_request", raising_on_one)
    model, _ = make_model()
    outcome = run(model, text("first"), text("raise"), text("third"))
    assert [a.status for a in outcome.answers] == [200, 500, 200]
    assert outcome.answers[1].body["type"] == "InternalError"
    # On a KServe route the 500 carries `error`, the field KServe's and Triton's clients read the message from.
    kserve = ({"body": b"raise"}, {"explain": "False", "content-type": "application/json"})
    outcome = run(model, text("first"), kserve)
    assert outcome.answers[1].status == 500 and outcome.answers[1].body["error"]


def test_a_binary_header_length_of_thousands_of_digits_is_refused_alone():
    # int() refuses strings of over 4,300 digits: the length is checked against the body's before converting.
    kserve = {"explain": "False"}  # the route TorchServe records for /v1 and /v2
    huge = ({"body": b'{"inputs": []}'}, {**kserve, "Inference-Header-Content-Length": "9" * 5000})
    model, _ = make_model()
    outcome = run(model, text("first"), huge, text("third"))
    assert [a.status for a in outcome.answers] == [200, 400, 200]
    assert outcome.answers[1].body["type"] == "MalformedRequest" and "error" in outcome.answers[1].body


def test_every_error_on_a_kserve_route_carries_the_protocols_error_field(monkeypatch):
    kserve = {"explain": "False"}
    past = str(int(1000 * (time.time() - 5)))
    broken = ({"body": b"{not json"}, kserve)  # too broken to tell v1 from v2
    late = ({"body": json.dumps({"instances": ["a"]}).encode()}, {**kserve, "X-Request-Deadline": past})
    v1_empty = ({"body": json.dumps({"instances": [" "]}).encode()}, kserve)
    plain_late = with_deadline("a text", time.time() - 5)
    model, _ = make_model()
    answers = run(model, broken, late, v1_empty, plain_late, text("")).answers
    assert [a.status for a in answers] == [400, 503, 400, 503, 400]
    for answer in answers[:3]:
        assert answer.body["error"] == answer.body["message"], answer.body
    assert all("error" not in answer.body for answer in answers[3:])  # /predictions keeps TorchServe's shape
