"""Where the benchmark runs: the device it resolves, what that device serves, and how its timers stop.

On CUDA the archives are PyTorch only: ONNX Runtime on the GPU host has no CUDA provider
(docs/benchmarks.md), so an ONNX archive's GPU worker would be refused at load.
"""

from __future__ import annotations

from collections.abc import Sequence

DEVICES = ("auto", "cpu", "cuda")
# The GPU run: docs/bench-gpu's command (run there with --duration 8, before the CUDA graphs backend existed),
# now with the graphs measured beside the eager passes and batch_size=1 served for the eager baseline only (18
# cells, about 9 minutes on the H100: one device call). The graphs first and 8 workers first: the cells most of
# the GPU targets read (pytorch-graphs, 8 workers, 1,024 clients) are measured early, not the first lost to a run
# cut short by a time limit (the ceilings, the served cells and the markdown are keyed by backend and layout,
# never by position). Printed at the start of every run, documented in docs/benchmarks.md.
GPU_COMMAND = (
    "python -m scripts.benchmark --device cuda --model bert-base --backends pytorch-graphs,pytorch "
    "--one-at-a-time-backends pytorch --batch-size 128 --delays 5 --gpu-workers 8,1 --concurrency 1,256,1024 "
    "--texts 512 --duration 8 --out docs/bench-gpu"
)
ONNX_ON_CUDA = "skipped on cuda: onnxruntime on the GPU host has no CUDAExecutionProvider"
GRAPHS_OFF_CUDA = "skipped on cpu: CUDA graphs need a GPU"


def resolve_device(requested: str, cuda_available: bool) -> str:
    """'auto' is cuda where torch sees a GPU, else cpu; 'cuda' without one is an error, not a silent CPU run."""
    if requested not in DEVICES:
        raise ValueError(f"--device must be one of {DEVICES}, got {requested!r}")
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ValueError("--device cuda, but torch.cuda.is_available() is False on this host")
    return requested


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_id_of(device: str) -> int | None:
    """The gpu_id load_model takes: the first GPU on cuda, none on cpu."""
    return 0 if device == "cuda" else None


def backends_for_device(names: Sequence[str], device: str) -> tuple[list[str], dict[str, str]]:
    """(the backends this device serves, {skipped backend: why})."""
    from tooling.bench.backends import BACKENDS

    if device != "cuda":
        return [n for n in names if not BACKENDS[n].cuda_only], {
            n: GRAPHS_OFF_CUDA for n in names if BACKENDS[n].cuda_only
        }
    kept = [name for name in names if not BACKENDS[name].onnx]
    return kept, {name: ONNX_ON_CUDA for name in names if BACKENDS[name].onnx}


def release(device: str) -> None:
    """Give the GPU memory of models this process no longer holds back to the driver, so the served cells'
    GPUMemoryUsed counts the workers (and this process' CUDA context), not models cached here."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def synchronize(device: str) -> None:
    """Wait for the GPU's queued kernels, so a timer stopped after this measures work done, not work launched."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
