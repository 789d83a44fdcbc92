"""Planning passes by the CUDA graphs' measured costs (handlers/batching.plan_by_cost, CheapestPasses). Pure: the
costs here stand for what a GPU measured at load; tests/gpu/test_cuda_graphs.py measures real ones."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.batching import Bucket, BucketCosts, CheapestPasses, padded_width, plan_by_cost
from handlers.cuda_graphs import bucket_ladder

SMALL_LADDER = bucket_ladder(4, 48)  # rows 1, 2, 4; widths 16, 32, 48


def partitions(items: list[int]):
    """Every way to split `items` into non-empty groups (a Bell number of them: 203 for six)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for split in partitions(rest):
        yield [[first], *split]
        for i in range(len(split)):
            yield [*split[:i], [first, *split[i]], *split[i + 1 :]]


def cost(costs: BucketCosts, rows: int, width: int) -> float:
    """What a pass of `rows` x `width` costs: its cheapest holding bucket's time; inf where none holds it."""
    bucket = costs.holding(rows, width)
    return math.inf if bucket is None else costs.costs[bucket]


def total(groups: list[list[int]], lengths: list[int], costs: BucketCosts, multiple: int) -> float:
    return sum(cost(costs, len(g), padded_width(max(lengths[p] for p in g), multiple, 512)) for g in groups)


@settings(deadline=None, max_examples=200)
@given(
    st.lists(st.integers(1, 48), min_size=1, max_size=6),
    st.lists(st.floats(0.01, 1.0), min_size=len(SMALL_LADDER), max_size=len(SMALL_LADDER)),
    st.sampled_from([1, 8]),
)
def test_the_plan_costs_the_least_of_every_way_to_split_the_batch(lengths, times, multiple):
    """Against every partition of the items, not only the length-sorted runs the planner searches: whatever the
    buckets measured (in any order, a larger one cheaper than a smaller), none is cheaper than its plan."""
    costs = BucketCosts(dict(zip(SMALL_LADDER, times)))
    groups = plan_by_cost(lengths, costs, multiple)
    assert sorted(p for g in groups for p in g) == list(range(len(lengths)))
    assert all(costs.holding(len(g), padded_width(max(lengths[p] for p in g), multiple, 512)) for g in groups)
    least = min(total(split, lengths, costs, multiple) for split in partitions(list(range(len(lengths)))))
    assert math.isclose(total(groups, lengths, costs, multiple), least, rel_tol=1e-9)


def measured(fixed_s: float, per_token_s: float) -> BucketCosts:
    """Costs of the shape a GPU measures: a fixed part per pass (launches, the copy, reading back) and each token."""
    return BucketCosts({b: fixed_s + per_token_s * b.rows * b.width for b in bucket_ladder(128, 256)})


# A batch like the benchmark's corpus: mostly short reviews, a few long ones.
LENGTHS = [12, 30, 25, 160, 9, 40, 18, 33, 140, 22, 15, 28, 37, 11, 60, 26] * 8


def test_where_a_pass_costs_its_launches_the_batch_is_one_pass():
    groups = plan_by_cost(LENGTHS, measured(fixed_s=1e-2, per_token_s=1e-9), multiple=8)
    assert groups == [sorted(range(len(LENGTHS)), key=LENGTHS.__getitem__)]


def test_where_a_pass_costs_its_padding_short_texts_leave_the_long_ones_pass():
    costs = measured(fixed_s=5e-4, per_token_s=5e-7)
    groups = plan_by_cost(LENGTHS, costs, multiple=8)
    assert len(groups) > 1
    longest = [max(LENGTHS[p] for p in g) for g in groups]
    assert longest == sorted(longest)  # shortest first, each group a run of neighbours in length
    assert all(LENGTHS[p] <= 40 for p in groups[0])  # the short reviews do not pay for the 160-token ones
    one_pass = cost(costs, len(LENGTHS), padded_width(max(LENGTHS), 8, 512))
    assert sum(cost(costs, len(g), padded_width(m, 8, 512)) for g, m in zip(groups, longest)) < one_pass


def test_of_plans_that_cost_the_same_the_one_with_fewer_passes_is_made():
    """Measured times that add up the same (one pass of two texts costs two passes of one): the fewer passes, each
    a launch and a wait of its own that a measured time may leave out. Four texts: two passes of two, not more."""
    costs = BucketCosts({Bucket(1, 16): 1.0, Bucket(2, 16): 2.0, Bucket(8, 16): 100.0})
    assert plan_by_cost([5, 5], costs) == [[0, 1]]
    assert plan_by_cost([5, 5, 5, 5], costs) == [[0, 1], [2, 3]]


def test_a_batch_over_the_largest_bucket_is_cut_into_passes_that_fit():
    groups = plan_by_cost([20] * 300, measured(fixed_s=1e-2, per_token_s=1e-9), multiple=8)
    assert len(groups) == 3 and max(len(g) for g in groups) == 128  # three passes, none past the largest bucket


def test_an_item_wider_than_every_bucket_runs_alone_last():
    costs = BucketCosts({Bucket(1, 16): 1.0, Bucket(4, 16): 1.5, Bucket(1, 32): 1.5, Bucket(4, 32): 3.0})
    assert plan_by_cost([10, 40, 12], costs) == [[0, 2], [1]]


def test_the_plan_counts_the_tokens_its_buckets_compute():
    planner = CheapestPasses(measured(1e-3, 1e-7), multiple=8, limit=512)
    assert planner.computed_tokens(3, 20) == 4 * 32  # 3 rows padded to 4, 24 columns to 32
    assert planner.computed_tokens(200, 20) == 200 * 24  # no bucket holds it: run eagerly, as collated
    assert planner.groups([]) == []
    assert "measured" in planner.description
