"""scripts/update_model.py on a real TorchServe: a new archive takes over a model's name under load with
no request failed, one that cannot serve leaves the old version serving, and TorchServe's own recipe
(register, set-default, unregister at once) fails a batch in flight, which is why the drain exists.
Followed as docs/checkpoints.md writes it, a failed update leaves <model>.mar, the file a restart
registers, the old version's archive, and a successful one makes it the new version's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support import batches_received, wait_until
from tooling.archiving import build_archive, write_model_config
from tooling.checkpoints import HEADS, build_random_classifier
from tooling.corpus import LABELS
from tooling.model_archive import archive_name, archive_version
from tooling.paths import REPO
from tooling.torchserve import TorchServe

pytestmark = pytest.mark.e2e

SLOW = "slow"  # the test-only fault hook: a batch holding this word stalls STALL_S
STALL_S = 1.5
# The stall of the version TorchServe's own recipe unregisters: four times STALL_S, room for a loaded machine to switch
# and unregister while the batch is held (at 1.5 s a test stalled that long would see it answered). The held request
# waits 5 s past it (a batch answered after the stall must be seen), and TorchServe drops it unanswered: the test's
# length (60 s of stall took 106 s).
HELD_S = 6.0
# The old version's drain waits this long (plus its 20 ms delay) after its queue empties: four times STALL_S,
# room for a loaded 2-core machine.
RESPONSE_TIMEOUT_S = 6
# Two: while one holds a stalled batch, the other empties the queue, so only the drain's wait saves that batch.
OLD_WORKERS = 2
SERVER_DEFAULT_WORKERS = 1  # what a registration without initial_workers gets: the update must copy the old count
NEW_LABELS = set(HEADS["multi-label"]["id2label"].values())


@pytest.fixture(scope="module")
def kinds(tiny_checkpoint, tmp_path_factory) -> dict[str, tuple[Path, Path | None, str]]:
    """(checkpoint, model-config.yaml, version) of each kind of archive the tests serve."""
    out = tmp_path_factory.mktemp("update-checkpoints")
    config = tmp_path_factory.mktemp("update-config")
    old_config = write_model_config(
        config / "old.yaml", {"responseTimeout": RESPONSE_TIMEOUT_S}, fault_marker=SLOW, fault_delay_s=STALL_S
    )
    bad_config = write_model_config(config / "bad.yaml", None, max_length="long")
    failing_config = write_model_config(config / "failing.yaml", None, fault_marker="clean", fault_kind="error")
    held_config = write_model_config(
        config / "held.yaml", {"responseTimeout": 2 * HELD_S}, fault_marker=SLOW, fault_delay_s=HELD_S
    )
    multi_label = build_random_classifier(out / "multi-label", "tiny", seed=1, head="multi-label")
    return {
        "old": (tiny_checkpoint, old_config, "1.0"),
        "held": (tiny_checkpoint, held_config, "1.0"),  # as old, its stalls HELD_S long
        "new": (multi_label, None, "2.0"),
        "bad": (tiny_checkpoint, bad_config, "3.0"),  # fails to load
        "failing": (tiny_checkpoint, failing_config, "4.0"),  # loads, fails every text with "clean" in it
    }


@pytest.fixture(scope="module")
def archives(kinds, tmp_path_factory):
    """archives(kind, model): an archive of that kind naming `model` in its manifest (as the update requires: a restart
    registers it under that name), outside the server's store; each test copies it in under the file name it needs."""
    out = tmp_path_factory.mktemp("update-archives")
    built: dict[tuple[str, str], Path] = {}

    def archive(kind: str, model: str) -> Path:
        if (kind, model) not in built:
            checkpoint, config, version = kinds[kind]
            options = {"config_file": config} if config else {}
            built[kind, model] = build_archive(checkpoint, model, out / f"{model}-{kind}", version=version, **options)
        return built[kind, model]

    return archive


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir, store = tmp_path_factory.mktemp("update-server"), tmp_path_factory.mktemp("update-store")
    with TorchServe(workdir, store, overrides={"default_workers_per_model": str(SERVER_DEFAULT_WORKERS)}) as ts:
        yield ts


def install(server: TorchServe, archive: Path, file_name: str) -> Path:
    """Put `archive` into the server's store as `file_name`, over what is there (the guide's workflow)."""
    target = server.model_store / file_name
    shutil.copyfile(archive, target)
    return target


