"""The handler's own metrics, emitted through TorchServe's metrics API.

TorchServe exposes a backend metric on /metrics only if metrics.yaml (the
server's `metrics_config`) declares it with the same name, type and dimension
names; an undeclared metric is dropped silently. Keep the two in step:
tests/unit/test_metrics_declarations.py checks DECLARED against metrics.yaml, and
tests/e2e/test_metrics_documented.py reads every name below back from a real /metrics.
"""

from __future__ import annotations

import logging

from ts.metrics.metric_cache_errors import MetricsCacheKeyError
from ts.metrics.metric_type_enum import MetricTypes

logger = logging.getLogger(__name__)

BATCHES = "bert_batches_total"
ITEMS = "bert_items_total"
REJECTED = "bert_rejected_items_total"
FORWARD_PASSES = "bert_forward_passes_total"
REAL_TOKENS = "bert_real_tokens_total"
PADDED_TOKENS = "bert_padded_tokens_total"
STAGE_MS = "bert_stage_milliseconds_total"
LAST_BATCH_SIZE = "bert_last_batch_size"
# TorchServe's own name: BaseHandler.handle emits it, and this handler replaces handle().
HANDLER_TIME = "HandlerTime"

# name -> (type, unit, extra dimension names after ModelName and Level)
DECLARED: dict[str, tuple[MetricTypes, str, tuple[str, ...]]] = {
    BATCHES: (MetricTypes.COUNTER, "Count", ()),
    ITEMS: (MetricTypes.COUNTER, "Count", ()),
    REJECTED: (MetricTypes.COUNTER, "Count", ("Reason",)),
    FORWARD_PASSES: (MetricTypes.COUNTER, "Count", ()),
    REAL_TOKENS: (MetricTypes.COUNTER, "Count", ()),
    PADDED_TOKENS: (MetricTypes.COUNTER, "Count", ()),
    STAGE_MS: (MetricTypes.COUNTER, "Milliseconds", ("Stage",)),
    LAST_BATCH_SIZE: (MetricTypes.GAUGE, "Count", ()),
    HANDLER_TIME: (MetricTypes.GAUGE, "ms", ()),
}


class HandlerMetrics:
    """Thin wrapper so the handler states what happened, not how TorchServe records it.

    Each metric is TorchServe's own metric object, looked up once: metrics.yaml declares them all, and one
    the server's config lacks is added to the cache as TorchServe's add_metric would. A metrics failure is
    logged once and never affects a prediction.
    """

    def __init__(self, cache, model_name: str) -> None:
        self._model_name = model_name
        self._warned = False
        self._metrics = {}  # name -> TorchServe's metric object; empty: no cache (outside a worker), emit nothing
        if cache is not None:
            try:
                self._metrics = {name: _metric_object(cache, name) for name in DECLARED}
            except Exception:
                logger.warning("could not set up the handler's metrics; serving without them", exc_info=True)

    def _emit(self, name: str, value: float, **extra: str) -> None:
        metric = self._metrics.get(name)
        if metric is None:
            return
        values = [self._model_name, "Model", *(extra[dim] for dim in DECLARED[name][2])]
        try:
            # Without a request id: a batch's figure belongs to no one request, and TorchServe's add_metric writes
            # every request id of the batch into the line (about 4.7 KB at 128), which the frontend then parses.
            metric.add_or_update(value, values, "")
        except Exception:
            if not self._warned:
                logger.warning("could not emit metric %s", name, exc_info=True)
                self._warned = True

    def batch(self, size: int, forward_passes: int, real_tokens: int, padded_tokens: int) -> None:
        self._emit(BATCHES, 1)
        self._emit(ITEMS, size)
        self._emit(LAST_BATCH_SIZE, size)
        self._emit(FORWARD_PASSES, forward_passes)
        self._emit(REAL_TOKENS, real_tokens)
        self._emit(PADDED_TOKENS, padded_tokens)

    def rejected(self, reason: str) -> None:
        self._emit(REJECTED, 1, Reason=reason)

    def stage(self, stage: str, milliseconds: float) -> None:
        self._emit(STAGE_MS, round(milliseconds, 3), Stage=stage)

    def handler_time(self, milliseconds: float) -> None:
        """Time inside handle() for one batch, as TorchServe's BaseHandler reports it."""
        self._emit(HANDLER_TIME, round(milliseconds, 2))


def _metric_object(cache, name: str):
    """TorchServe's metric object for `name` in `cache`: metrics.yaml's, or a new one with DECLARED's dimensions."""
    metric_type, unit, extra_dims = DECLARED[name]
    try:
        return cache.get_metric(name, metric_type)
    except MetricsCacheKeyError:
        return cache.add_metric_to_cache(name, unit, ["ModelName", "Level", *extra_dims], metric_type)
