#!/usr/bin/env bash
# Idempotent set-up: .venv at the repo root, the project and its dependencies, the
# demo model (build/demo-model) and its archive (model_store/bert.mar; SETUP_DEMO=0: neither). A second run
# skips every step whose output is already current.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

# A GPU host (scripts/detect_device.py: nvidia-smi lists a GPU, or PYTHON's torch sees CUDA;
# BERT_DEVICE=cpu|gpu forces it) gets torch with CUDA and the demo archived for the GPU.
# Assigned first, then eval'd: eval of a failed command substitution runs nothing and succeeds (set -e goes on).
device=$("$PYTHON" scripts/detect_device.py --python "$PYTHON")
eval "$device"
echo "==> device: $DEVICE ($DEVICE_REASON)"

# HAProxy and Prometheus (Debian packages) for the fleet: installed when missing and running as root. After the
# device, so that a BERT_DEVICE it cannot read is said before an apt-get of seconds to minutes.
scripts/install_system_packages.sh

# torch: on a CPU host the pinned CPU build this project is tested with. On a GPU host whose PYTHON
# already has a CUDA torch (a CUDA container, a GPU image), .venv sees it and keeps it; otherwise the
# same pin from PyPI, whose Linux x86_64 wheel is the CUDA build (its nvidia-* packages come along).
# TORCH_SPEC overrides either; TORCH_SPEC=keep installs none.
if [ "$DEVICE" = gpu ] && [ "$CUDA_TORCH" = 1 ]; then
  TORCH_SPEC=${TORCH_SPEC:-keep}
fi
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# A .venv is reused only when its creation finished, for the torch this run wants. `python -m venv` writes
# bin/python before ensurepip installs pip: a creation that failed (Debian without python3.11-venv) or was
# interrupted left one in which every later run died ("No module named pip"); in keep mode the .pth file
# below is its last step. One made for the other mode would serve the wrong torch: without
# --system-site-packages it hides PYTHON's CUDA torch, with them it mixes PYTHON's packages in.
if [ "$TORCH_SPEC" = keep ]; then system_site=true; else system_site=false; fi
kept_pth() { echo "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kept-python.pth"; }
if [ -e .venv ] || [ -L .venv ]; then
  incomplete="is incomplete (its creation failed or was interrupted)" remake=
  if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    remake=$incomplete
  elif [ "$(sed -n 's/^include-system-site-packages *= *//p' .venv/pyvenv.cfg 2>/dev/null)" != "$system_site" ]; then
    remake="was made $([ "$system_site" = true ] && echo without || echo with) --system-site-packages, this run"
    remake+=" $([ "$system_site" = true ] && echo keeps || echo replaces) $PYTHON's torch"
  elif [ "$system_site" = true ] && [ ! -s "$(kept_pth)" ]; then
    remake=$incomplete
  fi
  if [ -n "$remake" ]; then
    echo "==> .venv $remake: making it again"
    rm -rf .venv
  fi
