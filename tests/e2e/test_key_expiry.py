"""TorchServe's keys expire token_expiration_min after they are issued: every call with them is refused
from then on, and scripts/rotate_keys.py (what scripts/serve.sh runs when it finds them expired) issues
new ones; scripts/update_model.py says so rather than failing obscurely."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest
import requests

from tooling.paths import REPO
from tooling.torchserve import TorchServe, key_refused

pytestmark = pytest.mark.e2e

LIFETIME_MIN = 0.1  # 6 s


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("expiry")
    store = tmp_path_factory.mktemp("expiry-store")
    with TorchServe(workdir, store, overrides={"token_expiration_min": str(LIFETIME_MIN)}) as ts:
        yield ts


def calls(server: TorchServe) -> dict[str, requests.Response]:
    """One call with each key: /ping (inference) and the model list (management)."""
    return {
        "inference": server.ping(),
        "management": requests.get(f"{server.management_url}/models", headers=server.auth("management"), timeout=10),
    }


def expiry(server: TorchServe, kind: str) -> float:
    stamp = json.loads((server.workdir / "key_file.json").read_text())[kind]["expiration time"]
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp)).timestamp()  # Java's nanoseconds: cut to µs


def command(server: TorchServe, script: str, *args: str) -> subprocess.CompletedProcess:
    paths = ["--config", str(server.config_path), "--key-file", str(server.workdir / "key_file.json")]
    return subprocess.run(
        [sys.executable, "-m", script, *args, *paths], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_expired_keys_are_refused_and_rotate_keys_issues_new_ones(server, tiny_checkpoint, make_archive, model_store):
    assert all(response.status_code == 200 for response in calls(server).values())
    expired_inference = server.keys()["inference"]
    time.sleep(max(0.0, max(expiry(server, "inference"), expiry(server, "management")) - time.time()) + 0.5)
    refused = calls(server)
    assert all(key_refused(response) for response in refused.values()), {k: r.text for k, r in refused.items()}

    archive = make_archive(tiny_checkpoint, "expiry-tiny")
    update = command(server, "scripts.update_model", str(model_store / archive))
    # (the archive is never registered: the update stops at its first call, the expired management key)
    assert update.returncode == 1 and "scripts.rotate_keys" in update.stderr, update.stderr

    rotated = command(server, "scripts.rotate_keys")
    assert rotated.returncode == 0, rotated.stderr
    assert "inference key rotated" in rotated.stdout and "management key rotated" in rotated.stdout, rotated.stdout
    assert all(response.status_code == 200 for response in calls(server).values())
    stale = requests.get(
        f"{server.inference_url}/ping", headers={"Authorization": f"Bearer {expired_inference}"}, timeout=5
    )
    assert key_refused(stale)
