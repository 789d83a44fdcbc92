"""The ONNX path's pure decisions: parity and agreement bars, evaluation sets, providers, session settings.

Exporting and serving real graphs is tested end to end in tests/e2e/test_onnx_backend.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from handlers.instances import TextPair
from handlers.onnx_forward import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    OnnxBackendError,
    graph_score_function,
    providers_for,
    session_options,
)
from handlers.options import CUDA_BATCH_TOKENS, HandlerOptions
from tooling.corpus import LABELS, held_out_examples
from tooling.onnx_export import (
    DEMO_STAMP,
    PARITY_TOLERANCE,
    AgreementTooLow,
    ExportFailed,
    ExportRecord,
    ParityError,
    check_agreement,
    check_parity,
    default_eval_set,
    fixed_texts,
    parity_inputs,
    read_eval_tsv,
)


def test_parity_holds_within_the_tolerance_and_reports_the_largest_difference():
    reference = np.array([[0.2, 0.8], [0.6, 0.4]], dtype=np.float32)
    candidate = reference + np.array([[0.0, 0.9e-4], [-0.3e-4, 0.0]], dtype=np.float32)
    assert check_parity(reference, candidate) == pytest.approx(0.9e-4, rel=1e-3)


@pytest.mark.parametrize("moved", [1.5e-4, 0.3, float("nan")])
def test_parity_refuses_a_probability_that_moved_more_than_the_tolerance(moved):
    reference = np.full((5, 2), 0.5, dtype=np.float32)
    candidate = reference.copy()
    candidate[3, 1] += moved
    with pytest.raises(ParityError, match=r"differs from PyTorch .*check text #3.*--backend pytorch"):
        check_parity(reference, candidate)
    assert PARITY_TOLERANCE == 1e-4


def test_agreement_below_the_bar_is_refused_with_the_way_out():
    check_agreement(0.99, 0.99, "int8")
    with pytest.raises(AgreementTooLow, match=r"98\.8% of labels agree .* below the required 99\.0%.*--min-agreement"):
        check_agreement(83 / 84, 0.99, "the int8 model")


def test_an_eval_tsv_takes_label_names_or_indices(tmp_path):
    path = tmp_path / "eval.tsv"
    path.write_text("positive\tgreat stay\n\n0\tawful\tfood\nnegative\tmeh\n", encoding="utf-8")
    eval_set = read_eval_tsv(path, ["negative", "positive"])
    assert eval_set.texts == ["great stay", "awful\tfood", "meh"]
    assert eval_set.labels == [1, 0, 0]


@pytest.mark.parametrize(("content", "error"), [("neutral\tso so\n", r"eval\.tsv:1: label 'neutral'"),
                                                ("positive\n", r"eval\.tsv:1: expected label<TAB>text"),
                                                # an index past the last label: no class of this model
                                                ("2\tout of range\n", r"eval\.tsv:1: label '2'"),
                                                ("\n", "no labelled rows")])  # fmt: skip
def test_a_malformed_eval_tsv_is_refused_with_its_line(tmp_path, content, error):
    path = tmp_path / "eval.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ExportFailed, match=error):
        read_eval_tsv(path, ["negative", "positive"])


def test_the_eval_set_is_the_tsv_then_the_demo_models_held_out_split_then_the_fixed_texts(tmp_path):
    demo, other = tmp_path / "demo", tmp_path / "other"
    demo.mkdir()
    other.mkdir()
    (demo / DEMO_STAMP).write_text("{}")
    held_out = default_eval_set(demo, None, list(LABELS))
    assert (held_out.texts, held_out.labels) == tuple(map(list, zip(*held_out_examples())))
    # A checkpoint with other labels is not the demo model, whatever files it has.
    assert default_eval_set(demo, None, ["spam", "ham"]).labels is None
    fixed = default_eval_set(other, None, list(LABELS))
    assert fixed.texts == fixed_texts() and fixed.labels is None
    tsv = tmp_path / "mine.tsv"
    tsv.write_text("negative\tbad\n")
    assert default_eval_set(demo, tsv, list(LABELS)).texts == ["bad"]


def test_the_fixed_texts_cover_padding_truncation_and_breadth():
    texts = fixed_texts()
    assert len(texts) >= 100 and len(set(texts)) == len(texts)
    assert max(len(t.split()) for t in texts) > 300  # over any token cap: the truncation path
    assert min(len(t.split()) for t in texts) == 1
    assert any(not t.isascii() for t in texts)
    # Parity is also checked on pairs, the only inputs whose second text has token type 1 in the graph.
    pairs = [item for item in parity_inputs() if isinstance(item, TextPair)]
    assert parity_inputs()[: len(texts)] == texts and len(pairs) == len(parity_inputs()) - len(texts) >= 3
    assert any(len(pair.text.split()) > 256 for pair in pairs)  # a pair cut longest first


def test_the_record_in_the_graphs_metadata_round_trips_and_summarises():
    record = ExportRecord("bert", "torch.onnx dynamo", 18, "int8", "softmax", 114, 2.4e-7, "held-out", 84, 1.0, 0.31,
                          0.9643, 0.9643, 0.99)  # fmt: skip
    stored = json.loads(record.metadata())
    assert stored["agreement"] == 1.0 and stored["quantization"] == "int8" and stored["summary"] == record.summary
    assert graph_score_function(stored) == "softmax"  # what the handler checks against the config at load
    assert "label agreement 100.0%" in record.summary and "accuracy 0.9643 (PyTorch 0.9643)" in record.summary


def test_a_cpu_worker_uses_the_cpu_provider():
    assert providers_for(None, [CPU_PROVIDER]) == ("cpu", [CPU_PROVIDER])


def test_a_gpu_worker_uses_the_cuda_provider_on_its_own_device_or_refuses():
    assert providers_for(1, [CUDA_PROVIDER, CPU_PROVIDER]) == (
        "cuda",
        [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER],
    )
    with pytest.raises(OnnxBackendError, match=r"GPU 0.*no CUDAExecutionProvider.*onnxruntime-gpu.*--backend pytorch"):
        providers_for(0, [CPU_PROVIDER])


def test_session_settings_follow_the_handler_options():
    default = session_options(HandlerOptions(cpu_threads=3))
    assert default.intra_op_num_threads == 3 and default.inter_op_num_threads == 1
    assert default.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    import onnxruntime as ort

    assert default.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    tuned = session_options(HandlerOptions(cpu_threads=2, onnx_inter_op_threads=2, onnx_spinning=True))
    assert tuned.execution_mode == ort.ExecutionMode.ORT_PARALLEL and tuned.inter_op_num_threads == 2
    assert tuned.get_session_config_entry("session.intra_op.allow_spinning") == "1"


@pytest.mark.parametrize("raw", [{"onnx_inter_op_threads": 0}, {"onnx_spinning": "yes"}, {"onnx_threads": 2}])
def test_wrong_onnx_options_fail_the_load(raw):
    with pytest.raises(ValueError):
        HandlerOptions.from_mapping(raw)


def test_the_token_budget_defaults_per_backend_and_device():
    options = HandlerOptions()
    assert options.for_device("cpu").max_batch_tokens == 256  # PyTorch on CPU
    assert options.for_device("cpu", "onnxruntime").max_batch_tokens == 64  # measured best for ONNX Runtime
    assert options.for_device("cuda", "onnxruntime").max_batch_tokens == CUDA_BATCH_TOKENS
    assert HandlerOptions(max_batch_tokens=300).for_device("cpu", "onnxruntime").max_batch_tokens == 300
    # Under CUDA graphs (PyTorch on a GPU), auto stays 0: planned by the graphs' measured costs (LoadedModel.planner).
    graphs = HandlerOptions(cuda_graphs=True)
    assert graphs.for_device("cuda").max_batch_tokens == 0
    assert graphs.for_device("cuda", "onnxruntime").max_batch_tokens == CUDA_BATCH_TOKENS  # no graphs for ONNX
    assert graphs.for_device("cpu").max_batch_tokens == 256  # nor on a CPU
    assert HandlerOptions(cuda_graphs=True, max_batch_tokens=8192).for_device("cuda").max_batch_tokens == 8192


class Node:
    def __init__(self, name: str) -> None:
        self.name = name


class StandInSession:
    """ONNX Runtime's session, as far as OnnxForward asks it: a graph taking `inputs` (by default without
    token_type_ids) whose one output has the shape `shape(rows)` for a pass of `rows` texts (by default one row of
    two scores per text)."""

    def __init__(
        self,
        shape: Callable[[int], tuple[int, ...]] = lambda rows: (rows, 2),
        inputs: tuple[str, ...] = ("input_ids", "attention_mask"),
    ) -> None:
        self.shape = shape
        self.inputs = inputs

    def get_inputs(self):
        return [Node(name) for name in self.inputs]

    def get_outputs(self):
        return [Node("probabilities")]

    def run(self, outputs, feed):
        return [np.full(self.shape(len(feed["input_ids"])), 0.5, dtype=np.float32)]


def test_an_onnx_graph_without_token_types_refuses_a_pass_that_holds_a_pair():
    # A graph exported elsewhere may take no token_type_ids: single texts lose nothing, a pair would be read as one
    # text. The pass raises, and bisection (handlers/fault_isolation.py) answers each pair alone with 500.
    from handlers.onnx_forward import OnnxForward
    from handlers.tokenization import Encoding

    options = HandlerOptions().for_device("cpu", "onnxruntime")
    forward = OnnxForward(StandInSession(), "cpu", options, 0, 512, "a graph", token_types=True)
    single = Encoding({"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0]}, False)
    pair = Encoding({"input_ids": [101, 7, 102, 8, 102], "token_type_ids": [0, 0, 0, 1, 1]}, False)
    assert forward([single, single]).shape == (2, 2)
    with pytest.raises(OnnxBackendError, match="needs token_type_ids"):
        forward([single, pair])
    # A model without token types (DistilBERT, RoBERTa) reads a pair by its separator: nothing is lost.
    assert OnnxForward(StandInSession(), "cpu", options, 0, 512, "a graph")([single, pair]).shape == (2, 2)


def test_an_onnx_graph_whose_output_is_not_one_row_per_text_is_refused():
    # A graph exported elsewhere may squeeze its one score column to a vector (one number per text): the scores
    # (handlers/scores.py) need one row per text, so the pass raises rather than answer from a misshapen output.
    from handlers.onnx_forward import OnnxForward
    from handlers.tokenization import Encoding

    options = HandlerOptions().for_device("cpu", "onnxruntime")
    text = Encoding({"input_ids": [101, 7, 102]}, False)

    def two_texts_through(shape):
        return OnnxForward(StandInSession(shape), "cpu", options, 0, 512, "a graph")([text, text])

    assert two_texts_through(lambda n: (n, 1)).shape == (2, 1)
    for shape in (lambda n: (n,), lambda n: (n, 1, 1), lambda n: (n + 1, 1)):
        with pytest.raises(OnnxBackendError, match="ONNX output shape"):
            two_texts_through(shape)


def test_an_onnx_graph_that_takes_inputs_the_tokenizer_does_not_give_is_refused_by_name():
    # A BERT graph (it takes token_type_ids) archived beside a tokenizer that gives none, as DistilBERT's does. The
    # pass raises naming what the tokenizer lacks, before ONNX Runtime's own missing-input error; the load's warm-up
    # pass (handlers/bert_handler.py, `warmup` on by default) fails the same way, so such an archive never registers.
    from handlers.onnx_forward import OnnxForward
    from handlers.tokenization import Encoding

    options = HandlerOptions().for_device("cpu", "onnxruntime")
    graph = StandInSession(inputs=("input_ids", "attention_mask", "token_type_ids"))
    forward = OnnxForward(graph, "cpu", options, 0, 512, "a graph")
    with pytest.raises(OnnxBackendError, match=r"does not give: \['token_type_ids'\]"):
        forward([Encoding({"input_ids": [101, 7, 102]}, False)])
    assert forward([Encoding({"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0]}, False)]).shape == (1, 2)
