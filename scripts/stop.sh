#!/usr/bin/env bash
# Stop the TorchServe that scripts/serve.sh started from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/runtime_env.sh
.venv/bin/torchserve --stop --foreground
echo "stop: done"
