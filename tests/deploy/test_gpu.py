"""Deploying on GPUs: every GPU figure in deploy/, tooling/ and the docs is read here from the committed H100
measurement (docs/bench-gpu/benchmark.json, docs/benchmarks.md#gpu), and each GPU variant gives its pods
what that measurement ran: one GPU, 8 workers on it, batch 128, and autoscaling targets from what it served.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    DOCKERFILE,
    KSERVE,
    KSERVE_GPU_MODES,
    fake_archive,
    gpu_cells,
    kubectl,
    one,
    render,
    render_kserve,
)
from tooling import cluster_config, latency_budget
from tooling.paths import REPO
from tooling.torchserve import read_properties

# The autoscaler's request-rate target: 70 % of one pod's saturation throughput (docs/autoscaling.md,
# deploy/kubernetes/components/autoscaling), on GPUs as on CPUs.
HPA_TARGET_SHARE = 0.7
RATE_METRIC = "bert_requests_per_second"


def _layout_cells(workers: int | None = None) -> list[dict]:
    """The measured cells at the GPU layout's batch size (and with `workers` workers per GPU)."""
    return [
        cell
        for cell in gpu_cells()
        if cell["batch_size"] == cluster_config.GPU_BATCH_SIZE and workers in (None, cell["workers"])
    ]


def _best(cells: list[dict]) -> dict:
    return max(cells, key=lambda cell: cell["rps"])


def _text(path) -> str:
    """A file's text as one line: comment markers and line breaks inside a sentence do not matter."""
    return " ".join(line.strip().lstrip("#").strip() for line in (REPO / path).read_text().splitlines())


def _cites(path, *figures: str) -> None:
    text = _text(path)
    for figure in figures:
        assert figure in text, (str(path), figure)


def _layout(tmp_path, gpus: int) -> dict[str, str]:
    """The config.properties `scripts.kserve_layout ... --gpus N` writes, as docs/kubernetes.md says to make it."""
    from scripts import kserve_layout

    archive = fake_archive(tmp_path / "bert.mar")
    assert kserve_layout.main([str(archive), "--out", str(tmp_path / "layout"), "--gpus", str(gpus)]) == 0
    return read_properties(tmp_path / "layout" / "config" / "config.properties")


# ---- the measurement ------------------------------------------------------------------------------


def test_every_measured_gpu_answer_was_right():
    for cell in gpu_cells():
        assert cell["errors"] == 0, cell
        assert cell["answers_checked"] > 0 and cell["answers_wrong"] == 0, cell


def test_the_gpu_layout_runs_the_workers_per_gpu_that_served_most_and_says_by_how_much():
    best = _best(_layout_cells())
    assert best["workers"] == cluster_config.GPU_WORKERS_PER_GPU
    one_worker = _best([c for c in _layout_cells(1) if c["concurrency"] == best["concurrency"]])
    ratio = f"{best['rps'] / one_worker['rps']:.1f}"
    figures = (f"{best['concurrency']:,} clients", f"{best['rps']:,.0f}", f"{one_worker['rps']:,.0f}")
    for path in (
        "deploy/kubernetes/overlays/gpu/kustomization.yaml",
        "deploy/kserve/components/gpu/kustomization.yaml",
        DOCKERFILE,
        "tooling/cluster_config.py",
        "scripts/kserve_layout.py",
    ):
        _cites(path, f"{ratio}x", *figures)
    _cites("docs/configuration.md", f"{ratio}×", *figures)


def test_the_gpu_throughput_the_queue_is_derived_from_is_the_measured_one():
    best = _best(_layout_cells(cluster_config.GPU_WORKERS_PER_GPU))
    assert round(best["rps"]) == latency_budget.GPU_RPS_PER_GPU
    assert latency_budget.machine_throughput("gpu", 2) == 2 * round(best["rps"])
    queue = latency_budget.admission(
        latency_budget.DEFAULT_BUDGET_MS,
        latency_budget.machine_throughput("gpu", 1),
        cluster_config.GPU_WORKERS_PER_GPU,
        cluster_config.GPU_BATCH_SIZE,
    ).job_queue_size
    _cites("docs/reliability.md", f"{best['rps']:,.0f} per H100", f"on one H100 (8 workers, batch 128), {queue:,}.")
    _cites("tooling/latency_budget.py", f"{best['rps']:,.0f} req/s on one H100")
    _cites("scripts/kserve_layout.py", f"measured {best['rps']:,.0f} requests/s")


