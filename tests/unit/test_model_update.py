"""tooling/model_update.py and scripts/archive_model.py against a stand-in for TorchServe's management and inference
APIs (a local HTTP server that answers as TorchServe 0.12 does, and records what it was asked): keys that would lapse
before the update could end are refused before any change; <store>/<model>.mar, the file a restart registers, holds
the old version until the new one serves, and the new one after; archive_model refuses to write a new version over the
file a registered version was loaded from. tests/e2e/test_model_update.py runs the same against a real TorchServe."""

from __future__ import annotations

import json
import threading
import zipfile
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from scripts import archive_model
from scripts import update_model as update_model_command
from tests.deploy.manifests import archive_with_handler_options
from tooling import model_update
from tooling.model_update import UpdateFailed, keep_for_restart, update_bound_s, update_model
from tooling.torchserve import RunningServer

MODEL = "sentiment"
PROBE = b"the room was clean"
# The old version's batching: its drain waits out maxBatchDelay + responseTimeout once its queue is empty.
MAX_BATCH_DELAY_MS, RESPONSE_TIMEOUT_S = 500, 120
# What FakeTorchServe.faults makes it answer a call with, besides (status, body): no answer (the connection closed, as
# a server that died or a proxy that gave up), or TorchServe's refusal of an expired key.
DROP, REFUSE_KEY = "drop", "refuse key"


def write_archive(path: Path, name: str, version: str, config: dict | None = None) -> Path:
    """A .mar as far as the update reads one: its manifest, and the checkpoint's config.json where given (with handler
    options: tests/deploy/manifests.archive_with_handler_options)."""
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": version}}))
        if config is not None:
            mar.writestr("model/config.json", json.dumps(config))
    return path


