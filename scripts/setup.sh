#!/usr/bin/env bash
# Idempotent set-up: .venv at the repo root, the project and its dependencies, the
# demo model (build/demo-model) and its archive (model_store/bert.mar). A second run
# skips every step whose output is already current.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

# HAProxy and Prometheus (Debian packages) for the fleet: installed when missing and running as root.
scripts/install_system_packages.sh

# The pinned CPU build is what this project is tested with; on a GPU host set
# TORCH_SPEC to the CUDA build you want (an unpinned "torch" pulls CUDA wheels).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi

# requirements.lock (scripts/lock.sh) pins every other package: installed as constraints, so each
# set-up gets exactly the versions the suite passes with. A change to it, to pyproject.toml or to
# TORCH_SPEC reinstalls.
stamp=".venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)-${TORCH_SPEC//[^A-Za-z0-9.]/_}"
if [ ! -f "$stamp" ]; then
  echo "==> installing $TORCH_SPEC and the project (.[test,bench]) at requirements.lock's versions"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet --constraint requirements.lock "$TORCH_SPEC"
  .venv/bin/python -m pip install --quiet --constraint requirements.lock ".[test,bench]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

echo "==> demo model"
.venv/bin/python -m scripts.build_demo_model

# The demo archive runs on ONNX Runtime (fp32: the same answers as PyTorch, measured fastest on
# CPU, docs/benchmarks.md) with one thread per worker: serve.sh starts one worker per core. On a
# GPU host archive it with --backend pytorch instead (docs/checkpoints.md, Backends).
# Rebuild the archive when the model, the handler code, its options or the export changed.
if [ ! -f model_store/bert.mar ] || [ -n "$(find build/demo-model handlers model-config.yaml tooling/archiving.py tooling/onnx_export.py -newer model_store/bert.mar -not -name '*.pyc' -print -quit)" ]; then
  echo "==> archiving model_store/bert.mar (ONNX Runtime, fp32)"
  .venv/bin/python -m scripts.archive_model build/demo-model --name bert --backend onnx --handler-option cpu_threads=1
else
  echo "==> model_store/bert.mar is up to date"
fi
