"""Reading samples from Prometheus text (TorchServe's /metrics), with prometheus-client's parser."""

from __future__ import annotations


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples called `name` whose labels include `labels` (0.0 if none yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