# ---- autoscaling ----------------------------------------------------------------------------------


def _rate_target(docs) -> int:
    hpa = one(docs, "HorizontalPodAutoscaler")
    [target] = [
        m["pods"]["target"]["averageValue"]
        for m in hpa["spec"]["metrics"]
        if m["pods"]["metric"]["name"] == RATE_METRIC
    ]
    return int(target)


def _without_rate_target(docs) -> list[dict]:
    metrics = one(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]
    return [m for m in metrics if m["pods"]["metric"]["name"] != RATE_METRIC]


def test_the_gpu_autoscaler_targets_70_percent_of_what_a_gpu_pod_served():
    expected = round(HPA_TARGET_SHARE * latency_budget.GPU_RPS_PER_GPU)
    assert _rate_target(render("gpu")) == expected
    assert _rate_target(render_kserve("raw-deployment-gpu")) == expected
    assert _rate_target(render("cpu")) < expected / 10  # the CPU pod's figure (test_observability), kept for CPU pods
    # Everything else (the queue-time target, the behaviour) is the CPU autoscaler's.
    assert _without_rate_target(render("gpu")) == _without_rate_target(render("cpu"))
    assert (
        one(render("gpu"), "HorizontalPodAutoscaler")["spec"]["behavior"]
        == (one(render("cpu"), "HorizontalPodAutoscaler")["spec"]["behavior"])
    )
    _cites(
        "deploy/kubernetes/components/autoscaling-gpu/kustomization.yaml",
        f"{latency_budget.GPU_RPS_PER_GPU:,.0f} requests/s",
        f"so {expected}.",
    )