class FakeTorchServe(ThreadingHTTPServer):
    """The calls an update makes, answered from `versions` (version -> file it was registered from)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.versions: dict[str, str] = {}
        self.default: str | None = None
        self.register_status = 200
        self.probe_status = 200
        self.calls: list[tuple[str, str]] = []
        # call ("register", "set-default", "unregister", "probe", "list") -> DROP, REFUSE_KEY or (status, body)
        self.faults: dict[str, str | tuple[int, bytes]] = {}
        # version -> the requests its queue holds; each description of that version shows one fewer while `draining`
        self.queued: dict[str, int] = {}
        self.draining = True
        self.workers, self.gpu = 2, False  # each version's, and whether they hold GPUs
        self.registered: list[dict[str, list[str]]] = []  # each registration's query parameters

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def describe(self, version: str) -> dict:
        return {
            "modelName": MODEL,
            "modelVersion": version,
            "modelUrl": self.versions[version],
            "batchSize": 8,
            "maxBatchDelay": MAX_BATCH_DELAY_MS,
            "minWorkers": self.workers,
            "responseTimeout": RESPONSE_TIMEOUT_S,
            "jobQueueStatus": {"pendingRequests": self.queued.get(version, 0)},
            "workers": [{"id": str(9000 + n), "status": "READY", "gpu": self.gpu} for n in range(self.workers)],
        }

    def call_of(self, method: str, segments: list[str]) -> str | None:
        if method == "GET" and segments == ["models"]:
            return "list"
        if method == "POST":
            return {"models": "register", "predictions": "probe"}.get(segments[0])
        if method == "PUT" and segments[-1] == "set-default":
            return "set-default"
        return "unregister" if method == "DELETE" else None


class _Handler(BaseHTTPRequestHandler):
    server: FakeTorchServe

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        fake, parts = self.server, urlsplit(self.path)
        fake.calls.append((method, parts.path))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        segments = parts.path.strip("/").split("/")
        fault = fake.faults.get(fake.call_of(method, segments))
        if fault == DROP:
            self.close_connection = True
            return None
        if fault == REFUSE_KEY:
            return self._answer(400, {"code": 400, "type": "InvalidKeyException", "message": "Token is not valid"})
        if fault is not None:
            status, body = fault
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        if method == "GET" and segments == ["models"]:
            models = [{"modelName": MODEL, "modelUrl": fake.versions[fake.default]}] if fake.default else []
            return self._answer(200, {"models": models})
        if segments[:2] == ["models", MODEL] and fake.default:
            rest = segments[2:]
            if method == "GET" and rest == []:
                return self._answer(200, [fake.describe(fake.default)])
            if method == "GET" and rest == ["all"]:
                return self._answer(200, [fake.describe(version) for version in fake.versions])
            if method == "GET" and len(rest) == 1 and rest[0] in fake.versions:
                described = fake.describe(rest[0])
                if fake.draining and fake.queued.get(rest[0]):
                    fake.queued[rest[0]] -= 1
                return self._answer(200, [described])
            if method == "PUT" and len(rest) == 2 and rest[1] == "set-default" and rest[0] in fake.versions:
                fake.default = rest[0]
                return self._answer(200, {"status": "Default version succsesfully updated"})
            if method == "DELETE" and len(rest) == 1 and rest[0] in fake.versions:
                del fake.versions[rest[0]]
                return self._answer(200, {"status": "Model unregistered"})
        if method == "POST" and segments == ["models"]:
            if fake.register_status != 200:
                return self._answer(fake.register_status, {"message": "Failed to start workers"})
            fake.registered.append(parse_qs(parts.query))
            url = parse_qs(parts.query)["url"][0]
            fake.versions[_manifest_version(fake, url)] = url
            return self._answer(200, {"status": "Model registered"})
        if method == "POST" and segments[:2] == ["predictions", MODEL]:
            return self._answer(fake.probe_status, {"label": "positive"})
        return self._answer(404, {"message": f"no {method} {parts.path} here"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")


def _manifest_version(fake: FakeTorchServe, url: str) -> str:
    from tooling.model_archive import archive_version

    return archive_version(fake.store / url)


@pytest.fixture
def fake(tmp_path):
    """The stand-in, serving `sentiment` 1.0 from sentiment.mar, as scripts/serve.sh registers it."""
    server = FakeTorchServe()
    server.store = tmp_path / "store"
    server.store.mkdir()
    write_archive(server.store / f"{MODEL}.mar", MODEL, "1.0")
    server.versions, server.default = {"1.0": f"{MODEL}.mar"}, "1.0"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def key_file(tmp_path: Path, lasting_s: float) -> Path:
    expires = (datetime.now(timezone.utc) + timedelta(seconds=lasting_s)).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    path = tmp_path / "key_file.json"
    path.write_text(
        json.dumps(
            {
                "management": {"key": "m", "expiration time": expires},
                "inference": {"key": "i", "expiration time": expires},
                "API": {"key": "a"},
            }
        )
    )
    return path


def running(fake: FakeTorchServe, keys: Path) -> RunningServer:
    return RunningServer(fake.url, fake.url, fake.store, keys)


def changes(fake: FakeTorchServe) -> list[tuple[str, str]]:
    return [call for call in fake.calls if call[0] != "GET"]


# ---- keys that would lapse before the update could end ---------------------------------------------------------


def test_the_bound_covers_the_load_the_probe_the_drain_and_the_other_calls():
    grace = MAX_BATCH_DELAY_MS / 1000 + RESPONSE_TIMEOUT_S
    assert update_bound_s(600, grace) == 600 + model_update.PROBE_TIMEOUT_S + 600 + grace + model_update.CALLS_MARGIN_S
    # deploy/systemd's timer rotates the keys every 30 minutes (they last 60; systemd may fire it a minute late), so an
    # update started at any moment has 29 left: the demo's (responseTimeout 60) must fit, or updates would be refused.
    assert update_bound_s(600, 0.002 + 60) < 29 * 60


def test_keys_that_would_lapse_during_the_drain_are_refused_before_any_change(fake, tmp_path):
    """Keys that outlast the load (the only span checked before) but not the drain that follows it."""
    grace = MAX_BATCH_DELAY_MS / 1000 + RESPONSE_TIMEOUT_S
    lasting = 600 + model_update.PROBE_TIMEOUT_S + 600 + grace / 2
    write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    server = running(fake, key_file(tmp_path, lasting))
    fake.register_status = 500  # were the keys taken, the update would stop here, not in the drain's long wait
    with pytest.raises(UpdateFailed, match=r"run python -m scripts.rotate_keys first; nothing was changed") as failed:
        update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, say=lambda _: None)
    assert f"then {grace:g} s" in str(failed.value)
    assert changes(fake) == [] and fake.versions == {"1.0": f"{MODEL}.mar"}


def test_keys_that_outlast_the_whole_update_are_taken(fake, tmp_path):
    grace = MAX_BATCH_DELAY_MS / 1000 + RESPONSE_TIMEOUT_S
    write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    server = running(fake, key_file(tmp_path, update_bound_s(600, grace) + 60))
    update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert fake.versions == {"2.0": f"{MODEL}-2.0.mar"}


# ---- the file a restart registers ------------------------------------------------------------------------------


def test_a_failed_update_leaves_the_restart_archive_the_old_version(fake, tmp_path):
    before = (fake.store / f"{MODEL}.mar").read_bytes()
    write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    server = running(fake, key_file(tmp_path, 3600))
    fake.probe_status = 500
    with pytest.raises(UpdateFailed, match=r"1\.0 still serves, unchanged"):
        update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    fake.probe_status, fake.register_status = 200, 500
    with pytest.raises(UpdateFailed, match=r"1\.0 still serves, unchanged"):
        update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert (fake.store / f"{MODEL}.mar").read_bytes() == before
    assert sorted(path.name for path in fake.store.iterdir()) == [f"{MODEL}-2.0.mar", f"{MODEL}.mar"]


def test_a_successful_update_puts_the_new_archive_where_a_restart_finds_it(fake, tmp_path):
    new = write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    said: list[str] = []
    update_model(running(fake, key_file(tmp_path, 3600)), MODEL, new.name, "2.0", PROBE, grace_s=0, say=said.append)
    assert (fake.store / f"{MODEL}.mar").read_bytes() == new.read_bytes()
    assert sorted(path.name for path in fake.store.iterdir()) == [f"{MODEL}-2.0.mar", f"{MODEL}.mar"]
    assert said[-1].endswith(f"{fake.store / MODEL}.mar is now 2.0's archive, what a restart registers"), said
    # Only once the new version served and the old one was gone.
    assert changes(fake)[-1] == ("DELETE", f"/models/{MODEL}/1.0")


SENTIMENT = {"id2label": {"0": "negative", "1": "positive"}}


@pytest.mark.parametrize(
    ("config", "note"),
    [
        (SENTIMENT, None),
        (
            {"id2label": {"0": "toxic", "1": "spam", "2": "offtopic"}, "problem_type": "multi_label_classification"},
            "==> note: 2.0 answers otherwise than 1.0: labels negative, positive -> toxic, spam, offtopic; scores "
            "softmax -> sigmoid (handlers/scores.py). Clients reading label names or comparing scores see it as soon "
            "as it serves",
        ),
        ({"id2label": {"0": "negative", "1": "positive"}, "problem_type": "regression"}, "scores softmax -> none"),
    ],
    ids=["same-answers", "other-labels-and-scores", "other-scores"],
)
def test_an_update_to_a_model_that_answers_otherwise_says_so_and_goes_on(fake, tmp_path, config, note):
    """A new label set may be the point of the update, so it is not refused; but every client reading label names
    sees it the moment the new version serves, so the operator is told before."""
    write_archive(fake.store / f"{MODEL}.mar", MODEL, "1.0", SENTIMENT)
    new = write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0", config)
    said: list[str] = []
    update_model(running(fake, key_file(tmp_path, 3600)), MODEL, new.name, "2.0", PROBE, grace_s=0, say=said.append)
    notes = [line for line in said if line.startswith("==> note:")]
    assert fake.default == "2.0"
    if note is None:
        assert notes == [], said
    else:
        assert len(notes) == 1 and note in notes[0] and said[0] == notes[0], said  # before anything is registered


# ---- the new version's workers on a CPU ------------------------------------------------------------------------


def update_with_threads(fake: FakeTorchServe, tmp_path: Path, old: int, new: int, cpus: int) -> tuple[int, list[str]]:
    """sentiment 1.0 (cpu_threads `old`, fake.workers workers) updated to 2.0 (cpu_threads `new`) on `cpus` CPUs: the
    workers 2.0 was registered with, and the notes and warnings said."""
    archive_with_handler_options(fake.store / f"{MODEL}.mar", {"cpu_threads": old}, MODEL, "1.0")
    archive_with_handler_options(fake.store / f"{MODEL}-2.0.mar", {"cpu_threads": new}, MODEL, "2.0")
    said: list[str] = []
    server = running(fake, key_file(tmp_path, 3600))
    update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0, say=said.append, cpus=cpus)
    [registration] = fake.registered
    return int(registration["initial_workers"][0]), [line for line in said if line.startswith(("==> note", "==> warn"))]


@pytest.mark.parametrize(
    ("old", "workers", "new", "expected"),
    [(1, 4, 0, 1), (0, 1, 1, 4), (1, 4, 2, 2)],
    ids=["one-thread-to-every-cpu", "every-cpu-to-one-thread", "one-thread-to-two"],
)
def test_workers_sized_by_serve_sh_are_sized_again_for_the_new_archives_threads(
    fake, tmp_path, old, workers, new, expected
):
    """The documented archive command without cpu_threads=1 makes a cpu_threads 0 archive: run with 1.0's four
    one-thread workers, each of its workers would run four threads on 4 CPUs (6-9x fewer requests/s). A count that is
    serve.sh's for the old archive becomes serve.sh's for the new one, the count a restart will start."""
    fake.workers = workers
    registered, said = update_with_threads(fake, tmp_path, old, new, cpus=4)
    assert registered == expected, said
    [note] = [line for line in said if "worker(s), where 1.0 has" in line]
    assert note.startswith(f"==> note: {MODEL} 2.0 gets {expected} worker(s), where 1.0 has {workers}: "), note
    assert not [line for line in said if line.startswith("==> warning")], said
    if new == 0:
        assert "archived with --handler-option cpu_threads=1 it runs one per CPU" in note, note


def test_a_count_chosen_otherwise_is_kept_and_warned_of_where_its_threads_outnumber_the_cpus(fake, tmp_path):
    fake.workers = 3  # not serve.sh's 4 for 1.0's one thread on 4 CPUs: WORKERS=3, say
    registered, said = update_with_threads(fake, tmp_path, old=1, new=2, cpus=4)
    assert registered == 3, said
    assert said == [
        f"==> warning: {MODEL} 2.0: 3 worker(s) of 2 threads each on 4 CPUs: more threads than CPUs, which cost a "
        f"PyTorch archive 6-9x its requests/s; scale it to 2 once it serves "
        f"(PUT /models/{MODEL}/2.0?min_worker=2&max_worker=2) (docs/batching.md)"
    ]
    fake.registered.clear()
    fake.versions, fake.default = {"1.0": f"{MODEL}.mar"}, "1.0"  # served again as before the update
    registered, said = update_with_threads(fake, tmp_path, old=1, new=1, cpus=4)
    assert (registered, said) == (3, [])  # kept, and fitting: nothing to say


def test_workers_whose_old_archive_is_gone_are_kept(fake, tmp_path):
    """1.0's archive no longer in the store: whether its count was serve.sh's cannot be told, so it is kept."""
    fake.workers = 4
    archive_with_handler_options(fake.store / "gone.mar", {"cpu_threads": 1}, MODEL, "1.0")
    fake.versions = {"1.0": "gone.mar"}
    archive_with_handler_options(fake.store / f"{MODEL}-2.0.mar", {"cpu_threads": 1}, MODEL, "2.0")
    (fake.store / "gone.mar").unlink()
    update_model(running(fake, key_file(tmp_path, 3600)), MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0,
                 say=lambda _: None, cpus=8)  # fmt: skip
    assert fake.registered[0]["initial_workers"] == ["4"]


def test_workers_on_a_gpu_are_kept_whatever_the_archives_threads(fake, tmp_path):
    fake.workers, fake.gpu = 4, True
    assert update_with_threads(fake, tmp_path, old=1, new=0, cpus=4) == (4, [])


def test_the_restart_archive_itself_is_refused_as_the_new_version(fake, tmp_path):
    """The guide's old way: the new version archived over sentiment.mar, where a failed update would leave it."""
    write_archive(fake.store / f"{MODEL}.mar", MODEL, "2.0")
    server = running(fake, key_file(tmp_path, 3600))
    with pytest.raises(UpdateFailed, match=r"the file a restart registers .* --file-name sentiment-2.0.mar"):
        update_model(server, MODEL, f"{MODEL}.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert changes(fake) == []


def test_an_archive_named_for_another_model_is_refused(fake, tmp_path):
    """A restart registers sentiment.mar under its manifest's name: it must be the model's."""
    write_archive(fake.store / "other-2.0.mar", "other", "2.0")
    server = running(fake, key_file(tmp_path, 3600))
    with pytest.raises(UpdateFailed, match="names its model 'other', not 'sentiment'"):
        update_model(server, MODEL, "other-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert changes(fake) == []


def test_the_restart_archive_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    (store / f"{MODEL}.mar").write_bytes(b"old")
    (store / f"{MODEL}-2.0.mar").write_bytes(b"new" * 1000)

    def disk_full(source, out, length=0):
        out.write(source.read(10))
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(model_update.shutil, "copyfileobj", disk_full)
        with pytest.raises(OSError, match="No space"):
            keep_for_restart(store, f"{MODEL}-2.0.mar", MODEL)
    assert (store / f"{MODEL}.mar").read_bytes() == b"old"
    assert sorted(path.name for path in store.iterdir()) == [f"{MODEL}-2.0.mar", f"{MODEL}.mar"]
    inode = (store / f"{MODEL}.mar").stat().st_ino
    assert keep_for_restart(store, f"{MODEL}-2.0.mar", MODEL) == store / f"{MODEL}.mar"
    assert (store / f"{MODEL}.mar").read_bytes() == b"new" * 1000
    assert (store / f"{MODEL}.mar").stat().st_ino != inode, "written in place, not renamed over it"


# ---- where an update stops, and what serves then ------------------------------------------------------------------


def update_to_2(fake: FakeTorchServe, server: RunningServer, **options) -> None:
    """The update of `sentiment` to 2.0, from sentiment-2.0.mar, with no drain's grace unless `options` give one."""
    write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, **{"grace_s": 0, "say": lambda _: None, **options})


def restart_archive_version(fake: FakeTorchServe) -> str:
    from tooling.model_archive import archive_version

    return archive_version(fake.store / f"{MODEL}.mar")


def test_a_model_the_server_does_not_serve_is_named_and_nothing_is_changed(fake, tmp_path):
    write_archive(fake.store / "absent-2.0.mar", "absent", "2.0")
    server = running(fake, key_file(tmp_path, 3600))
    with pytest.raises(UpdateFailed, match=f"^absent is not registered on {fake.url}$"):
        update_model(server, "absent", "absent-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert changes(fake) == []


def test_a_file_that_is_not_an_archive_is_refused_before_any_change(fake, tmp_path):
    (fake.store / f"{MODEL}-2.0.mar").write_bytes(b"not a zip")
    server = running(fake, key_file(tmp_path, 3600))
    with pytest.raises(UpdateFailed, match=r"not a TorchServe model archive .*; nothing was changed$"):
        update_model(server, MODEL, f"{MODEL}-2.0.mar", "2.0", PROBE, grace_s=0, say=lambda _: None)
    assert fake.calls == []


def test_a_server_without_token_authorization_is_updated_without_keys(fake):
    """config.properties may turn token authorization off (docs/configuration.md): there is no key file to check."""
    update_to_2(fake, RunningServer(fake.url, fake.url, fake.store, None))
    assert fake.versions == {"2.0": f"{MODEL}-2.0.mar"} and restart_archive_version(fake) == "2.0"


def test_a_registration_that_gets_no_answer_says_the_new_version_may_still_be_loading(fake, tmp_path):
    """No answer is not a refusal: TorchServe may still be loading it, so it is named for the operator to drop, not
    unregistered blind."""
    fake.faults["register"] = DROP
    expected = (
        r"registering sentiment-2\.0\.mar got no answer \(.*\); sentiment 1\.0 still serves, and 2\.0 may still be "
        r"loading: DELETE /models/sentiment/2\.0 to drop it"
    )
    with pytest.raises(UpdateFailed, match=expected):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert ("DELETE", f"/models/{MODEL}/2.0") not in fake.calls and restart_archive_version(fake) == "1.0"


def test_a_refusal_that_is_not_json_is_quoted_as_the_server_wrote_it(fake, tmp_path):
    """A proxy's error page, say, in front of the management API."""
    fake.faults["register"] = (502, b"<html>Bad Gateway</html>\n")
    with pytest.raises(UpdateFailed, match=r"failed \(HTTP 502: <html>Bad Gateway</html>\); 2\.0 is not registered"):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (DROP, r"answered the probe with HTTP 0 \(.*Connection aborted"),
        (REFUSE_KEY, r"answered the probe with HTTP 400 \(the server refused the inference key .*scripts\.rotate_keys"),
    ],
    ids=["no-answer", "key-refused"],
)
def test_a_probe_without_an_answer_withdraws_the_new_version_and_says_why(fake, tmp_path, fault, said):
    fake.faults["probe"] = fault
    with pytest.raises(UpdateFailed, match=said + r".*2\.0 is unregistered again, and sentiment 1\.0 still serves"):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert fake.versions == {"1.0": f"{MODEL}.mar"} and fake.default == "1.0"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (DROP, r"unregistering 2\.0 failed \(.*Connection aborted.*\): DELETE /models/sentiment/2\.0"),
        (REFUSE_KEY, r"unregistering 2\.0 failed \(the server refused the management key .*\): DELETE /models/.*"),
        ((500, b'{"message": "busy"}'), r"unregistering 2\.0 failed \(HTTP 500\): DELETE /models/sentiment/2\.0"),
    ],
    ids=["no-answer", "key-refused", "http-500"],
)
def test_a_new_version_that_cannot_be_withdrawn_is_named_with_the_call_that_drops_it(fake, tmp_path, fault, said):
    """The probe failed; the unregister of the new version fails too: the operator is told what to send."""
    fake.probe_status, fake.faults["unregister"] = 500, fault
    with pytest.raises(UpdateFailed, match=said + r", and sentiment 1\.0 still serves, unchanged\.$"):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert fake.default == "1.0" and restart_archive_version(fake) == "1.0"


