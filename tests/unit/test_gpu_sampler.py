"""The benchmark's NVML sampler (tooling/bench/gpu_sampler.py), driven by a stand-in for NVML: the real one
needs a GPU, and on the H100 the benchmark uses it (docs/benchmarks.md#gpu)."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

from tooling.bench.gpu_sampler import GpuSampler


class FakeNvml:
    def __init__(self, utilization: list[float], memory_bytes: list[int], fail_init: bool = False) -> None:
        self._utilization, self._memory = itertools.cycle(utilization), itertools.cycle(memory_bytes)
        self.fail_init, self.reads, self.shut_down = fail_init, 0, False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(gpu=next(self._utilization))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=next(self._memory))

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def test_a_cell_gets_the_mean_utilisation_and_the_peak_memory_of_the_samples_taken_while_it_ran():
    nvml = FakeNvml(utilization=[40, 60], memory_bytes=[1 * 2**30, 3 * 2**30, 2 * 2**30])
    with GpuSampler(interval_s=0.005, nvml=nvml) as gpu:
        deadline = time.monotonic() + 5
        while nvml.reads < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    reads_at_exit = nvml.reads
    time.sleep(0.05)
    assert nvml.reads == reads_at_exit, "the sampler kept reading after its block ended"
    assert nvml.shut_down
    figures = gpu.figures()
    assert 40 <= figures["gpu_utilization_percent"] <= 60
    assert figures["gpu_memory_used_mb"] == 3 * 1024


def test_where_nvml_cannot_start_the_cell_reports_nothing_rather_than_zero():
    nvml = FakeNvml(utilization=[50], memory_bytes=[2**30], fail_init=True)
    with GpuSampler(interval_s=0.005, nvml=nvml) as gpu:
        time.sleep(0.05)
    assert nvml.reads == 0
    assert gpu.figures() == {"gpu_utilization_percent": None, "gpu_memory_used_mb": None}
