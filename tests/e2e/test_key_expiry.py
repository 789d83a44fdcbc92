"""TorchServe's keys expire token_expiration_min after they are issued: every call with them is refused
from then on, and scripts/rotate_keys.py (what scripts/serve.sh runs when it finds them expired) issues
new ones; scripts/update_model.py refuses to start with keys that would lapse, and names a refused key."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tooling.paths import REPO
from tooling.torchserve import TorchServe, key_expiry, key_refused

pytestmark = pytest.mark.e2e

LIFETIME_MIN = 0.5  # 30 s: room for a loaded machine to register a model with the first keys


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoint, make_archive, model_store):
    """A server whose store holds expiry-tiny.mar, built before it starts: its first keys' lifetime is short."""
    workdir = tmp_path_factory.mktemp("expiry")
    store = tmp_path_factory.mktemp("expiry-store")
    archive = make_archive(tiny_checkpoint, "expiry-tiny")
    (model_store / archive).replace(store / archive)
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


def test_expired_keys_are_refused_and_rotate_keys_issues_new_ones(server, tiny_checkpoint, make_archive, model_store):
    archive = server.model_store / "expiry-tiny.mar"
    assert server.register(archive.name).status_code == 200
    assert all(response.status_code == 200 for response in calls(server).values())
    expired_inference = server.keys()["inference"]
    time.sleep(max(0.0, latest_expiry(server) - time.time()) + 0.5)
    refused = calls(server)
    assert all(key_refused(response) for response in refused.values()), {k: r.text for k, r in refused.items()}

    # Each update stops before its first change.
    update = command(server, "scripts.update_model", str(archive))
    assert update.returncode == 1 and "refused the management key" in update.stderr, update.stderr
    assert "scripts.rotate_keys" in update.stderr

    rotated = command(server, "scripts.rotate_keys")
    assert rotated.returncode == 0, rotated.stderr
    assert "inference key rotated" in rotated.stdout and "management key rotated" in rotated.stdout, rotated.stdout
    assert all(response.status_code == 200 for response in calls(server).values())
    stale = requests.get(
        f"{server.inference_url}/ping", headers={"Authorization": f"Bearer {expired_inference}"}, timeout=5
    )
    assert key_refused(stale)

    # Keys that work now but would lapse before an update could end (it allows 10 minutes for the load).
    update = command(server, "scripts.update_model", str(archive))
    assert update.returncode == 1 and "scripts.rotate_keys first" in update.stderr, update.stderr
