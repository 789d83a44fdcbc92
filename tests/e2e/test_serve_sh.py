"""scripts/serve.sh (README command 1) run for real, in a copy of the checkout on ports of its own: what it prints,
what it puts on command lines, and the TorchServe it starts.

The copy holds what serve.sh runs (scripts/, tooling/, config.properties with free loopback ports, metrics.yaml,
log4j2.xml, review.txt, the repository's .venv linked) and a tiny archive as its model. Its set-up step is a no-op:
set-up is not what is tested here, and the .venv and the archive are ready. serve.sh runs under umask 022 (a
login shell's usual one) with TS_CONFIG_FILE and TS_OPEN_INFERENCE_PROTOCOL set, as a user's environment could
have them. Every curl it runs goes through a shim on PATH that records its arguments, then runs the real curl: a
key in them would be readable by every local user (ps, /proc/PID/cmdline). The module stops the server with the
copy's scripts/stop.sh, then kills whatever of serve.sh's process group is left, by that group's id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from tests.deploy.manifests import archive_with_handler_options
from tests.support import logs_caught_up, umask_of
from tooling.paths import LOG_CONFIG, METRICS_CONFIG, REPO, REVIEW, SERVER_CONFIG
from tooling.processes import process_record, stop_recorded
from tooling.torchserve import ADDRESS_KEYS, IGNORED_VARIABLES, free_port, read_properties

pytestmark = pytest.mark.e2e

MODEL = "serve-sh-tiny"
MARKER = "QUERY-MARKER-5d1f0b"
KEY_NAMES = ("inference", "management", "API")


def shim(directory: Path, name: str, real: str, log: Path) -> None:
    """`name` on a PATH through `directory`: appends its arguments to `log`, one call a line, then runs `real`."""
    path = directory / name
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >>{shlex.quote(str(log))}\nexec {shlex.quote(real)} "$@"\n')
    path.chmod(0o755)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@dataclass
class Served:
    checkout: Path
    output: str  # serve.sh's standard output and error
    curl_calls: list[str]  # the arguments of every curl it ran
    keys: dict[str, str]
    java: psutil.Process  # the Java frontend, named by TorchServe's pid file
    inference_url: str
    env: dict[str, str]  # the environment serve.sh ran with

    # What tests/support.logs_caught_up reads of a server: its log folder, and a way to send it a text.
    @property
    def log_dir(self) -> Path:
        return self.checkout / "logs"

    def predict(self, model: str, text: str) -> requests.Response:
        headers = {"Content-Type": "text/plain", "Authorization": f"Bearer {self.keys['inference']}"}
        return requests.post(
            f"{self.inference_url}/predictions/{model}", data=text.encode(), headers=headers, timeout=60
        )


def make_checkout(root: Path, archive: Path) -> tuple[Path, str]:
    """A copy of what serve.sh runs, with free ports; (its folder, its inference URL)."""
    checkout = root / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("scripts", "tooling", "handlers"):
        shutil.copytree(REPO / folder, checkout / folder, ignore=ignore)
    for path in (METRICS_CONFIG, LOG_CONFIG, REVIEW):
        shutil.copy(path, checkout / path.name)
    (checkout / ".venv").symlink_to(REPO / ".venv")
    (checkout / "model_store").mkdir()
    shutil.copy(archive, checkout / "model_store" / archive.name)
    setup = checkout / "scripts" / "setup.sh"
    # Not under test here (the repository's .venv and the test's archive): it only records whether it was asked for
    # the demo (SETUP_DEMO).
    setup.write_text('#!/usr/bin/env bash\necho "${SETUP_DEMO-unset}" >"$(dirname "$0")/../setup-demo"\n')
    setup.chmod(0o755)
    ports = {key: free_port() for key in ADDRESS_KEYS}
    config = SERVER_CONFIG.read_text()
    for key, port in ports.items():
        value = f"http://127.0.0.1:{port}" if key.endswith("_address") else str(port)
        config, found = re.subn(rf"^{key}=.*$", f"{key}={value}", config, flags=re.MULTILINE)
        assert found == 1, key
    (checkout / SERVER_CONFIG.name).write_text(config)
    return checkout, f"http://127.0.0.1:{ports['inference_address']}"


LEFT_UNPACKED = "0123456789abcdef0123456789abcdef"  # a folder name as TorchServe gives an unpacked archive


def plant_unpacked_archive(checkout: Path) -> Path:
    """An archive unpacked in the checkout's logs/tmp/models, as a server of it that was killed leaves one."""
    left = checkout / "logs" / "tmp" / "models" / LEFT_UNPACKED
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"weights")
    return left


