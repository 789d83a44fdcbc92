"""Planning a batch's forward passes. Pure and torch-free.

Padding every item of a batch to its longest one wastes compute on pad tokens. Two plans:
- a token budget (TokenBudget, the eager passes'): when that waste would push one forward pass over
  the budget, the items are sorted by length and cut into micro-batches of similar lengths instead;
- measured costs (CheapestPasses, CUDA graphs'): each captured shape's pass time is measured at load,
  and the length-sorted items are cut where the passes' summed time is least. A graph's shape is
  fixed, so a pass costs its bucket's time whatever it holds; with launches replayed, padding is the
  cost left (docs/benchmarks.md, "CUDA graphs"), and a cut is worth it when it saves more than the
  extra pass costs, which the measured times decide rather than a budget guessed for the GPU.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


def padded_length(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def padded_width(longest: int, multiple: int, limit: int) -> int:
    """Width a group is padded to: its longest item rounded up to `multiple`, never past `limit`."""
    return min(padded_length(longest, multiple), max(limit, longest))


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


class PassPlanner(Protocol):
    """How a model's batches become forward passes: LoadedModel.planner, read by handlers/pipeline.plan."""

    description: str

    def groups(self, lengths: Sequence[int]) -> list[list[int]]:
        """Item positions grouped into passes, every position exactly once."""
        ...

    def computed_tokens(self, rows: int, longest: int) -> int:
        """Tokens a pass of `rows` items whose longest has `longest` tokens computes, padding included."""
        ...


@dataclass(frozen=True)
class TokenBudget:
    """One pass per batch while its padded size fits `max_batch_tokens`; length-sorted cuts beyond it."""

    max_batch_tokens: int
    multiple: int
    limit: int

    @property
    def description(self) -> str:
        return f"passes of at most {self.max_batch_tokens} padded tokens"

    def groups(self, lengths: Sequence[int]) -> list[list[int]]:
        return plan_micro_batches(lengths, self.max_batch_tokens, self.multiple)

    def computed_tokens(self, rows: int, longest: int) -> int:
        return rows * padded_width(longest, self.multiple, self.limit)


@dataclass(frozen=True, order=True)
class Bucket:
    """One captured shape (handlers/cuda_graphs.py): passes of at most `rows` texts, each at most `width` tokens."""

    rows: int
    width: int


class BucketCosts:
    """What one pass through each bucket costs (seconds, measured on the device at load), and for a pass of a
    given size, the cheapest bucket that holds it: the one the pass is replayed in and the one plans count."""

    def __init__(self, costs: Mapping[Bucket, float]) -> None:
        if not costs:
            raise ValueError("no bucket to plan passes with")
        self.costs = dict(costs)
        self.row_sizes = sorted({b.rows for b in costs})
        self.widths = sorted({b.width for b in costs})
        # cheapest[r][w]: of the buckets at least row_sizes[r] rows and widths[w] wide, the cheapest (fewer tokens
        # on a tie); None where no bucket is both. Cheaper never with more rows or width: fewer buckets qualify.
        self.cheapest = [
            [
                min(
                    (b for b in costs if b.rows >= rows and b.width >= width),
                    key=lambda b: (self.costs[b], b.rows * b.width),
                    default=None,
                )
                for width in self.widths
            ]
            for rows in self.row_sizes
        ]

        # The same as plain lists, for plan_by_cost's loop, which runs on every batch: table[r][w], the cost of
        # cheapest[r][w] (inf where none); rows_index[n], the index of the smallest row size of at least n.
        self.table = [[math.inf if b is None else self.costs[b] for b in row] for row in self.cheapest]
        self.rows_index = [bisect.bisect_left(self.row_sizes, n) for n in range(self.row_sizes[-1] + 1)]

    def holding(self, rows: int, width: int) -> Bucket | None:
        """The cheapest bucket with room for `rows` items `width` tokens wide; None when none has."""
        r, w = bisect.bisect_left(self.row_sizes, rows), bisect.bisect_left(self.widths, width)
        if r == len(self.row_sizes) or w == len(self.widths):
            return None
        return self.cheapest[r][w]

    @property
    def description(self) -> str:
        times = sorted(self.costs.values())
        return f"passes {1000 * times[0]:.2f}-{1000 * times[-1]:.2f} ms measured"


@dataclass(frozen=True)
class CheapestPasses:
    """Length-sorted passes cut where their buckets' measured times add up to the least."""

    costs: BucketCosts
    multiple: int
    limit: int

    @property
    def description(self) -> str:
        return f"passes planned by their measured cost ({self.costs.description})"

    def groups(self, lengths: Sequence[int]) -> list[list[int]]:
        return plan_by_cost(lengths, self.costs, self.multiple, self.limit)

    def computed_tokens(self, rows: int, longest: int) -> int:
        width = padded_width(longest, self.multiple, self.limit)
        bucket = self.costs.holding(rows, width)
        return rows * width if bucket is None else bucket.rows * bucket.width  # none: run eagerly, as collated


def plan_by_cost(lengths: Sequence[int], costs: BucketCosts, multiple: int = 1, limit: int = 512) -> list[list[int]]:
    """Item positions grouped into passes at the least summed bucket cost, shortest items first.

    Over the items sorted by length, every group is a run of neighbours (a cheaper plan never interleaves
    lengths) and is held by one bucket. best[j], the least cost of the j shortest items, is found from the
    earlier best[i]: for each bucket row size R, the last group is the up to R items before j, as many as fit,
    since best[] never falls as it covers more items. n x (row sizes) steps: about a thousand for a batch of
    128. An item no bucket is wide enough for gets a pass of its own, last (it runs eagerly).
    """
    width_of = [padded_width(n, multiple, limit) for n in lengths]
    widest = costs.widths[-1]
    order = sorted((p for p in range(len(lengths)) if width_of[p] <= widest), key=lengths.__getitem__)
    table, rows_index = costs.table, costs.rows_index
    width_index = [bisect.bisect_left(costs.widths, width_of[p]) for p in order]
    best = [0.0] + [math.inf] * len(order)
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        w = width_index[j - 1]  # the group's widest: order is ascending
        least, cut = math.inf, 0
        # On a tie, the later candidate, the larger last group: fewer passes for the same measured time.
        for r, rows in enumerate(costs.row_sizes):
            if rows >= j:  # every item so far in one group, in the smallest row size that holds j
                if (total := table[rows_index[j]][w]) <= least:
                    least, cut = total, 0
                break  # more rows only costs as much or more for the same group
            if (total := best[j - rows] + table[r][w]) <= least:
                least, cut = total, j - rows
        best[j], start[j] = least, cut
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(order[start[j] : j])
        j = start[j]
    groups.reverse()
    return groups + [[p] for p in range(len(lengths)) if width_of[p] > widest]