def test_a_switch_the_server_refuses_withdraws_the_new_version(fake, tmp_path):
    fake.faults["set-default"] = (500, b'{"code": 500, "message": "cannot set default"}')
    expected = (
        r"making 2\.0 the default failed \(HTTP 500: cannot set default\); 2\.0 is unregistered again, and "
        r"sentiment 1\.0 still serves"
    )
    with pytest.raises(UpdateFailed, match=expected):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert fake.versions == {"1.0": f"{MODEL}.mar"} and fake.default == "1.0"
    assert restart_archive_version(fake) == "1.0"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (REFUSE_KEY, r"the server refused the management key .*\. sentiment 2\.0 serves; 1\.0 may still be registered: "
                     r"DELETE /models/sentiment/1\.0 with a new key"),
        (DROP, r"Connection aborted.*: sentiment 2\.0 serves; whether 1\.0 is still registered, GET "
               r"/models/sentiment/all shows"),
        ((500, b'{"message": "busy"}'), r"sentiment 2\.0 serves, but unregistering 1\.0 failed \(HTTP 500: busy\): "
                                       r"DELETE /models/sentiment/1\.0 once it is idle"),
    ],
    ids=["key-refused", "no-answer", "http-500"],
)  # fmt: skip
def test_once_the_new_version_serves_a_failed_retirement_of_the_old_still_leaves_the_new_for_a_restart(
    fake, tmp_path, fault, said
):
    """After the switch every request goes to 2.0: a restart must register 2.0 too, whatever became of 1.0."""
    fake.faults["unregister"] = fault
    kept = r"; .*sentiment\.mar is now 2\.0's archive, what a restart registers$"
    with pytest.raises(UpdateFailed, match=said + kept):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert fake.default == "2.0" and restart_archive_version(fake) == "2.0"


