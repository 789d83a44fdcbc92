#!/usr/bin/env bash
# Idempotent set-up: .venv at the repo root, the project and its dependencies, the
# demo model (build/demo-model) and its archive (model_store/bert.mar). A second run
# skips every step whose output is already current.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

# HAProxy and Prometheus (Debian packages) for the fleet: installed when missing and running as root.
scripts/install_system_packages.sh

# A GPU host (scripts/detect_device.py: nvidia-smi lists a GPU, or PYTHON's torch sees CUDA;
# BERT_DEVICE=cpu|gpu forces it) gets torch with CUDA and the demo archived for the GPU.
eval "$("$PYTHON" scripts/detect_device.py --python "$PYTHON")"
echo "==> device: $DEVICE ($DEVICE_REASON)"

# torch: on a CPU host the pinned CPU build this project is tested with. On a GPU host whose PYTHON
# already has a CUDA torch (a CUDA container, a GPU image), .venv sees it and keeps it; otherwise the
# same pin from PyPI, whose Linux x86_64 wheel is the CUDA build (its nvidia-* packages come along).
# TORCH_SPEC overrides either; TORCH_SPEC=keep installs none.
if [ "$DEVICE" = gpu ] && [ "$CUDA_TORCH" = 1 ]; then
  TORCH_SPEC=${TORCH_SPEC:-keep}
fi
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
  if [ "$TORCH_SPEC" = keep ]; then
    echo "==> creating .venv on $PYTHON's packages (its CUDA torch is kept)"
    "$PYTHON" -m venv --system-site-packages .venv
  else
    echo "==> creating .venv"
    "$PYTHON" -m venv .venv
  fi
fi

# requirements.lock (scripts/lock.sh) pins every other package: installed as constraints, so each
# set-up gets exactly the versions the suite passes with. A change to it, to pyproject.toml or to
# TORCH_SPEC reinstalls.
stamp=".venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)-${TORCH_SPEC//[^A-Za-z0-9.]/_}"
if [ ! -f "$stamp" ]; then
  echo "==> installing $TORCH_SPEC and the project (.[test,bench]) at requirements.lock's versions"
  .venv/bin/python -m pip install --quiet --upgrade pip
  if [ "$TORCH_SPEC" != keep ]; then
    .venv/bin/python -m pip install --quiet --constraint requirements.lock "$TORCH_SPEC"
  fi
  .venv/bin/python -m pip install --quiet --constraint requirements.lock ".[test,bench]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

echo "==> demo model"
.venv/bin/python -m scripts.build_demo_model

# The demo archive: on a CPU host ONNX Runtime (fp32: the same answers as PyTorch, measured fastest on
# CPU, docs/benchmarks.md) with one thread per worker, as serve.sh starts one worker per core; on a GPU
# host PyTorch, float16 on CUDA (ONNX Runtime here has no CUDA provider, and a worker refuses to run an
# ONNX archive on the CPU when TorchServe gave it a GPU). Rebuilt when the model, the handler code, its
# options, the export or the device changed.
if [ "$DEVICE" = gpu ]; then
  archive=(--backend pytorch) described="PyTorch, float16 on the GPU"
else
  archive=(--backend onnx --handler-option cpu_threads=1) described="ONNX Runtime, fp32"
fi
built_for=model_store/.bert.mar.device
if [ ! -f model_store/bert.mar ] || [ "$(cat "$built_for" 2>/dev/null)" != "$DEVICE" ] \
   || [ -n "$(find build/demo-model handlers model-config.yaml tooling/archiving.py tooling/onnx_export.py -newer model_store/bert.mar -not -name '*.pyc' -print -quit)" ]; then
  echo "==> archiving model_store/bert.mar ($described)"
  .venv/bin/python -m scripts.archive_model build/demo-model --name bert "${archive[@]}"
  echo "$DEVICE" >"$built_for"
else
  echo "==> model_store/bert.mar is up to date ($described)"
fi
