"""The soak's own accounting (tooling/soak.py, scripts/soak.py) without a TorchServe: a request fails when its status
is not the one expected or it raises, and the open-loop run's verdict. The soak against a real TorchServe is
tests/e2e/test_reliability.py::test_soak_short_mode."""

from __future__ import annotations

from scripts.soak import open_loop_verdict
from tests.support import answering_every_call, serving_http
from tooling.soak import drive
from tooling.torchserve import TorchServe, free_port


def server_at(tmp_path, inference_url: str) -> TorchServe:
    """A TorchServe, never started, whose inference address is `inference_url` (no keys: token auth off)."""
    overrides = {"inference_address": inference_url, "disable_token_authorization": "true"}
    return TorchServe(tmp_path / "server", tmp_path / "store", overrides)


def test_every_answer_other_than_the_expected_one_is_a_failure_and_so_is_a_request_that_raises(tmp_path):
    with serving_http(answering_every_call(body=b"{}")) as url:
        sent, failures = drive(server_at(tmp_path / "ok", url), "soak", 0.5, clients=2, seed=1)
    # The mix holds invalid requests (400, 413) among the valid ones: each answered 200 is a failure.
    assert sent > len(failures) > 0, (sent, failures)
    assert set(failures) <= {"status 200, expected 400", "status 200, expected 413"}, set(failures)

    nothing_listens = server_at(tmp_path / "gone", f"http://127.0.0.1:{free_port()}")
    sent, failures = drive(nothing_listens, "soak", 0.3, clients=2, seed=1)
    assert sent > 0 and failures == ["ConnectionError"] * sent


def test_the_open_loop_verdict_needs_little_growth_a_steady_p99_and_no_failure(capsys):
    # A run of 60 s: its first and last windows are 10 s each.
    steady = [(at / 10, 0.1) for at in range(600)]
    slower_at_the_end = [(at, 0.1 if at < 50 else 0.2) for at, _ in steady]
    assert open_loop_verdict(steady, 60.0, [], growth=0.01) == 0
    assert open_loop_verdict(slower_at_the_end, 60.0, [], growth=0.01) == 1
    assert open_loop_verdict(steady, 60.0, ["status 503, expected 200"], growth=0.01) == 1
    assert open_loop_verdict(steady, 60.0, [], growth=0.06) == 1
    said = capsys.readouterr().out
    assert "FAIL: last window's p99 within 20 % of the first's" in said and "FAIL: no failures" in said, said
    assert "FAIL: worker RSS growth < 5 %" in said, said
