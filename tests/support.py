"""Helpers the test modules share (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import csv
import http.server
import ipaddress
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from tooling.paths import REPO

DATA = Path(__file__).resolve().parent / "data"
TEXT = "text/plain"
JSON = "application/json"
# The tiny model conftest.py's `shared_model` fixture registers once per session.
SHARED_MODEL = "tiny-shared"


def port_share(index: int, count: int) -> tuple[int, int]:
    """[low, high): the part of free_port's whole range (tooling/torchserve.py) that process `index` of `count`
    side by side draws from (tests/conftest.py sets it for pytest-xdist's processes)."""
    from tooling.torchserve import LOWEST_PORT, _ephemeral_low

    size = (_ephemeral_low() - LOWEST_PORT) // count
    return LOWEST_PORT + index * size, LOWEST_PORT + (index + 1) * size


@contextlib.contextmanager
def logged_warnings(*names: str) -> Iterator[list[logging.LogRecord]]:
    """The records at WARNING or above that reach the loggers `names` ("" the root) while in the block: what their
    handlers would print. torch's and transformers' loggers end at handlers of their own, which pytest's capture
    does not see (caplog reads the root's)."""
    records: list[logging.LogRecord] = []
    collector = logging.Handler(logging.WARNING)
    collector.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(collector)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(collector)


@contextlib.contextmanager
def serving_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A loopback HTTP server answering with `handler` on a thread of its own while in the block: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answering_every_call(
    status: int = 200, body: bytes = b"", asked: list[str] | None = None
) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler for serving_http that answers every GET and POST with `status` and `body` (reading a POST's body
    first), each path appended to `asked` where given: a stand-in for an API a command must, or must not, call."""

    class Answering(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if asked is not None:
                asked.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.do_GET()

        def log_message(self, *args) -> None:
            pass

    return Answering


def umask_of(pid: int) -> str:
    """A running process's umask as Linux reports it ("0077"): what every file it creates is masked with."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:"))


def pinned_versions(requirements: Path) -> dict[str, str]:
    """name -> version of every requirement line of a pip requirements or constraints file, each `==`-pinned."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()  # comments and uv's `# via` annotations
        if line:
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", f"{requirements.name}: not pinned: {line}"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def wait_until(
    check: Callable[[], object], timeout: float, what: str | Callable[[], str], interval: float = 0.05
) -> None:
    """Poll `check` until it returns something true; fail the test naming `what` after `timeout` seconds. `what` may
    be a callable, called then, for a message that shows the state the wait gave up on."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def metrics_once(server, model: str, at_least: Mapping[str, float], timeout: float = 30.0) -> str:
    """/metrics once each of the handler's counters in `at_least` (name -> value) has reached its value for `model`
    (its ModelName label): the frontend reads the worker's metric lines from the worker's log stream, apart from
    the answers, so they may land on /metrics a moment after the responses. Fails the test, with the values
    seen, after `timeout` seconds. The lines of one batch arrive in the order the handler writes them
    (handlers/handler_metrics.py: bert_rejected_items_total, bert_batches_total, bert_items_total, ...), so a
    counter reached means the ones written before it in the same batch have arrived too."""
    from tooling.prometheus import metric_value

    deadline = time.monotonic() + timeout
    while True:
        text = server.metrics_text()
        seen = {name: metric_value(text, name, ModelName=model) for name in at_least}
        if all(seen[name] >= value for name, value in at_least.items()):
            return text
        if time.monotonic() > deadline:
            pytest.fail(
                f"{model}'s handler metrics did not reach {dict(at_least)} within {timeout:g}s: {seen} on /metrics"
            )
        time.sleep(0.05)


def settled_metrics(server, model: str, quiet_s: float = 0.5, timeout: float = 30.0) -> str:
    """/metrics once the handler's item counter for `model` has stayed the same for `quiet_s`: what a test reads as
    its "before". The counters of requests answered earlier (an earlier test's, on a server tests share) land a moment
    after their answers (metrics_once), and one landing after "before" was read counts as the test's own."""
    from tooling.prometheus import metric_value

    deadline = time.monotonic() + timeout
    text = server.metrics_text()
    while True:
        time.sleep(quiet_s)
        again = server.metrics_text()
        then, now = (metric_value(t, "bert_items_total", ModelName=model) for t in (text, again))
        if now == then:
            return again
        if time.monotonic() > deadline:
            pytest.fail(f"{model}'s bert_items_total still moving after {timeout:g}s ({then} -> {now})")
        text = again


def batches_received(server, model: str, version: str = "1.0") -> int:
    """How many batches the workers of `model` (at `version`) have received so far, by their "Backend received
    inference" lines in the server's model_log.log: written by a worker as it takes a batch off its socket, so
    a count that grew means a batch sent since is in that worker's hands."""
    log = server.log_dir / "model_log.log"
    if not log.is_file():
        return 0
    worker = rf"W-\d+-{re.escape(model)}_{re.escape(version)}-stdout MODEL_LOG - Backend received inference"
    return len(re.findall(worker, log.read_text(errors="replace")))


def logs_caught_up(server, model: str, timeout: float = 30.0) -> None:
    """Return once the server's log files hold every line its earlier requests to `model` made it write. A sentinel
    request (an empty text: the handler refuses it and logs that, without any text) is sent after them. The frontend
    reads a worker's output line by line and writes each line to every log file before the next, so once the
    sentinel's refusal is in model_log.log every earlier worker line is written; once its access-log line is in
    access_log.log, every earlier answer's is."""

    def count(log: str, line: str) -> int:
        path = server.log_dir / log
        return path.read_text(errors="replace").count(line) if path.is_file() else 0

    def seen() -> tuple[int, int]:
        return count("model_log.log", "rejected item: reason=EmptyText"), count(
            "access_log.log", f'"POST /predictions/{model} HTTP/1.1" 400'
        )

    before = seen()
    sentinel = server.predict(model, "")
    assert sentinel.status_code == 400, sentinel.text
    wait_until(
        lambda: all(now > then for now, then in zip(seen(), before)),
        timeout,
        lambda: (
            f"the sentinel request's lines in {server.log_dir} (refusals, 400s logged: {before} before, {seen()} now)"
        ),
    )


def require_system_packages() -> None:
    """Skip a test that needs HAProxy and Prometheus where they are not installed; under CI=true fail it instead, so
    that a CI machine without them cannot pass the fleet's tests by skipping them."""
    from tooling.fleet import missing_system_commands

    missing = missing_system_commands()
    if missing:
        message = (
            f"the fleet needs {' and '.join(missing)}: run scripts/install_system_packages.sh as root "
            "(or apt-get install -y --no-install-recommends haproxy prometheus)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def unseen_reviews() -> list[tuple[str, str]]:
    """(label, text) pairs written for the tests; none of them is in data/."""
    with (DATA / "unseen_reviews.tsv").open(encoding="utf-8") as f:
        return [(label, text) for label, text in csv.reader(f, delimiter="\t")]


def statuses(context, n: int) -> list[int]:
    """The HTTP status the handler set for each of the first n items of the context's batch."""
    return [context.get_response_status(i)[0] for i in range(n)]


def expected_alone(handler, model_dir, texts: list[str]) -> list[dict]:
    """The answer for each text sent alone, from the same handler code and weights in-process."""
    from tooling.inprocess import make_context, set_batch

    answers = []
    context = make_context(model_dir)  # set_batch refills its per-request state each time
    for text in texts:
        [out] = handler.handle(set_batch(context, [(text.encode(), TEXT)]), context)
        answers.append(json.loads(out))
    return answers


def plain_outcome(decoded: object) -> object:
    """What the handler makes of one decoded body, with the pipeline's own steps: the body read by
    protocols.parse_request, each instance checked by validation.validate_instance; the text (or pair), or the
    request's first rejection."""
    from handlers.options import HandlerOptions
    from handlers.protocols import parse_request
    from handlers.rejection import Rejection
    from handlers.validation import validate_instance

    request = parse_request(decoded, HandlerOptions().max_instances)
    problem = request.first_problem()
    if problem is not None:
        return problem[1]
    checked = [validate_instance(instance) for instance in request.instances]
    return next((c for c in checked if isinstance(c, Rejection)), checked[0])


def decode_and_validate(value: object, content_type: str | None, max_bytes: int) -> object:
    """A payload sent as the raw body with its whole Content-Type -> its valid text, or why not (everything
    before batching), through the pipeline's own decode_request."""
    from handlers.decoding import decode_request, route_of

    headers = {} if content_type is None else {"content-type": content_type}
    return plain_outcome(decode_request({"body": value}, headers, max_bytes, route=route_of(headers)))


def server_from_layout(workdir: Path, root: Path, config: Path):
    """A TorchServe (not started) running exactly the generated cluster configuration at `config` for the
    layout at `root` (standing for /mnt/models): only its addresses and ports move to free loopback ones."""
    from tooling.cluster_config import MODEL_STORE_DIR
    from tooling.torchserve import TorchServe, read_properties

    generated = read_properties(config)
    # TorchServe() points metrics_config at the repository's metrics.yaml; keep the layout's copy.
    return TorchServe(
        workdir, root / MODEL_STORE_DIR, overrides={"metrics_config": generated["metrics_config"]}, base=generated
    )


def run_transformers_pipeline(checkpoint, inputs: list, **call_options) -> list:
    """transformers' own text-classification pipeline on `inputs` (texts, or {"text", "text_pair"} dicts): the
    reference the handler's answers are checked against, with its default function_to_apply."""
    from unittest import mock

    from transformers import pipeline

    # The pipeline sets TOKENIZERS_PARALLELISM=false in this process's environment, which later tests' subprocesses
    # would inherit (tests/inprocess/test_tokenizer_threads.py counts the tokenizer's threads): put it back after.
    with mock.patch.dict(os.environ):
        classify = pipeline("text-classification", model=str(checkpoint), tokenizer=str(checkpoint), device="cpu")
        return classify(inputs, **call_options)


def worker_ended(script: str, model_dir: Path, texts: list[str]) -> tuple[int, str, list[str]]:
    """Run `script` (a handler serving `model_dir`, given `texts`, in a process of its own, as a TorchServe worker is)
    from the repository root: its exit status, its output, and the CRITICAL lines of its log."""
    ended = subprocess.run(
        [sys.executable, "-c", script, str(model_dir), json.dumps(texts)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = ended.stdout + ended.stderr
    return ended.returncode, output, [line for line in output.splitlines() if line.startswith("CRITICAL:")]


def listening(processes: Iterable[psutil.Process]) -> dict[int, set[str]]:
    """Port -> the addresses these processes listen on (TCP), an IPv4-mapped IPv6 address written as IPv4 (Java
    listens on IPv6 sockets: its 127.0.0.1 shows as ::ffff:127.0.0.1)."""
    sockets: dict[int, set[str]] = {}
    for process in processes:
        connections = getattr(process, "net_connections", process.connections)
        for connection in connections(kind="inet"):
            if connection.status == psutil.CONN_LISTEN:
                address = ipaddress.ip_address(connection.laddr.ip.split("%")[0])
                address = getattr(address, "ipv4_mapped", None) or address
                sockets.setdefault(connection.laddr.port, set()).add(str(address))
    return sockets


def fleet_command(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`scripts.fleet --root ROOT ARGS` in a process of its own, as an operator runs it."""
    command = [sys.executable, "-m", "scripts.fleet", "--root", str(root), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
