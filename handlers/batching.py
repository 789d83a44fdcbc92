"""Length-aware micro-batch planning. Pure and torch-free.

Padding every item of a batch to its longest one wastes compute on pad tokens.
When that waste would push one forward pass over the token budget, the items are
sorted by length and cut into micro-batches of similar lengths instead.
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_length(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def padded_width(longest: int, multiple: int, limit: int) -> int:
    """Width a group is padded to: its longest item rounded up to `multiple`, never past `limit`."""
    return min(padded_length(longest, multiple), max(limit, longest))


def padded_tokens(lengths: Sequence[int], groups: Sequence[Sequence[int]], multiple: int, limit: int) -> int:
    """Tokens a plan actually computes, padding included (compare with sum(lengths))."""
    return sum(len(group) * padded_width(max(lengths[p] for p in group), multiple, limit) for group in groups)


def plan_micro_batches(lengths: Sequence[int], max_batch_tokens: int, multiple: int = 1) -> list[list[int]]:
    """Group item positions into forward passes whose padded size fits the budget.

    Returns one group with every position when padding all items to the longest
    fits; otherwise length-sorted groups cut greedily. An item longer than the
    budget on its own still gets a group of one.
    """
    if not lengths:
        return []
    if len(lengths) * padded_length(max(lengths), multiple) <= max_batch_tokens:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = []
    current: list[int] = []
    for position in sorted(range(len(lengths)), key=lengths.__getitem__):
        # Ascending order: the item being added is the longest of its group.
        if current and (len(current) + 1) * padded_length(lengths[position], multiple) > max_batch_tokens:
            groups.append(current)
            current = []
        current.append(position)
    groups.append(current)
    return groups
