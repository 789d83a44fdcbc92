"""Read one sample from TorchServe's Prometheus /metrics text, with the standard parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`; 0.0 when none exist yet."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
