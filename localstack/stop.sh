#!/usr/bin/env bash
# Stops the LocalStack that localstack/start.sh started, by the PID in its pid file.
#
# SIGTERM first. LocalStack 2026.3 on hypercorn runs its shutdown hooks and closes the port but
# its event loop can stay asleep afterwards (it is stopped from another thread without a
# wake-up), so once the port is closed, or after SILT_LOCALSTACK_STOP_TIMEOUT seconds (default
# 15), the process is SIGKILLed. Either way S3's objects were only in memory.
#
# Settings (environment): SILT_LOCALSTACK_DIR, as for start.sh.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
dir="${SILT_LOCALSTACK_DIR:-$(dirname "$here")/.localstack}"
pidfile="$dir/localstack.pid"
grace="${SILT_LOCALSTACK_STOP_TIMEOUT:-15}"

if [[ ! -f $pidfile ]]; then
  echo "localstack: not running (no $pidfile)"
  exit 0
fi
pid="$(cat "$pidfile")"
ours() { [[ $pid =~ ^[0-9]+$ ]] && grep -qs 'localstack.runtime.main' "/proc/$pid/cmdline"; }
if ! ours; then
  echo "localstack: not running (stale pid file $pidfile)"
  rm -f "$pidfile"
  exit 0
fi

# The port it listens on, from its environment, to see when the server has closed it.
port="$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^GATEWAY_LISTEN=.*:\([0-9]*\)$/\1/p' || true)"
listening() { [[ -n $port ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

kill -TERM "$pid" 2>/dev/null || true
deadline=$((SECONDS + grace))
closed_at=""
while ours && ((SECONDS < deadline)); do
  if [[ -z $closed_at ]] && ! listening; then
    closed_at=$SECONDS
  fi
  # Shut down but not exited: give it two seconds to exit on its own.
  [[ -n $closed_at ]] && ((SECONDS - closed_at >= 2)) && break
  sleep 0.2
done
if ours; then
  kill -KILL "$pid" 2>/dev/null || true
  while ours; do sleep 0.1; done
  echo "localstack: stopped (pid $pid, SIGKILL after SIGTERM)"
else
  echo "localstack: stopped (pid $pid)"
fi
rm -f "$pidfile"
