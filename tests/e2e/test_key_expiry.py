"""TorchServe's keys expire token_expiration_min after they are issued: every call with them is refused
from then on, and scripts/rotate_keys.py (what scripts/serve.sh runs when it finds them expired, and the
systemd timer every 30 minutes) issues new ones; scripts/update_model.py refuses to start with keys that
would lapse while it loads, and names a key the server refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tooling.paths import REPO
from tooling.torchserve import TorchServe, key_expiry, key_refused

pytestmark = pytest.mark.e2e

LIFETIME_MIN = 0.25  # 15 s
ARCHIVE = "expiry-tiny.mar"  # in the server's store, never registered: each update stops before its first change


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoint, make_archive, model_store):
    workdir = tmp_path_factory.mktemp("expiry")
    store = tmp_path_factory.mktemp("expiry-store")
    (model_store / make_archive(tiny_checkpoint, ARCHIVE.removesuffix(".mar"))).replace(store / ARCHIVE)
    with TorchServe(workdir, store, overrides={"token_expiration_min": str(LIFETIME_MIN)}) as ts:
        yield ts


def calls(server: TorchServe) -> dict[str, requests.Response]:
    """One call with each key: /ping (inference) and the model list (management)."""
    return {
        "inference": server.ping(),
        "management": requests.get(f"{server.management_url}/models", headers=server.auth("management"), timeout=10),
    }


def latest_expiry(server: TorchServe) -> float:
    entries = server.running().key_entries()
    return max(key_expiry(entries[api]["expiration time"]).timestamp() for api in ("inference", "management"))


def command(server: TorchServe, script: str, *args: str, key_file: Path | None = None) -> subprocess.CompletedProcess:
    paths = ["--config", str(server.config_path), "--key-file", str(key_file or server.key_file)]
    return subprocess.run(
        [sys.executable, "-m", script, *args, *paths], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_expired_keys_are_refused_and_rotate_keys_issues_new_ones(server):
    first = server.keys()["inference"]
    time.sleep(max(0.0, latest_expiry(server) - time.time()) + 0.5)
    refused = calls(server)
    assert all(key_refused(response) for response in refused.values()), {k: r.text for k, r in refused.items()}
    update = command(server, "scripts.update_model", str(server.model_store / ARCHIVE))
    assert update.returncode == 1 and "run python -m scripts.rotate_keys first" in update.stderr, update.stderr

    rotated = command(server, "scripts.rotate_keys")
    assert rotated.returncode == 0, rotated.stderr
    assert "inference key rotated" in rotated.stdout and "management key rotated" in rotated.stdout, rotated.stdout
    assert all(response.status_code == 200 for response in calls(server).values())
    stale = requests.get(f"{server.inference_url}/ping", headers={"Authorization": f"Bearer {first}"}, timeout=5)
    assert key_refused(stale)


def test_update_model_names_a_management_key_the_server_refuses(server, tmp_path):
    """A key file whose keys would last, but whose management key the server does not hold."""
    entries = server.running().key_entries()
    for api in ("inference", "management"):
        entries[api] = {**entries[api], "expiration time": "2999-01-01T00:00:00Z"}
    entries["management"]["key"] = "wrong"
    wrong = tmp_path / "key_file.json"
    wrong.write_text(json.dumps(entries))
    update = command(server, "scripts.update_model", str(server.model_store / ARCHIVE), key_file=wrong)
    assert update.returncode == 1, update.stderr
    assert "refused the management key" in update.stderr and "nothing was switched" in update.stderr, update.stderr