@pytest.fixture
def register_old(server, archives):
    """Registers the old archive as `model`, and unregisters every version of it after the test, pass or fail."""
    models = []

    def register(model: str, kind: str = "old", workers: int = OLD_WORKERS) -> None:
        install(server, archives(kind, model), f"{model}.mar")
        models.append(model)
        response = server.register(
            f"{model}.mar", batch_size=8, max_batch_delay=20, initial_workers=workers, model_name=model
        )
        assert response.status_code == 200, response.text

    yield register
    for model in models:
        unregister_all(server, model)


def unregister_all(server: TorchServe, model: str) -> None:
    """Every version of `model`, the default last (TorchServe insists)."""
    try:
        default = server.describe(model)[0]["modelVersion"]
    except requests.HTTPError:  # never registered, or already gone
        return
    others = [entry["modelVersion"] for entry in versions(server, model) if entry["modelVersion"] != default]
    for version in [*others, default]:
        server.session.delete(
            f"{server.management_url}/models/{model}/{version}", headers=server.auth("management"), timeout=60
        )


def update_command(server: TorchServe, archive: Path, *extra: str) -> list[str]:
    paths = ["--config", str(server.config_path), "--key-file", str(server.key_file)]
    return [
        sys.executable,
        "-m",
        "scripts.update_model",
        str(archive),
        *extra,
        *paths,
        "--log",
        str(server.log_dir / "model_log.log"),
    ]


def run_update(
    server: TorchServe, archive: Path, *extra: str, cpus: set[int] | None = None
) -> subprocess.CompletedProcess:
    """The update command to its end, on `cpus` (its affinity: the CPUs it counts for the new version's workers) where
    given; its limit is below pytest's per-test timeout, so a hang fails here, named."""
    return subprocess.run(
        update_command(server, archive, *extra), cwd=REPO, capture_output=True, text=True, timeout=240,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )  # fmt: skip


def versions(server: TorchServe, model: str) -> list[dict]:
    return server.describe(f"{model}/all")


def predict_label(server: TorchServe, model: str, text: str, timeout: float = 30.0) -> tuple[int, str | None]:
    try:
        response = server.predict(model, text, timeout=timeout)
    except requests.RequestException as error:
        return 0, type(error).__name__
    return response.status_code, response.json().get("label") if response.status_code == 200 else response.text


