"""scripts/setup.sh's own decisions, run for real in a copy of the checkout with stand-ins for what it calls.

PYTHON is a stand-in whose `-m venv` makes a fake .venv the way `python -m venv` does (pyvenv.cfg, then bin/python,
then pip: VENV_FAILS stops it before pip, as a missing python3.11-venv or a Ctrl-C would); anything else it hands to
the real interpreter. The fake .venv's python answers `-m pip` only once pip is there, and archives by touching
model_store/bert.mar (ARCHIVE_FAILS: then fails, as an interrupted archiving would). Every call is logged. Nothing
here touches the repository's .venv or model_store; the last test reads what the real set-up left in .venv.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tooling.paths import REPO

VENV_PYTHON = """#!/bin/sh
venv=$(cd "$(dirname "$0")/.." && pwd)
echo "venv-python $*" >>"$LOG"
case "$1 $2" in
  "-m pip") [ -d "$venv/lib/python3.11/site-packages/pip" ] || { echo "No module named pip" >&2; exit 1; } ;;
  "-m scripts.archive_model") touch model_store/bert.mar; [ -z "${ARCHIVE_FAILS:-}" ] || exit 1 ;;
  -c*) echo "$venv/lib/python3.11/site-packages" ;;  # the one question setup.sh asks it: its purelib
esac
"""

PYTHON = """#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
  shift 2
  system=false
  if [ "$1" = --system-site-packages ]; then system=true; shift; fi
  echo "venv $system" >>"$LOG"
  mkdir -p "$1/bin" "$1/lib/python3.11/site-packages"
  printf 'home = /usr/bin\\ninclude-system-site-packages = %s\\nversion = 3.11.7\\n' "$system" >"$1/pyvenv.cfg"
  cp {venv_python} "$1/bin/python"
  if [ -n "${VENV_FAILS:-}" ]; then echo "ensurepip is not available" >&2; exit 1; fi
  mkdir "$1/lib/python3.11/site-packages/pip"
  exit 0
fi
if [ -n "${SITE_FAILS:-}" ] && [ "$1" = -c ]; then exit 1; fi
exec {real} "$@"
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "detect_device.py"):
        shutil.copy(REPO / "scripts" / name, checkout / "scripts" / name)
    (checkout / "scripts" / "install_system_packages.sh").write_text(
        '#!/usr/bin/env bash\necho system-packages >>"$LOG"\n'
    )
    (checkout / "scripts" / "install_system_packages.sh").chmod(0o755)
    for name in ("pyproject.toml", "requirements.lock", "model-config.yaml", "handlers/handler.py",
                 "tooling/archiving.py", "tooling/onnx_export.py", "build/demo-model/config.json"):  # fmt: skip
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(f"# {name}\n")
    (checkout / "model_store").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "venv-python").write_text(VENV_PYTHON)
    python = bin_dir / "python"
    python.write_text(PYTHON.replace("{venv_python}", str(bin_dir / "venv-python")).replace("{real}", sys.executable))
    for path in (python, bin_dir / "venv-python"):
        path.chmod(0o755)
    return checkout


def setup(checkout: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": str(checkout.parent / "bin" / "python"), "LOG": str(checkout.parent / "calls.log"),
           "BERT_DEVICE": "cpu", **variables}  # fmt: skip
    for name in ("TORCH_SPEC", "SETUP_EXTRAS", "SETUP_DEMO", "VENV_FAILS", "ARCHIVE_FAILS", "SITE_FAILS"):
        if name not in variables:
            env.pop(name, None)
    return subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )


def calls(checkout: Path) -> list[str]:
    """Every call the stand-ins logged, in order."""
    log = checkout.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def creations(checkout: Path) -> list[str]:
    return [line for line in calls(checkout) if line.startswith("venv ")]


def test_a_device_setting_it_cannot_read_stops_the_set_up_with_its_reason_alone(checkout):
    """detect_device refuses BERT_DEVICE=foo; the set-up went on past it (eval of a failed substitution succeeds) into
    a shell error, `DEVICE: unbound variable`."""
    refused = setup(checkout, BERT_DEVICE="foo")
    assert refused.returncode == 2, refused  # detect_device's own status, as argparse's refusals
    assert refused.stderr.strip() == "detect_device: BERT_DEVICE must be one of auto, cpu, gpu, not 'foo'", refused
    assert "==> device" not in refused.stdout and calls(checkout) == [], refused.stdout  # no apt-get, no .venv
    assert setup(checkout).returncode == 0 and "system-packages" in calls(checkout)  # what the stand-in logs


