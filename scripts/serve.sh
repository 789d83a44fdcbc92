#!/usr/bin/env bash
# README command 1: set up if needed, start TorchServe, register the model through the
# management API with dynamic batching, wait until it is ready, print a curl to try.
#   BATCH_SIZE       largest batch TorchServe hands the handler   (default 8 on CPU, 128 on a GPU)
#   MAX_BATCH_DELAY  ms TorchServe waits to fill a batch           (default 2 on CPU, 5 on a GPU)
#   MODEL_NAME       archive in model_store/ to serve              (default bert)
#   WORKERS          worker processes                              (default on a CPU: as many as the CPUs
#                    hold at the archive's cpu_threads each, so one per CPU for the demo archive's one
#                    thread; 8 per GPU on a GPU host). Also the server's default_workers_per_model: what
#                    a model registered later without initial_workers gets.
#   BERT_DEVICE      cpu|gpu forces the host's kind (default: scripts/detect_device.py decides)
#   LATENCY_BUDGET_MS  how long a request may wait for its answer (default 1000): the one overload knob.
#                    The queue (job_queue_size) holds what the workers finish within it; beyond, 503 at
#                    once; a budget under five batch times also gets smaller batches (docs/reliability.md,
#                    "Overload"; scripts/latency_budget.py derives both)
#   THROUGHPUT_RPS   this host's measured requests/s for the model (default: the figure measured for
#                    the demo archive on this kind of host, per core or per GPU)
# The defaults are the best layouts measured: on CPU docs/benchmarks.md; on a GPU one H100 run
# (docs/benchmarks.md, "GPU"), where one worker's Python, not the GPU, was the limit.
set -euo pipefail
cd "$(dirname "$0")/.."

WORKERS_PER_GPU=8

# This script talks to TorchServe with curl, which no set-up step installs: said now, before a set-up of minutes.
if ! command -v curl >/dev/null 2>&1; then
  echo "scripts/serve.sh needs curl, which is not on PATH: install the curl package" \
    "(Debian/Ubuntu: sudo apt-get install -y curl), then run it again" >&2
  exit 1
fi

# A setting that cannot mean anything (WORKERS=0, MAX_BATCH_DELAY=-1, LATENCY_BUDGET_MS=1s) is said now, by its name,
# before a set-up of minutes; the system's python3, as the set-up's (.venv may not exist yet).
"${PYTHON:-python3}" -m scripts.serve_settings

# An archive other than the demo is the user's to make (docs/checkpoints.md): one missing is said now, before the
# set-up and a server start, not as the registration's 404 after them.
if [ "${MODEL_NAME:-bert}" != bert ] && [ ! -f "model_store/${MODEL_NAME}.mar" ]; then
  echo "scripts/serve.sh: no model_store/${MODEL_NAME}.mar to serve: archive your checkpoint under that name first" \
    "(.venv/bin/python -m scripts.archive_model CHECKPOINT --name ${MODEL_NAME}; docs/checkpoints.md)" >&2
  exit 1
fi

# Serving needs none of the test and bench extras (scripts/setup.sh, SETUP_EXTRAS), nor the demo when another model
# is served (SETUP_DEMO).
SETUP_DEMO=${SETUP_DEMO:-$([ "${MODEL_NAME:-bert}" = bert ] && echo 1 || echo 0)} SETUP_EXTRAS=${SETUP_EXTRAS-} \
  scripts/setup.sh
source scripts/runtime_env.sh
# Assigned first, then eval'd: eval of a failed command substitution runs nothing and succeeds (set -e goes on).
device=$(.venv/bin/python scripts/detect_device.py)
eval "$device"
MODEL_NAME=${MODEL_NAME:-bert}
if [ "$DEVICE" = gpu ]; then
  BATCH_SIZE=${BATCH_SIZE:-128} MAX_BATCH_DELAY=${MAX_BATCH_DELAY:-5} WORKERS=${WORKERS:-$((WORKERS_PER_GPU * GPUS))}
  UNITS=$GPUS
