"""The forward pass in ONNX Runtime: the fast CPU path for archives that hold a `model.onnx`.

Its twin is handlers/torch_forward.py; both take encodings and return the head's scores (class
probabilities for most checkpoints: handlers/scores.py), so validation, planning, fault isolation
and metrics (handlers/pipeline.py) are the same whichever backend an archive holds. The graph is
exported by tooling/onnx_export.py with the score function inside it, so its one output is already
float32 scores; its metadata names the function, and a graph whose function is not the one the
checkpoint's config asks for is refused at load. No torch here: an ONNX worker does not need it for
the forward pass.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from handlers.options import HandlerOptions
from handlers.scores import SOFTMAX
from handlers.tokenization import Encoding, collate

# The graph's file name in an ONNX checkpoint folder (and in an archive's model/).
ONNX_FILE = "model.onnx"
# Key of the JSON record tooling/onnx_export.py writes into the graph's metadata_props:
# how the graph was made and the numbers its export measured against PyTorch.
EXPORT_METADATA_KEY = "bert_torchserve.export"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


class OnnxBackendError(RuntimeError):
    """The archive's ONNX model cannot be served here (no CUDA provider on a GPU worker, a graph
    that wants inputs the tokenizer does not give, an output that is not one row per text, or a score
    function other than the checkpoint's)."""


class OnnxForward:
    """One ONNX Runtime session, created once at load; called once per micro-batch."""

    def __init__(self, session, device_type: str, options: HandlerOptions, pad_token_id: int, token_limit: int,
                 description: str, token_types: bool = False) -> None:  # fmt: skip
        self.session = session
        self.device_type = device_type
        self.description = description
        self._options = options
        self._pad_token_id = pad_token_id
        self._token_limit = token_limit
        self._inputs = frozenset(i.name for i in session.get_inputs())
        self._output = session.get_outputs()[0].name
        # The model embeds token types (BERT: type_vocab_size >= 2), so a graph without the input loses a pair's
        # second text; DistilBERT and RoBERTa have no types to lose, and read a pair by its separator alone.
        self._pairs_need_types = token_types and "token_type_ids" not in self._inputs

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        """Float32 scores (handlers/scores.py), one row per encoding, in order."""
        arrays = collate(encodings, self._pad_token_id, self._options.pad_to_multiple_of, self._token_limit)
        missing = self._inputs - arrays.keys()
        if missing:
            raise OnnxBackendError(f"the ONNX graph needs inputs the tokenizer does not give: {sorted(missing)}")
        if self._pairs_need_types and "token_type_ids" in arrays and arrays["token_type_ids"].any():
            # A pair's second text is marked by token type 1 alone: a graph without the input would read it as one
            # text and answer wrongly. Raised, bisection answers each pair 500 and the single texts as usual.
            raise OnnxBackendError("a pair of texts needs token_type_ids, which this ONNX graph does not take")
        # Feed only what the graph declares: DistilBERT, and RoBERTa with one token type, take no token_type_ids.
        feed = {name: array for name, array in arrays.items() if name in self._inputs}
        (probabilities,) = self.session.run([self._output], feed)
        if probabilities.ndim != 2 or probabilities.shape[0] != len(encodings):
            raise OnnxBackendError(f"ONNX output shape {probabilities.shape} for {len(encodings)} texts")
        return probabilities.astype(np.float32, copy=False)


def session_options(options: HandlerOptions):
    """ONNX Runtime session settings from the handler options (values measured in docs/benchmarks.md)."""
    import onnxruntime as ort

    settings = ort.SessionOptions()
    settings.intra_op_num_threads = options.cpu_threads or len(os.sched_getaffinity(0))
    if options.onnx_inter_op_threads > 1:
        # Independent branches of the graph run at the same time; BERT's graph is a chain, so this rarely helps.
        settings.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        settings.inter_op_num_threads = options.onnx_inter_op_threads
    else:
        settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        settings.inter_op_num_threads = 1
    spin = "1" if options.onnx_spinning else "0"
    settings.add_session_config_entry("session.intra_op.allow_spinning", spin)
    settings.add_session_config_entry("session.inter_op.allow_spinning", spin)
    # Shapes change with every micro-batch, so a memory pattern planned for one shape is never reused.
    settings.enable_mem_pattern = False
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    settings.log_severity_level = 3  # errors only: the worker log is for our own lines
    return settings