def test_the_gpu_concurrency_target_is_where_the_gpu_layout_filled_its_batches(tmp_path):
    cells = sorted(_layout_cells(cluster_config.GPU_WORKERS_PER_GPU), key=lambda cell: cell["concurrency"])
    best = _best(cells)
    predictor = one(render_kserve("serverless-gpu"), "InferenceService")["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"
    assert predictor["scaleTarget"] == best["concurrency"]
    assert best["mean_batch_size"] > 0.9 * cluster_config.GPU_BATCH_SIZE
    # What the kustomization cites for each client count it names, as measured.
    text = _text("deploy/kserve/serverless-gpu/kustomization.yaml")
    for cell in cells:
        if cell["concurrency"] > 1:
            assert f"{cell['rps']:,.0f} requests/s at {cell['concurrency']:,} clients" in text, cell
            assert f"batches averaging {cell['mean_batch_size']:.0f} and p99 {cell['p99_ms']:.0f} ms" in text, cell
    # At the target a pod refuses nothing: the layout's queue (from the latency budget) holds that many.
    queue = int(_layout(tmp_path, gpus=1)["job_queue_size"])
    assert queue >= predictor["scaleTarget"]
    assert f"queue ({queue:,} at the default 1 s budget)" in text
    raw = one(render_kserve("raw-deployment-gpu"), "InferenceService")["spec"]["predictor"]
    assert "scaleMetric" not in raw and "scaleTarget" not in raw


# ---- what a GPU pod gets --------------------------------------------------------------------------


def _gpu_overlay_pod() -> dict:
    return one(render("gpu"), "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("mode", KSERVE_GPU_MODES)
def test_a_kserve_gpu_predictor_gets_one_gpu_the_cuda_image_and_the_gpu_layout(mode, tmp_path):
    docs, cpu_docs = render_kserve(mode), render_kserve(mode.removesuffix("-gpu"))
    [container] = one(docs, "ServingRuntime")["spec"]["containers"]
    [cpu_container] = one(cpu_docs, "ServingRuntime")["spec"]["containers"]
    # The pod the plain Kubernetes gpu overlay runs: one GPU, the CPUs the measurement had, requests = limits.
    [overlay_container] = _gpu_overlay_pod()["containers"]
    assert container["resources"] == overlay_container["resources"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == int(container["resources"]["requests"]["nvidia.com/gpu"]) == 1
    # The CUDA image without a baked layout; nothing else of the runtime changes.
    assert cpu_container["image"].endswith("-cpu-runtime")
    assert container["image"] == cpu_container["image"].removesuffix("-cpu-runtime") + "-cuda-runtime"
    unchanged = ("image", "resources")
    assert {k: v for k, v in container.items() if k not in unchanged} == {
        k: v for k, v in cpu_container.items() if k not in unchanged
    }
    # Its own layout (made with --gpus 1): the measured workers per GPU and batch.
    isvc, cpu_isvc = one(docs, "InferenceService"), one(cpu_docs, "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["storageUri"] != cpu_isvc["spec"]["predictor"]["model"]["storageUri"]
    [entry] = json.loads(_layout(tmp_path, gpus)["model_snapshot"])["models"]["bert"].values()
    assert entry["minWorkers"] == entry["maxWorkers"] == cluster_config.GPU_WORKERS_PER_GPU * gpus
    assert entry["batchSize"] == cluster_config.GPU_BATCH_SIZE
    # Tolerations where Knative does not refuse them (RawDeployment), as the gpu overlay tolerates the taint.
    tolerations = isvc["spec"]["predictor"].get("tolerations")
    if mode.startswith("serverless"):
        assert tolerations is None
    else:
        assert tolerations == _gpu_overlay_pod()["tolerations"]


def test_the_layout_command_points_a_gpu_layout_at_the_gpu_variants_storage_uri(tmp_path, capsys):
    from scripts import kserve_layout

    _layout(tmp_path, gpus=1)
    printed = capsys.readouterr().out
    assert f"in {kserve_layout.STORAGE_URI_GPU}" in printed and "VARIANT=cuda" in printed
    for mode in KSERVE_GPU_MODES:
        storage_uri = one(render_kserve(mode), "InferenceService")["spec"]["predictor"]["model"]["storageUri"]
        assert storage_uri in _text(kserve_layout.STORAGE_URI_GPU)


def test_the_gpu_patches_refuse_a_runtime_they_do_not_know(tmp_path):
    """The GPU component patches the runtime's first container by index: a renamed or reordered one fails to
    render instead of giving the GPU to the wrong container."""
    runtime = copy.deepcopy(one(render_kserve("serverless"), "ServingRuntime"))
    isvc = one(render_kserve("serverless"), "InferenceService")
    runtime["spec"]["containers"][0]["name"] = "sidecar"
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all([runtime, isvc]))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["objects.yaml"],
                "components": [os.path.relpath(KSERVE / "components" / "gpu", tmp_path)],
            }
        )
    )
    result = subprocess.run([kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "test failed" in result.stderr, result.stdout + result.stderr


def test_the_docs_name_the_gpu_variants_and_cite_the_measurement(tmp_path):
    cells = {cell["concurrency"]: cell for cell in _layout_cells(cluster_config.GPU_WORKERS_PER_GPU)}
    best = _best(list(cells.values()))
    one_worker = _best([c for c in _layout_cells(1) if c["concurrency"] == best["concurrency"]])
    queue = int(_layout(tmp_path, gpus=1)["job_queue_size"])
    rate_target = _rate_target(render("gpu"))
    concurrency_target = one(render_kserve("serverless-gpu"), "InferenceService")["spec"]["predictor"]["scaleTarget"]
    figures = [f"{best['rps']:,.0f}", f"{queue:,}", str(rate_target), f"{concurrency_target:,}"]
    for clients, cell in cells.items():
        if clients > 1:
            figures += [f"batches of {cell['mean_batch_size']:.0f}", f"{cell['p99_ms']:.0f} ms", f"{cell['rps']:,.0f}"]
    for path in ("docs/kubernetes.md", "docs/autoscaling.md"):
        _cites(path, *figures, *(f"deploy/kserve/{mode}" for mode in KSERVE_GPU_MODES))
    _cites("docs/kubernetes.md", f"{best['rps'] / one_worker['rps']:.1f}×", f"{one_worker['rps']:,.0f}")
    for mode in KSERVE_GPU_MODES:
        assert (DEPLOY / "kserve" / mode / "kustomization.yaml").is_file()
