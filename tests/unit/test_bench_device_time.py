"""What the benchmark loads and computes only once, and how it warms a registration up before measuring it
(tooling/bench/ceilings.py, tooling/bench/served.py): the same figures, without spending device time twice."""

from __future__ import annotations

from pathlib import Path

from handlers.loading import load_model
from handlers.options import HandlerOptions
from handlers.pipeline import answer_batch
from handlers.responses import ModelIdentity
from tooling.bench import answers, served
from tooling.bench.backends import BACKENDS, PreparedBackend
from tooling.bench.ceilings import plan_statistics

TEXTS = ["the room was clean", "rude staff at the desk and a cold breakfast", "fine", "a quiet hotel " * 40]


def test_the_planning_statistics_are_what_the_handlers_own_batches_report(tiny_checkpoint):
    """The benchmark's padded/real and passes per batch are read from the served model's own plan
    (handlers/pipeline.plan, its planner included), on the model already loaded: the same figures the handler's
    batches report to its metrics, for a budget that cuts batches and one that does not."""
    batches = [TEXTS[i:] + TEXTS[:i] for i in range(3)]
    for budget in (64, 10**9):
        model = load_model(tiny_checkpoint, HandlerOptions(max_batch_tokens=budget), None)
        headers = [{"content-type": "text/plain"}] * 4
        outcomes = [
            answer_batch([{"body": t.encode()} for t in b], headers, model, ModelIdentity("t")) for b in batches
        ]
        assert all(answer.status == 200 for outcome in outcomes for answer in outcome.answers)
        padded, real = sum(o.padded_tokens for o in outcomes), sum(o.real_tokens for o in outcomes)
        passes = sum(o.forward_passes for o in outcomes)
        assert plan_statistics(model, [t for batch in batches for t in batch], 4) == {
            "padding_waste": padded / real,
            "forward_passes_per_batch": passes / len(batches),
        }
        assert (passes > len(batches)) == (budget == 64)


def test_backends_that_serve_one_checkpoint_share_one_reference(tiny_checkpoint, monkeypatch):
    """pytorch and pytorch-graphs serve the same checkpoint, and their float32 reference is the same computation:
    it runs once, and both are checked against it."""
    calls: list[Path] = []

    def counted(model_dir, texts, handler_options, device):
        calls.append(model_dir)
        return answers.answers_alone(model_dir, texts, handler_options, device)

    monkeypatch.setattr(served, "answers_alone", counted)
    backends = [PreparedBackend(BACKENDS[name], Path(tiny_checkpoint), None) for name in ("pytorch", "pytorch-graphs")]
    expected = served.reference_answers(backends, TEXTS, {}, "cpu")
    assert calls == [Path(tiny_checkpoint)]
    assert expected["pytorch"] is expected["pytorch-graphs"]
    assert expected["pytorch"] == answers.answers_alone(Path(tiny_checkpoint), TEXTS, {}, "cpu")


def test_the_warm_up_runs_at_the_largest_client_count_the_cells_measure():
    """So the eager backend has run its fullest batches before a measured cell, as CUDA graphs did at capture."""
    assert served.warm_up_clients([1, 64, 1024, 256], 128, 8) == 1024  # fewer than 8 workers' batches twice over
    assert served.warm_up_clients([8], 128, 1) == 8
