"""The image's entry command: run TorchServe, and on SIGTERM answer every admitted request before stopping it.

    tini -- python3 /usr/local/bin/graceful_stop.py -- torchserve --start --foreground ... --ts-config PATH

TorchServe's launcher (`torchserve --foreground`) does not forward SIGTERM: it dies and leaves the
Java frontend to be killed with the container, in-flight batches included; and the frontend's own
shutdown closes every connection at once. tini (PID 1, without -g) hands the kubelet's SIGTERM to
this process only. This process then:

1. keeps TorchServe serving until the requests it admitted are answered: admitted
   (ts_inference_requests_total) minus answered by the handler (bert_items_total, one per request)
   minus answered by the frontend without the handler (5xx: queue full, a lost worker; Requests5XX
   less the handler's own 5xx, its 503 DeadlineExceeded included) reaches 0, read from the metrics
   port of the configuration. A request arriving meanwhile is admitted and waited for too. It keeps
   serving for at least --linger seconds (default 5) even when idle: requests routed before every
   proxy knows the pod is leaving still arrive (a preStop hook covers most of that time where the
   pod has one). At most --drain-timeout seconds (default: the largest responseTimeout of the
   configuration's model_snapshot, plus 5);
2. sends SIGTERM to TorchServe's process group (launcher, frontend, workers), SIGKILL after
   --stop-timeout seconds, and exits with TorchServe's status.

Requests5XX counts every 5xx the frontend writes (TorchServe 0.12 NettyUtils.sendHttpResponse), the
liveness probe's /ping 500 too, which stands for no admitted request and lowers the count. That cannot
end a drain early: /ping answers 500 only once a worker has failed to come back for maxRetryTimeoutInSec
(300 s, never set here), the worker stays given up for the life of the process, and readiness (every
worker READY, model_ready.py) has kept the pod out of the endpoints since it died, longer than any
admitted request stays open (responseTimeout, tests/deploy checks it is shorter).

Standard library only: it runs in the image. The pod's terminationGracePeriodSeconds must cover the
preStop hook, the drain and the stop (tests/deploy checks it).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

# The readiness probe's reader, installed next to this file (/usr/local/bin, deploy/docker).
from model_ready import read_properties

# Every 5xx the handler answers itself (handlers/rejection.py; tests/deploy checks the list against it). Each
# such request is counted twice: in bert_items_total (every request of a batch) and, by its HTTP status, in
# TorchServe's Requests5XX, so it must leave the frontend's share, DeadlineExceeded (503) included. The
# recording rule instance:bert_unavailable_per_second (deploy/prometheus/rules.yaml) subtracts all but
# DeadlineExceeded: it counts that 503 as shed on purpose, and never as "answered by the frontend".
HANDLER_5XX_REASONS = ("InferenceFailed", "OutOfMemory", "InternalError", "ExplanationNotSupported", "DeadlineExceeded")
DRAIN_MARGIN_S = 5
DEFAULT_LINGER_S = 5.0
DEFAULT_STOP_TIMEOUT_S = 20.0
# The handler's counter can move just before the frontend has written the answer (worker metrics
# travel through the worker's log): give the last answers this long to be written.
SETTLE_S = 1.0
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# As tooling/torchserve.py starts every TorchServe (tests/deploy checks they agree): files it creates are its
# user's alone (TorchServe makes key_file.json 0600 only after writing the keys into it), and the variables it
# reads even with enable_envvars_config=false are not inherited: TS_CONFIG_FILE would replace the --ts-config
# file, TS_OPEN_INFERENCE_PROTOCOL=oip turn on a mode one gRPC call can make the frontend drop a worker with.
SERVER_UMASK = 0o077
IGNORED_VARIABLES = ("TS_CONFIG_FILE", "TS_OPEN_INFERENCE_PROTOCOL")


# Where TorchServe unpacks each archive it registers, under its temp folder (TEMP: the launcher's java.io.tmpdir).
# As tooling/torchserve.clear_unpacked_archives (tests/deploy checks they agree).
UNPACKED_ARCHIVES = "models"


def clear_unpacked_archives(environment: dict[str, str]) -> None:
    """Remove what an earlier TorchServe of this pod unpacked and, killed (out of memory: the kubelet restarts the
    container, and the /tmp emptyDir outlives it), never removed: each restart would add the model's size again,
    until the emptyDir's sizeLimit evicts the pod. This container's TorchServe, the folder's only one, has not started.
    """
    temp = environment.get("TEMP")
    if temp:
        shutil.rmtree(os.path.join(temp, UNPACKED_ARCHIVES), ignore_errors=True)


def config_path(command: list[str]) -> str | None:
    """The --ts-config argument of the torchserve command line."""
    for flag, value in itertools.pairwise(command):
        if flag == "--ts-config":
            return value
    return None


def default_drain_timeout(properties: dict[str, str]) -> float:
    """The largest responseTimeout of the model_snapshot: no admitted request can take longer to be answered."""
    try:
        snapshot = json.loads(properties["model_snapshot"])
        timeouts = [
            int(version.get("responseTimeout", 120))
            for versions in snapshot["models"].values()
            for version in versions.values()
        ]
    except (KeyError, ValueError, TypeError, AttributeError):
        timeouts = []
    return float(max(timeouts, default=120) + DRAIN_MARGIN_S)


def metric_sum(text: str, name: str, reasons: tuple[str, ...] | None = None) -> float:
    """Sum of a metric's samples (0 when TorchServe exports none yet), optionally only those Reasons."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match[1] != name:
            continue
        if reasons is not None and not any(f'Reason="{reason}"' in (match[2] or "") for reason in reasons):
            continue
        total += float(match[3])
    return total


