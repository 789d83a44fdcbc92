"""deploy/systemd: the units systemd runs scripts/serve.sh and scripts/rotate_keys.py with, validated offline
(no systemd runs here as the init system): `systemd-analyze verify` on copies pointing at this checkout, and
their paths, pid file and timer held to what the scripts and TorchServe do."""

from __future__ import annotations

import configparser
import inspect
import re
import shutil
import subprocess

import pytest

from tooling.paths import REPO, SERVER_CONFIG
from tooling.torchserve import DEFAULT_KEY_LIFETIME_MIN, read_properties

UNITS = REPO / "deploy" / "systemd"
ROOT = "/opt/bert-torchserve"  # where the units expect the checkout
SERVICE, KEYS, TIMER = "bert-torchserve.service", "bert-torchserve-keys.service", "bert-torchserve-keys.timer"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def minutes(value: str) -> float:
    number, unit_name = re.fullmatch(r"(\d+)\s*(min|h)", value).groups()
    return float(number) * (60 if unit_name == "h" else 1)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_verifies_the_units_pointed_at_this_checkout(tmp_path):
    for path in UNITS.iterdir():
        (tmp_path / path.name).write_text(path.read_text().replace(ROOT, str(REPO)))
    result = subprocess.run(
        ["systemd-analyze", "verify", *(f"./{name}" for name in (SERVICE, KEYS, TIMER))],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_service_runs_the_scripts_of_its_checkout_and_follows_torchserve_by_its_pid_file():
    service = unit(SERVICE)["Service"]
    assert service["WorkingDirectory"] == ROOT
    assert service["ExecStart"] == f"{ROOT}/scripts/serve.sh" and service["ExecStop"] == f"{ROOT}/scripts/stop.sh"
    assert service["Type"] == "forking" and service["Restart"] == "on-failure"
    assert "143" in service["SuccessExitStatus"].split()  # Java's exit on ExecStop's SIGTERM is a stop, not a crash
    # serve.sh and stop.sh source runtime_env.sh, which points TMPDIR at logs/tmp; torchserve writes its
    # Java frontend's pid to TMPDIR/.model_server.pid, and systemd follows that process.
    assert 'TMPDIR="$PWD/logs/tmp"' in (REPO / "scripts" / "runtime_env.sh").read_text()
    import ts.model_server

    assert 'os.path.join(tempfile.gettempdir(), ".model_server.pid")' in inspect.getsource(ts.model_server.start)
    assert service["PIDFile"] == f"{ROOT}/logs/tmp/.model_server.pid"
    keys = unit(KEYS)
    assert keys["Service"]["WorkingDirectory"] == ROOT
    assert keys["Service"]["ExecStart"] == f"{ROOT}/.venv/bin/python -m scripts.rotate_keys"
    assert keys["Unit"]["Requisite"] == SERVICE and keys["Service"]["User"] == service["User"]


def test_both_services_create_files_for_their_user_alone():
    """TorchServe creates key_file.json with mode 0666 less the umask and narrows it to 0600 only after writing the
    keys: under systemd's default umask (0022) another local user could open it in between and read every later key."""
    for name in (SERVICE, KEYS):
        assert unit(name)["Service"]["UMask"] == "0077", name


def test_the_timer_issues_keys_before_the_servers_expire():
    """A key is issued at a start or by the timer; the timer fires again within its interval of its last run,
    so no key is older than the interval when it is replaced: less than the keys' lifetime."""
    timer = unit(TIMER)["Timer"]
    interval = minutes(timer["OnUnitActiveSec"])
    assert minutes(timer["OnActiveSec"]) == interval
    lifetime = float(read_properties(SERVER_CONFIG).get("token_expiration_min", DEFAULT_KEY_LIFETIME_MIN))
    assert interval < lifetime
