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
from tooling import model_update
from tooling.model_update import UpdateFailed, keep_for_restart, update_bound_s, update_model
from tooling.torchserve import RunningServer

MODEL = "sentiment"
PROBE = b"the room was clean"
# The old version's batching: its drain waits out maxBatchDelay + responseTimeout once its queue is empty.
MAX_BATCH_DELAY_MS, RESPONSE_TIMEOUT_S = 500, 120


def write_archive(path: Path, name: str, version: str) -> Path:
    """A .mar as far as the update reads one: its manifest."""
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": version}}))
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
            "minWorkers": 2,
            "responseTimeout": RESPONSE_TIMEOUT_S,
            "jobQueueStatus": {"pendingRequests": 0},
        }


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
                return self._answer(200, [fake.describe(rest[0])])
            if method == "PUT" and len(rest) == 2 and rest[1] == "set-default" and rest[0] in fake.versions:
                fake.default = rest[0]
                return self._answer(200, {"status": "Default version succsesfully updated"})
            if method == "DELETE" and len(rest) == 1 and rest[0] in fake.versions:
                del fake.versions[rest[0]]
                return self._answer(200, {"status": "Model unregistered"})
        if method == "POST" and segments == ["models"]:
            if fake.register_status != 200:
                return self._answer(fake.register_status, {"message": "Failed to start workers"})
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


# ---- archive_model and a registered archive ----------------------------------------------------------------------


def server_config(fake: FakeTorchServe, tmp_path: Path) -> list[str]:
    config = tmp_path / "config.properties"
    config.write_text(f"inference_address={fake.url}\nmanagement_address={fake.url}\nmodel_store={fake.store}\n")
    return ["--server-config", str(config), "--key-file", str(key_file(tmp_path, 3600))]


def test_archive_model_refuses_a_new_version_over_a_registered_archive(fake, tmp_path, capsys):
    before = (fake.store / f"{MODEL}.mar").read_bytes()
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "2.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *server_config(fake, tmp_path)]) == 2
    refusal = capsys.readouterr().err
    assert "is the archive of sentiment 1.0 on the running server" in refusal, refusal
    assert "--file-name sentiment-2.0.mar" in refusal and "scripts.update_model" in refusal, refusal
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
    assert "no config.json" in said, said


def test_archive_model_asks_nothing_of_a_server_that_is_not_running(fake, tmp_path, capsys):
    flags = server_config(fake, tmp_path)
    fake.shutdown()
    fake.server_close()
    argv = [str(tmp_path / "checkpoint"), "--name", MODEL, "--version", "2.0", "--export-path", str(fake.store)]
    assert archive_model.main([*argv, *flags]) == 2
    said = capsys.readouterr().err
    assert "no config.json" in said and "WARNING" not in said, said
