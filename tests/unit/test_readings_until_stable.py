"""The saturation's rounds: measured until two in a row agree, each caller keeping the reading it wants."""

from __future__ import annotations

from tooling.bench.loadgen import readings_until_stable


def test_rounds_stop_at_the_first_agreeing_pair_and_the_soak_keeps_its_lower_reading():
    values = [50.0, 100.0, 85.0, 80.0, 999.0]
    readings = readings_until_stable(lambda i: values[i])
    assert readings.values == [50.0, 100.0, 85.0, 80.0] and readings.agreed
    assert readings.lower_of_agreeing_pair == 80.0
    rising = readings_until_stable(lambda i: [50.0, 80.0, 85.0][i])
    assert rising.lower_of_agreeing_pair == 80.0  # the lower one, wherever it is in the pair


def test_without_agreement_every_round_is_taken_and_the_last_is_kept():
    values = [10.0, 20.0, 40.0, 80.0]
    readings = readings_until_stable(lambda i: values[i], rounds=4)
    assert readings.values == values and not readings.agreed
    assert readings.lower_of_agreeing_pair == 80.0


def test_two_readings_exactly_the_agreement_bar_apart_agree():
    # "two in a row agree within `agree`": a gap of exactly agree x the earlier reading is within it.
    readings = readings_until_stable(lambda i: [100.0, 75.0, 10.0, 10.0][i], agree=0.25)
    assert readings.values == [100.0, 75.0] and readings.agreed
