#!/usr/bin/env bash
# Refresh the lock: requirements.lock pins every package of pyproject.toml's dependencies and its
# test and bench extras (torch aside) for Python 3.11 on Linux x86_64; scripts/setup.sh installs
# with it as constraints. deploy/docker/requirements.txt, the serving image's packages, is derived
# from it, so the image gets the same versions.
#   scripts/lock.sh              after editing pyproject.toml: keeps every pin that still fits
#   scripts/lock.sh --upgrade    take the newest releases that fit (then run scripts/test.sh)
# Extra arguments go to `uv pip compile` (e.g. --upgrade-package transformers).
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
TOOLS=build/lock-tools
if [ ! -x "$TOOLS/bin/uv" ] || [ "$("$TOOLS/bin/uv" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  echo "==> installing uv $UV_VERSION into $TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet "uv==$UV_VERSION"
fi

# torch is resolved as the set-up installs it by default (TORCH_SPEC in scripts/setup.sh, the CPU
# build that pip's find-links provide here), so the lock pins that build's dependencies (sympy,
# networkx, …). torch itself is left out: TORCH_SPEC keeps the choice of build, and a CUDA build
# adds its nvidia-* packages unpinned.
torch_spec=$(sed -n 's/^TORCH_SPEC=\${TORCH_SPEC:-\(.*\)}$/\1/p' scripts/setup.sh)
[ -n "$torch_spec" ] || { echo "lock.sh: no default TORCH_SPEC in scripts/setup.sh" >&2; exit 1; }
find_links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
torch_constraint=$(mktemp)
trap 'rm -f "$torch_constraint"' EXIT
echo "$torch_spec" >"$torch_constraint"

target=(--python-version 3.11 --python-platform x86_64-manylinux_2_28)
"$TOOLS/bin/uv" pip compile pyproject.toml --extra test --extra bench "${target[@]}" \
  --constraint "$torch_constraint" --no-emit-package torch ${find_links:+--find-links "$find_links"} \
  --quiet --custom-compile-command scripts/lock.sh --output-file requirements.lock "$@"

"$TOOLS/bin/uv" pip compile deploy/docker/requirements.in --constraint requirements.lock "${target[@]}" \
  --quiet --no-annotate --custom-compile-command scripts/lock.sh --output-file deploy/docker/requirements.txt
echo "==> wrote requirements.lock and deploy/docker/requirements.txt"
