#!/usr/bin/env bash
# Stop the TorchServe that scripts/serve.sh started from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/runtime_env.sh
# `torchserve --stop` stops any TorchServe its pid file names, and a pid is reused (a reboot, a crash): it may now
# be another TorchServe (a fleet replica, a test's, another checkout's). Only the one that wrote the file is stopped
# (tooling/torchserve.py, running_torchserve).
pid=$(.venv/bin/python -c 'from tooling.torchserve import pid_file, running_torchserve
server = running_torchserve(pid_file())
print(server.pid if server else "")')
if [ -z "$pid" ]; then
  if [ -f "$PID_FILE" ]; then
    # Stale, and in the way: `torchserve --start` refuses to start while it names a live TorchServe.
    echo "stop: $PID_FILE named pid $(head -c 20 "$PID_FILE" | tr -d '\n'), not this checkout's TorchServe: removed the file," \
      "left that process alone"
    rm -f "$PID_FILE"
  fi
  echo "stop: this checkout's TorchServe is not running"
  exit 0
fi
# A frontend stopped by a signal (SIGSTOP, a debugger, a terminal's Ctrl-Z) acts on no SIGTERM until it runs again:
# continued first, it stops in seconds, not after `torchserve --stop`'s 60 s wait and a message to kill it.
kill -CONT "$pid" 2>/dev/null || true
.venv/bin/torchserve --stop --foreground
# --foreground waits up to 60 s for the server, then removes the pid file whether or not it has exited: whether it
# has is read here (a zombie, exited but not yet reaped, counts as gone).
for _ in $(seq 1 50); do
  if process_ended "$pid"; then
    echo "stop: done"
    exit 0
  fi
  sleep 0.1
done
echo "stop: TorchServe (pid $pid) still runs after torchserve --stop; stop it with kill $pid (kill -9 $pid if it" \
  "ignores that)" >&2
exit 1
