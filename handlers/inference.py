"""The forward pass, and isolation of items that make it fail."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from handlers import rejection
from handlers.rejection import Rejection

logger = logging.getLogger(__name__)


def forward_probabilities(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """One forward pass; returns float32 class probabilities on the CPU, one row per item."""
    if device.type == "cuda":
        batch = {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    elif device.type != "cpu":
        batch = {k: v.to(device) for k, v in batch.items()}
    with torch.inference_mode():
        logits = model(**batch).logits
        return logits.float().softmax(dim=-1).cpu()


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def run_isolating_faults(
    run: Callable[[Sequence[int]], torch.Tensor],
    group: Sequence[int],
    describe: Callable[[Sequence[int]], str] = lambda g: f"{len(g)} items",
    _depth: int = 0,
) -> dict[int, torch.Tensor | Rejection]:
    """Run `group`; if the pass fails, bisect until only the items that fail alone fail.

    A healthy batch costs one call. A batch with one poisonous item costs about
    2*log2(n) extra calls, and every other item still gets its own answer. The
    failure is logged once, with the shape of the group that first failed; the
    items that fail alone are reported by the caller, per item.
    """
    try:
        probabilities = run(group)
        return {item: probabilities[row] for row, item in enumerate(group)}
    except Exception as exc:  # noqa: BLE001 - any failure is isolated, never propagated
        oom = _is_out_of_memory(exc)
        logger.log(
            logging.WARNING if _depth == 0 else logging.DEBUG,
            "forward pass failed for %s (%s%s); retrying by bisection",
            describe(group),
            type(exc).__name__,
            ", out of memory" if oom else "",
        )
        if oom and torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(group) == 1:
            return {group[0]: rejection.out_of_memory() if oom else rejection.inference_failed()}
    middle = len(group) // 2
    results = run_isolating_faults(run, group[:middle], describe, _depth + 1)
    results.update(run_isolating_faults(run, group[middle:], describe, _depth + 1))
    return results
