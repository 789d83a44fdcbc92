"""The shapes CUDA graphs are captured for, and how a pass is padded into one (handlers/cuda_graphs.py).
Pure: no GPU needed; the graphs themselves are tested in tests/gpu."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.batching import Bucket, BucketCosts
from handlers.cuda_graphs import bucket_ladder, pad_into
from handlers.tokenization import Encoding, collate


def test_the_ladder_runs_from_one_short_text_to_the_largest_batch_at_the_cap():
    ladder = bucket_ladder(128, 256)
    assert {b.rows for b in ladder} == {1, 2, 4, 8, 16, 32, 64, 128}
    assert {b.width for b in ladder} == {16, 32, 48, 64, 96, 128, 192, 256}
    assert len(ladder) == 64


def test_maxima_off_the_ladder_are_buckets_themselves():
    ladder = bucket_ladder(100, 200)
    assert max(b.rows for b in ladder) == 100 and max(b.width for b in ladder) == 200
    assert Bucket(64, 192) in ladder and Bucket(100, 200) in ladder
    assert bucket_ladder(1, 8) == [Bucket(1, 8)]


def by_tokens(ladder: list[Bucket]) -> BucketCosts:
    """Costs as a GPU measures them when padding is what a pass pays for: a fixed part, and each token."""
    return BucketCosts({b: 1e-3 + 1e-6 * b.rows * b.width for b in ladder})


@settings(deadline=None)  # no time limit per example: CI's machine is shared; what is checked is the buckets
@given(st.integers(1, 160), st.integers(1, 300), st.integers(1, 128), st.integers(8, 256))
def test_every_pass_within_the_maxima_gets_the_tightest_bucket_and_no_other_does(rows, width, max_rows, max_width):
    ladder = bucket_ladder(max_rows, max_width)
    chosen = by_tokens(ladder).holding(rows, width)
    if rows > max_rows or width > max_width:
        assert chosen is None
        return
    assert chosen is not None and chosen.rows >= rows and chosen.width >= width
    assert all(b.rows * b.width >= chosen.rows * chosen.width for b in ladder if b.rows >= rows and b.width >= width)
    # The ladder's steps bound the padding: rows at most doubled, width at most doubled (1.5x above 32).
    assert chosen.rows < 2 * rows or chosen.rows == 1
    assert chosen.width <= max(16, 2 * width)


def test_a_pass_goes_to_the_bucket_measured_cheapest_even_when_it_holds_more_tokens():
    """What the GPU measured decides, not the token count: a wider bucket that ran faster (tensor cores, or a
    kernel better suited to it) is the one replayed and the one plans count."""
    costs = {Bucket(4, 32): 2.0, Bucket(4, 64): 1.0, Bucket(8, 64): 3.0, Bucket(1, 32): 0.5}
    assert BucketCosts(costs).holding(3, 20) == Bucket(4, 64)
    assert BucketCosts(costs).holding(1, 20) == Bucket(1, 32)
    assert BucketCosts(costs).holding(5, 20) == Bucket(8, 64)
    assert BucketCosts(costs).holding(9, 20) is None and BucketCosts(costs).holding(1, 65) is None


def test_of_buckets_measured_as_fast_the_one_with_fewer_tokens_holds_the_pass():
    """Equal times (a GPU whose passes cost their launches): the smaller bucket, which the metrics count as fewer
    padded tokens, whatever order the times were measured in."""
    costs = {Bucket(8, 64): 1.0, Bucket(4, 64): 1.0, Bucket(4, 32): 1.0}
    assert BucketCosts(costs).holding(3, 20) == Bucket(4, 32)
    assert BucketCosts(costs).holding(5, 20) == Bucket(8, 64)


def test_a_pass_is_padded_into_its_bucket_as_masked_columns_and_lone_token_rows():
    encodings = [Encoding({"input_ids": [101, 7, 8, 102], "token_type_ids": [0, 0, 0, 0]}, False),
                 Encoding({"input_ids": [101, 9, 102], "token_type_ids": [0, 0, 0]}, False)]  # fmt: skip
    arrays = collate(encodings, pad_token_id=0, multiple=1, limit=512)
    out = {key: np.full((4, 8), -1, dtype=np.int64) for key in arrays}  # stale values from a previous pass
    pad_into(arrays, out, pad_token_id=0)
    assert out["input_ids"][:2, :4].tolist() == [[101, 7, 8, 102], [101, 9, 102, 0]]
    assert out["attention_mask"][:2].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    assert (out["input_ids"][:, 4:] == 0).all() and (out["input_ids"][2:] == 0).all()
    # Rows beyond the pass: one attended pad token each, nothing left over from before.
    assert out["attention_mask"][2:].tolist() == [[1, 0, 0, 0, 0, 0, 0, 0]] * 2
    assert (out["token_type_ids"] == 0).all()
