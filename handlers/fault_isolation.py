"""Isolating the items that make a forward pass fail. Backend-agnostic and torch-free."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from handlers import rejection
from handlers.rejection import Rejection

logger = logging.getLogger(__name__)

Row = TypeVar("Row")


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, torch.cuda.OutOfMemoryError, or an ONNX Runtime/CUDA allocation failure."""
    return (
        isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
    )


def run_isolating_faults(
    run: Callable[[Sequence[int]], Sequence[Row]],
    group: Sequence[int],
    describe: Callable[[Sequence[int]], str] = lambda g: f"{len(g)} items",
    _depth: int = 0,
) -> dict[int, Row | Rejection]:
    """Run `group`; if the pass fails, bisect until only the items that fail alone fail.

    A healthy batch costs one call. A batch with one poisonous item costs about
    2*log2(n) extra calls, and every other item still gets its own answer. The
    failure is logged once, with the shape of the group that first failed; the
    items that fail alone are reported by the caller, per item.
    """
    try:
        rows = run(group)
        return {item: rows[row] for row, item in enumerate(group)}
    except Exception as exc:  # noqa: BLE001 - any failure is isolated, never propagated
        oom = is_out_of_memory(exc)
        logger.log(
            logging.WARNING if _depth == 0 else logging.DEBUG,
            "forward pass failed for %s (%s%s); retrying by bisection",
            describe(group),
            type(exc).__name__,
            ", out of memory" if oom else "",
        )
        if len(group) == 1:
            return {group[0]: rejection.out_of_memory() if oom else rejection.inference_failed()}
    middle = len(group) // 2
    results = run_isolating_faults(run, group[:middle], describe, _depth + 1)
    results.update(run_isolating_faults(run, group[middle:], describe, _depth + 1))
    return results
