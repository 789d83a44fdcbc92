"""Is this a GPU host? One answer for set-up and serve.sh, printed as shell assignments to `eval`.

    eval "$(python3 scripts/detect_device.py [--python PYTHON])"
    # DEVICE=cpu|gpu  GPUS=<count>  CUDA_TORCH=0|1  DEVICE_REASON='<why, in words>'

BERT_DEVICE=cpu|gpu forces the answer (auto, the default, decides). Auto says gpu when
`nvidia-smi -L` lists a GPU, or when PYTHON (the interpreter the set-up builds .venv from) imports a
torch that sees CUDA. CUDA_TORCH=1 means that interpreter already has such a torch: the set-up then
keeps it (a CUDA container or GPU image) instead of installing another build.

Standard library only: it runs before .venv exists.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

CHOICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "gpu"
    gpus: int
    cuda_torch: bool
    reason: str

    def shell(self) -> str:
        return "\n".join(
            [
                f"DEVICE={self.kind}",
                f"GPUS={self.gpus}",
                f"CUDA_TORCH={int(self.cuda_torch)}",
                f"DEVICE_REASON={shlex.quote(self.reason)}",
            ]
        )


def listed_gpus() -> int:
    """GPUs that `nvidia-smi -L` lists (lines "GPU 0: ..."); 0 without the tool or a driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if listing.returncode != 0:
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def torch_cuda_devices(python: str) -> int:
    """CUDA devices that `python`'s torch sees; 0 when it has no torch or a CPU build."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    try:
        return int(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else 0
    except (ValueError, IndexError):
        return 0


def detect(choice: str, python: str) -> Device:
    if choice not in CHOICES:
        raise ValueError(f"BERT_DEVICE must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "cpu":
        return Device("cpu", 0, False, "BERT_DEVICE=cpu")
    listed = listed_gpus()
    in_torch = torch_cuda_devices(python)
    gpus = max(listed, in_torch)
    if choice == "gpu":
        return Device("gpu", max(gpus, 1), in_torch > 0, "BERT_DEVICE=gpu")
    if in_torch:
        return Device("gpu", gpus, True, f"{python}'s torch sees {in_torch} CUDA device(s)")
    if listed:
        return Device("gpu", gpus, False, f"nvidia-smi lists {listed} GPU(s)")
    return Device("cpu", 0, False, "no GPU listed by nvidia-smi and no CUDA torch")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch to probe")
    args = parser.parse_args(argv)
    try:
        device = detect(os.environ.get("BERT_DEVICE", "auto") or "auto", args.python)
    except ValueError as exc:
        print(f"detect_device: {exc}", file=sys.stderr)
        return 2
    print(device.shell())
    return 0


if __name__ == "__main__":
    sys.exit(main())
