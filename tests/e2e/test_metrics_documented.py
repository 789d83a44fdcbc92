"""Every metric the metrics table of docs/metrics.md lists is on a real server's /metrics after traffic, as documented.

The table is read from docs/metrics.md as it is when the tests run (tests/doc_tables.py), so a
metric renamed, dropped from metrics.yaml, or documented but never emitted fails here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from handlers.handler_metrics import DECLARED, HANDLER_TIME, ITEMS
from tests.doc_tables import documented_metrics
from tests.support import metrics_once

pytestmark = pytest.mark.e2e

MODEL_LABELS = ("ModelName", "model_name")  # the handler's and TorchServe's frontend's spelling


@pytest.fixture(scope="module")
def exported(torchserve, tiny_checkpoint, make_archive) -> tuple[str, dict[str, tuple[str, list]]]:
    """(model, /metrics after valid, rejected and truncated requests: sample name -> (family type, samples))."""
    model = "tiny-metrics"
    archive = make_archive(tiny_checkpoint, model)
    assert torchserve.register(archive, batch_size=4, max_batch_delay=50).status_code == 200
    try:
        texts = ["a pleasant stay", "the room was dirty", "", "long " * 400, "fine"]
        with ThreadPoolExecutor(max_workers=len(texts)) as pool:
            statuses = [r.status_code for r in pool.map(lambda t: torchserve.predict(model, t), texts)]
        assert statuses == [200, 200, 400, 200, 200]
        # The handler's metric lines reach /metrics through the worker's log stream, after the answers, a batch's
        # lines in the order it writes them (its item count before its token counts, stages and HandlerTime). One
        # more request, answered after all of those, is a batch of its own: once its item count is in, every line
        # of the batches before it is too.
        assert torchserve.predict(model, "one more, in a batch of its own").status_code == 200
        text = metrics_once(torchserve, model, {ITEMS: len(texts) + 1})
        samples: dict[str, tuple[str, list]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # The parser names a counter's samples <name>_total even where /metrics does not.
                for name in {sample.name, family.name}:
                    samples.setdefault(name, (family.type, []))[1].append(sample)
        yield model, samples
    finally:
        torchserve.unregister(model)


def test_every_metric_in_the_metrics_guide_is_exported_after_traffic(exported):
    model, samples = exported
    documented = documented_metrics()
    assert len(documented) >= len(DECLARED) - 1, "docs/metrics.md's table was not found or not parsed"
    for name, (kind, labels) in documented.items():
        assert name in samples, f"{name} is documented but not on /metrics"
        family_type, found = samples[name]
        assert family_type == kind, f"{name} is documented as a {kind}, exported as a {family_type}"
        for label in labels:
            assert all(label in sample.labels for sample in found), f"{name} has no {label} label"
        ours = [s for s in found if any(s.labels.get(key) == model for key in MODEL_LABELS)]
        if any(key in sample.labels for sample in found for key in MODEL_LABELS):  # a per-model metric
            assert ours and sum(s.value for s in ours) > 0, f"{name} did not move for {model}"


def test_handler_time_is_exported_for_the_model(exported):
    model, samples = exported
    family_type, found = samples[HANDLER_TIME]
    assert family_type == "gauge"
    assert [s.value > 0 for s in found if s.labels.get("ModelName") == model] == [True]