def test_a_new_archive_takes_over_under_load_and_no_request_fails(server, archives, register_old, tmp_path):
    model = "swap"
    register_old(model)
    stop = threading.Event()
    answers: list[tuple[float, int, str | None]] = []  # (when it came, status, label)
    switched_at: list[float] = []

    def client(text: str) -> None:
        count = 0
        while not stop.is_set():
            count += 1
            status, label = predict_label(server, model, f"{text} {count}")
            answers.append((time.monotonic(), status, label))

    def held_across_the_switch() -> None:
        # Sent to 1.0 by name as the new version passes its probe, just before the switch: it stalls STALL_S in an old
        # worker, so it is answered after the switch however late this test reads the update's "is the default" line
        # (the clients' stalled batches alone left that to the reading's delay against where a stall stood).
        status, label = predict_label(server, f"{model}/1.0", f"a {SLOW} one sent to 1.0 as it is replaced")
        held.append((time.monotonic(), status, label))

    held: list[tuple[float, int, str | None]] = []
    update: subprocess.Popen | None = None
    errors = tmp_path / "update.stderr"  # a file, not a pipe: nothing it writes can block it while stdout is read
    with ThreadPoolExecutor(max_workers=8) as pool, errors.open("w") as stderr_file:
        clients = [pool.submit(client, f"client {index}: the room was clean") for index in range(6)]
        # Keeps an old worker busy with a stalled batch almost all the time, so one is in flight at the
        # switch: the drain must let it finish. The new archive has no fault hook and answers at once.
        clients.append(pool.submit(client, f"a {SLOW} one that was held up"))
        try:
            # The load is on before the update starts: answers are coming back from the old version.
            wait_until(lambda: any(label in LABELS for _, _, label in answers), 60, "an answer from the old version")
            archive = install(server, archives("new", model), f"{model}-2.0.mar")
            update = subprocess.Popen(
                update_command(server, archive, "--model", model),
                cwd=REPO, stdout=subprocess.PIPE, stderr=stderr_file, text=True,
            )  # fmt: skip
            output = []
            for line in update.stdout:
                output.append(line)
                if "answered the probe" in line:
                    clients.append(pool.submit(held_across_the_switch))
                if "is the default" in line:
                    switched_at.append(time.monotonic())
            update.wait(timeout=240)
            ended = time.monotonic()
            # The old version is gone once the update ends: the clients' next answers are the new version's.
            wait_until(
                lambda: any(when > ended and label in NEW_LABELS for when, _, label in answers),
                60,
                lambda: f"an answer from the new version after the update; last answers: {answers[-3:]}",
            )
        finally:
            stop.set()  # before the pool's exit waits for the clients
            if update is not None and update.poll() is None:  # it did not finish: stopped, by its pid
                update.kill()
                update.wait(timeout=30)
            if update is not None:
                update.stdout.close()
        for future in clients:
            future.result()
    stderr = errors.read_text()

    assert update.returncode == 0, stderr
    assert switched_at and "unregistered" in output[-1], output
    failed = [answer for answer in answers if answer[1] != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed during the update: {failed[:5]}"
    labels = [label for _, _, label in sorted(answers)]
    assert labels[0] in LABELS and labels[-1] in NEW_LABELS, (labels[:3], labels[-3:])
    # The drain mattered: the old version answered what it held at the switch.
    [(when, status, label)] = held
    assert status == 200 and label in LABELS and when > switched_at[0], (held, switched_at)
    [served] = versions(server, model)
    assert served["modelVersion"] == "2.0"
    assert (served["batchSize"], served["maxBatchDelay"], served["minWorkers"]) == (8, 20, OLD_WORKERS)
    assert len(served["workers"]) == OLD_WORKERS and all(worker["status"] == "READY" for worker in served["workers"])
    # What a restart registers is the version that now serves.
    assert (server.model_store / f"{model}.mar").read_bytes() == archive.read_bytes()


def test_torchserves_own_recipe_fails_a_batch_in_flight(server, archives, register_old):
    """Pins TorchServe 0.12: unregistering a version right after the switch fails what it holds."""
    model = "naive"
    register_old(model, "held")
    install(server, archives("new", model), "naive-2.mar")
    assert server.register("naive-2.mar", model_name=model, initial_workers=1).status_code == 200
    with ThreadPoolExecutor(max_workers=1) as pool:
        # By name, so it reaches 1.0 whenever it arrives; queued or in flight there, the unregister fails it.
        received = batches_received(server, model, "1.0")
        held = pool.submit(predict_label, server, f"{model}/1.0", f"a {SLOW} one that was held up", HELD_S + 5)
        # In flight: a worker of 1.0 has taken its batch, which it holds for HELD_S from then.
        wait_until(lambda: batches_received(server, model, "1.0") > received, 30, f"a worker of {model}/1.0 to take it")
        management = f"{server.management_url}/models/{model}"
        headers = server.auth("management")
        assert requests.put(f"{management}/2.0/set-default", headers=headers, timeout=10).status_code == 200
        assert requests.delete(f"{management}/1.0", headers=headers, timeout=60).status_code == 200
        status, _ = held.result()
    # 500 "Worker died." for a batch in flight, no answer at all (0) for one still queued or being collected.
    assert status in (0, 500), f"{status}: TorchServe now treats what a version holds otherwise: revisit the drain"


def test_an_archive_that_cannot_serve_leaves_the_old_version_serving(server, archives, register_old, tmp_path):
    model = "rollback"
    register_old(model)
    restart_file = (server.model_store / f"{model}.mar").read_bytes()
    bad = install(server, archives("bad", model), "rollback-3.mar")
    update = run_update(server, bad, "--model", model)
    assert update.returncode == 1
    assert "still serves, unchanged" in update.stderr and "max_length" in update.stderr, update.stderr
    assert [served["modelVersion"] for served in versions(server, model)] == ["1.0"]

    # Loads, but fails the probe (its fault hook fails every text with "clean" in it).
    probe = tmp_path / "probe.txt"
    probe.write_text("the room was clean")
    failing = install(server, archives("failing", model), "rollback-4.mar")
    update = run_update(server, failing, "--model", model, "--probe", str(probe))
    assert update.returncode == 1
    assert "answered the probe with HTTP 500" in update.stderr and "4.0 is unregistered again" in update.stderr
    assert [served["modelVersion"] for served in versions(server, model)] == ["1.0"]
    assert predict_label(server, model, "the room was clean")[0] == 200

    again = run_update(server, install(server, archives("old", model), "rollback-1.mar"), "--model", model)
    assert again.returncode == 1 and "already has a version 1.0" in again.stderr, again.stderr

    elsewhere = tmp_path / "rollback-5.mar"
    shutil.copyfile(archives("new", model), elsewhere)
    outside = run_update(server, elsewhere, "--model", model)
    assert outside.returncode == 2 and "not in the server's model store" in outside.stderr, outside.stderr

    # Named for another model: after the update it would be rollback.mar, which a restart registers by that name.
    other = run_update(server, install(server, archives("new", "other"), "rollback-2.mar"), "--model", model)
    assert other.returncode == 1 and "names its model 'other', not 'rollback'" in other.stderr, other.stderr

    # The guide's old way: the new version written over rollback.mar, what a restart registers, is refused.
    overwritten = run_update(server, install(server, archives("new", model), f"{model}.mar"))
    assert overwritten.returncode == 1 and "the file a restart registers" in overwritten.stderr, overwritten.stderr
    assert [served["modelVersion"] for served in versions(server, model)] == ["1.0"]
    assert predict_label(server, model, "the room was clean")[0] == 200
    (server.model_store / f"{model}.mar").write_bytes(restart_file)


def archive_command(server: TorchServe, checkpoint: Path, model: str, version: str, *extra: str) -> list[str]:
    """docs/checkpoints.md's archive_model line, into the test server's store (and checked against that server)."""
    return [
        sys.executable, "-m", "scripts.archive_model", str(checkpoint), "--name", model, "--version", version,
        "--export-path", str(server.model_store),
        "--server-config", str(server.config_path), "--key-file", str(server.key_file), *extra,
    ]  # fmt: skip


def archive_per_guide(server: TorchServe, checkpoint: Path, model: str, version: str, *extra: str):
    return subprocess.run(
        archive_command(server, checkpoint, model, version, *extra), cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def restarted_version(server: TorchServe, model: str) -> tuple[str, str | None]:
    """What a restart would serve: <model>.mar registered afresh (under another name, beside the running model) and
    asked once; (its version, the label it answers). scripts/serve.sh registers it by its manifest's name."""
    restart = server.model_store / f"{model}.mar"
    assert archive_name(restart) == model
    fresh = f"{model}-restart"
    response = server.register(restart.name, model_name=fresh, initial_workers=1)
    assert response.status_code == 200, response.text
    try:
        [described] = server.describe(fresh)
        status, label = predict_label(server, fresh, "the room was clean")
        assert status == 200, label
        return described["modelVersion"], label
    finally:
        unregister_all(server, fresh)


def test_the_guides_update_leaves_a_restart_serving_the_last_version_that_passed(server, kinds, register_old):
    model = "guide"
    register_old(model, workers=1)  # what scripts/serve.sh starts for it: its cpu_threads 0 takes every CPU
    store = server.model_store
    tiny, bad_config, _ = kinds["bad"]
    multi_label = kinds["new"][0]

    # The old guide's way, the new version over guide.mar, is refused: it is what guide 1.0 was registered from.
    over = archive_per_guide(server, multi_label, model, "2.0")
    assert over.returncode == 2 and "--file-name guide-2.0.mar" in over.stderr, over.stderr
    assert archive_version(store / "guide.mar") == "1.0"

    # A new version that cannot load, archived under a file name of its own as the guide says: the update fails ...
    bad = ("--file-name", "guide-3.0.mar", "--config", str(bad_config))
    archived = archive_per_guide(server, tiny, model, "3.0", *bad)
    assert archived.returncode == 0, archived.stderr
    failed = run_update(server, store / "guide-3.0.mar")
    assert failed.returncode == 1 and "1.0 still serves, unchanged" in failed.stderr, failed.stderr
    # ... and a restart serves 1.0, the version that still serves, not the one that failed.
    version, label = restarted_version(server, model)
    assert version == "1.0" and label in LABELS, (version, label)

    # A new version that serves: once it does and 1.0 is gone, guide.mar is its archive. Archived with one thread per
    # worker as the guide says, it runs serve.sh's count for that on the update's CPUs (two here), not 1.0's one.
    new = ("--file-name", "guide-2.0.mar", "--handler-option", "cpu_threads=1")
    archived = archive_per_guide(server, multi_label, model, "2.0", *new)
    assert archived.returncode == 0, archived.stderr
    two_cpus = set(sorted(os.sched_getaffinity(0))[:2])
    updated = run_update(server, store / "guide-2.0.mar", cpus=two_cpus)
    assert updated.returncode == 0, updated.stderr
    assert "guide.mar is now 2.0's archive" in updated.stdout, updated.stdout
    assert f"==> note: guide 2.0 gets {len(two_cpus)} worker(s), where 1.0 has 1: " in updated.stdout, updated.stdout
    [served] = versions(server, model)
    assert (served["modelVersion"], served["minWorkers"]) == ("2.0", len(two_cpus))
    assert (store / "guide.mar").read_bytes() == (store / "guide-2.0.mar").read_bytes()
    version, label = restarted_version(server, model)
    assert version == "2.0" and label in NEW_LABELS, (version, label)
    assert not [path.name for path in store.iterdir() if path.name.startswith(".")], "a partial file was left"