def test_the_old_version_is_unregistered_only_once_its_queue_is_empty(fake, tmp_path):
    fake.queued["1.0"] = 3  # one fewer at each description: the fourth shows it empty
    update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    described = [index for index, call in enumerate(fake.calls) if call == ("GET", f"/models/{MODEL}/1.0")]
    assert len(described) == 4 and fake.calls.index(("DELETE", f"/models/{MODEL}/1.0")) > described[-1], fake.calls


def test_a_queue_still_full_at_the_deadline_stops_the_update_with_the_new_version_serving(fake, tmp_path):
    fake.queued["1.0"], fake.draining = 5, False
    expected = (
        r"sentiment 1\.0 still had queued requests at the deadline; the new version serves, and 1\.0 stays "
        r"registered: DELETE /models/sentiment/1\.0 later; .*sentiment\.mar is now 2\.0's archive"
    )
    with pytest.raises(UpdateFailed, match=expected):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)), load_timeout_s=1.0)
    assert fake.default == "2.0" and "1.0" in fake.versions and restart_archive_version(fake) == "2.0"


def test_a_restart_archive_that_cannot_be_replaced_is_said_once_the_new_version_serves(fake, tmp_path):
    """A folder where sentiment.mar should be: the rename over it fails, and a restart would still find 1.0's."""
    (fake.store / f"{MODEL}.mar").unlink()
    (fake.store / f"{MODEL}.mar").mkdir()
    (fake.store / f"{MODEL}.mar" / "kept").write_text("in the way")
    expected = (
        r"sentiment 2\.0 serves and 1\.0 is unregistered, but putting sentiment-2\.0\.mar at .*sentiment\.mar failed "
        r"\(.*\): a restart would register 1\.0 again; copy sentiment-2\.0\.mar over it$"
    )
    with pytest.raises(UpdateFailed, match=expected):
        update_to_2(fake, running(fake, key_file(tmp_path, 3600)))
    assert fake.versions == {"2.0": f"{MODEL}-2.0.mar"}
    assert sorted(path.name for path in fake.store.iterdir()) == [f"{MODEL}-2.0.mar", f"{MODEL}.mar"]


