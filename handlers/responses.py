"""Probabilities -> the JSON answer a client gets for one item. Pure and torch-free."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from handlers.rejection import Rejection


def label_names(id2label: Mapping[int, str] | None, num_labels: int) -> list[str]:
    """Label names in class-index order; falls back to LABEL_i where the config has none."""
    id2label = id2label or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(num_labels)]


def prediction_body(probabilities: Sequence[float], labels: Sequence[str], truncated: bool) -> dict[str, object]:
    scores = {label: float(p) for label, p in zip(labels, probabilities)}
    best = max(range(len(labels)), key=lambda i: probabilities[i])
    return {"label": labels[best], "score": float(probabilities[best]), "scores": scores, "truncated": truncated}


def to_json(body: Mapping[str, object]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def error_json(reason: Rejection) -> str:
    return to_json(reason.body())
