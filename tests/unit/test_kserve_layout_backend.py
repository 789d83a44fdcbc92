"""scripts.kserve_layout --gpus N refuses an archive holding an ONNX model, which every GPU worker refuses to serve
(handlers/onnx_forward.providers_for: the image's onnxruntime has no CUDA provider), so its pods would never be
ready; archives packed by the project's own packer (tooling/archiving.pack_archive). A CPU layout gets, unless told,
as many workers as the pod's CPUs hold at the archive's cpu_threads (docs/batching.md), the pod's CPUs being the
manifests' CPU limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from handlers.onnx_forward import ONNX_FILE
from scripts import kserve_layout
from tests.deploy.manifests import archive_with_handler_options
from tooling.archiving import pack_archive
from tooling.latency_budget import DEFAULT_BUDGET_MS, admission, machine_throughput
from tooling.paths import REPO
from tooling.torchserve import read_properties


@pytest.fixture(scope="module")
def archives(tiny_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """The tiny checkpoint packed as a PyTorch archive, and beside it as an ONNX one: its tokenizer and config with a
    model.onnx in place of the weights, as tooling/onnx_export.py lays out an export (the layout reads the listing
    only, never the graph)."""
    root = tmp_path_factory.mktemp("kserve-archives")
    onnx_dir = root / "onnx-checkpoint"
    onnx_dir.mkdir()
    for item in tiny_checkpoint.iterdir():
        if item.name not in ("model.safetensors", "pytorch_model.bin"):
            shutil.copy2(item, onnx_dir / item.name)
    (onnx_dir / ONNX_FILE).write_bytes(b"an ONNX graph")
    store = root / "store"
    return {
        "pytorch": pack_archive(tiny_checkpoint, "tiny-pytorch", store),
        "onnx": pack_archive(onnx_dir, "tiny-onnx", store),
    }


def test_a_gpu_layout_of_an_onnx_archive_is_refused_with_the_archive_that_serves_instead(archives, tmp_path, capsys):
    out = tmp_path / "layout"
    assert kserve_layout.main([str(archives["onnx"]), "--out", str(out), "--gpus", "1"]) == 2
    refusal = capsys.readouterr().err
    assert f"holds an ONNX model ({ONNX_FILE})" in refusal and "no CUDAExecutionProvider" in refusal
    assert "python -m scripts.archive_model CHECKPOINT --name NAME --backend pytorch" in refusal
    assert not out.exists()  # nothing half-written for an upload


def test_a_gpu_layout_of_a_pytorch_archive_and_a_cpu_layout_of_an_onnx_one_are_written(archives, tmp_path):
    assert kserve_layout.main([str(archives["pytorch"]), "--out", str(tmp_path / "gpu"), "--gpus", "1"]) == 0
    assert kserve_layout.main([str(archives["onnx"]), "--out", str(tmp_path / "cpu")]) == 0
    assert (tmp_path / "gpu" / "model-store" / "bert.mar").is_file()
    assert (tmp_path / "cpu" / "model-store" / "bert.mar").is_file()


# ---- workers of a CPU layout ------------------------------------------------------------------------------


def layout_workers(tmp_path: Path, handler: dict | None, *args: str) -> int:
    tmp_path.mkdir(parents=True, exist_ok=True)
    archive = archive_with_handler_options(tmp_path / "bert.mar", handler)
    assert kserve_layout.main([str(archive), "--out", str(tmp_path / "layout"), *args]) == 0
    snapshot = json.loads(read_properties(tmp_path / "layout" / "config" / "config.properties")["model_snapshot"])
    [entry] = snapshot["models"]["bert"].values()
    assert entry["minWorkers"] == entry["maxWorkers"]
    return entry["minWorkers"]


@pytest.mark.parametrize(
    ("handler", "workers"),
    [
        ({"cpu_threads": 1}, kserve_layout.POD_CPUS),  # the set-up's archive: one one-thread worker per CPU
        ({"cpu_threads": 2}, kserve_layout.POD_CPUS // 2),
        ({"cpu_threads": 0}, 1),  # one worker, its threads following the pod's CPU limit
        ({}, 1),
        (None, 1),  # no model-config.yaml: the handler's defaults, cpu_threads 0
    ],
)
def test_a_cpu_layout_runs_as_many_workers_as_the_pods_cpus_hold_at_the_archives_threads(tmp_path, handler, workers):
    assert layout_workers(tmp_path, handler) == workers


def test_workers_and_pod_cpus_given_on_the_command_line_are_taken(tmp_path):
    assert layout_workers(tmp_path / "a", {"cpu_threads": 1}, "--workers", "3") == 3
    assert layout_workers(tmp_path / "b", {"cpu_threads": 1}, "--pod-cpus", "4") == 4
    assert layout_workers(tmp_path / "c", {"cpu_threads": 1}, "--gpus", "1") == kserve_layout.GPU_WORKERS_PER_GPU


@pytest.mark.parametrize(
    ("handler", "args", "cores"),
    [
        ({"cpu_threads": 1}, (), 2),  # two one-thread workers: both cores
        ({"cpu_threads": 0}, (), 2),  # one worker, as many threads as the pod's CPUs: both cores too
        ({"cpu_threads": 1}, ("--workers", "1"), 1),  # one one-thread worker leaves a core idle
        ({"cpu_threads": 2}, ("--pod-cpus", "4"), 4),
    ],
)
def test_the_queue_is_sized_for_the_cores_the_workers_keep_busy(tmp_path, handler, args, cores):
    """The queue holds what the pod serves within the budget: the measured figure per core times the cores its
    workers use, not per worker (a cpu_threads 0 worker uses every core of the pod)."""
    workers = layout_workers(tmp_path, handler, *args)
    queue = int(read_properties(tmp_path / "layout" / "config" / "config.properties")["job_queue_size"])
    assert queue == admission(DEFAULT_BUDGET_MS, machine_throughput("cpu", cores), workers, 8).job_queue_size


@pytest.mark.parametrize("handler", [["cpu_threads", 1], {"cpu_threads": "two"}, {"no_such_option": 1}])
def test_an_archive_whose_handler_options_the_handler_would_refuse_is_refused_in_one_line(tmp_path, capsys, handler):
    archive = archive_with_handler_options(tmp_path / "bert.mar", handler)
    assert kserve_layout.main([str(archive), "--out", str(tmp_path / "layout")]) == 2
    assert capsys.readouterr().err.startswith("kserve_layout: ")


def test_the_pod_cpus_are_the_cpu_limit_of_every_cpu_pod_and_the_set_up_archives_one_thread_per_worker():
    deployment = yaml.safe_load((REPO / "deploy/kubernetes/base/deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    runtime = yaml.safe_load((REPO / "deploy/kserve/serverless/servingruntime.yaml").read_text())
    [runtime_container] = runtime["spec"]["containers"]
    for resources in (container["resources"], runtime_container["resources"]):
        assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == str(kserve_layout.POD_CPUS), resources
    # So model_store/bert.mar, the archive the image bakes, gets one worker per CPU.
    assert "--backend onnx --handler-option cpu_threads=1" in (REPO / "scripts" / "setup.sh").read_text()


@pytest.mark.parametrize(
    ("threads", "workers", "fix"),
    [(4, [], "archive it with cpu_threads 2 or less"), (0, ["--workers", "2"], "leave --workers unset for 1")],
    ids=["archive-threads", "given-workers"],
)
def test_a_pod_of_more_threads_than_cpus_is_laid_out_with_a_warning_naming_the_fix(
    tmp_path, capsys, threads, workers, fix
):
    archive = archive_with_handler_options(tmp_path / "bert.mar", {"cpu_threads": threads})
    assert kserve_layout.main([str(archive), "--out", str(tmp_path / "layout"), "--pod-cpus", "2", *workers]) == 0
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("kserve_layout: warning: each pod's 2 CPUs: "), warning
    assert "more threads than CPUs, which cost a PyTorch archive 6-9x its requests/s" in warning, warning
    assert warning.endswith(f"; {fix} (docs/batching.md)"), warning
