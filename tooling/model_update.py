"""Replace the archive a running TorchServe serves under a model name, without failing a request.

TorchServe's own recipe is: register the new version, make it the default, unregister the old one.
Done in one go, it fails the requests the old version holds at that moment. TorchServe 0.12's
unregister stops the old workers at once: a batch in flight is answered 500 "Worker died." (or never
answered), and requests still queued for that version are never answered at all
(`tests/e2e/test_model_update.py` pins both). This module does the same steps in an order that fails
none:

1. read how the running default version is served (batch size, delay, workers) and register the
   new archive as another version of the same name with the same settings;
2. answer one request through the new version by name (`/predictions/NAME/VERSION`); if it cannot,
   unregister it and stop, and the old version never stopped serving;
3. make the new version the default: every request that arrives from then on goes to it;
4. drain the old version: wait until its queue is empty, then one `responseTimeout` more, the
   longest TorchServe lets a batch it already took run before it stops that worker itself;
5. unregister the old version.

`scripts/update_model.py` is the command line; docs/checkpoints.md#updating-a-served-model the guide.
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests

from tooling.torchserve import RunningServer, key_refused


class UpdateFailed(Exception):
    """The update stopped; the message says where, and what still serves."""


@dataclass(frozen=True)
class ServedVersion:
    """One registered version of a model, as the management API describes it."""

    version: str
    batch_size: int
    max_batch_delay: int
    workers: int
    response_timeout: int
    pending: int

    @classmethod
    def from_description(cls, described: dict) -> ServedVersion:
        return cls(
            version=described["modelVersion"],
            batch_size=described["batchSize"],
            max_batch_delay=described["maxBatchDelay"],
            workers=described["minWorkers"],
            response_timeout=described["responseTimeout"],
            pending=described["jobQueueStatus"]["pendingRequests"],
        )


def archive_identity(archive: Path) -> tuple[str, str]:
    """The model name and version an archive carries in its manifest (scripts/archive_model.py --name, --version)."""
    with zipfile.ZipFile(archive) as mar:
        model = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
    return model["modelName"], model["modelVersion"]


@dataclass(frozen=True)
class Update:
    model: str
    old: ServedVersion
    new: ServedVersion


class _Management:
    """The management calls an update makes, for one model; the key is read at each call (it may rotate)."""

    def __init__(self, server: RunningServer, model: str) -> None:
        self.server = server
        self.model = model
        self.session = requests.Session()

    def _call(self, method: str, path: str, timeout: float, **params) -> requests.Response:
        response = self.session.request(
            method,
            f"{self.server.management_url}/{path}",
            params=params or None,
            headers=self.server.headers("management"),
            timeout=timeout,
        )
        if key_refused(response):
            raise UpdateFailed(
                f"the management key in {self.server.key_file} was refused: keys expire token_expiration_min "
                "(60) minutes after they are issued; python -m scripts.rotate_keys issues new ones"
            )
        return response

    def describe(self, version: str | None = None) -> ServedVersion:
        path = self.model if version is None else f"{self.model}/{version}"
        response = self._call("GET", f"models/{path}", 10)
        if response.status_code == 404:
            raise UpdateFailed(f"{path} is not registered on {self.server.management_url}")
        response.raise_for_status()
        return ServedVersion.from_description(response.json()[0])

    def versions(self) -> list[str]:
        response = self._call("GET", f"models/{self.model}/all", 10)
        response.raise_for_status()
        return [described["modelVersion"] for described in response.json()]

    def register(self, archive: str, like: ServedVersion, timeout: float) -> requests.Response:
        return self._call(
            "POST",
            "models",
            timeout,
            url=archive,
            model_name=self.model,
            batch_size=like.batch_size,
            max_batch_delay=like.max_batch_delay,
            initial_workers=like.workers,
            synchronous="true",
        )

    def set_default(self, version: str) -> requests.Response:
        return self._call("PUT", f"models/{self.model}/{version}/set-default", 10)

    def unregister(self, version: str, timeout: float) -> requests.Response:
        return self._call("DELETE", f"models/{self.model}/{version}", timeout)


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body.get("status"))
    except (ValueError, AttributeError):  # not JSON, or not an object
        return response.text.strip()[:300]


def _probe(server: RunningServer, model: str, version: str, body: bytes) -> tuple[int, str]:
    """One request to `version` by name: its status and body (status 0 and the error when none came)."""
    try:
        answer = requests.post(
            f"{server.inference_url}/predictions/{model}/{version}",
            data=body,
            headers={**server.headers("inference"), "Content-Type": "text/plain"},
            timeout=60,
        )
    except requests.RequestException as error:
        return 0, str(error)
    return answer.status_code, answer.text.strip()


def update_model(
    server: RunningServer,
    model: str,
    archive: str,
    version: str,
    probe: bytes,
    grace_s: float | None = None,
    load_timeout_s: float = 600.0,
    say: Callable[[str], None] = print,
    explain_load_failure: Callable[[], str | None] = lambda: None,
) -> Update:
    """Serve `archive` (a file name in the server's model store, carrying `version`) as `model`'s default,
    then retire the version that served before; raises UpdateFailed with what still serves.

    `grace_s` overrides the wait after the old queue is empty (default: the old version's responseTimeout):
    a batch the old version still runs when it ends fails.
    """
    management = _Management(server, model)
    old = management.describe()
    if version in management.versions():
        raise UpdateFailed(
            f"{model} already has a version {version}: archive the new checkpoint with another "
            f"(python -m scripts.archive_model CHECKPOINT --name {model} --version X)"
        )
    say(
        f"==> registering {archive} as {model} {version} beside {old.version}: batch_size={old.batch_size} "
        f"max_batch_delay={old.max_batch_delay}ms workers={old.workers}"
    )
    try:
        registered = management.register(archive, old, load_timeout_s)
    except requests.RequestException as error:
        raise UpdateFailed(
            f"registering {archive} got no answer ({error}); {model} {old.version} still serves, and {version} "
            f"may still be loading: DELETE /models/{model}/{version} to drop it"
        ) from error
    if registered.status_code != 200:
        # TorchServe has already unregistered a version whose workers failed to start.
        cause = explain_load_failure()
        raise UpdateFailed(
            f"registering {archive} failed (HTTP {registered.status_code}: {_message(registered)})"
            + (f"; cause: {cause}" if cause else "")
            + f". {model} {old.version} still serves, unchanged."
        )
    status, answer = _probe(server, model, version, probe)
    if status != 200:
        management.unregister(version, timeout=load_timeout_s)
        raise UpdateFailed(
            f"{model} {version} answered the probe with HTTP {status} ({answer[:300]}); "
            f"it is unregistered again and {model} {old.version} still serves, unchanged."
        )
    say(f"    {model} {version} answered the probe: {answer[:200]}")
    switched = management.set_default(version)
    if switched.status_code != 200:
        management.unregister(version, timeout=load_timeout_s)
        raise UpdateFailed(
            f"making {version} the default failed (HTTP {switched.status_code}: {_message(switched)}); "
            f"{model} {old.version} still serves, unchanged."
        )
    grace = old.response_timeout if grace_s is None else grace_s
    say(f"==> {model} {version} is the default; draining {old.version} (its queue, then {grace:g} s)")
    _drain(management, old.version, grace, deadline=time.monotonic() + load_timeout_s)
    retired = management.unregister(old.version, timeout=load_timeout_s)
    if retired.status_code != 200:
        raise UpdateFailed(
            f"{model} {version} serves, but unregistering {old.version} failed (HTTP {retired.status_code}: "
            f"{_message(retired)}): DELETE /models/{model}/{old.version} once it is idle"
        )
    say(f"==> {model} {old.version} unregistered; {model} serves {version}")
    return Update(model, old, management.describe(version))


def _drain(management: _Management, version: str, grace_s: float, deadline: float) -> None:
    """Return once `version`'s queue is empty and `grace_s` seconds have passed for the batches it already took.

    After the switch only a request addressed to this version by name (`/predictions/NAME/VERSION`) can
    reach it; one that arrives during the grace is not waited for.
    """
    while management.describe(version).pending:
        if time.monotonic() > deadline:
            raise UpdateFailed(
                f"{management.model} {version} still had queued requests at the deadline; the new version "
                f"serves, and {version} stays registered: DELETE /models/{management.model}/{version} later"
            )
        time.sleep(0.05)
    time.sleep(grace_s)