else
  # As many workers as the CPUs a worker may use hold at the archive's cpu_threads each, unless WORKERS says:
  # one per CPU for the demo archive (scripts/cpu_layout.py). Sets CPUS, WORKERS, LAYOUT_NOTE, LAYOUT_WARNING.
  layout=$(.venv/bin/python -m scripts.cpu_layout "model_store/$MODEL_NAME.mar" ${WORKERS:+--workers "$WORKERS"})
  eval "$layout"
  UNITS=$CPUS
  BATCH_SIZE=${BATCH_SIZE:-8} MAX_BATCH_DELAY=${MAX_BATCH_DELAY:-2}
fi
THROUGHPUT_GIVEN=${THROUGHPUT_RPS:-}
budget=$(.venv/bin/python -m scripts.latency_budget --device "$DEVICE" --units "$UNITS" --workers "$WORKERS" \
  --batch-size "$BATCH_SIZE" ${LATENCY_BUDGET_MS:+--budget-ms "$LATENCY_BUDGET_MS"} \
  ${THROUGHPUT_RPS:+--throughput-rps "$THROUGHPUT_RPS"})
eval "$budget"
# config.properties leaves default_workers_per_model and job_queue_size to the launcher (see there):
# the server runs a copy with them, logs/config.properties, written only when this script starts it (below),
# so that it always describes the running server.
# On a CPU host, or with BERT_DEVICE=cpu, no worker gets a GPU: TorchServe would give each one a GPU that
# nvidia-smi lists, and a worker refuses a GPU its torch cannot use (handlers/torch_forward.select_device).
server_config=$(cat config.properties; echo "default_workers_per_model=$WORKERS"; echo "job_queue_size=$JOB_QUEUE_SIZE"
  if [ "$DEVICE" = cpu ]; then echo "number_of_gpu=0"; fi)

# A server already running keeps the configuration it started with: say so when this run asks for another.
# server_queue: then the running server's job_queue_size, which the registration below reports, not this run's.
server_queue=
config_unchanged() {
  [ "$(cat logs/config.properties 2>/dev/null)" = "$server_config" ] && return 0
  local running
  running=$(grep -E '^(default_workers_per_model|job_queue_size)=' logs/config.properties 2>/dev/null | paste -sd' ' - || true)
  server_queue=$(sed -n 's/^job_queue_size=//p' logs/config.properties 2>/dev/null || true)
  server_queue=${server_queue:-unknown}
  echo "==> the running TorchServe keeps its configuration (${running:-logs/config.properties}), not this run's" \
    "(latency budget ${LATENCY_BUDGET_MS} ms: job_queue_size=$JOB_QUEUE_SIZE default_workers_per_model=$WORKERS):" \
    "to change it, scripts/stop.sh, then this script" >&2
}