# ---- archive_model and a registered archive ----------------------------------------------------------------------


def server_files(fake: FakeTorchServe, tmp_path: Path) -> tuple[Path, Path]:
    """config.properties and key_file.json of the stand-in, as a server started in `tmp_path` has them."""
    config = tmp_path / "config.properties"
    config.write_text(f"inference_address={fake.url}\nmanagement_address={fake.url}\nmodel_store={fake.store}\n")
    return config, key_file(tmp_path, 3600)


def server_config(fake: FakeTorchServe, tmp_path: Path) -> list[str]:
    config, keys = server_files(fake, tmp_path)
    return ["--server-config", str(config), "--key-file", str(keys)]


def test_archive_model_refuses_a_new_version_over_a_registered_archive(fake, tmp_path, capsys):
    before = (fake.store / f"{MODEL}.mar").read_bytes()
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "2.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *server_config(fake, tmp_path)]) == 2
    refusal = capsys.readouterr().err
    assert "is the archive of sentiment 1.0 on the running server" in refusal, refusal
    assert "--file-name sentiment-2.0.mar" in refusal and "scripts.update_model" in refusal, refusal
    assert (fake.store / f"{MODEL}.mar").read_bytes() == before


def test_archive_model_refuses_another_model_over_a_registered_archive(fake, tmp_path, capsys):
    """The same version under another name: a restart would register that other model in place of sentiment."""
    before = (fake.store / f"{MODEL}.mar").read_bytes()
    argv = [str(tmp_path / "checkpoint"), "--name", "other", "--file-name", f"{MODEL}.mar", "--version", "1.0"]
    assert archive_model.main([*argv, "--export-path", str(fake.store), *server_config(fake, tmp_path)]) == 2
    refusal = capsys.readouterr().err
    assert "is the archive of sentiment 1.0 on the running server" in refusal, refusal
    assert "a restart would serve other 1.0 in its place" in refusal and "WARNING" not in refusal, refusal
    assert (fake.store / f"{MODEL}.mar").read_bytes() == before