@pytest.fixture(scope="module")
def served(tiny_checkpoint, make_archive, model_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-sh")
    checkout, inference_url = make_checkout(root, model_store / make_archive(tiny_checkpoint, MODEL))
    shims = root / "shims"
    shims.mkdir()
    curl_log = root / "curl-calls.log"
    shim(shims, "curl", shutil.which("curl"), curl_log)
    # A host whose nvidia-smi lists a GPU, as TorchServe 0.12's ConfigManager asks it ("--query-gpu=index
    # --format=csv": a header, then an index a line), while BERT_DEVICE=cpu asks for the CPU: the workers must get
    # no GPU, or each would refuse one its CPU-only torch cannot use and serve.sh would fail.
    smi = shims / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "index\\n0\\n"\n')
    smi.chmod(0o755)
    # A file the launchers must not let TorchServe read instead of the configuration serve.sh writes; it is the
    # same configuration, so that a launcher that passed it on is caught by the assertions, not by a failed start.
    planted = root / "planted.properties"
    planted.write_text((checkout / "config.properties").read_text())
    env = {
        **os.environ,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
        "BERT_DEVICE": "cpu",
        "MODEL_NAME": MODEL,
        "TS_CONFIG_FILE": str(planted),
        "TS_OPEN_INFERENCE_PROTOCOL": "oip",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)  # TorchServe would read it instead of asking nvidia-smi
    env.pop("WORKERS", None)  # serve.sh decides them from the archive (a test below)
    env.pop("SETUP_DEMO", None)  # serve.sh decides it (a test below)
    plant_unpacked_archive(checkout)  # as a killed server of this checkout leaves it (a test below)
    script = subprocess.Popen(
        ["bash", "scripts/serve.sh"], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # serve.sh's group holds the TorchServe it starts: stopped by that group's id below
        umask=0o022,
    )  # fmt: skip
    group = process_record(script.pid)
    try:
        output, _ = script.communicate(timeout=240)  # under pytest's 300 s: a hang fails here, named
        assert script.returncode == 0, output
        java = psutil.Process(int((checkout / "logs" / "tmp" / ".model_server.pid").read_text()))
        keys = {name: entry["key"] for name, entry in json.loads((checkout / "key_file.json").read_text()).items()}
        assert set(keys) == set(KEY_NAMES)
        yield Served(checkout, output, calls(curl_log), keys, java, inference_url, env)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
        stop = subprocess.run(["bash", "scripts/stop.sh"], cwd=checkout, env=env, capture_output=True, timeout=120)
        # serve.sh's process group: its TorchServe, should stop.sh have left anything of it.
        stop_recorded(group, group=True)
        assert stop.returncode == 0 and b"stop: done" in stop.stdout, stop.stdout + stop.stderr


def test_serve_sh_starts_as_many_workers_as_the_cpus_hold_at_the_archives_threads(served):
    """The test's archive has the handler's default cpu_threads 0 (every CPU in each worker): one worker, whatever the
    CPUs, and where there are more than one, a line saying why and what gives one per CPU. It started one per core,
    each of every core: a PyTorch archive so served 6-9x fewer requests (docs/batching.md)."""
    from handlers.cpu_quota import usable_cpus

    assert f"==> registering {MODEL}.mar on cpu: batch_size=8 max_batch_delay=2ms workers=1\n" in served.output
    assert "default_workers_per_model=1" in (served.checkout / "logs" / "config.properties").read_text()
    management = read_properties(served.checkout / "config.properties")["management_address"]
    headers = {"Authorization": f"Bearer {served.keys['management']}"}
    workers = requests.get(f"{management}/models/{MODEL}", headers=headers, timeout=10)
    assert len(workers.json()[0]["workers"]) == 1, workers.text
    note = f"    {MODEL}.mar's workers run {usable_cpus()} threads each (its cpu_threads 0: every CPU), so 1 on"
    assert (note in served.output) == (usable_cpus() > 1), served.output


def test_serve_sh_puts_no_key_on_a_command_line_and_prints_none(served):
    assert any("/ping" in call for call in served.curl_calls), served.curl_calls
    [registration] = [call for call in served.curl_calls if "/models?url=" in call]
    assert "-H @/dev/fd/" in registration  # the header read from a pipe
    for name, key in served.keys.items():
        assert not [call for call in served.curl_calls if key in call], f"the {name} key on curl's command line"
        assert key not in served.output, f"serve.sh printed the {name} key"


def test_the_commands_serve_sh_prints_answer_with_no_key_on_a_command_line(served, tmp_path):
    """Run as printed, in the checkout, by bash with nothing on PATH but a recording curl and python3: any other
    program they ran would be missing, and the answer with it."""
    printed = served.output.split("Ready. Try:\n", 1)[1].split("\nMetrics:", 1)[0]
    lines = [line.removeprefix("  ") for line in printed.splitlines()]
    assert lines[0].startswith("KEY=") and len(lines) == 3, printed
    log = tmp_path / "calls.log"
    shim(tmp_path, "curl", shutil.which("curl"), log)
    shim(tmp_path, "python3", sys.executable, log)
    run = subprocess.run(
        [shutil.which("bash"), "-c", "\n".join(lines)], cwd=served.checkout, env={"PATH": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    answers, decoder, at = [], json.JSONDecoder(), 0
    while at < len(run.stdout):
        answer, at = decoder.raw_decode(run.stdout, at)
        answers.append(answer)
    assert [sorted(answer) for answer in answers] == [["label", "score", "scores", "truncated"]] * 2, run.stdout
    made = calls(log)
    assert [call.split()[0] for call in made] == ["python3", "curl", "curl"], made
    assert not [call for call in made for key in served.keys.values() if key in call], made


def test_serve_sh_starting_a_server_clears_what_a_killed_one_left_unpacked(served):
    """A server that is killed leaves the archives it unpacked in logs/tmp/models (TorchServe removes a model's folder
    at its unregistration or at the server's stop only), each start of one after it more: serve.sh, starting the only
    server of the checkout, clears them first. The one it registered is there, unpacked."""
    unpacked = served.checkout / "logs" / "tmp" / "models"
    assert not (unpacked / LEFT_UNPACKED).exists()
    assert [path.name for path in unpacked.glob("*/MAR-INF")] == ["MAR-INF"], list(unpacked.iterdir())


def test_the_server_serve_sh_starts_writes_its_key_file_and_logs_for_its_owner_alone(served):
    assert umask_of(served.java.pid) == "0077"  # key_file.json is created 0600, never 0644 until TorchServe narrows it
    written = [served.checkout / "key_file.json", *(served.checkout / "logs").glob("*.log")]
    assert len(written) > 3
    for path in written:
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} is open to others: {oct(path.stat().st_mode)}"


def test_the_server_serve_sh_starts_ignores_the_variables_that_would_replace_its_configuration(served):
    environment = served.java.environ()
    assert not [name for name in IGNORED_VARIABLES if name in environment]
    command = served.java.cmdline()
    assert command[command.index("-f") + 1] == "logs/config.properties", command


def test_a_text_in_the_query_string_reaches_no_log(served):
    """On /invocations TorchServe hands every query parameter to the handler as an input (the text is classified),
    and its access log names the whole URI."""
    key = {"Authorization": f"Bearer {served.keys['inference']}"}
    url = f"{served.inference_url}/invocations"
    answer = requests.post(url, params={"model_name": MODEL, "text": f"a review {MARKER}"}, headers=key, timeout=60)
    assert answer.status_code == 200 and answer.json()["label"], answer.text
    logs_caught_up(served, MODEL)  # every line the request made the server write is written (was: a second's sleep)
    logs = {path.name: path.read_text(errors="replace") for path in served.log_dir.rglob("*.log")}
    assert [name for name, text in logs.items() if MARKER in text] == []
    assert '"POST /invocations?<redacted> HTTP/1.1" 200' in logs["access_log.log"]


def test_with_bert_device_cpu_no_worker_gets_the_gpu_nvidia_smi_lists(served):
    """The fixture's nvidia-smi lists GPU 0; serve.sh registered the model all the same (a worker given the GPU
    would have refused it: the repository's torch is a CPU build), and TorchServe gave no worker a GPU."""
    config = (served.checkout / "logs" / "config.properties").read_text().splitlines()
    assert "number_of_gpu=0" in config
    management = re.search(r"^management_address=(.*)$", "\n".join(config), flags=re.MULTILINE).group(1)
    key = {"Authorization": f"Bearer {served.keys['management']}"}
    [described] = requests.get(f"{management}/models/{MODEL}", headers=key, timeout=30).json()
    assert described["workers"] and not any(worker["gpu"] for worker in described["workers"]), described


def test_serve_sh_run_again_with_another_budget_leaves_the_running_server_and_its_configuration_and_says_so(served):
    """A second run finds the server running: the same settings pass silently; another latency budget (another
    job_queue_size) cannot reach a running TorchServe, so logs/config.properties, which describes it, stays as it
    is, and serve.sh says how to apply the budget."""
    config = served.checkout / "logs" / "config.properties"
    written = config.read_bytes()

    def again(**variables: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "scripts/serve.sh"], cwd=served.checkout, env={**served.env, **variables},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    same = again()
    assert same.returncode == 0, same.stderr
    assert "already running" in same.stdout and "keeps its configuration" not in same.stderr, same.stderr
    other = again(LATENCY_BUDGET_MS="500")
    assert other.returncode == 0, other.stderr
    assert "already running" in other.stdout and "already registered" in other.stdout, other.stdout
    queue = re.search(r"^job_queue_size=(\d+)$", written.decode(), flags=re.MULTILINE).group(1)
    assert f"keeps its configuration (default_workers_per_model=1 job_queue_size={queue})" in other.stderr
    assert "latency budget 500 ms" in other.stderr and "scripts/stop.sh, then this script" in other.stderr
    assert config.read_bytes() == written


def test_serve_sh_registering_on_a_server_that_keeps_another_budget_names_the_servers_queue(served):
    """The model gone from a server that runs with another configuration than this run's: serve.sh registers it and
    names the queue the server has (logs/config.properties), not the one this run's budget asks for."""
    config = (served.checkout / "logs" / "config.properties").read_text()
    queue = re.search(r"^job_queue_size=(\d+)$", config, flags=re.MULTILINE).group(1)
    management = re.search(r"^management_address=(.*)$", config, flags=re.MULTILINE).group(1)
    key = {"Authorization": f"Bearer {served.keys['management']}"}
    removed = requests.delete(f"{management}/models/{MODEL}", headers=key, timeout=120)
    assert removed.status_code == 200, removed.text
    for _ in range(60):
        if requests.get(f"{management}/models/{MODEL}", headers=key, timeout=30).status_code == 404:
            break
        time.sleep(0.5)
    run = subprocess.run(
        ["bash", "scripts/serve.sh"], cwd=served.checkout, env={**served.env, "LATENCY_BUDGET_MS": "500"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "keeps its configuration" in run.stderr and f"==> registering {MODEL}.mar" in run.stdout, run.stdout
    assert f"    job_queue_size={queue}: the running server's, not this run's" in run.stdout, run.stdout
    assert "latency budget 500 ms at" not in run.stdout, run.stdout


def checkout_without_a_model(root: Path) -> tuple[Path, str]:
    """make_checkout with an archive of a manifest and handler options alone (what serve.sh reads of it before it
    starts a server), for runs of serve.sh that end before any registration."""
    return make_checkout(root, archive_with_handler_options(root / "bert.mar", {"cpu_threads": 1}))


@contextlib.contextmanager
def stand_in_torchserve(checkout: Path, code: str) -> Iterator[subprocess.Popen]:
    """A process the checkout's pid file names, with a TorchServe frontend's command line (its main class, the
    checkout's temp folder as its Java temp dir), running `code`, which prints a line once it is ready; killed after.
    Reaped as soon as it ends, as a real frontend is (by init: its launcher has exited): `torchserve --stop` waits
    until the pid is gone, a zombie included."""
    tmpdir = checkout / "logs" / "tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", code, f"-Djava.io.tmpdir={tmpdir}", "org.pytorch.serve.ModelServer"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    threading.Thread(target=server.wait, daemon=True).start()
    try:
        server.stdout.readline()
        (tmpdir / ".model_server.pid").write_text(str(server.pid))
        yield server
    finally:
        server.kill()
        server.wait()


# Runs its arguments as a subreaper (prctl PR_SET_CHILD_SUBREAPER): a process orphaned below it (the Java frontend,
# once its launcher exits) becomes its child and, dead, stays a zombie until the command ends, as under a container's
# init that does not reap.
SUBREAPER = (
    "import ctypes, subprocess, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
    "sys.exit(subprocess.run(sys.argv[1:]).returncode)"
)


def run_serve_sh(checkout: Path, timeout: float, zombies: bool = False) -> subprocess.CompletedProcess:
    """serve.sh in the checkout on the CPU, to its end; its limit is below pytest's, so a hang fails here, named.
    `zombies`: under SUBREAPER."""
    command = ["bash", "scripts/serve.sh"]
    if zombies:
        command = [sys.executable, "-c", SUBREAPER, *command]
    return subprocess.run(
        command, cwd=checkout, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        env={**without_setup_demo(), "BERT_DEVICE": "cpu", "WORKERS": "1"}, timeout=timeout,
    )  # fmt: skip


def test_serve_sh_says_why_torchserve_start_refused(tmp_path):
    """The pid file names a live TorchServe of this checkout that does not answer /ping (starting, or hung; here a
    stand-in with its command line): `torchserve --start` refuses, and serve.sh says so in its words, which only
    logs/console.log held, rather than stop with nothing said."""
    checkout, _ = checkout_without_a_model(tmp_path)
    in_use = plant_unpacked_archive(checkout)  # the running server's, as far as serve.sh can tell
    with stand_in_torchserve(checkout, "import time; print(flush=True); time.sleep(120)"):
        run = run_serve_sh(checkout, timeout=120)
    assert (checkout / "setup-demo").read_text() == "1\n", "serving the demo (bert), the set-up must build it"
    assert run.returncode == 1, run.stdout
    assert "torchserve --start failed; the end of logs/console.log:" in run.stderr, run.stderr
    assert "TorchServe is already running" in run.stderr and "scripts/stop.sh" in run.stderr, run.stderr
    assert in_use.is_dir(), "serve.sh cleared the unpacked archives of a server of the checkout that runs"


def test_serve_sh_says_a_frontend_that_takes_connections_and_never_answers_is_hung(tmp_path):
    """This checkout's TorchServe, by its pid file, holds the inference port and answers nothing (here a stand-in with
    its command line that listens and never accepts; a SIGSTOPped frontend does the same): serve.sh's /ping gives up
    after its limit and says so, with what to do, where it waited for ever."""
    checkout, inference_url = checkout_without_a_model(tmp_path)
    port = int(inference_url.rsplit(":", 1)[1])
    listen = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); print(flush=True); time.sleep(120)"
    (checkout / "key_file.json").write_text(json.dumps({name: {"key": "k"} for name in KEY_NAMES}))
    with stand_in_torchserve(checkout, listen):
        run = run_serve_sh(checkout, timeout=90)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"TorchServe takes connections on {inference_url} but does not answer /ping within 10 s" in run.stderr
    assert "scripts/stop.sh stops it" in run.stderr, run.stderr


def test_serve_sh_says_at_once_why_a_frontend_that_cannot_start_ended(tmp_path):
    """A JVM that cannot start (a heap too small for it, from config.properties' vmargs) ends before /ping answers:
    serve.sh says so at once, with what it printed (logs/console.log, where log4j2.xml writes nothing else), rather
    than wait out its two minutes and point at TorchServe's log, which does not hold the cause. The dead JVM stays a
    zombie meanwhile (nothing reaps it until serve.sh ends), which has ended all the same."""
    checkout, _ = checkout_without_a_model(tmp_path)
    config = checkout / "config.properties"
    config.write_text(config.read_text() + "vmargs=-Xmx1k\n")
    run = run_serve_sh(checkout, timeout=90, zombies=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "ended before it answered /ping; the end of logs/console.log:" in run.stderr, run.stderr
    assert "heap" in run.stderr, run.stderr  # the JVM's own words


def test_stop_sh_stops_a_frozen_frontend_in_seconds(tmp_path):
    """This checkout's TorchServe stopped by a signal (SIGSTOP here; a debugger, a terminal's Ctrl-Z) acts on no
    SIGTERM until it runs again: stop.sh continues it first, so it stops at once, where it took `torchserve --stop`'s
    60 s wait and ended saying to kill it."""
    checkout, _ = checkout_without_a_model(tmp_path)
    with stand_in_torchserve(checkout, "import time; print(flush=True); time.sleep(120)") as server:
        os.kill(server.pid, signal.SIGSTOP)
        stop = subprocess.run(["bash", "scripts/stop.sh"], cwd=checkout, capture_output=True, text=True, timeout=30)
        assert stop.returncode == 0 and "stop: done" in stop.stdout, stop.stdout + stop.stderr
        assert server.wait(timeout=10) == -signal.SIGTERM


def checkout_before_set_up(root: Path) -> tuple[Path, Path]:
    """What serve.sh runs before its set-up (scripts/, tooling/), the set-up a stand-in that touches a mark and fails:
    (the checkout, the mark). For the runs that must end before the set-up, and one that must get that far."""
    checkout = root / "checkout"
    for folder in ("scripts", "tooling"):
        shutil.copytree(REPO / folder, checkout / folder, ignore=shutil.ignore_patterns("__pycache__"))
    mark = root / "set-up-ran"
    (checkout / "scripts" / "setup.sh").write_text(f"#!/usr/bin/env bash\ntouch {shlex.quote(str(mark))}\nexit 1\n")
    return checkout, mark


def test_serve_sh_without_curl_names_the_package_before_anything_runs(tmp_path):
    """PATH holds every command of the test's PATH but curl: serve.sh stops at once, naming the package, before the
    set-up (here a stand-in that leaves a mark) or anything else runs."""
    checkout, mark = checkout_before_set_up(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in filter(os.path.isdir, os.environ["PATH"].split(os.pathsep)):
        for command in Path(directory).iterdir():
            link = bin_dir / command.name
            if command.name != "curl" and not link.exists() and command.is_file() and os.access(command, os.X_OK):
                link.symlink_to(command)
    environment = {**os.environ, "PATH": str(bin_dir)}
    assert shutil.which("curl", path=str(bin_dir)) is None and shutil.which("python3", path=str(bin_dir))
    run = subprocess.run(
        [shutil.which("bash"), "scripts/serve.sh"], cwd=checkout, env=environment, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run
    assert "scripts/serve.sh needs curl" in run.stderr and "apt-get install -y curl" in run.stderr, run.stderr
    assert not mark.exists() and not (checkout / "logs").exists()


def test_serve_sh_for_another_model_says_its_queue_follows_the_demos_rate_unless_told_its_own(served):
    """MODEL_NAME without THROUGHPUT_RPS: the queue is sized from the demo archive's measured rate, which a slower model
    of the user's would outrun: serve.sh says so and names the knob."""
    assert f"is the demo archive's measured rate on this host, not {MODEL}'s" in served.output, served.output
    assert "set THROUGHPUT_RPS" in served.output


def test_serve_sh_for_another_model_asks_the_set_up_for_no_demo(served):
    """The demo's training and archiving (a minute or more) serve nothing when another model is served: serve.sh
    runs the set-up with SETUP_DEMO=0 (tests/unit/test_setup_sh.py: what that skips). The demo's case: above."""
    assert (served.checkout / "setup-demo").read_text() == "0\n"


def without_setup_demo() -> dict[str, str]:
    """This environment without SETUP_DEMO, which serve.sh decides when it is not given."""
    return {name: value for name, value in os.environ.items() if name != "SETUP_DEMO"}


def test_serve_sh_for_an_archive_not_in_the_store_says_how_to_make_it_before_anything_runs(tmp_path):
    """MODEL_NAME naming no archive of model_store/: said at once, with the command that makes it, before the set-up
    (here a stand-in that leaves a mark) or a server start; the registration's 404 came minutes later."""
    checkout, mark = checkout_before_set_up(tmp_path)
    (checkout / "model_store").mkdir()
    run = subprocess.run(
        ["bash", "scripts/serve.sh"], cwd=checkout, env={**os.environ, "MODEL_NAME": "mine"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run
    assert "no model_store/mine.mar to serve" in run.stderr, run.stderr
    assert "python -m scripts.archive_model CHECKPOINT --name mine" in run.stderr, run.stderr
    assert not mark.exists() and not (checkout / "logs").exists()


SETTINGS = ("BATCH_SIZE", "MAX_BATCH_DELAY", "WORKERS", "LATENCY_BUDGET_MS", "THROUGHPUT_RPS")


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("BATCH_SIZE", "0", "0 is not a whole number of 1 or more"),
        ("MAX_BATCH_DELAY", "-1", "-1 is negative"),  # TorchServe registered it as given
        ("WORKERS", "two", "'two' is not a whole number"),
        ("LATENCY_BUDGET_MS", "1s", "'1s' is not a whole number"),
        ("LATENCY_BUDGET_MS", "1_000", "'1_000' is not a whole number: digits only"),  # Python's int() takes it
        ("THROUGHPUT_RPS", "inf", "'inf' is not a finite number"),
    ],
)
def test_serve_sh_refuses_a_setting_that_means_nothing_by_its_name_before_the_set_up(tmp_path, name, value, why):
    """It was scripts/latency_budget.py's usage after the set-up (minutes on a fresh machine), naming `--budget-ms`,
    which the user never typed, then a shell error; MAX_BATCH_DELAY=-1 was registered as given."""
    checkout, mark = checkout_before_set_up(tmp_path)
    environment = {key: item for key, item in os.environ.items() if key not in SETTINGS}
    run = subprocess.run(
        ["bash", "scripts/serve.sh"], cwd=checkout, env={**environment, name: value}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run
    assert run.stderr.startswith(f"scripts/serve.sh: {name}: {why} ("), run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert not mark.exists() and not (checkout / "logs").exists()


def test_serve_sh_takes_every_setting_that_means_something_and_empty_ones_as_unset(tmp_path):
    """The least values that mean something, and empty ones (serve.sh's defaults), get as far as the set-up."""
    checkout, mark = checkout_before_set_up(tmp_path)
    given = dict(zip(SETTINGS, ("1", "0", "", "1", "0.5"), strict=True))
    run = subprocess.run(
        ["bash", "scripts/serve.sh"], cwd=checkout, env={**os.environ, **given}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert mark.exists(), run  # the stand-in set-up ran (and failed, ending the run)
    assert "scripts/serve.sh:" not in run.stderr, run.stderr
