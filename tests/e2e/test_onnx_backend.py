"""ONNX Runtime archives against a real TorchServe: PyTorch's answers for all three model families, the
shared pipeline (validation, bisection) on the ONNX path, and the export's refusals (parity, int8 agreement).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from handlers.onnx_forward import ONNX_FILE
from tests.answers import assert_same_answer, distinguishable_texts
from tests.rejection_cases import REJECTED_BODIES
from tests.support import logged_warnings, logs_caught_up
from tooling.archiving import build_archive, write_model_config
from tooling.inprocess import load_handler, unpacked_layout
from tooling.paths import REPO

pytestmark = pytest.mark.e2e

# The bar: an ONNX archive answers as the PyTorch checkpoint does, every probability within 1e-4.
TOLERANCE = 1e-4
POISON = "POISON"
FAMILIES = ("bert", "distilbert", "roberta")


def worker_lines(server, model: str) -> list[str]:
    """The server's log lines written by this model's worker (TorchServe names workers W-<port>-<model>_<version>)."""
    return [line for line in server.log_text().splitlines() if f"-{model}_" in line]


def load_line(server, model: str) -> str:
    """The handler's log line at load (handlers/bert_handler.py); TorchServe copies it into several logs."""
    lines = [line for line in worker_lines(server, model) if "loaded " in line and "max_batch_tokens=" in line]
    assert lines, f"no load line for {model}"
    return lines[0]


# One rejected body of each kind, from the table every layer's tests share.
ONE_OF_EACH_REJECTION = list({case[3]: case for case in REJECTED_BODIES}.values())


@dataclass(frozen=True)
class OnnxModel:
    name: str  # registered on the session's TorchServe
    exported: Path  # the ONNX checkpoint folder packed into the archive
    handler: object  # the PyTorch handler in-process, for the expected answers
    model_dir: Path  # its unpacked layout


@pytest.fixture(scope="module", params=FAMILIES)
def onnx_model(request, torchserve, model_store, tiny_checkpoint, tmp_path_factory) -> OnnxModel:
    """The family's tiny checkpoint exported (as build_archive's onnx backend does), packed and registered."""
    from tooling.archiving import pack_archive
    from tooling.checkpoints import build_random_family_classifier
    from tooling.onnx_export import export_checkpoint

    family = request.param
    if family == "bert":
        checkpoint = tiny_checkpoint
    else:
        checkpoint = build_random_family_classifier(tmp_path_factory.mktemp(family) / "checkpoint", family)
    name = f"onnx-{family}"
    exported = tmp_path_factory.mktemp(name) / "model"
    export_checkpoint(checkpoint, exported)
    config = write_model_config(tmp_path_factory.mktemp("config") / "model-config.yaml", fault_marker=POISON)
    pack_archive(exported, name, model_store, config)
    # A generous delay makes batches of several requests form under the concurrent test.
    response = torchserve.register(f"{name}.mar", batch_size=8, max_batch_delay=100)
    assert response.status_code == 200, response.text
    model_dir = unpacked_layout(checkpoint, tmp_path_factory.mktemp(f"pytorch-{family}"))
    yield OnnxModel(name, exported, load_handler(model_dir), model_dir)
    torchserve.unregister(name)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_an_export_prints_its_progress_and_no_warning(quantize, tiny_checkpoint, tmp_path, recwarn):
    """What scripts/archive_model.py (and README command 1's set-up) shows of an export: its steps, no warning. The
    exporter's and the quantizer's notices about nothing in the model are hidden one by one (tooling/onnx_export.py);
    a new one fails here. torch's loggers print through torch's own handler, which pytest's capture does not see, and
    onnxruntime's quantizer logs on the root logger: a handler of the test's on both receives what would be printed."""
    import gc

    from tooling.onnx_export import export_checkpoint

    # What earlier tests of this process left to the garbage collector (a pipe of a failed test's subprocess, kept by
    # its traceback) warns when it is collected, whenever that is: collected now, it is not counted as the export's.
    gc.collect()
    recwarn.clear()
    steps: list[str] = []
    gate = {"min_agreement": 0.0} if quantize else {}  # what is printed, not how well the tiny model quantizes
    with logged_warnings("torch.onnx", "") as logged:
        export_checkpoint(tiny_checkpoint, tmp_path / "model", quantize=quantize, progress=steps.append, **gate)
    assert any(step.startswith("parity:") for step in steps), steps
    assert [f"{w.category.__name__}: {w.message}" for w in recwarn] == []
    assert [f"{r.name}: {r.getMessage()[:120]}" for r in logged] == []


