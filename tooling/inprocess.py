"""Drive the handler in-process, the way TorchServe's worker does, without a server.

Used by the tests (a unit test may drive the handler with a minimal context) and by
the benchmark's in-process ceiling. The context is TorchServe's own Context class.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tooling.paths import METRICS_CONFIG


def make_context(
    model_dir: Path, handler_options: dict | None = None, model_name: str = "tiny", gpu_id: int | None = None,
    batch_size: int = 8, metrics_config: Path = METRICS_CONFIG,
):  # fmt: skip
    """TorchServe's Context for a model unpacked at model_dir, with the server's metrics declarations (or those of
    `metrics_config`); `gpu_id` as TorchServe gives a GPU worker (None: a CPU worker), `batch_size` as registered."""
    from ts.context import Context
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    metrics = MetricsCacheYamlImpl(str(metrics_config))
    metrics.initialize_cache()
    metrics.model_name = model_name
    manifest = {"model": {"modelName": model_name, "modelVersion": "1.0", "handler": "bert_handler.py"}}  # as archived
    return Context(
        model_name,
        str(model_dir),
        manifest,
        batch_size,
        gpu_id,
        "0.12.0",
        metrics=metrics,
        model_yaml_config={"handler": dict(handler_options or {})},
    )


def set_batch(context, items: list[tuple[object, str | None]]) -> list[dict]:
    """Fill the context's per-request state as the worker does; returns the handler's `data` list."""
    from ts.context import RequestProcessor

    context.request_ids = {i: f"req-{i}" for i in range(len(items))}
    context.request_processor = [
        RequestProcessor({"body": {"content-type": ct}} if ct is not None else {}) for _, ct in items
    ]
    context.metrics.set_request_ids(context.request_ids)
    return [{"body": payload} for payload, _ in items]


def unpacked_layout(checkpoint: Path, root: Path | None = None) -> Path:
    """The directory layout TorchServe unpacks an archive to: the checkpoint under model/."""
    root = Path(root or tempfile.mkdtemp(prefix="unpacked-"))
    root.mkdir(parents=True, exist_ok=True)
    link = root / "model"
    if not link.exists():
        link.symlink_to(Path(checkpoint).resolve(), target_is_directory=True)
    return root


def load_handler(model_dir: Path, handler_options: dict | None = None, gpu_id: int | None = None, batch_size: int = 8):
    from handlers.bert_handler import BertSequenceClassifierHandler

    handler = BertSequenceClassifierHandler()
    handler.initialize(make_context(model_dir, handler_options, gpu_id=gpu_id, batch_size=batch_size))
    return handler
