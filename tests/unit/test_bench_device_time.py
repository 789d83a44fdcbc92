"""What the benchmark loads and computes only once, and how it warms a registration up before measuring it
(tooling/bench/ceilings.py, tooling/bench/served.py): the same figures, without spending device time twice."""

from __future__ import annotations

import shutil
from pathlib import Path

from handlers.options import HandlerOptions
from tooling.bench import answers, served
from tooling.bench.backends import BACKENDS, PreparedBackend
from tooling.bench.ceilings import plan_statistics
from tooling.onnx_export import WEIGHT_FILES

TEXTS = ["the room was clean", "rude staff at the desk and a cold breakfast", "fine", "a quiet hotel " * 40]


def test_the_planning_statistics_read_the_tokenizer_alone(tiny_checkpoint, tmp_path):
    """A checkpoint folder without its weights gives the plan the whole checkpoint gives: the weights are never
    loaded (on a GPU run they were loaded on the GPU for each backend and budget, only for the tokenizer)."""
    tokenizer_only = tmp_path / "tokenizer-only"
    shutil.copytree(tiny_checkpoint, tokenizer_only, ignore=shutil.ignore_patterns(*WEIGHT_FILES))
    assert not any((tokenizer_only / name).exists() for name in WEIGHT_FILES)
    for budget in (256, 10**9):
        options = HandlerOptions(max_batch_tokens=budget).for_device("cpu")
        whole = plan_statistics(tiny_checkpoint, TEXTS * 3, 4, options)
        assert plan_statistics(tokenizer_only, TEXTS * 3, 4, options) == whole
        assert whole["padding_waste"] >= 1.0 and whole["forward_passes_per_batch"] >= 1.0


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