def test_archive_model_refuses_a_new_version_over_the_restart_archive_after_an_update(fake, tmp_path, capsys):
    """After an update 2.0 was registered from sentiment-2.0.mar; sentiment.mar is still what a restart registers."""
    write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    fake.versions, fake.default = {"2.0": f"{MODEL}-2.0.mar"}, "2.0"
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "3.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *server_config(fake, tmp_path)]) == 2
    refusal = capsys.readouterr().err
    assert "is the archive of sentiment 2.0 on the running server" in refusal, refusal


def test_archive_model_warns_of_the_same_version_over_a_registered_archive(fake, tmp_path, capsys):
    """scripts/setup.sh rebuilding model_store/bert.mar while serve.sh's server runs: warned, not refused (here the
    missing checkpoint stops it right after)."""
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "1.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *server_config(fake, tmp_path)]) == 2
    said = capsys.readouterr().err
    assert "WARNING" in said and "a restart registers this new archive, unchecked" in said, said
    assert "no such folder" in said, said


def test_archive_model_asks_nothing_of_a_server_that_is_not_running(fake, tmp_path, capsys):
    flags = server_config(fake, tmp_path)
    fake.shutdown()
    fake.server_close()
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "2.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *flags]) == 2
    said = capsys.readouterr().err
    assert "no such folder" in said and "WARNING" not in said, said