# Why the model's workers did not start, from the worker's own log: the last Python exception it
# printed (the handler's message names the cause and the fix), not TorchServe's summary line.
explain_load_failure() {
  local cause
  cause=$(.venv/bin/python -c 'import sys; from tooling.torchserve import load_failure_cause as cause
print(cause(open(sys.argv[1], errors="replace").read()) or "")' logs/model_log.log 2>/dev/null || true)
  if [ -n "$cause" ]; then
    echo "cause: $cause" >&2
  else
    echo "no exception in logs/model_log.log; TorchServe's own log is logs/ts_log.log" >&2
  fi
}

key() { .venv/bin/python -c "import json,sys; print(json.load(open('key_file.json'))[sys.argv[1]][sys.argv[2]])" "$1" "${2:-key}"; }
# The Authorization header for an API's key, for curl to read from a pipe: `curl -H @<(auth inference)`.
# A key is never on a command line, where every local user can read it (ps, /proc/PID/cmdline) for as
# long as the command runs (the synchronous registration: the whole model load). printf is a bash
# builtin: no process gets the key as an argument.
auth() { printf 'Authorization: Bearer %s\n' "$(key "$1")"; }
# The longest any call but the registration may take: a frontend that takes a connection and never answers (hung:
# stopped, or wedged) would hold curl, and this script, for ever. The registration waits for the model's load.
CALL_LIMIT_S=10
# /ping with the inference key: its body, then its status on the last line (000 when nothing answers; "hung"
# when something took the connection and gave no answer within CALL_LIMIT_S).
# 400 InvalidKeyException once TorchServe's keys have expired (token_expiration_min, 60 minutes after
# they were issued); 500 while a model has fewer healthy workers than its minimum.
ping_answer() {
  if [ -f key_file.json ]; then
    local answer code=0
    answer=$(curl -s --max-time "$CALL_LIMIT_S" -w '\n%{http_code}' -H @<(auth inference) "$INFERENCE/ping" 2>/dev/null) \
      || code=$?
    if [ "$code" = 28 ]; then printf '\nhung'; else printf '%s' "$answer"; fi  # 28: curl's time limit
  else
    printf '\n000'
  fi
}
ping_status() { local answer; answer=$(ping_answer); echo "${answer##*$'\n'}"; }
# The end of logs/console.log, where what the launcher and the JVM print themselves goes (log4j2.xml writes nothing
# there): why a start failed.
console_end() { tail -n 5 logs/console.log | sed 's/^/    /' >&2; }
# Whether the model has a worker READY, asked of the management API.
model_ready() {
  curl -fsS --max-time "$CALL_LIMIT_S" -H @<(auth management) "$MANAGEMENT/models/$MODEL_NAME" | grep -q '"status": "READY"'
}

# Unless this checkout's TorchServe already runs, every port it binds must be free: else another program
# would answer below as if it were this server, or this server would fail to bind.
.venv/bin/python -m scripts.ports_free || exit 1
answer=$(ping_answer)
if [ "${answer##*$'\n'}" = 200 ]; then
  echo "==> TorchServe is already running"
  config_unchanged
elif [[ "$answer" == *InvalidKeyException* ]]; then
  echo "==> TorchServe is already running, but its keys have expired: new keys"
  config_unchanged
  .venv/bin/python -m scripts.rotate_keys
  [[ "$(ping_answer)" != *InvalidKeyException* ]] || { echo "TorchServe refuses the new key too" >&2; exit 1; }
elif [ "${answer##*$'\n'}" = hung ]; then
  echo "TorchServe takes connections on $INFERENCE but does not answer /ping within $CALL_LIMIT_S s: hung (stopped," \
    "or wedged: logs/ts_log.log, logs/console.log). scripts/stop.sh stops it; then this script starts it again" >&2
  exit 1
elif [ "${answer##*$'\n'}" != 000 ]; then
  echo "==> TorchServe is already running (/ping: HTTP ${answer##*$'\n'}; the model's workers say why below)"
  config_unchanged
else
  echo "==> starting TorchServe (logs in logs/)"
  printf '%s\n' "$server_config" >logs/config.properties
  # What a server of this checkout that was killed left unpacked in logs/tmp (tooling/torchserve.py says why), unless
  # the pid file names one that runs still (starting: `torchserve --start` then refuses, below).
  .venv/bin/python -c 'from tooling.torchserve import clear_unpacked_archives, pid_file, running_torchserve
if running_torchserve(pid_file()) is None: clear_unpacked_archives(pid_file().parent)'
  # runtime_env.sh set the umask and dropped the variables that would override this configuration.
  # log4j2.xml is TorchServe's own logging with the access log's query strings redacted (TorchServe
  # would also find it on its class path, which begins with the directory it starts in: named, it is
  # the one whatever that directory holds).
  # Its refusal (a pid file naming a live TorchServe, one that does not answer /ping yet) is only in its output.
  .venv/bin/torchserve --start --ncs --ts-config logs/config.properties --model-store model_store \
    --log-config log4j2.xml >logs/console.log 2>&1 || {
    echo "torchserve --start failed; the end of logs/console.log:" >&2
    console_end
    echo "scripts/stop.sh stops this checkout's TorchServe, or clears a pid file left naming another process" >&2
    exit 1
  }
  # The frontend's pid, as the launcher wrote it before returning: one that ends before it answers (a JVM that
  # cannot start, a configuration it refuses) is said at once, with what it printed, not after the whole wait.
  frontend=$(cat "$PID_FILE" 2>/dev/null || true)
  frontend_gone() { [ -n "$frontend" ] && process_ended "$frontend"; }
  started=$SECONDS  # a deadline, not a count: each /ping may itself take up to CALL_LIMIT_S
  while [ $((SECONDS - started)) -lt 120 ]; do [ "$(ping_status)" = 200 ] || frontend_gone && break; sleep 1; done
  if [ "$(ping_status)" != 200 ]; then
    if frontend_gone; then
      echo "TorchServe's frontend (pid $frontend) ended before it answered /ping; the end of logs/console.log:" >&2
    else
      echo "TorchServe did not answer /ping within 120 s (scripts/stop.sh stops it); the end of logs/console.log:" >&2
    fi
    console_end
    echo "TorchServe's own log: logs/ts_log.log" >&2
    exit 1
  fi
fi

if curl -fsS --max-time "$CALL_LIMIT_S" -o /dev/null -H @<(auth management) "$MANAGEMENT/models/$MODEL_NAME" 2>/dev/null; then
  echo "==> $MODEL_NAME is already registered (scripts/stop.sh, then this script, to change batching)"
else
  echo "==> registering $MODEL_NAME.mar on $DEVICE: batch_size=$BATCH_SIZE max_batch_delay=${MAX_BATCH_DELAY}ms workers=$WORKERS"
  if [ "$DEVICE" = cpu ]; then
    if [ -n "$LAYOUT_NOTE" ]; then echo "    $LAYOUT_NOTE"; fi
    if [ -n "$LAYOUT_WARNING" ]; then echo "    $LAYOUT_WARNING" >&2; fi
  fi
  if [ -n "$server_queue" ]; then
    echo "    job_queue_size=$server_queue: the running server's, not this run's $JOB_QUEUE_SIZE (see above)"
  else
    echo "    latency budget ${LATENCY_BUDGET_MS} ms at ${THROUGHPUT_RPS} req/s: job_queue_size=$JOB_QUEUE_SIZE"
    if [ "$MODEL_NAME" != bert ] && [ -z "$THROUGHPUT_GIVEN" ]; then
      # The queue holds what the workers finish within the budget at that rate: a slower model needs its own.
      echo "    ${THROUGHPUT_RPS} req/s is the demo archive's measured rate on this host, not $MODEL_NAME's: measure" \
        "yours (scripts.benchmark) and set THROUGHPUT_RPS, or a slower model queues past the budget"
    fi
  fi
  answer=$(curl -sS -w '\n%{http_code}' -X POST -H @<(auth management) \
    "$MANAGEMENT/models?url=$MODEL_NAME.mar&batch_size=$BATCH_SIZE&max_batch_delay=$MAX_BATCH_DELAY&initial_workers=$WORKERS&synchronous=true")
  if [ "${answer##*$'\n'}" != 200 ]; then
    echo "registering $MODEL_NAME failed (HTTP ${answer##*$'\n'}): $(echo "${answer%$'\n'*}" | tr -s ' \n' ' ')" >&2
    explain_load_failure
    exit 1
  fi
  echo "${answer%$'\n'*}"
fi

started=$SECONDS
while [ $((SECONDS - started)) -lt 120 ]; do model_ready && break; sleep 1; done
model_ready || { echo "$MODEL_NAME has no ready worker" >&2; explain_load_failure; exit 1; }

# What to paste reads the key from key_file.json rather than showing it: this output lands in logs and,
# under systemd, in the journal. The key reaches curl through a pipe, never its command line (see auth).
cat <<MSG

Ready. Try:
  KEY=\$(python3 -c "import json; print(json.load(open('key_file.json'))['inference']['key'])")
  curl -H @<(echo "Authorization: Bearer \$KEY") $INFERENCE/predictions/$MODEL_NAME -T review.txt
  curl -H @<(echo "Authorization: Bearer \$KEY") -H "Content-Type: application/json" -d '{"text": "The staff were rude and the room was dirty."}' $INFERENCE/predictions/$MODEL_NAME
Metrics: curl $METRICS/metrics        Stop: scripts/stop.sh
Keys expire $(key inference "expiration time"): .venv/bin/python -m scripts.rotate_keys issues new ones
MSG