def test_the_archive_holds_the_graph_and_no_pytorch_weights(onnx_model, model_store, torchserve):
    name = onnx_model.name
    files = {Path(n).name for n in zipfile.ZipFile(model_store / f"{name}.mar").namelist()}
    assert ONNX_FILE in files and "config.json" in files and "tokenizer.json" in files
    assert not files & {"model.safetensors", "pytorch_model.bin"}
    # The worker says which backend it loaded and what the export measured.
    loaded = load_line(torchserve, name)
    assert "ONNX Runtime" in loaded and "CPUExecutionProvider" in loaded and "parity max |dp|" in loaded
    # ... under the name it is registered with, and how its head's outputs are read (docs/checkpoints.md).
    assert f"loaded {name} (" in loaded and "scores=softmax " in loaded
    # ONNX Runtime's own planning budget on CPU (HandlerOptions.for_device with the backend), not PyTorch's 256.
    assert "max_batch_tokens=64" in loaded


def test_concurrent_mixed_traffic_gets_pytorchs_answers_and_isolates_a_failing_item(onnx_model, torchserve):
    name, handler, model_dir = onnx_model.name, onnx_model.handler, onnx_model.model_dir
    # Texts whose PyTorch answers are pairwise further apart than twice the tolerance: a swap cannot pass.
    candidates = (f"review {i}: " + " ".join(f"w{(i * 11 + k) % 89}" for k in range(2 + i % 17)) for i in range(400))
    texts, expected = distinguishable_texts(handler, model_dir, candidates, 24, 2.5 * TOLERANCE)
    poisoned = [f"{POISON} in review {i}" for i in range(2)]
    requests_ = [(t.encode(), "text/plain", answer) for t, answer in zip(texts, expected)]
    for i, (body, content_type, status, kind) in enumerate(ONE_OF_EACH_REJECTION):
        requests_.insert(3 * i + 1, (body, content_type, (status, kind)))
    requests_.insert(5, (poisoned[0].encode(), "text/plain", (500, "InferenceFailed")))
    requests_.insert(20, (json.dumps({"text": poisoned[1]}).encode(), "application/json", (500, "InferenceFailed")))

    with ThreadPoolExecutor(max_workers=24) as pool:
        responses = list(pool.map(lambda r: torchserve.predict(name, r[0], r[1]), requests_))

    for (_, _, want), response in zip(requests_, responses):
        if isinstance(want, tuple):
            assert (response.status_code, response.json()["type"]) == want, response.text
        else:
            assert response.status_code == 200, response.text
            assert_same_answer(response.json(), want, tolerance=TOLERANCE)
    # Each poisoned item shared a failing pass with neighbours, which the bisection then answered. The worker's lines
    # reach the log files apart from, and after, the answers.
    logs_caught_up(torchserve, name)
    log = "\n".join(worker_lines(torchserve, name))
    groups = [int(n) for n in re.findall(r"forward pass failed for a group of (\d+) items", log)]
    assert groups and max(groups) > 1, "the poisoned items must have been batched with others"


def test_a_gpu_worker_refuses_an_onnx_archive_without_the_cuda_provider(onnx_model):
    import onnxruntime

    from handlers.onnx_forward import CUDA_PROVIDER, OnnxBackendError, load_onnx_forward
    from handlers.options import HandlerOptions

    if CUDA_PROVIDER in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: a GPU worker would use it")
    with pytest.raises(OnnxBackendError, match=r"assigned this worker GPU 0.*refusing to run on the CPU"):
        load_onnx_forward(onnx_model.exported, HandlerOptions().for_device("cuda"), 0, 0, 512)


