"""TorchServe handler for Hugging Face sequence classifiers (BERT, DistilBERT, RoBERTa ...).

For every batch the frontend hands over, each item is decoded and validated on
its own before anything is batched; only valid items are tokenized and run
through the model, and every item gets its own answer and HTTP status by index.
One bad item never fails its neighbours, and handle() never raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from handlers import rejection
from handlers.batching import padded_tokens, plan_micro_batches
from handlers.decoding import payload_of
from handlers.handler_metrics import HandlerMetrics
from handlers.inference import forward_probabilities, run_isolating_faults
from handlers.options import HandlerOptions
from handlers.rejection import Rejection
from handlers.responses import error_json, label_names, prediction_body, to_json
from handlers.tokenization import Encoding, PreparedBatch, collate, encode, model_token_limit
from handlers.validation import decode_and_validate

logger = logging.getLogger(__name__)

JSON = "application/json"


def select_device(gpu_id: Any) -> torch.device:
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


# TorchServe loads the one class this module defines; helpers live in other modules.
class BertSequenceClassifierHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.options = HandlerOptions()
        self.tokenizer = None
        self.labels: list[str] = []
        self.max_length = self.options.max_length
        self.token_limit = self.options.max_length
        self.metrics: HandlerMetrics = HandlerMetrics(None, "")
        self._results: list[Any] = []

    # ---- load ---------------------------------------------------------------------------

    def initialize(self, context) -> None:
        # Ask TorchServe's worker to hand over request bodies as the bytes the client
        # sent: the byte limit and UTF-8/JSON validation then apply to exactly those
        # bytes, and TorchServe does not log its own decode failures. The worker reads
        # this variable on every request, so setting it here takes effect at once.
        os.environ["TS_DECODE_INPUT_REQUEST"] = "false"
        # The checkpoint is inside the archive; never reach for a model hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        properties = context.system_properties
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.options = HandlerOptions.from_mapping(yaml_config.get("handler"))
        self.manifest = context.manifest
        self.device = select_device(properties.get("gpu_id"))
        self.options = self.options.for_device(self.device.type)
        if self.device.type == "cpu":
            threads = self.options.cpu_threads or len(os.sched_getaffinity(0))
            torch.set_num_threads(threads)

        model_dir = Path(properties.get("model_dir", ".")) / self.options.model_subdir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        dtype = select_dtype(self.options.dtype, self.device)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        self.model.to(self.device).eval()

        config = self.model.config
        self.labels = label_names(config.id2label, config.num_labels)
        self.token_limit = model_token_limit(self.tokenizer, config)
        self.max_length = min(self.options.max_length, self.token_limit)
        model_name = getattr(context, "model_name", None) or "model"
        self.metrics = HandlerMetrics(getattr(context, "metrics", None), model_name)

        if self.options.warmup:
            warm = encode(self.tokenizer, ["warm up the model"], self.max_length)
            self._forward(warm)
        self.initialized = True
        logger.info(
            "loaded %s on %s (%s): labels=%s max_length=%d max_batch_tokens=%d",
            config.model_type,
            self.device,
            dtype,
            self.labels,
            self.max_length,
            self.options.max_batch_tokens,
        )

    # ---- per batch ----------------------------------------------------------------------

    def handle(self, data: list, context) -> list:
        """Answer every item of the batch; the returned list always has len(data) entries."""
        self.context = context
        self._results = [None] * len(data)
        try:
            prepared = self.preprocess(data)
            started = time.perf_counter()
            outputs = self.inference(prepared)
            answered = time.perf_counter()
            self.postprocess((prepared, outputs))
            self.metrics.stage("forward", 1000 * (answered - started))
            self.metrics.stage("response", 1000 * (time.perf_counter() - answered))
        except Exception:
            logger.exception("handler failed on a batch of %d items", len(data))
        for index, result in enumerate(self._results):
            if result is None:
                self._reject(index, rejection.internal_error())
        return self._results

    def preprocess(self, data: list) -> PreparedBatch:
        """Decode and validate each item on its own, then tokenize the valid ones together."""
        started = time.perf_counter()
        prepared = PreparedBatch()
        for index, item in enumerate(data):
            name, value = payload_of(item)
            outcome = decode_and_validate(value, self._content_type(index, name), self.options.max_bytes)
            if isinstance(outcome, Rejection):
                self._reject(index, outcome)
            else:
                prepared.texts[index] = outcome
        validated = time.perf_counter()
        self.metrics.stage("validation", 1000 * (validated - started))

        indices = list(prepared.texts)
        encodings = encode(self.tokenizer, [prepared.texts[i] for i in indices], self.max_length)
        for index, encoding in zip(indices, encodings):
            if encoding.truncated and self.options.overlength == "reject":
                self._reject(index, rejection.too_many_tokens(self.max_length))
            else:
                prepared.encodings[index] = encoding
        self.metrics.stage("tokenization", 1000 * (time.perf_counter() - validated))
        return prepared

    def inference(self, prepared: PreparedBatch, *args, **kwargs) -> dict[int, torch.Tensor | Rejection]:
        """One forward pass per length-planned micro-batch; failures bisected down to the culprit."""
        indices = list(prepared.encodings)
        if not indices:
            self.metrics.batch(len(self._results), 0, 0, 0)
            return {}
        lengths = [prepared.encodings[i].length for i in indices]
        groups = plan_micro_batches(lengths, self.options.max_batch_tokens, self.options.pad_to_multiple_of)
        outputs: dict[int, torch.Tensor | Rejection] = {}

        def run(subset: Sequence[int]) -> torch.Tensor:
            return self._forward([prepared.encodings[i] for i in subset], [prepared.texts[i] for i in subset])

        describe = self._describe_group(prepared)
        for group in groups:
            outputs.update(run_isolating_faults(run, [indices[p] for p in group], describe))
        padded = padded_tokens(lengths, groups, self.options.pad_to_multiple_of, self.token_limit)
        self.metrics.batch(len(self._results), len(groups), sum(lengths), padded)
        return outputs

    def postprocess(self, data: tuple[PreparedBatch, dict[int, torch.Tensor | Rejection]]) -> list:
        prepared, outputs = data
        for index, output in outputs.items():
            if isinstance(output, Rejection):
                self._reject(index, output)
                continue
            body = prediction_body(output.tolist(), self.labels, prepared.encodings[index].truncated)
            self._results[index] = to_json(body)
            self._set_content_type(index)
        return self._results

    # ---- helpers ------------------------------------------------------------------------

    def _forward(self, encodings: Sequence[Encoding], texts: Sequence[str] = ()) -> torch.Tensor:
        if self.options.fault_marker and any(self.options.fault_marker in t for t in texts):
            if not self.options.fault_delay_s:
                raise RuntimeError("injected fault (handler option fault_marker)")
            time.sleep(self.options.fault_delay_s)
        batch = collate(encodings, self.tokenizer.pad_token_id or 0, self.options.pad_to_multiple_of, self.token_limit)
        return forward_probabilities(self.model, batch, self.device)

    def _describe_group(self, prepared: PreparedBatch):
        def describe(group: Sequence[int]) -> str:
            lengths = [prepared.encodings[i].length for i in group]
            return f"a group of {len(group)} items (longest {max(lengths)} tokens, batch indices {list(group)})"

        return describe

    def _content_type(self, index: int, name: str | None) -> str | None:
        context = self.context
        if context is None or getattr(context, "request_processor", None) is None or name is None:
            return None
        try:
            parameter = context.get_request_header(index, name)
        except (IndexError, KeyError, AttributeError, TypeError):
            return None
        if isinstance(parameter, dict):
            return parameter.get("content-type")
        return parameter if isinstance(parameter, str) else None

    def _request_id(self, index: int) -> str:
        try:
            return str(self.context.get_request_id(index))
        except Exception:  # noqa: BLE001
            return "unknown"

    def _set_content_type(self, index: int) -> None:
        # A context without a request processor (e.g. a bare test double) has nowhere to put headers.
        with contextlib.suppress(Exception):
            self.context.set_response_content_type(index, JSON)

    def _reject(self, index: int, reason: Rejection) -> None:
        # The text is never logged: it may be personal data.
        logger.warning(
            "rejected item: reason=%s status=%d index=%d request_id=%s",
            reason.type,
            reason.status,
            index,
            self._request_id(index),
        )
        self.metrics.rejected(reason.type)
        self._results[index] = error_json(reason)
        with contextlib.suppress(Exception):
            self.context.set_response_status(reason.status, reason.phrase, index)
        self._set_content_type(index)