def test_a_venv_whose_creation_stopped_before_pip_is_made_again(checkout):
    failed = setup(checkout, VENV_FAILS="1")
    assert failed.returncode != 0 and (checkout / ".venv" / "bin" / "python").exists(), failed.stderr
    again = setup(checkout)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "==> .venv is incomplete (its creation failed or was interrupted): making it again" in again.stdout
    assert creations(checkout) == ["venv false", "venv false"]
    assert setup(checkout).returncode == 0 and len(creations(checkout)) == 2  # a complete one is kept


def test_a_kept_torch_venv_whose_pth_was_not_written_is_made_again(checkout):
    """In keep mode the .pth file is the creation's last step: PYTHON failing to name its packages leaves none."""
    failed = setup(checkout, TORCH_SPEC="keep", SITE_FAILS="1")
    assert failed.returncode != 0, failed.stdout
    again = setup(checkout, TORCH_SPEC="keep")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "==> .venv is incomplete" in again.stdout and creations(checkout) == ["venv true", "venv true"]
    assert (checkout / ".venv" / "lib" / "python3.11" / "site-packages" / "kept-python.pth").read_text().strip()


def test_a_venv_made_for_the_other_torch_is_made_again(checkout):
    assert setup(checkout).returncode == 0
    keep = setup(checkout, TORCH_SPEC="keep")
    assert keep.returncode == 0, keep.stdout + keep.stderr
    assert "==> .venv was made without --system-site-packages, this run keeps" in keep.stdout, keep.stdout
    assert "include-system-site-packages = true" in (checkout / ".venv" / "pyvenv.cfg").read_text()
    assert setup(checkout, TORCH_SPEC="keep").returncode == 0  # the same mode again: kept
    back = setup(checkout)
    assert back.returncode == 0 and "==> .venv was made with --system-site-packages, this run replaces" in back.stdout
    assert creations(checkout) == ["venv false", "venv true", "venv false"]


CPU_ARCHIVE = "cpu --backend onnx --handler-option cpu_threads=1"
ARCHIVING = "venv-python -m scripts.archive_model build/demo-model --name bert "


def archivings(checkout: Path) -> list[str]:
    """The archive options of each archiving the set-up ran, in order."""
    return [line.removeprefix(ARCHIVING) for line in calls(checkout) if line.startswith(ARCHIVING)]


def test_a_gpu_host_archives_the_demo_for_pytorch_with_cuda_graphs_and_a_change_of_kind_archives_again(checkout):
    assert setup(checkout).returncode == 0
    gpu = setup(checkout, BERT_DEVICE="gpu")
    assert gpu.returncode == 0, gpu.stdout + gpu.stderr
    assert "==> archiving model_store/bert.mar (PyTorch, float16 on the GPU, CUDA graphs)" in gpu.stdout, gpu.stdout
    assert archivings(checkout) == ["--backend onnx --handler-option cpu_threads=1",
                                    "--backend pytorch --handler-option cuda_graphs=true"]  # fmt: skip
    stamp = checkout / "model_store" / ".bert.mar.device"
    assert stamp.read_text() == "gpu --backend pytorch --handler-option cuda_graphs=true\n"
    assert "==> model_store/bert.mar is up to date" in setup(checkout, BERT_DEVICE="gpu").stdout
    # An archive built with other options (the stamp of a set-up before the graphs) is built again.
    stamp.write_text("gpu --backend pytorch\n")
    assert "==> archiving model_store/bert.mar" in setup(checkout, BERT_DEVICE="gpu").stdout
    assert len(archivings(checkout)) == 3


def test_setup_demo_0_trains_and_archives_no_demo_and_the_default_does(checkout):
    """What serve.sh asks when it serves another model: the set-up without the demo's training and archiving."""
    without = setup(checkout, SETUP_DEMO="0")
    assert without.returncode == 0, without.stdout + without.stderr
    assert without.stdout.rstrip().endswith("==> demo model: not built (SETUP_DEMO=0)"), without.stdout
    assert not [line for line in calls(checkout) if "build_demo_model" in line] and archivings(checkout) == []
    assert not (checkout / "model_store" / "bert.mar").exists()
    assert setup(checkout).returncode == 0
    assert "venv-python -m scripts.build_demo_model" in calls(checkout)
    assert archivings(checkout) == ["--backend onnx --handler-option cpu_threads=1"]


