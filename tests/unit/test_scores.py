"""The score function a head is read through (handlers/scores.py), and what int8's check reads off each kind."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.scores import RAW, SIGMOID, SOFTMAX, apply, score_function
from tooling.onnx_export import _agreement


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "function"),
    [
        (None, 2, SOFTMAX),
        (None, 5, SOFTMAX),
        ("single_label_classification", 3, SOFTMAX),
        (None, 1, SIGMOID),  # a cross-encoder: one output, no problem_type
        ("multi_label_classification", 4, SIGMOID),
        ("multi_label_classification", 1, SIGMOID),
        ("regression", 1, RAW),
        ("regression", 3, RAW),
    ],
)
def test_the_function_follows_the_config_as_the_transformers_pipeline_does(problem_type, num_labels, function):
    assert score_function(problem_type, num_labels) == function


def test_each_function_maps_logits_as_named_and_an_unknown_one_is_refused():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0]])
    assert torch.allclose(apply(logits, SOFTMAX).sum(-1), torch.ones(2))
    assert torch.allclose(apply(logits, SIGMOID), 1 / (1 + torch.exp(-logits)))
    assert apply(logits, RAW) is logits
    with pytest.raises(ValueError, match="unknown score function"):
        apply(logits, "tanh")


def test_int8_agreement_reads_each_label_of_a_sigmoid_head_and_the_top_label_of_a_softmax_one():
    reference = np.array([[0.9, 0.2, 0.6], [0.1, 0.7, 0.4]], dtype=np.float32)
    # The same top label in both rows, but row 2's "yes" for its label 1 became a "no".
    same_top_other_decisions = np.array([[0.9, 0.2, 0.6], [0.1, 0.45, 0.4]], dtype=np.float32)
    assert _agreement(reference, same_top_other_decisions, SOFTMAX) == 1.0
    assert _agreement(reference, same_top_other_decisions, SIGMOID) == 0.5
    # Row 1's top label moved from 0 to 2, while every label's yes or no stayed.
    other_top_same_decisions = np.array([[0.9, 0.2, 0.95], [0.1, 0.7, 0.4]], dtype=np.float32)
    assert _agreement(reference, other_top_same_decisions, SOFTMAX) == 0.5
    assert _agreement(reference, other_top_same_decisions, SIGMOID) == 1.0