def test_torchserves_worker_reports_that_refusal_as_itself_never_as_out_of_memory(
    onnx_model, model_store, tmp_path, monkeypatch
):
    """TorchServe's own worker loading the archive with a GPU assigned, as on a GPU host (its load path runs
    in-process here; the handler sees gpu 0 and no CUDA provider, as on the H100 host without onnxruntime-gpu).

    TorchServe 0.12 files a load-time RuntimeError that mentions CUDA as "cuda OOM" / "System out of memory";
    the handler's ModelLoadFailed is of another type, so the worker dies logging the cause itself."""
    import logging

    import onnxruntime
    from ts.model_service_worker import TorchModelServiceWorker

    from handlers.loading import ModelLoadFailed
    from handlers.onnx_forward import CUDA_PROVIDER
    from tooling.paths import METRICS_CONFIG

    if CUDA_PROVIDER in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: a GPU worker would use it")
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(model_store / f"{onnx_model.name}.mar").extractall(unpacked)
    manifest = json.loads((unpacked / "MAR-INF" / "MANIFEST.json").read_text())
    monkeypatch.syspath_prepend(str(unpacked))  # the frontend starts each worker with the model's folder on its path
    worker = TorchModelServiceWorker("tcp", None, "127.0.0.1", "0", str(METRICS_CONFIG), False)
    request = {"modelPath": str(unpacked).encode(), "modelName": onnx_model.name.encode(), "gpu": 0,
               "handler": manifest["model"]["handler"].encode(), "batchSize": 8}  # fmt: skip
    try:
        with pytest.raises(ModelLoadFailed) as refused:
            logging.disable(logging.CRITICAL)  # TorchServe's loader logs at module level; only the outcome counts
            worker.load_model(request)
    finally:
        logging.disable(logging.NOTSET)
        worker.sock.close()
    assert not isinstance(refused.value, (RuntimeError, MemoryError))  # what TorchServe's worker would catch
    message = str(refused.value)
    assert message.startswith(f"cannot load {onnx_model.name} on GPU 0: OnnxBackendError: ")
    assert "onnxruntime-gpu" in message and "--backend pytorch" in message  # the fix, in the same line


# ---- the export's refusals ----------------------------------------------------------------------


def test_an_export_that_disagrees_with_pytorch_is_refused_and_nothing_is_written(
    tiny_checkpoint, tmp_path_factory, monkeypatch
):
    """The graph of a differently seeded model stands in for an exporter bug; the parity check must catch it."""
    from tooling import onnx_export
    from tooling.checkpoints import build_random_classifier

    other = build_random_classifier(tmp_path_factory.mktemp("other") / "checkpoint", "tiny", seed=1)
    export_graph = onnx_export._export_graph
    monkeypatch.setattr(onnx_export, "_export_graph", lambda _checkpoint, ref, path: export_graph(other, ref, path))
    store = tmp_path_factory.mktemp("refused-store")
    with pytest.raises(onnx_export.ParityError, match=r"differs from PyTorch by .* \(> 1e-04\).*--backend pytorch"):
        build_archive(tiny_checkpoint, "mismatch", store, backend="onnx")
    assert not list(store.iterdir())


