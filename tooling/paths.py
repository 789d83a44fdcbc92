"""Repository locations, defined once."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
HANDLERS = REPO / "handlers"
SERVER_CONFIG = REPO / "config.properties"
METRICS_CONFIG = REPO / "metrics.yaml"
LOG_CONFIG = REPO / "log4j2.xml"  # TorchServe's own logging, the access log's query strings redacted
MODEL_CONFIG = REPO / "model-config.yaml"
MODEL_STORE = REPO / "model_store"
DEMO_MODEL = REPO / "build" / "demo-model"
REVIEW = REPO / "review.txt"  # README command 1's sample text; also update_model's default probe
