"""metrics.yaml declares exactly the metrics the handler emits, with the same type, unit and dimensions.

TorchServe's frontend exports a backend metric on /metrics only if metrics.yaml declares it;
an undeclared one, or one whose dimensions differ, is dropped without a word. These checks
catch that before a server is started.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.service import PREDICTION_METRIC

from handlers.handler_metrics import DECLARED, HANDLER_TIME, HandlerMetrics
from tests.doc_tables import documented_metrics
from tooling.paths import METRICS_CONFIG

# Every model metric carries these first; the backend appends Hostname itself.
DEFAULT_DIMENSIONS = ["ModelName", "Level"]


def model_metrics() -> dict[str, tuple[str, str, list[str]]]:
    """metrics.yaml's model_metrics: name -> (type, unit, dimension names)."""
    section = yaml.safe_load(METRICS_CONFIG.read_text())["model_metrics"]
    declared: dict[str, tuple[str, str, list[str]]] = {}
    for metric_type, metrics in section.items():
        for metric in metrics:
            assert metric["name"] not in declared, f"{metric['name']} is declared twice"
            declared[metric["name"]] = (metric_type, metric["unit"], list(metric["dimensions"]))
    return declared


def test_every_metric_the_handler_emits_is_declared_alike():
    declared = model_metrics()
    for name, (metric_type, unit, extra_dimensions) in DECLARED.items():
        assert name in declared, f"{name} is emitted by the handler but not declared in metrics.yaml"
        assert declared[name] == (metric_type.value, unit, [*DEFAULT_DIMENSIONS, *extra_dimensions]), name


def test_metrics_yaml_declares_no_model_metric_that_nothing_emits():
    # PredictionTime is emitted by TorchServe's own worker (ts/service.py) around every batch.
    assert set(model_metrics()) - set(DECLARED) == {PREDICTION_METRIC}


def test_emitting_every_handler_metric_through_torchserve_adds_nothing_undeclared(caplog):
    """Drive every HandlerMetrics method through TorchServe's own yaml-backed cache."""
    cache = MetricsCacheYamlImpl(str(METRICS_CONFIG))
    cache.initialize_cache()
    cache.set_request_ids({0: "req-0"})
    declared = set(cache.cache_keys())
    metrics = HandlerMetrics(cache, "tiny")
    caplog.set_level(logging.INFO)
    metrics.batch(size=3, forward_passes=1, real_tokens=10, padded_tokens=12)
    metrics.rejected("EmptyText")
    metrics.stage("forward", 1.5)
    metrics.handler_time(2.0)
    assert set(cache.cache_keys()) == declared
    emitted = {line.split("[METRICS]", 1)[1].split(".", 1)[0] for line in caplog.messages if "[METRICS]" in line}
    assert emitted == set(DECLARED)
    assert "could not emit metric" not in caplog.text


def test_on_a_server_whose_metrics_config_lacks_them_the_handler_still_emits_every_metric(caplog):
    """TorchServe's own metrics.yaml declares none of the handler's but HandlerTime: each other one is added to
    the cache, as add_metric would, and emitted (the frontend then drops it from /metrics: hence this
    project's own metrics.yaml)."""
    import ts

    cache = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    present = {key.split(":", 1)[1] for key in cache.cache_keys()}
    assert not {name for name in DECLARED if name != HANDLER_TIME} & present
    caplog.set_level(logging.INFO)
    metrics = HandlerMetrics(cache, "tiny")
    metrics.batch(size=3, forward_passes=1, real_tokens=10, padded_tokens=12)
    metrics.rejected("EmptyText")
    metrics.stage("forward", 1.5)
    metrics.handler_time(2.0)
    emitted = {line.split("[METRICS]", 1)[1].split(".", 1)[0] for line in caplog.messages if "[METRICS]" in line}
    assert emitted == set(DECLARED)
    assert "could not" not in caplog.text


def test_the_metrics_guide_documents_every_metric_the_handler_emits_as_declared():
    documented = documented_metrics()
    for name, (metric_type, _, extra_dimensions) in DECLARED.items():
        assert name in documented, f"{name} is emitted by the handler but missing from docs/metrics.md's table"
        assert documented[name] == (metric_type.value, extra_dimensions), name