def test_archive_model_says_a_refused_key_when_it_cannot_ask_the_server(fake, tmp_path, capsys):
    """Only warned (the server cannot say what it loaded), but with the cause an operator can act on."""
    fake.faults["list"] = REFUSE_KEY
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "2.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *server_config(fake, tmp_path)]) == 2
    said = capsys.readouterr().err
    assert "WARNING: could not ask the running server what it loaded from" in said, said
    assert "the server refused the management key" in said and "scripts.rotate_keys issues new ones" in said, said


# ---- scripts/update_model, the command line ------------------------------------------------------------------------


def update_command(fake: FakeTorchServe, tmp_path: Path, archive: Path) -> list[str]:
    config, keys = server_files(fake, tmp_path)
    return [str(archive), "--config", str(config), "--key-file", str(keys), "--log", str(tmp_path / "model_log.log")]


def test_update_model_refuses_a_file_that_is_not_an_archive_in_one_line(fake, tmp_path, capsys):
    (fake.store / f"{MODEL}-2.0.mar").write_bytes(b"not a zip")
    with pytest.raises(SystemExit) as stopped:
        update_model_command.main(update_command(fake, tmp_path, fake.store / f"{MODEL}-2.0.mar"))
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "not a TorchServe model archive" in said and "Traceback" not in said, said
    assert fake.calls == []


def test_update_model_says_where_to_look_when_the_server_does_not_answer(fake, tmp_path, capsys):
    """The server stopped (or never ran at that address): one line naming what shows the state, no traceback."""
    archive = write_archive(fake.store / f"{MODEL}-2.0.mar", MODEL, "2.0")
    command = update_command(fake, tmp_path, archive)
    fake.shutdown()
    fake.server_close()
    assert update_model_command.main(command) == 1
    said = capsys.readouterr().err
    assert said.startswith("update_model: ") and "Traceback" not in said, said
    assert said.rstrip().endswith("; GET /models/sentiment/all shows where the update stopped"), said