def test_the_test_command_builds_the_demo_whatever_the_environment_says(tmp_path):
    """scripts/test.sh (README command 2) sets SETUP_DEMO=1: the tests need the demo, even where a user exported 0."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", checkout / "scripts" / "test.sh")
    stand_ins = {"scripts/setup.sh": 'echo "setup SETUP_DEMO=$SETUP_DEMO"', ".venv/bin/python": 'echo "python $*"'}
    for name, says in stand_ins.items():
        (checkout / name).write_text(f"#!/bin/sh\n{says}\n")
        (checkout / name).chmod(0o755)
    run = subprocess.run(["bash", "scripts/test.sh", "-k", "nothing"], cwd=checkout, capture_output=True, text=True,
                         env={**os.environ, "SETUP_DEMO": "0"}, timeout=30)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "setup SETUP_DEMO=1",
        "python -m pytest --numprocesses 2 --dist loadfile -k nothing",
    ], run.stdout


def test_byte_code_does_not_rebuild_the_archive_and_an_interrupted_rebuild_is_not_trusted(checkout):
    assert setup(checkout).returncode == 0
    archive, stamp = checkout / "model_store" / "bert.mar", checkout / "model_store" / ".bert.mar.device"
    assert stamp.read_text() == f"{CPU_ARCHIVE}\n"
    for path in checkout.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    os.utime(archive, (2_000_000, 2_000_000))
    # A test run's imports write byte code: a new handlers/__pycache__ (handlers/ changes too) and its .pyc.
    (checkout / "handlers" / "__pycache__").mkdir()
    (checkout / "handlers" / "__pycache__" / "handler.cpython-311.pyc").write_bytes(b"\0")
    current = setup(checkout)
    assert "==> model_store/bert.mar is up to date" in current.stdout, current.stdout
    # A handler change, then an archiving interrupted after it wrote bert.mar: the next run archives again.
    os.utime(checkout / "handlers" / "handler.py", (3_000_000, 3_000_000))
    interrupted = setup(checkout, ARCHIVE_FAILS="1")
    assert interrupted.returncode != 0 and archive.stat().st_mtime > 3_000_000 and not stamp.exists()
    again = setup(checkout)
    assert again.returncode == 0 and "==> archiving model_store/bert.mar" in again.stdout, again.stdout
    assert stamp.read_text() == f"{CPU_ARCHIVE}\n"


def test_an_archive_written_over_the_demos_since_is_kept_and_not_called_up_to_date(checkout):
    # docs/checkpoints.md once had the demo's int8 archive written as model_store/bert.mar: the next set-up said
    # "up to date (ONNX Runtime, fp32)" and serve.sh served it so.
    assert setup(checkout).returncode == 0
    archive = checkout / "model_store" / "bert.mar"
    archive.write_bytes(b"an int8 archive written by hand")
    rerun = setup(checkout)
    assert rerun.returncode == 0, rerun.stderr
    assert "==> model_store/bert.mar was written since the set-up archived it" in rerun.stdout, rerun.stdout
    assert "is up to date" not in rerun.stdout
    assert archive.read_bytes() == b"an int8 archive written by hand" and len(archivings(checkout)) == 1
    archive.unlink()  # as the message says: the demo is archived again, and up to date after
    assert "==> archiving model_store/bert.mar" in setup(checkout).stdout
    assert "==> model_store/bert.mar is up to date" in setup(checkout).stdout


def test_the_set_up_byte_compiles_modules_that_nothing_imports():
    """The set-up byte-compiles what it installs (pip's default, kept on purpose: scripts/setup.sh). Where
    PYTHONDONTWRITEBYTECODE is set, as on this project's machines, nothing else writes the .pyc files, and every
    process would compile torch anew (the suite took 1.5x as long). Read on TorchServe's stock handlers for images
    and LLMs, which nothing here imports (so no test process wrote their byte code), in this checkout's .venv:
    TorchServe is installed there on every kind of host, a kept torch not."""
    [ts] = importlib.util.find_spec("ts").submodule_search_locations
    sources = sorted(Path(ts, "torch_handler").glob("*.py"))
    assert len(sources) > 10, sources
    missing = [source.name for source in sources if not Path(importlib.util.cache_from_source(str(source))).is_file()]
    assert not missing, f"no byte code beside {missing} in {Path(ts, 'torch_handler')}: did the set-up compile?"
