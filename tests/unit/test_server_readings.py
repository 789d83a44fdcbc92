"""What the scripts read from a server's files and answers (tooling/torchserve.py): its properties, whether a
model's workers are ready, and why a load failed, from the worker's log as TorchServe writes it."""

from __future__ import annotations

from tooling.torchserve import all_workers_ready, load_failure_cause, new_load_failure, read_properties


def test_a_property_whose_value_holds_an_equals_sign_is_read_whole(tmp_path):
    """Java options in config.properties (vmargs=-Dkey=value) are common: read at the first "=" only."""
    config = tmp_path / "config.properties"
    config.write_text("# a comment\nvmargs=-Dlog4j2.formatMsgNoLookups=true -Xmx1g\n\njob_queue_size = 66\n")
    assert read_properties(config) == {"vmargs": "-Dlog4j2.formatMsgNoLookups=true -Xmx1g", "job_queue_size": "66"}


def test_a_model_without_workers_is_not_ready():
    """A replica whose model has no worker (all died, none started yet) must not go back into rotation."""
    assert not all_workers_ready([{"workers": []}])
    assert not all_workers_ready([{"workers": [{"status": "READY"}, {"status": "UNLOADING"}]}])
    assert all_workers_ready([{"workers": [{"status": "READY"}, {"status": "READY"}]}])


def test_the_cause_of_a_failed_load_is_the_last_exception_a_worker_printed():
    log = (
        "2026-11-29 [INFO ] W-9000 MODEL_LOG - ValueError: an earlier, handled one\n"
        "2026-11-29 [INFO ] W-9000 MODEL_LOG - handlers.loading.ModelLoadFailed: cuda_graphs needs transformers 5\n"
    )
    assert load_failure_cause(log) == "handlers.loading.ModelLoadFailed: cuda_graphs needs transformers 5"
    assert load_failure_cause("2026-11-29 [INFO ] W-9000 MODEL_LOG - loaded\n") is None


def test_a_load_failure_is_read_after_the_log_rolled_over(tmp_path):
    """log4j starts model_log.log afresh when it rolls it over: shorter than where the reading began, it is read
    from its start, so serve.sh still prints why the load failed."""
    log = tmp_path / "model_log.log"
    log.write_text("2026-11-29 [INFO ] W-9000 MODEL_LOG - an earlier run's line\n" * 5)
    read = new_load_failure(log)
    assert read() is None
    log.write_text("2026-11-29 [INFO ] W-9000 MODEL_LOG - handlers.loading.ModelLoadFailed: boom\n")
    assert read() == "handlers.loading.ModelLoadFailed: boom"


def test_a_log_not_written_yet_gives_no_cause_until_it_is(tmp_path):
    """`--log` may name a file the server has not written (yet): no cause then, and the first lines once it is."""
    log = tmp_path / "model_log.log"
    read = new_load_failure(log)
    assert read() is None
    log.write_text("2026-11-29 [INFO ] W-9000 MODEL_LOG - handlers.loading.ModelLoadFailed: boom\n")
    assert read() == "handlers.loading.ModelLoadFailed: boom"