def providers_for(gpu_id: int | None, available: Sequence[str]) -> tuple[str, list]:
    """(device type, execution providers) for this worker; a GPU worker without the CUDA provider is refused."""
    if gpu_id is None:
        return "cpu", [CPU_PROVIDER]
    if CUDA_PROVIDER not in available:
        raise OnnxBackendError(
            f"this archive holds an ONNX model and TorchServe assigned this worker GPU {gpu_id}, but the installed "
            f"onnxruntime has no {CUDA_PROVIDER} (it has {', '.join(available)}); refusing to run on the CPU in "
            "its place. Install onnxruntime-gpu, serve this archive on a CPU-only TorchServe, or archive the "
            "checkpoint with --backend pytorch for GPUs."
        )
    return "cuda", [(CUDA_PROVIDER, {"device_id": int(gpu_id)}), CPU_PROVIDER]


def export_record(session) -> dict:
    """The export's own record from the graph's metadata ({} for a graph exported elsewhere)."""
    raw = session.get_modelmeta().custom_metadata_map.get(EXPORT_METADATA_KEY)
    if not raw:
        return {}
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def describe(session, device_type: str, settings, options: HandlerOptions, record: dict) -> str:
    import onnxruntime as ort

    provider = session.get_providers()[0]
    threads = (
        f"{settings.intra_op_num_threads} intra-op threads, {settings.inter_op_num_threads} inter-op, "
        f"spinning {'on' if options.onnx_spinning else 'off'}"
    )
    line = f"ONNX Runtime {ort.__version__} {provider} on {device_type} ({threads})"
    if record:
        line += f"; export: {record.get('summary', record)}"
    return line


def graph_score_function(record: dict) -> str | None:
    """The score function baked into a graph this project exported (tooling/onnx_export.py); None for one exported
    elsewhere. Exports made before the record named it all baked a softmax."""
    if not record:
        return None
    return str(record.get("scores", SOFTMAX))


def load_onnx_forward(
    model_dir: Path, options: HandlerOptions, gpu_id: int | None, pad_token_id: int, token_limit: int,
    scores: str = SOFTMAX, token_types: bool = False,
) -> OnnxForward:  # fmt: skip
    """The session for `<model_dir>/model.onnx`, created once; raises OnnxBackendError where it cannot run.
    `scores`: the function the checkpoint's config asks for (handlers/scores.py), which the graph must have baked.
    `token_types`: the model embeds token types, so pairs need the graph to take token_type_ids."""
    import onnxruntime as ort

    device_type, providers = providers_for(gpu_id, ort.get_available_providers())
    settings = session_options(options)
    session = ort.InferenceSession(str(Path(model_dir) / ONNX_FILE), settings, providers=providers)
    if device_type == "cuda" and session.get_providers()[0] != CUDA_PROVIDER:
        raise OnnxBackendError(f"ONNX Runtime did not start {CUDA_PROVIDER} on GPU {gpu_id}: {session.get_providers()}")
    record = export_record(session)
    baked = graph_score_function(record)
    if baked is not None and baked != scores:
        raise OnnxBackendError(
            f"the ONNX graph returns {baked} scores but the checkpoint's config asks for {scores} "
            "(handlers/scores.py: problem_type and num_labels decide); export it again with this version "
            "(scripts/archive_model.py --backend onnx) or archive it with --backend pytorch"
        )
    description = describe(session, device_type, settings, options, record)
    return OnnxForward(session, device_type, options, pad_token_id, token_limit, description, token_types)