def outstanding(metrics_text: str) -> float:
    """Requests admitted and not yet answered (<= 0: none)."""
    admitted = metric_sum(metrics_text, "ts_inference_requests_total")
    handled = metric_sum(metrics_text, "bert_items_total")
    frontend_5xx = metric_sum(metrics_text, "Requests5XX") - metric_sum(
        metrics_text, "bert_rejected_items_total", HANDLER_5XX_REASONS
    )
    return admitted - handled - max(frontend_5xx, 0.0)


def drain(metrics_url: str, timeout: float, linger: float, log) -> bool:
    """Wait until every admitted request is answered, and `linger` seconds at least; False if the timeout came first."""
    start = time.monotonic()
    deadline = start + timeout
    left = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=2) as response:
                left = outstanding(response.read().decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log(f"drain: metrics unreadable ({exc}); stopping now")
            return False
        if left <= 0 and time.monotonic() - start >= linger:
            time.sleep(SETTLE_S)
            return True
        time.sleep(0.2)
    log(f"drain: {left:.0f} request(s) still unanswered after {timeout:.0f}s")
    return False


def stop_group(process: subprocess.Popen, timeout: float) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drain-timeout", type=float, help="seconds (default: largest responseTimeout + 5)")
    parser.add_argument(
        "--linger", type=float, default=DEFAULT_LINGER_S, help="seconds to keep serving after SIGTERM, at least"
    )
    parser.add_argument(
        "--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, help="seconds from SIGTERM to SIGKILL"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- torchserve --start --foreground ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")

    def log(message: str) -> None:
        print(f"graceful_stop: {message}", file=sys.stderr, flush=True)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # Its own session: the whole of TorchServe (launcher, frontend, workers) is stopped as one group.
    environment = {name: value for name, value in os.environ.items() if name not in IGNORED_VARIABLES}
    clear_unpacked_archives(environment)
    process = subprocess.Popen(command, start_new_session=True, env=environment, umask=SERVER_UMASK)
    while process.poll() is None and not stop.wait(0.5):
        pass
    if process.poll() is not None:
        return process.returncode
    path = config_path(command)
    properties = read_properties(path) if path else {}
    timeout = args.drain_timeout if args.drain_timeout is not None else default_drain_timeout(properties)
    metrics_url = properties.get("metrics_address", "http://127.0.0.1:8082").rstrip("/")
    log(f"SIGTERM: answering admitted requests (at most {timeout:.0f}s) before stopping TorchServe")
    if drain(metrics_url, timeout, args.linger, log):
        log("drained: every admitted request is answered")
    code = stop_group(process, args.stop_timeout)
    log(f"TorchServe stopped ({code})")
    return 0 if code in (0, -signal.SIGTERM, 128 + signal.SIGTERM) else code


if __name__ == "__main__":
    sys.exit(main())