def damaged_by_int8(out: Path, source: Path) -> Path:
    """A tiny BERT that int8 genuinely harms: one large weight per output channel of every encoder layer makes
    per-channel int8 scales coarse, and the decision boundary sits at the median of the fixed texts' margins."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tooling.onnx_export import fixed_texts

    model = AutoModelForSequenceClassification.from_pretrained(source).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    with torch.no_grad():
        for module in model.bert.encoder.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight[:, 0] = 40 * module.weight.abs().max()
        batch = tokenizer(fixed_texts(), padding=True, truncation=True, max_length=256, return_tensors="pt")
        logits = model(**batch).logits
        model.classifier.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_int8_below_the_agreement_bar_is_refused_by_the_archive_command(tiny_checkpoint, tmp_path):
    checkpoint = damaged_by_int8(tmp_path / "damaged", tiny_checkpoint)
    store = tmp_path / "store"
    command = [sys.executable, "-m", "scripts.archive_model", str(checkpoint), "--name", "damaged",
               "--export-path", str(store), "--backend", "onnx", "--quantize", "int8"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    # Standard error holds the refusal and nothing else: no traceback, and no progress bar of transformers' loads
    # (a line of carriage returns in a log; scripts/__init__.py turns them off for every command).
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, [line[-120:] for line in lines]
    message = lines[0]
    assert re.search(
        r"archive_model: the int8 model .*% of labels agree with PyTorch, below the required 99\.0%", message
    )
    assert not (store / "damaged.mar").exists()


# ---- the demo model in int8 ---------------------------------------------------------------------


# How many of the held-out reviews int8 may label differently from float32. One review is 1.2 points of
# the 84, so a bound in points is finer than the set. The demo model is retrained at set-up and its
# weights differ between CPUs, and dynamic int8 quantizes activations per batch, so a review near the
# boundary can change label with the CPU and with the batch it is served in. `scripts.demo_spread` (five
# training seeds, a harsher spread than between CPUs, and six batchings each; docs/checkpoints.md) saw at
# most 3 of 84 change, in either direction, and the default 99 % gate (no change allowed at 84) refused
# three of the five int8 exports. Twice the worst seen; an int8 that really loses fails by far
# (sign-flipped scales: 41 of 84 changed).
INT8_LABELS_ALLOWED_TO_CHANGE = 6


def test_the_demo_models_int8_archive_keeps_its_held_out_accuracy(demo_checkpoint, torchserve, model_store):
    """Served over HTTP, int8 labels at most INT8_LABELS_ALLOWED_TO_CHANGE held-out reviews differently from
    float32, so it loses at most that many (a gain is no failure); the archive's own agreement gate (at
    export, in batches of 8) is set to the same count."""
    from tooling.corpus import LABELS, held_out_examples
    from tooling.onnx_export import probabilities

    examples = held_out_examples()
    gate = 1 - INT8_LABELS_ALLOWED_TO_CHANGE / len(examples)
    build_archive(demo_checkpoint, "demo-int8", model_store, backend="onnx", quantize="int8", min_agreement=gate)
    assert torchserve.register("demo-int8.mar", batch_size=8, max_batch_delay=20).status_code == 200
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            responses = list(pool.map(lambda e: torchserve.predict("demo-int8", e[0].encode(), "text/plain"), examples))
        assert all(r.status_code == 200 for r in responses)
        int8 = [LABELS.index(r.json()["label"]) for r in responses]
        loaded = load_line(torchserve, "demo-int8")
        assert "bert int8" in loaded and "label agreement" in loaded
    finally:
        torchserve.unregister("demo-int8")

    # fp32: the demo checkpoint through the PyTorch forward pass the handler uses.
    from transformers import AutoTokenizer

    from handlers.options import HandlerOptions
    from handlers.tokenization import text_encoder
    from handlers.torch_forward import load_torch_forward

    tokenizer = AutoTokenizer.from_pretrained(demo_checkpoint)
    forward = load_torch_forward(demo_checkpoint, HandlerOptions().for_device("cpu"), None, 0, 512)
    fp32 = probabilities(forward, text_encoder(tokenizer, 256), [t for t, _ in examples]).argmax(-1).tolist()
    truth = [y for _, y in examples]
    fp32_correct, int8_correct = (sum(p == y for p, y in zip(labels, truth)) for labels in (fp32, int8))
    changed = sum(a != b for a, b in zip(fp32, int8))
    assert fp32_correct >= 0.9 * len(examples)  # the set-up's own floor (TrainingSettings.min_accuracy)
    assert changed <= INT8_LABELS_ALLOWED_TO_CHANGE, (changed, fp32_correct, int8_correct)
    assert int8_correct >= fp32_correct - INT8_LABELS_ALLOWED_TO_CHANGE, (int8_correct, fp32_correct)
