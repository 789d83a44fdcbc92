"""Replace the archive a running TorchServe serves under a model name, without failing a request.

TorchServe's own recipe is: register the new version, make it the default, unregister the old one.
Done in one go, it fails requests the old version holds at that moment: TorchServe 0.12's unregister
stops the old workers at once, and what they hold is answered 500 "Worker died." or not at all
(`tests/e2e/test_model_update.py` pins that a batch in flight fails). This module does the same steps
in an order that fails none:

1. read how the running default version is served (batch size, delay, workers) and register the
   new archive as another version of the same name with the same settings; on a CPU, workers that
   scripts/serve.sh sized for the old archive's cpu_threads are sized again for the new one's
   (new_version_workers);
2. answer one request through the new version by name (`/predictions/NAME/VERSION`); if it cannot,
   unregister it and stop: the old version never stopped serving;
3. make the new version the default: every request that arrives from then on goes to it;
4. drain the old version: wait until its queue is empty, then for the longest a batch it already
   took may take (`maxBatchDelay` to fill it, then `responseTimeout`, after which TorchServe stops
   that worker itself). The management API cannot tell whether a worker holds a batch, so nothing
   shorter is safe;
5. unregister the old version;
6. put the new archive at <store>/<model>.mar, the file a restart registers (scripts/serve.sh with
   MODEL_NAME=<model>), by an atomic rename: until then that file is the old version's, so an update that
   fails at any step leaves a restart serving the version that served before.

The new archive comes in under a file name of its own: one written over <model>.mar would be what a
restart serves even if the update then failed, so that file is refused as the new archive.

`scripts/update_model.py` is the command line; docs/checkpoints.md#updating-a-served-model the guide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

from handlers.cpu_quota import usable_cpus
from tooling.cpu_layout import cpu_layout, cpu_workers
from tooling.model_archive import NotAnArchive, archive_answers, archive_name, handler_options
from tooling.torchserve import RunningServer, key_expiry, key_refused

PROBE_TIMEOUT_S = 60.0
# The management calls an update makes besides the registration, the probe and the drain (set-default, the
# drain's polls, the unregister of an idle version): seconds each, counted once together.
CALLS_MARGIN_S = 60.0


class UpdateFailed(Exception):
    """The update stopped; the message says where, and what serves."""


class KeyRefused(Exception):
    """The server refused a key: the update stops, and says what serves at that point."""


@dataclass(frozen=True)
class ServedVersion:
    """One registered version of a model, as the management API describes it."""

    version: str
    batch_size: int
    max_batch_delay: int
    workers: int
    response_timeout: int
    pending: int
    url: str = ""  # the archive it was registered from (modelUrl: a file name of the store)
    on_gpu: bool = False  # its workers hold GPUs (each worker's "gpu" in the description)

    @classmethod
    def from_description(cls, described: dict) -> ServedVersion:
        return cls(
            version=described["modelVersion"],
            batch_size=described["batchSize"],
            max_batch_delay=described["maxBatchDelay"],
            workers=described["minWorkers"],
            response_timeout=described["responseTimeout"],
            pending=described["jobQueueStatus"]["pendingRequests"],
            url=described.get("modelUrl", ""),
            on_gpu=any(worker.get("gpu") for worker in described.get("workers", [])),
        )

    @property
    def longest_batch_s(self) -> float:
        """The longest a batch this version took from its queue can still run before TorchServe ends it."""
        return self.max_batch_delay / 1000 + self.response_timeout


class _Management:
    """The management calls an update makes, for one model; the key is read at each call (it may rotate)."""

    def __init__(self, server: RunningServer, model: str) -> None:
        self.server = server
        self.model = model
        self.session = requests.Session()

    def _call(self, method: str, path: str, timeout: float, **params) -> requests.Response:
        url = f"{self.server.management_url}/{path}"
        response = self.server.request(self.session, method, url, "management", params=params or None, timeout=timeout)
        if key_refused(response):
            raise KeyRefused(self.server.refusal_hint("management"))
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
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return [described["modelVersion"] for described in response.json()]

    def register(self, archive: str, like: ServedVersion, workers: int, timeout: float) -> requests.Response:
        return self._call(
            "POST",
            "models",
            timeout,
            url=archive,
            model_name=self.model,
            batch_size=like.batch_size,
            max_batch_delay=like.max_batch_delay,
            initial_workers=workers,
            synchronous="true",
        )

    def set_default(self, version: str) -> requests.Response:
        return self._call("PUT", f"models/{self.model}/{version}/set-default", 10)

    def unregister(self, version: str, timeout: float) -> requests.Response:
        return self._call("DELETE", f"models/{self.model}/{version}", timeout)

    def withdraw(self, version: str, timeout: float) -> str:
        """Unregister a version that must not serve; what became of it, for the message."""
        try:
            if version not in self.versions():
                return f"{version} is not registered"
            answer = self.unregister(version, timeout)
        except (requests.RequestException, KeyRefused) as error:
            return f"unregistering {version} failed ({error}): DELETE /models/{self.model}/{version}"
        if answer.status_code != 200:
            return f"unregistering {version} failed (HTTP {answer.status_code}): DELETE /models/{self.model}/{version}"
        return f"{version} is unregistered again"


def _message(response: requests.Response) -> str:
    try:
        body = response.json()
        return str(body.get("message") or body.get("status"))
    except (ValueError, AttributeError):  # not JSON, or not an object
        return response.text.strip()[:300]


def _probe(server: RunningServer, model: str, version: str, body: bytes) -> tuple[int, str]:
    """One request to `version` by name: its status and body (status 0 and the error when none came)."""
    url = f"{server.inference_url}/predictions/{model}/{version}"
    try:
        answer = server.request(
            requests.Session(),
            "POST",
            url,
            "inference",
            data=body,
            headers={"Content-Type": "text/plain"},
            timeout=PROBE_TIMEOUT_S,
        )
    except requests.RequestException as error:
        return 0, str(error)
    if key_refused(answer):
        return answer.status_code, server.refusal_hint("inference")
    return answer.status_code, answer.text.strip()


def update_bound_s(load_timeout_s: float, grace_s: float) -> float:
    """The longest an update may take: the new workers' load (`load_timeout_s`), the probe, the old version's
    drain (its queue, for up to `load_timeout_s`, then `grace_s` for the batches it took) and a margin for the
    other management calls, the unregister among them."""
    return load_timeout_s + PROBE_TIMEOUT_S + load_timeout_s + grace_s + CALLS_MARGIN_S


def _check_keys_outlast(server: RunningServer, load_timeout_s: float, grace_s: float | None) -> None:
    """Refuse to start an update whose keys would expire before it could end (update_bound_s; `grace_s` None: the
    drain's grace is not known yet, and counted as 0)."""
    seconds = update_bound_s(load_timeout_s, grace_s or 0.0)
    grace = "its longest batch" if grace_s is None else f"{grace_s:g} s"
    entries = server.key_entries()
    until = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    for api in ("inference", "management"):
        if api in entries and key_expiry(entries[api]["expiration time"]) < until:
            raise UpdateFailed(
                f"the {api} key expires at {entries[api]['expiration time']}, within the {seconds:.0f} s this update "
                f"may take (the new workers' load, up to {load_timeout_s:g} s; the probe, {PROBE_TIMEOUT_S:g} s; the "
                f"old version's drain, its queue for up to {load_timeout_s:g} s and then {grace}; "
                f"{CALLS_MARGIN_S:g} s for the other calls): run python -m scripts.rotate_keys first; "
                "nothing was changed"
            )


def restart_archive(model: str) -> str:
    """The file in the store a restart registers as `model`: scripts/serve.sh registers MODEL_NAME.mar."""
    return f"{model}.mar"


def keep_for_restart(store: Path, archive: str, model: str) -> Path:
    """Copy `archive` (in `store`) over <store>/<model>.mar in one rename: a restart, at any moment, finds the
    old file or the new one whole. The running server is not affected: TorchServe unzips an archive into a
    folder of its own when it registers it, and its workers load from there."""
    target = store / restart_archive(model)
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=store)
    try:
        with os.fdopen(fd, "wb") as out, (store / archive).open("rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        shutil.copymode(store / archive, partial)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def _kept_for_restart(store: Path, archive: str, model: str, version: str, old_version: str) -> tuple[bool, str]:
    """keep_for_restart, and what a restart registers now, said for a message."""
    try:
        target = keep_for_restart(store, archive, model)
    except OSError as error:
        return False, (
            f"putting {archive} at {store / restart_archive(model)} failed ({error}): a restart would register "
            f"{old_version} again; copy {archive} over it"
        )
    return True, f"{target} is now {version}'s archive, what a restart registers"


def registered_from(server: RunningServer, file_name: str) -> list[tuple[str, str]]:
    """(model, version) of every version `server` registered from `file_name` (a file in its store), or whose
    model a restart would register from it (restart_archive: after an update, the model's versions were loaded
    from files of their own), as the management API lists them. Raises requests.RequestException when the server
    does not answer, KeyRefused when it refuses the key."""
    session = requests.Session()

    def get(path: str, **params) -> list | dict:
        url = f"{server.management_url}/{path}"
        response = server.request(session, "GET", url, "management", params=params or None, timeout=5)
        if key_refused(response):
            raise KeyRefused(server.refusal_hint("management"))
        response.raise_for_status()
        return response.json()

    names, token = [], None
    while True:
        page = get("models", limit=100, **({"next_page_token": token} if token else {}))
        names += [entry["modelName"] for entry in page.get("models", [])]
        token = page.get("nextPageToken")
        if not token:
            break
    return [
        (name, described["modelVersion"])
        for name in names
        for described in get(f"models/{name}/all")
        if Path(str(described.get("modelUrl") or "")).name == file_name or restart_archive(name) == file_name
    ]


def answers_change(store: Path, old: ServedVersion, archive: str, version: str) -> str | None:
    """A note when `archive` answers with other labels, or reads its scores otherwise, than the version serving:
    not refused (a new label set may be the point of the update), but said, since every client reading a label name
    or comparing scores sees the change the moment the new version serves. None when they agree, or either archive
    carries no config.json to tell."""
    before = archive_answers(store / old.url) if old.url else None
    after = archive_answers(store / archive)
    if before is None or after is None or before == after:
        return None
    (old_labels, old_scores), (new_labels, new_scores) = before, after
    changes = []
    if old_labels != new_labels:
        changes.append(f"labels {', '.join(old_labels)} -> {', '.join(new_labels)}")
    if old_scores != new_scores:
        changes.append(f"scores {old_scores} -> {new_scores} (handlers/scores.py)")
    return (
        f"==> note: {version} answers otherwise than {old.version}: {'; '.join(changes)}. Clients reading label "
        "names or comparing scores see it as soon as it serves"
    )


def new_version_workers(
    store: Path, old: ServedVersion, archive: str, model: str, version: str, cpus: int
) -> tuple[int, list[str]]:
    """The workers `archive` (`model` `version`, in `store`) is registered with beside `old`, and what to say of them.

    On a GPU, old's: workers per GPU do not depend on cpu_threads. On `cpus` CPUs, a count that is the one
    scripts/serve.sh gives old's archive (tooling/cpu_layout: as many as the CPUs hold at its cpu_threads) was
    serve.sh's choice, made again for the new archive, what a restart will register: an archive of other cpu_threads
    never runs more threads than CPUs, which cost a PyTorch archive 6-9x its requests/s. A count chosen otherwise
    (serve.sh's WORKERS, a scale call) is kept, with a warning where it does; so is old's for an archive whose handler
    options its workers would refuse (the load fails and says why)."""
    if old.on_gpu:
        return old.workers, []
    try:
        running_fit = cpu_workers(handler_options(store / Path(old.url).name), cpus) if old.url else None
    except (OSError, ValueError):  # old's archive is gone from the store or changed: its count was not serve.sh's
        running_fit = None
    given = None if old.workers == running_fit else old.workers

    def fewer(fit: int) -> str:
        return f"scale it to {fit} once it serves (PUT /models/{model}/{version}?min_worker={fit}&max_worker={fit})"

    try:
        layout = cpu_layout(store / archive, cpus, given, fewer)
    except ValueError:
        return old.workers, []
    said = []
    if layout.workers != old.workers:
        said.append(
            f"==> note: {model} {version} gets {layout.workers} worker(s), where {old.version} has {old.workers}: "
            f"scripts/serve.sh's count for {archive} on {cpus} CPUs, as a restart will start it"
            + (f" ({layout.note})" if layout.note else "")
        )
    if layout.warning:
        said.append(f"==> warning: {model} {version}: {layout.warning}")
    return layout.workers, said


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
    cpus: int | None = None,
) -> None:
    """Serve `archive` (a file name in the server's model store, carrying `version`) as `model`'s default,
    retire the version that served before, then put `archive` at <store>/<model>.mar for a restart; raises
    UpdateFailed saying what serves. `cpus`: those the server's workers may use (default: this process's, the
    handler's count; the update runs beside the server, whose store is local), for new_version_workers.

    `grace_s` replaces the wait after the old queue is empty (default: ServedVersion.longest_batch_s): a
    batch the old version still runs when it ends fails. A key rotated meanwhile is picked up; one that
    expires unrotated stops the update where it is, and the message says what serves.
    """
    # Keys that would lapse are named before the first call (which they would fail), and again once the old
    # version's drain is known.
    _check_keys_outlast(server, load_timeout_s, grace_s)
    try:
        named = archive_name(server.model_store / archive)
    except NotAnArchive as error:
        raise UpdateFailed(f"{error}; nothing was changed") from error
    if named != model:
        raise UpdateFailed(
            f"{archive} names its model {named!r}, not {model!r}: once it serves it becomes "
            f"{restart_archive(model)}, which a restart (scripts/serve.sh, MODEL_NAME={model}) registers under the "
            f"name in its manifest. Archive it with --name {model} (--file-name gives it a file of its own); "
            "nothing was changed"
        )
    management = _Management(server, model)
    try:
        old = management.describe()
        if version in management.versions():
            raise UpdateFailed(
                f"{model} already has a version {version}: archive the new checkpoint with another "
                f"(python -m scripts.archive_model CHECKPOINT --name {model} --version X --file-name "
                f"{model}-X.mar); nothing was changed"
            )
        if archive == restart_archive(model):
            raise UpdateFailed(
                f"{archive} is the file a restart registers as {model} (scripts/serve.sh, MODEL_NAME={model}), and "
                f"it holds {version} now, not {old.version}, which serves: were the update to fail, a restart would "
                f"serve {version} unchecked. Put {old.version}'s archive back as {archive}, archive {version} under "
                f"a file name of its own (python -m scripts.archive_model CHECKPOINT --name {model} --version "
                f"{version} --file-name {model}-{version}.mar) and update with that; nothing was changed"
            )
        change = answers_change(server.model_store, old, archive, version)
        if change:
            say(change)
        workers, said = new_version_workers(
            server.model_store, old, archive, model, version, usable_cpus() if cpus is None else cpus
        )
        for line in said:
            say(line)
        grace = old.longest_batch_s if grace_s is None else grace_s
        _check_keys_outlast(server, load_timeout_s, grace)
        _bring_up(management, server, old, archive, version, workers, probe, load_timeout_s, say, explain_load_failure)
        switched = management.set_default(version)
    except KeyRefused as refused:
        where = f"GET /models/{model}/all shows whether {version} was registered beside it"
        raise UpdateFailed(f"{refused}; nothing was switched: {model}'s default still serves ({where})") from refused
    if switched.status_code != 200:
        withdrawn = management.withdraw(version, load_timeout_s)
        raise UpdateFailed(
            f"making {version} the default failed (HTTP {switched.status_code}: {_message(switched)}); "
            f"{withdrawn}, and {model} {old.version} still serves"
        )
    say(f"==> {model} {version} is the default; draining {old.version} (its queue, then {grace:g} s)")

    # From here the new version serves every request that names no version: whatever happens to the old one,
    # a restart must register the new archive.
    def restart_note() -> str:
        return _kept_for_restart(server.model_store, archive, model, version, old.version)[1]

    try:
        _drain(management, old.version, grace, deadline=time.monotonic() + load_timeout_s)
        retired = management.unregister(old.version, timeout=load_timeout_s)
    except KeyRefused as refused:
        raise UpdateFailed(
            f"{refused}. {model} {version} serves; {old.version} may still be registered: "
            f"DELETE /models/{model}/{old.version} with a new key; {restart_note()}"
        ) from refused
    except requests.RequestException as error:
        raise UpdateFailed(
            f"{error}: {model} {version} serves; whether {old.version} is still registered, GET /models/{model}/all "
            f"shows; {restart_note()}"
        ) from error
    except UpdateFailed as stuck:  # the drain's deadline
        raise UpdateFailed(f"{stuck}; {restart_note()}") from stuck
    if retired.status_code != 200:
        raise UpdateFailed(
            f"{model} {version} serves, but unregistering {old.version} failed (HTTP {retired.status_code}: "
            f"{_message(retired)}): DELETE /models/{model}/{old.version} once it is idle; {restart_note()}"
        )
    kept, note = _kept_for_restart(server.model_store, archive, model, version, old.version)
    if not kept:
        raise UpdateFailed(f"{model} {version} serves and {old.version} is unregistered, but {note}")
    say(f"==> {model} {old.version} unregistered; {model} serves {version}, and {note}")