fi
if [ ! -e .venv ]; then
  if [ "$TORCH_SPEC" = keep ]; then
    echo "==> creating .venv on $PYTHON's packages (its CUDA torch is kept)"
    "$PYTHON" -m venv --system-site-packages .venv
    # PYTHON may itself be a virtual environment (a CUDA image's /opt/…/.venv): --system-site-packages
    # reaches only its base interpreter's packages, so a .pth file adds PYTHON's own (after .venv's).
    # Written only once PYTHON has answered: a non-empty file is the creation's proof of completion (above).
    kept=$("$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))')
    echo "$kept" >"$(kept_pth)"
  else
    echo "==> creating .venv"
    "$PYTHON" -m venv .venv
  fi
fi

# requirements.lock (scripts/lock.sh) pins every other package: installed as constraints, so each
# set-up gets exactly the versions the suite passes with. A change to it, to pyproject.toml or to
# TORCH_SPEC reinstalls. SETUP_EXTRAS: the project's extras to install beside what serving needs:
# test and bench by default (README command 2, the benchmark); serve.sh asks for none, so a host that
# only serves installs only what serving needs. A set-up with more extras already installed satisfies one with fewer.
EXTRAS=${SETUP_EXTRAS-test,bench}
stamp=".venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)-${TORCH_SPEC//[^A-Za-z0-9.]/_}"
installed_extras=$(cat "$stamp" 2>/dev/null || echo none)
wanted=$(printf '%s\n' ${EXTRAS//,/ } | sort -u)
missing_extras=$(comm -23 <(echo "$wanted" | sed '/^$/d') <(printf '%s\n' ${installed_extras//,/ } | sort -u))
if [ ! -f "$stamp" ] || [ -n "$missing_extras" ]; then
  if [ -f "$stamp" ]; then
    EXTRAS=$(printf '%s\n' ${EXTRAS//,/ } ${installed_extras//,/ } | sort -u | paste -sd, -)
  fi
  constraints=requirements.lock
  if [ "$TORCH_SPEC" = keep ]; then
    # The kept torch came with its own dependencies (an image is built consistent): the lock governs
    # every other package, those stay as they are (torch 2.11's setuptools<82 would refuse the lock's).
    constraints=.venv/constraints-beside-kept-torch.txt
    .venv/bin/python scripts/constraints_beside.py torch requirements.lock >"$constraints"
  fi
  if [ "$TORCH_SPEC" = keep ]; then installing="the project (.${EXTRAS:+[$EXTRAS]}) beside the kept torch"
  else installing="$TORCH_SPEC and the project (.${EXTRAS:+[$EXTRAS]})"; fi
  echo "==> installing $installing at requirements.lock's versions"
  .venv/bin/python -m pip install --quiet --upgrade pip
  # Byte-compiled at install (torch: about 35 s), not skipped: where PYTHONDONTWRITEBYTECODE is set, as on
  # this project's machines, nothing else writes the .pyc files, and every process would compile torch from
  # source at each start (measured: the suite took 1.5x as long; tests/unit/test_setup_sh.py holds it). By pip,
  # as it installs: --no-compile then compileall on every core saved nothing on 2 cores (2026-11-28, a fresh venv
  # each, alternated: pip compiling 91.8 and 128.0 s, compiling after it 105.5 and 117.0 s).
  if [ "$TORCH_SPEC" != keep ]; then
    .venv/bin/python -m pip install --quiet --constraint requirements.lock "$TORCH_SPEC"
  fi
  .venv/bin/python -m pip install --quiet --constraint "$constraints" ".${EXTRAS:+[$EXTRAS]}"
  rm -f .venv/.installed-*
  echo "$EXTRAS" >"$stamp"
fi

# SETUP_DEMO=0: no demo model and no demo archive, for a host that serves an archive of its own (serve.sh with another
# MODEL_NAME sets it): the demo's training and archiving take a minute or more that nothing there uses. The tests
# need the demo: scripts/test.sh builds it whatever the environment says.
if [ "${SETUP_DEMO:-1}" = 0 ]; then
  echo "==> demo model: not built (SETUP_DEMO=0)"
  exit 0
fi

echo "==> demo model"
.venv/bin/python -m scripts.build_demo_model

# The demo archive: on a CPU host ONNX Runtime (fp32: the same answers as PyTorch, measured fastest on
# CPU, docs/benchmarks.md) with one thread per worker, as serve.sh starts one worker per core; on a GPU
# host PyTorch, float16 on CUDA (ONNX Runtime here has no CUDA provider, and a worker refuses to run an
# ONNX archive on the CPU when TorchServe gave it a GPU), each pass replayed from a CUDA graph, the passes
# planned by their measured times (faster than eager passes at 1, 256 and 1,024 clients on an H100, measured
# in docs/benchmarks.md, "CUDA graphs: passes planned by their measured times"). Rebuilt when the model,
# the handler code, its options, the export, the device or these archive options changed (the stamp holds
# the last two).
if [ "$DEVICE" = gpu ]; then
  archive=(--backend pytorch --handler-option cuda_graphs=true) described="PyTorch, float16 on the GPU, CUDA graphs"
else
  archive=(--backend onnx --handler-option cpu_threads=1) described="ONNX Runtime, fp32"
fi
built_for=model_store/.bert.mar.device built_as="$DEVICE ${archive[*]}"
# The archive's checksum as the set-up wrote it: a bert.mar written since by hand (another archive_model run) is
# not the set-up's, and is said to be so rather than called up to date.
written=model_store/.bert.mar.sha256
if [ ! -f model_store/bert.mar ] || [ "$(cat "$built_for" 2>/dev/null)" != "$built_as" ] \
   || [ -n "$(find build/demo-model handlers model-config.yaml tooling/archiving.py tooling/onnx_export.py \
                -type f -not -path '*/__pycache__/*' -newer model_store/bert.mar -print -quit)" ]; then
  # Files only, byte code aside: a test run that writes handlers/__pycache__/*.pyc touches that folder (and
  # handlers/ when it creates it), which is no reason to archive again.
  echo "==> archiving model_store/bert.mar ($described)"
  # An archiving interrupted midway may leave a bert.mar newer than its sources: without the stamp, the
  # next run archives again rather than trust it.
  rm -f "$built_for" "$written"
  .venv/bin/python -m scripts.archive_model build/demo-model --name bert "${archive[@]}"
  echo "$built_as" >"$built_for"
  sha256sum model_store/bert.mar | cut -d' ' -f1 >"$written"
elif [ -f "$written" ] && [ "$(sha256sum model_store/bert.mar | cut -d' ' -f1)" != "$(cat "$written")" ]; then
  echo "==> model_store/bert.mar was written since the set-up archived it, not as its $described archive:" \
    "kept as it is (delete it to have the demo archived again)"
else
  echo "==> model_store/bert.mar is up to date ($described)"
fi
