"""Which failures of a forward pass end the worker (handlers/torch_forward.poisons_the_device), with the exception
objects torch raises, and the refusal of `cuda_graphs` where transformers cannot capture BERT's masks
(handlers/cuda_graphs.require_capture_safe_transformers)."""

from __future__ import annotations

import pytest
import torch

from handlers.cuda_graphs import require_capture_safe_transformers
from handlers.fault_isolation import is_out_of_memory
from handlers.loading import ModelLoadFailed
from handlers.torch_forward import poisons_the_device

# What c10_cuda_check_implementation writes for a failed CUDA call, which torch 2.8+ raises as AcceleratorError.
ASYNC = "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "


def accelerator_error(message: str, code: int) -> BaseException:
    error = torch.AcceleratorError(message + ASYNC)
    error.error_code = code  # type: ignore[attr-defined] - as torch's C++ side sets it: the cudaError_t
    return error


def torch_raised(call) -> BaseException:
    """The exception a real torch call raises on this host."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever torch raises is the object under test
        return exc
    raise AssertionError("the call did not raise")


ENDS_THE_WORKER = {
    "device-side assert": accelerator_error("CUDA error: device-side assert triggered", 710),
    "illegal address": accelerator_error("CUDA error: an illegal memory access was encountered", 700),
    "launch failure": accelerator_error("CUDA error: unspecified launch failure", 719),
    # torch before 2.8 raised a failed CUDA call as a RuntimeError
    "older torch": RuntimeError("CUDA error: device-side assert triggered" + ASYNC),
}
ANSWERED_PER_ITEM = {
    "allocator out of memory": torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."),
    # cudaErrorMemoryAllocation from a CUDA call: an out-of-memory, bisected to 507, not a poisoned context
    "CUDA call out of memory": accelerator_error("CUDA error: out of memory", 2),
    "host out of memory": MemoryError(),
    "injected fault": RuntimeError("injected fault (handler option fault_marker)"),
    "token id out of range on the CPU": torch_raised(lambda: torch.nn.Embedding(4, 2)(torch.tensor([9]))),
    "shapes that do not match": torch_raised(lambda: torch.ones(2, 3) @ torch.ones(2, 3)),
    "value error": ValueError("a pair of texts needs token type 1"),
}


@pytest.mark.parametrize("exc", ENDS_THE_WORKER.values(), ids=ENDS_THE_WORKER.keys())
def test_a_cuda_error_other_than_out_of_memory_ends_the_worker(exc):
    assert poisons_the_device(exc)
    assert not is_out_of_memory(exc)  # so it never reaches the per-item 507 either


@pytest.mark.parametrize("exc", ANSWERED_PER_ITEM.values(), ids=ANSWERED_PER_ITEM.keys())
def test_out_of_memory_and_failures_of_an_item_are_left_to_bisection(exc):
    assert not poisons_the_device(exc)


def test_out_of_memory_keeps_its_507():
    assert is_out_of_memory(ANSWERED_PER_ITEM["allocator out of memory"])
    assert is_out_of_memory(ANSWERED_PER_ITEM["CUDA call out of memory"])


def test_cuda_graphs_are_refused_where_transformers_would_read_the_mask_inside_the_capture(monkeypatch):
    import transformers
    import transformers.utils.import_utils

    require_capture_safe_transformers()  # this transformers has the check
    # As transformers 4.56 and 4.57 are: no is_cuda_stream_capturing, and BERT's mask read on the host.
    monkeypatch.delattr(transformers.utils.import_utils, "is_cuda_stream_capturing")
    with pytest.raises(ModelLoadFailed) as refused:
        require_capture_safe_transformers()
    message = str(refused.value)
    assert f"this worker has transformers {transformers.__version__}" in message
    assert "is_cuda_stream_capturing" in message and "transformers 5.0 or newer" in message
    assert "cuda_graphs: false" in message