def _bring_up(
    management: _Management,
    server: RunningServer,
    old: ServedVersion,
    archive: str,
    version: str,
    workers: int,
    probe: bytes,
    load_timeout_s: float,
    say: Callable[[str], None],
    explain_load_failure: Callable[[], str | None],
) -> None:
    """Register `version` beside `old` with its batching and `workers`, and check it answers; withdrawn if it cannot
    serve."""
    model = management.model
    say(
        f"==> registering {archive} as {model} {version} beside {old.version}: batch_size={old.batch_size} "
        f"max_batch_delay={old.max_batch_delay}ms workers={workers}"
    )
    try:
        registered = management.register(archive, old, workers, load_timeout_s)
    except requests.RequestException as error:
        raise UpdateFailed(
            f"registering {archive} got no answer ({error}); {model} {old.version} still serves, and {version} "
            f"may still be loading: DELETE /models/{model}/{version} to drop it"
        ) from error
    if registered.status_code != 200:
        cause = explain_load_failure()
        # TorchServe unregisters a version whose workers failed to start; anything it left is withdrawn.
        withdrawn = management.withdraw(version, load_timeout_s)
        raise UpdateFailed(
            f"registering {archive} failed (HTTP {registered.status_code}: {_message(registered)})"
            + (f"; cause: {cause}" if cause else "")
            + f"; {withdrawn}, and {model} {old.version} still serves, unchanged."
        )
    status, answer = _probe(server, model, version, probe)
    if status != 200:
        withdrawn = management.withdraw(version, load_timeout_s)
        raise UpdateFailed(
            f"{model} {version} answered the probe with HTTP {status} ({answer[:300]}); "
            f"{withdrawn}, and {model} {old.version} still serves, unchanged."
        )
    say(f"    {model} {version} answered the probe: {answer[:200]}")


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
