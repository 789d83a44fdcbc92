"""What a classifier head's logits become: softmax, sigmoid or the raw values, as the checkpoint's config says.

Why not always softmax: a checkpoint with one output (a cross-encoder's relevance, a binary scorer)
would answer 1.0 for every text, and a multi-label tagger would have its labels compete for one unit
of probability. The choice follows transformers' text-classification pipeline
(`TextClassificationPipeline.postprocess`), so a checkpoint answers here as it does there:

| config | scores |
|---|---|
| `problem_type: regression` | the raw outputs |
| `problem_type: multi_label_classification`, or a single label | sigmoid: each label its own probability |
| otherwise (`single_label_classification`, or two labels or more) | softmax: the labels share one |

Pure and torch-free: the forward passes apply it to their own tensors through `apply`.
"""

from __future__ import annotations

from typing import Any

SOFTMAX = "softmax"
SIGMOID = "sigmoid"
RAW = "none"
FUNCTIONS = (SOFTMAX, SIGMOID, RAW)


def score_function(problem_type: str | None, num_labels: int) -> str:
    """The function a head with this `problem_type` and `num_labels` is read through (see the table above)."""
    if problem_type == "regression":
        return RAW
    if problem_type == "multi_label_classification" or num_labels == 1:
        return SIGMOID
    return SOFTMAX


def apply(logits: Any, function: str) -> Any:
    """The scores of a (rows, labels) float tensor of logits, torch's or any with its `softmax`/`sigmoid` methods."""
    if function == SOFTMAX:
        return logits.softmax(dim=-1)
    if function == SIGMOID:
        return logits.sigmoid()
    if function == RAW:
        return logits
    raise ValueError(f"unknown score function {function!r}; expected one of {FUNCTIONS}")
