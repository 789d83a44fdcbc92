"""TorchServe handler for Hugging Face sequence classifiers (BERT, DistilBERT, RoBERTa ...).

A thin adapter: at load it builds the model value (handlers/loading.py); for each batch
it hands the requests and their headers to handlers/pipeline.py and writes each
answer's status, content type and headers back through TorchServe's context (which
its frontend copies onto each request's own HTTP reply). One bad request never fails
its neighbours, and handle() never raises.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ts.torch_handler.base_handler import BaseHandler

from handlers import rejection
from handlers.deadline import PassPace
from handlers.decoding import ROUTE_KSERVE, asks_to_describe, came_over_grpc, route_of
from handlers.description import describe
from handlers.fault_isolation import is_out_of_memory
from handlers.frame_reader import install_buffered_frame_reader
from handlers.handler_metrics import HandlerMetrics
from handlers.loading import LoadedModel, ModelLoadFailed, load_model
from handlers.options import HandlerOptions
from handlers.pipeline import BatchOutcome, answer_batch
from handlers.responses import JSON_CONTENT, Answer, ModelIdentity, encode_answer, rejection_answer, to_json
from handlers.tokenization import encode

logger = logging.getLogger(__name__)

# The response header TorchServe's frontend reads to tell a streamed answer's last part (RequestInput.TS_STREAM_NEXT).
STREAM_NEXT_HEADER = "ts_stream_next"


# TorchServe loads the one class this module defines; helpers live in other modules.
class BertSequenceClassifierHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.served: LoadedModel | None = None
        self.model_name = "model"
        self.identity = ModelIdentity(self.model_name)
        self.metrics = HandlerMetrics(None, "")
        # How long this worker's forward passes take: the deadline check's estimate of when a batch's answers
        # leave, which the batch before must tell it (handlers/deadline.py). The only figure kept across batches.
        self.pace = PassPace()

    def initialize(self, context) -> None:
        # Ask TorchServe's worker to hand over request bodies as the bytes the client
        # sent: the byte limit, charset and JSON validation then apply to exactly those
        # bytes, and TorchServe does not log its own decode failures. The worker reads
        # this variable on every request, so setting it here takes effect at once.
        os.environ["TS_DECODE_INPUT_REQUEST"] = "false"
        # The checkpoint is inside the archive; never reach for a model hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # TorchServe logs each line of a worker's stderr as a WARN in model_log.log: no progress bar there
        # (from_pretrained draws one at every load), so that each line an operator finds there is worth reading.
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        properties = context.system_properties
        self.manifest = context.manifest
        self.model_name = getattr(context, "model_name", None) or "model"
        gpu_id = properties.get("gpu_id")
        try:
            yaml_config = getattr(context, "model_yaml_config", None) or {}
            options = HandlerOptions.from_mapping(yaml_config.get("handler"))
            model_dir = Path(properties.get("model_dir", ".")) / options.model_subdir
            served = load_model(model_dir, options, gpu_id, batch_size=int(properties.get("batch_size") or 1))
            if served.options.warmup:
                served.forward(encode(served.encoder, ["warm up the model"]))
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            where = "the CPU" if gpu_id is None else f"GPU {gpu_id}"
            raise ModelLoadFailed(f"cannot load {self.model_name} on {where}: {type(exc).__name__}: {exc}") from exc
        self.metrics = HandlerMetrics(getattr(context, "metrics", None), self.model_name)
        version = (self.manifest or {}).get("model", {}).get("modelVersion")
        self.identity = ModelIdentity(self.model_name, None if version is None else str(version))
        self.served = served
        self.initialized = True
        frames = "buffered" if install_buffered_frame_reader() else "TorchServe's own"
        logger.info(
            "loaded %s (%s, %s): %s; labels=%s scores=%s max_length=%d max_batch_tokens=%d (%s) max_instances=%d; "
            "frame reader: %s",
            self.model_name,
            served.model_type,
            served.backend,
            served.description,
            list(served.labels),
            served.scores,
            served.max_length,
            served.options.max_batch_tokens,
            served.planner.description,
            served.options.max_instances,
            frames,
        )

    def handle(self, data: list, context) -> list[bytes]:
        """Answer every request of the batch; the returned list always has len(data) entries."""
        started = time.perf_counter()
        headers = [_request_headers(context, index) for index in range(len(data))]
        # TorchServe sends a describe call alone, a batch of one (Model.pollInferJob), marked by its header.
        if len(data) == 1 and asks_to_describe(headers[0]):
            try:
                return [self._describe(context)]
            except Exception:  # handle() never raises: the description is left out, the worker serves on
                logger.exception("describing %s failed; the describe call gets no customizedMetadata", self.model_name)
                return [b""]  # what TorchServe reads as no customizedMetadata (RestJob.responseDescribe)
        try:
            outcome = answer_batch(data, headers, self.served, self.identity, self.pace)
        except Exception:
            # The pipeline answers what it can itself; this is the net under the pipeline's own code.
            logger.exception("answer_batch raised on a batch of %d requests; every request gets 500", len(data))
            reason = rejection.internal_error()
            # Each in its own request's form: on a KServe route the error carries `error`, which its clients read.
            on_kserve = [route_of(item_headers) == ROUTE_KSERVE for item_headers in headers]
            outcome = BatchOutcome([rejection_answer(reason, kserve=kserve) for kserve in on_kserve])
        bodies = [
            self._respond(context, index, answer, came_over_grpc(headers[index]))
            for index, answer in enumerate(outcome.answers)
        ]
        self.metrics.batch(len(data), outcome.forward_passes, outcome.real_tokens, outcome.padded_tokens)
        for stage, milliseconds in outcome.stage_ms.items():
            self.metrics.stage(stage, milliseconds)
        # TorchServe's BaseHandler.handle emits HandlerTime; this handle() replaces it, so it does too.
        self.metrics.handler_time(1000 * (time.perf_counter() - started))
        return bodies

    def _describe(self, context) -> bytes:
        """A management describe call's answer: the worker's description (handlers/description.py), never a
        prediction or a rejection, and not counted among the items."""
        context.set_response_content_type(0, JSON_CONTENT)
        return to_json(describe(self.served, self.identity)).encode("utf-8")

    def _respond(self, context, index: int, answer: Answer, over_grpc: bool) -> bytes:
        # Encoded here, per item: TorchServe encodes a returned str after handle() returns, outside any guard,
        # and one that cannot be written (a lone surrogate a client sent, a NaN, a value FP32 cannot hold) would
        # kill the worker and every request of the batch. Such an answer becomes this item's 500 (JSON).
        try:
            encoded = encode_answer(answer)
        except ValueError:  # UnicodeEncodeError among them
            logger.error(
                "answer %d of the batch (status %d%s) cannot be written %s; it gets 500 instead",
                index,
                answer.status,
                f", {answer.rejection.type}" if answer.rejection else "",
                "in the binary tensor extension" if answer.binary_outputs else "as UTF-8 JSON",
            )
            answer = rejection_answer(rejection.internal_error(), answer.instance, answer.kserve)
            encoded = encode_answer(answer)
        if answer.rejection is not None:
            reason = answer.rejection
            # The text is never logged: it may be personal data.
            logger.warning(
                "rejected item: reason=%s status=%d index=%d request_id=%s%s",
                reason.type,
                reason.status,
                index,
                context.get_request_id(index),
                f" instance={answer.instance}" if answer.instance else "",
            )
            self.metrics.rejected(reason.type)
            context.set_response_status(reason.status, reason.phrase, index)
        # TorchServe 0.12's frontend (RestJob.responseInference) sets each of this item's headers on its reply.
        context.set_response_content_type(index, encoded.content_type)
        for name, value in encoded.headers:
            context.set_response_header(index, name, value)
        if over_grpc:
            # TorchServe 0.12's GRPCJob.response reads this header of every StreamPredictions answer and throws
            # without it, dropping the worker and every request of its batch ("Worker died."): this answer is the
            # stream's last. A Predictions call ignores it; HTTP never sees it (RestJob would stream the reply).
            context.set_response_header(index, STREAM_NEXT_HEADER, "false")
        return encoded.body


def _request_headers(context, index: int) -> dict[str, Any]:
    """The request's headers and per-parameter content types, as TorchServe's worker recorded them."""
    return context.get_all_request_header(index)
