#!/usr/bin/env bash
# Idempotent: installs the Debian packages the fleet needs (scripts/fleet.py, tests/e2e/test_fleet.py)
# when one of their commands is missing: haproxy (the load balancer) and prometheus (the server and promtool),
# and tini, the image's PID 1, so tests/e2e/test_graceful_stop.py runs the entry command as the image does.
# As root it installs them non-interactively; otherwise it says what to run and exits 0, so the rest of
# the set-up still works (the fleet tests then fail in CI with the same advice, and skip elsewhere).
# A package's postinst may start its daemon (where no policy-rc.d forbids it): the fleet runs its own
# instances on private ports, so any haproxy/prometheus process the install started is stopped, by pid;
# under systemd their units, which the postinst enabled, are disabled and stopped first.
set -euo pipefail

PACKAGES=(haproxy prometheus tini)
COMMANDS=(haproxy prometheus promtool tini)

missing=()
for command in "${COMMANDS[@]}"; do
  command -v "$command" >/dev/null 2>&1 || missing+=("$command")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "==> system packages: haproxy, prometheus, promtool and tini are installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  cat >&2 <<MSG
==> system packages: missing ${missing[*]} (needed by scripts/fleet.py and the fleet tests).
    Install them as root, then run the set-up again:
      sudo apt-get update && sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}
    (other systems: HAProxy >= 2.4 and Prometheus >= 2.37 with promtool, on PATH)
MSG
  exit 0
fi

# Processes running one of the packages' daemons, as "pid" lines (matched by executable, never by name).
daemon_pids() {
  local proc exe
  for proc in /proc/[0-9]*; do
    exe=$(readlink "$proc/exe" 2>/dev/null) || continue
    case "$exe" in
      */haproxy | */prometheus) echo "${proc#/proc/}" ;;
    esac
  done | sort
}

before=$(daemon_pids)
# The daemons' packages not installed yet: their units, once installed, are this run's to disable (below).
new_daemons=()
for package in haproxy prometheus; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q ' installed$' || new_daemons+=("$package")
done
echo "==> system packages: installing ${PACKAGES[*]} (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
# Serving needs none of them: a host whose package mirror cannot be reached (an offline GPU host, say)
# gets the same advice as above and the set-up goes on.
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold \
        "${PACKAGES[@]}" >/dev/null; }; then
  echo "==> system packages: apt-get could not install ${PACKAGES[*]} (missing: ${missing[*]}); serving does" \
    "not need them, the fleet and its tests do: install them when the mirror can be reached" >&2
  exit 0
fi
# Under systemd (PID 1; /run/systemd/system is sd_booted(3)'s test) a kill is not enough: haproxy.service
# (Restart=always) starts it again, and prometheus.service would start at every boot, listening on :9090
# on every interface. Only the units of packages this run installed: a host's own HAProxy stays as it was.
# Without systemd (a container) there are no units, and the pids below are all there is.
if [ -d /run/systemd/system ]; then
  for unit in "${new_daemons[@]}"; do
    systemctl cat "$unit.service" >/dev/null 2>&1 || continue
    if systemctl disable --now "$unit.service" >/dev/null; then
      echo "==> system packages: disabled and stopped $unit.service, enabled by its postinst"
    else
      echo "==> system packages: could not disable $unit.service: systemctl disable --now $unit" >&2
    fi
  done
fi
after=$(daemon_pids)

# Stop only what the install itself started: pids that did not exist before it.
started=$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d')
for pid in $started; do
  echo "==> system packages: stopping $(readlink "/proc/$pid/exe" 2>/dev/null || echo '?') (pid $pid), started by its postinst"
  kill "$pid" 2>/dev/null || true
done
for pid in $started; do
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
done

for package in "${PACKAGES[@]}"; do
  echo "==> system packages: installed $package $(dpkg-query -W -f='${Version}' "$package")"
done
for command in "${COMMANDS[@]}"; do
  command -v "$command" >/dev/null 2>&1 || { echo "$command is still missing after the install" >&2; exit 1; }
done
