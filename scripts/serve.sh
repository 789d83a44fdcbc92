#!/usr/bin/env bash
# README command 1: set up if needed, start TorchServe, register the model through the
# management API with dynamic batching, wait until it is ready, print a curl to try.
#   BATCH_SIZE       largest batch TorchServe hands the handler   (default 8)
#   MAX_BATCH_DELAY  ms TorchServe waits to fill a batch           (default 2, see docs/benchmarks.md)
#   MODEL_NAME       archive in model_store/ to serve              (default bert)
#   WORKERS          worker processes                              (default: one per core; the demo
#                    archive runs one thread per worker, measured fastest on CPU in docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/.."

BATCH_SIZE=${BATCH_SIZE:-8}
MAX_BATCH_DELAY=${MAX_BATCH_DELAY:-2}
MODEL_NAME=${MODEL_NAME:-bert}
WORKERS=${WORKERS:-$(nproc)}

scripts/setup.sh
source scripts/runtime_env.sh

key() { .venv/bin/python -c "import json,sys; print(json.load(open('key_file.json'))[sys.argv[1]]['key'])" "$1"; }
ping_ok() { [ -f key_file.json ] && curl -fsS -o /dev/null -H "Authorization: Bearer $(key inference)" "$INFERENCE/ping" 2>/dev/null; }

if ping_ok; then
  echo "==> TorchServe is already running"
else
  echo "==> starting TorchServe (logs in logs/)"
  .venv/bin/torchserve --start --ncs --ts-config config.properties --model-store model_store >logs/console.log 2>&1
  for _ in $(seq 1 120); do ping_ok && break; sleep 1; done
  ping_ok || { echo "TorchServe did not become healthy; see logs/ts_log.log" >&2; exit 1; }
fi
MKEY=$(key management)
IKEY=$(key inference)

if curl -fsS -o /dev/null -H "Authorization: Bearer $MKEY" "$MANAGEMENT/models/$MODEL_NAME" 2>/dev/null; then
  echo "==> $MODEL_NAME is already registered (scripts/stop.sh, then this script, to change batching)"
else
  echo "==> registering $MODEL_NAME.mar: batch_size=$BATCH_SIZE max_batch_delay=${MAX_BATCH_DELAY}ms workers=$WORKERS"
  curl -fsS -X POST -H "Authorization: Bearer $MKEY" \
    "$MANAGEMENT/models?url=$MODEL_NAME.mar&batch_size=$BATCH_SIZE&max_batch_delay=$MAX_BATCH_DELAY&initial_workers=$WORKERS&synchronous=true"
  echo
fi

for _ in $(seq 1 120); do
  curl -fsS -H "Authorization: Bearer $MKEY" "$MANAGEMENT/models/$MODEL_NAME" | grep -q '"status": "READY"' && break
  sleep 1
done
curl -fsS -H "Authorization: Bearer $MKEY" "$MANAGEMENT/models/$MODEL_NAME" | grep -q '"status": "READY"' \
  || { echo "$MODEL_NAME has no ready worker; see logs/model_log.log" >&2; exit 1; }

cat <<MSG

Ready. Try:
  curl -H "Authorization: Bearer $IKEY" $INFERENCE/predictions/$MODEL_NAME -T review.txt
  curl -H "Authorization: Bearer $IKEY" -H "Content-Type: application/json" -d '{"text": "The staff were rude and the room was dirty."}' $INFERENCE/predictions/$MODEL_NAME
Metrics: curl $METRICS/metrics        Stop: scripts/stop.sh
MSG
