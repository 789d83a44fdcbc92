"""Micro-batch planning and handler options: pure functions."""

from __future__ import annotations

import pytest

from handlers.batching import padded_length, padded_width, plan_micro_batches
from handlers.options import HandlerOptions


def test_one_pass_when_padding_fits_the_budget():
    assert plan_micro_batches([5, 30, 12], max_batch_tokens=96, multiple=8) == [[0, 1, 2]]


def test_split_by_length_when_padding_would_exceed_the_budget():
    lengths = [200, 10, 12, 190, 9, 11]
    groups = plan_micro_batches(lengths, max_batch_tokens=256, multiple=8)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * padded_length(max(lengths[i] for i in group), 8) <= 256
    # short items travel together, long ones apart
    assert [4, 1, 5, 2] in groups


def test_item_longer_than_budget_gets_its_own_group():
    assert plan_micro_batches([600, 4], max_batch_tokens=100, multiple=1) == [[1], [0]]


def test_empty_plan():
    assert plan_micro_batches([], 100) == []


def test_rounding_up_to_the_multiple_never_pads_past_the_models_limit():
    """Positions past the model's limit have no embedding: a pass padded there fails (RoBERTa's 514 positions leave
    512 tokens, not a multiple of 8 when a special token is added or its limit is set otherwise)."""
    assert padded_width(13, 8, 16) == 16
    assert padded_width(13, 8, 14) == 14  # 16 would be past the limit
    assert padded_width(20, 8, 14) == 20  # an item already longer (the caller's to refuse) is never cut here


def test_options_defaults_and_overrides():
    assert HandlerOptions.from_mapping(None) == HandlerOptions()
    options = HandlerOptions.from_mapping({"max_length": 64, "overlength": "reject", "fault_delay_s": 1})
    assert (options.max_length, options.overlength, options.fault_delay_s) == (64, "reject", 1.0)


def test_a_misspelt_option_is_refused_with_the_name_it_is_nearest_to():
    with pytest.raises(
        ValueError, match=r"^unknown handler option\(s\): max_lenght \(did you mean max_length\?\), zzz$"
    ):
        HandlerOptions.from_mapping({"max_lenght": 128, "zzz": 1})


@pytest.mark.parametrize(
    "raw",
    [
        {"max_lenght": 64},
        {"max_length": "64"},
        {"overlength": "drop"},
        {"dtype": "int8"},
        {"max_bytes": 0},
        {"warmup": "yes"},
        {"max_length": 2},
        # YAML reads true, yes and on as booleans, and a bool is an int to Python: max_instances: true is not 1.
        {"max_instances": True},
        {"cpu_threads": False},
        {"fault_kind": "segfault"},
        {"max_batch_tokens": -1},
        {"pad_to_multiple_of": -8},
        {"cuda_memory_fraction": 1.5},
        {"cuda_memory_fraction": -0.5},
        {"cpu_threads": -1},
        {"fault_delay_s": -1.0},
    ],
)
def test_bad_options_fail_loudly(raw):
    # The message names the option, so the load log points at the line of model-config.yaml to mend.
    with pytest.raises(ValueError, match=next(iter(raw))):
        HandlerOptions.from_mapping(raw)


def test_repository_model_config_is_valid():
    import yaml

    from tooling.paths import MODEL_CONFIG

    config = yaml.safe_load(MODEL_CONFIG.read_text())
    HandlerOptions.from_mapping(config["handler"])
