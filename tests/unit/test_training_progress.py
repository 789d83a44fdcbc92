"""The demo model's fine-tuning progress: a bar on a terminal, one line per epoch in a log."""

from __future__ import annotations

import io

from tooling.demo_model import TrainingProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_epochs(stream: io.StringIO, epochs: int = 3, steps: int = 20) -> str:
    progress = TrainingProgress(epochs, steps, stream=stream)
    for epoch in range(epochs):
        for step in range(steps):
            progress.step(epoch, loss=1.0 / (1 + step))
        progress.end_epoch(epoch)
    progress.close()
    return stream.getvalue()


def test_a_log_gets_one_line_per_epoch_and_no_bar_redraws():
    output = run_epochs(io.StringIO())
    assert "\r" not in output
    lines = output.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"fine-tuning: epoch {k}/3" for k in (1, 2, 3)]
    mean = sum(1.0 / (1 + step) for step in range(20)) / 20
    assert all(f"mean loss {mean:.3f} over 20 steps" in line for line in lines)


def test_a_terminal_gets_the_progress_bar():
    output = run_epochs(Terminal())
    assert "\r" in output  # tqdm redraws the bar in place
    assert "60/60" in output
    assert "epoch 3/3" not in output  # no epoch lines under the bar
