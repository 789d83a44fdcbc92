"""GPU utilisation and memory sampled through NVML while a benchmark cell runs.

TorchServe's own GPU metrics (tooling/bench/scrape.py) are collected once a minute, so a cell of a few
seconds mostly records a sample taken before it started (the H100 run in docs/bench-gpu shows 0-7 %
for cells that kept the GPU busy). NVML, read every quarter second by the benchmark's own process, sees
the cell itself. Where NVML cannot start (no driver, a CPU host) the sampler reports nothing and the
cell keeps TorchServe's figures: never a made-up 0.
"""

from __future__ import annotations

import threading
from types import ModuleType

SAMPLE_INTERVAL_S = 0.25


def _nvml() -> ModuleType | None:
    try:
        import pynvml  # nvidia-ml-py, installed with nvgpu (TorchServe's GPU metrics)
    except ImportError:
        return None
    return pynvml


class GpuSampler:
    """`with GpuSampler() as gpu: ...` samples GPU `index` until the block ends; `gpu.figures()` after it."""

    def __init__(self, index: int = 0, interval_s: float = SAMPLE_INTERVAL_S, nvml: ModuleType | None = None):
        self._index, self._interval = index, interval_s
        self._nvml = nvml if nvml is not None else _nvml()
        self._utilization: list[float] = []
        self._memory_bytes: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if self._nvml is None:
            return self
        try:
            self._nvml.nvmlInit()
            handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)
        except Exception:  # noqa: BLE001 - NVMLError and its library-not-found variants: no GPU to sample
            self._nvml = None
            return self
        self._thread = threading.Thread(target=self._run, args=(handle,), daemon=True)
        self._thread.start()
        return self

    def _run(self, handle) -> None:
        while True:
            try:
                self._utilization.append(float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                self._memory_bytes.append(int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used))
            except Exception:  # noqa: BLE001 - a failed read loses one sample, not the cell
                pass
            if self._stop.wait(self._interval):
                return

    def __exit__(self, *exc_info) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._nvml.nvmlShutdown()

    def figures(self) -> dict[str, float | None]:
        """Mean utilisation (%) and peak memory used (MB) over the samples; None for each without any."""
        return {
            "gpu_utilization_percent": sum(self._utilization) / len(self._utilization) if self._utilization else None,
            "gpu_memory_used_mb": max(self._memory_bytes) / 2**20 if self._memory_bytes else None,
        }
