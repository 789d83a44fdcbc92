"""scripts/detect_device.py: the one answer to "is this a GPU host?" that set-up and serve.sh act on.

Each case runs the script as set-up does, with a PATH holding a stand-in `nvidia-smi` (or none) and a
stand-in interpreter whose torch sees N CUDA devices (or has no torch), and reads back what `eval`
would set.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tooling.paths import REPO

SCRIPT = REPO / "scripts" / "detect_device.py"
H100_LISTING = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def detect(tmp_path: Path, *, listing: str | None, torch_devices: int | None, choice: str | None = None) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if listing is not None:
        executable(bin_dir / "nvidia-smi", f"printf '%s' {shlex.quote(listing)}\n")
    if torch_devices is None:  # an interpreter without torch: the probe's import fails
        python = executable(tmp_path / "python", "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1\n")
    else:
        python = executable(tmp_path / "python", f"echo {torch_devices}\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if choice is not None:
        env["BERT_DEVICE"] = choice
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--python", str(python)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # What `eval "$(python3 scripts/detect_device.py)"` sets, read back by a real shell.
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1"; echo "$DEVICE|$GPUS|$CUDA_TORCH|$DEVICE_REASON"', "_", result.stdout],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    device, gpus, cuda_torch, reason = shell.stdout.rstrip("\n").split("|")
    return {"device": device, "gpus": int(gpus), "cuda_torch": cuda_torch == "1", "reason": reason}


def test_a_host_without_a_gpu_is_a_cpu_host(tmp_path):
    found = detect(tmp_path, listing=None, torch_devices=None)
    assert found == {"device": "cpu", "gpus": 0, "cuda_torch": False, "reason": found["reason"]}
    assert "no GPU" in found["reason"]


def test_gpus_listed_by_nvidia_smi_make_a_gpu_host_that_still_needs_a_cuda_torch(tmp_path):
    found = detect(tmp_path, listing=H100_LISTING, torch_devices=None)
    assert (found["device"], found["gpus"], found["cuda_torch"]) == ("gpu", 2, False)
    assert "nvidia-smi lists 2 GPU(s)" in found["reason"]


def test_mig_devices_listed_under_a_gpu_are_not_counted_as_gpus(tmp_path):
    """With MIG on, `nvidia-smi -L` lists each MIG device indented under its GPU: one GPU, however many slices."""
    listing = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-0)\n"
        "  MIG 1g.10gb     Device  1: (UUID: MIG-1)\n"
    )
    found = detect(tmp_path, listing=listing, torch_devices=None)
    assert (found["device"], found["gpus"]) == ("gpu", 1)


def test_a_cuda_torch_already_installed_is_a_gpu_host_whose_torch_is_kept(tmp_path):
    # A CUDA container may lack nvidia-smi on PATH; the interpreter's torch still sees the device.
    found = detect(tmp_path, listing=None, torch_devices=1)
    assert (found["device"], found["gpus"], found["cuda_torch"]) == ("gpu", 1, True)


def test_a_cpu_build_of_torch_on_a_gpu_host_is_not_kept(tmp_path):
    found = detect(tmp_path, listing=H100_LISTING, torch_devices=0)
    assert (found["device"], found["cuda_torch"]) == ("gpu", False)


def test_nvidia_smi_without_a_working_driver_lists_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9\n")
    assert detect(tmp_path, listing=None, torch_devices=None)["device"] == "cpu"


@pytest.mark.parametrize(
    ("choice", "listing", "torch_devices", "expected"),
    [("cpu", H100_LISTING, 1, ("cpu", 0)), ("gpu", None, None, ("gpu", 1)), ("auto", None, None, ("cpu", 0))],
)
def test_bert_device_forces_either_way(tmp_path, choice, listing, torch_devices, expected):
    found = detect(tmp_path, listing=listing, torch_devices=torch_devices, choice=choice)
    assert (found["device"], found["gpus"]) == expected


def test_an_unknown_choice_is_refused_with_the_choices(tmp_path):
    env = {**os.environ, "BERT_DEVICE": "tpu"}
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "BERT_DEVICE must be one of auto, cpu, gpu, not 'tpu'" in result.stderr
