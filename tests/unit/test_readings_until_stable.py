"""The saturation's rounds: measured until two in a row agree, each caller keeping the reading it wants."""

from __future__ import annotations

from tooling.bench.loadgen import readings_until_stable


def test_rounds_stop_at_the_first_agreeing_pair():
    values = [50.0, 100.0, 80.0, 85.0, 999.0]
    assert readings_until_stable(lambda i: values[i]) == [50.0, 100.0, 80.0, 85.0]


def test_without_agreement_every_round_is_taken():
    values = [10.0, 20.0, 40.0, 80.0]
    assert readings_until_stable(lambda i: values[i], rounds=4) == values
