#!/usr/bin/env bash
# Silt beside mosquitto and rumqttd: runs every silt-loadgen scenario against each broker in one
# session and prints a Markdown table of each figure and Silt's ratio to each of the others.
#
#   bench/mqtt.sh                      # the full run (about 5 minutes on 2 cores, plus the build)
#   DURATION=3 IDLE=1000 DRAIN=10000 bench/mqtt.sh   # a quick one
#
# Each scenario gets fresh brokers: mosquitto (Debian package; generated config: loopback
# listener, anonymous, unlimited queues, no persistence), then rumqttd (`cargo install rumqttd`,
# done by this script when it is missing; generated config from its own rumqttd.toml: one v4
# (MQTT 3.1.1) server on loopback, in memory only, no connection throttling), then Silt (fresh
# data directory, default config: fsync "always"), one after the other on the same cores, so a
# memory or CPU figure never carries over from an earlier scenario. All are stopped by PID.
#
# The idle scenarios read each broker's RSS 2 s after the last connection and again at SETTLED
# s, once an allocator that returns freed pages over time (Silt's jemalloc: about 10 s) has given
# back what the burst of connections freed as it went idle.
#
# Settings (environment): DURATION (s, 10), PUBLISHERS (50), SUBSCRIBERS (200), IDLE (5000),
# SETTLED (s, 15),
# DRAIN (100000), PAYLOAD (bytes, 128), RATE (msgs/s of the paced fan-in, 10000),
# SILT_CONFIG (a silt.toml, e.g. to try another fsync policy), MOSQUITTO_EXTRA (config lines
# appended to mosquitto.conf), RESULTS (where to keep the JSON lines), LOADGEN_THREADS (1),
# SCENARIOS (a space-separated subset of: idle idle-subscribe fan-in-qos0 fan-in-qos1
# fan-in-qos1-paced fan-out-qos0 fan-out-qos1 drain; all by default), BROKERS (the reference
# brokers run beside Silt: "mosquitto rumqttd" by default), RUMQTTD (its binary).
#
# With the paced scenario, the disk under the data directories is measured on its own too (a
# 4 KiB write and an fdatasync every 0.5 ms for DURATION, `silt-loadgen disk-sync`), printed
# below the table: with fsync always, a paced QoS 1 PUBACK waits for such a sync, so Silt's
# paced p99 and maximum cannot be lower than the disk's.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
PUBLISHERS=${PUBLISHERS:-50}
SUBSCRIBERS=${SUBSCRIBERS:-200}
IDLE=${IDLE:-5000}
SETTLED=${SETTLED:-15}
DRAIN=${DRAIN:-100000}
PAYLOAD=${PAYLOAD:-128}
RATE=${RATE:-10000}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/silt-target}"

BROKERS=${BROKERS:-mosquitto rumqttd}
if [[ " $BROKERS " == *" mosquitto "* ]]; then
  command -v mosquitto >/dev/null || { echo "mosquitto not found: apt-get install mosquitto" >&2; exit 1; }
fi
if [[ " $BROKERS " == *" rumqttd "* ]]; then
  # Built into the shared target's tools folder once; `--locked` fails on its lockfile today.
  RUMQTTD=${RUMQTTD:-$(command -v rumqttd || echo "$CARGO_TARGET_DIR/tools/bin/rumqttd")}
  if [[ ! -x $RUMQTTD ]]; then
    echo "installing rumqttd (a few minutes, once)" >&2
    cargo install -q rumqttd --version 0.20.0 --root "$CARGO_TARGET_DIR/tools"
    RUMQTTD="$CARGO_TARGET_DIR/tools/bin/rumqttd"
  fi
fi
cargo build --release -q -p silt -p silt-loadgen
SILT="$CARGO_TARGET_DIR/release/silt"
LOADGEN="$CARGO_TARGET_DIR/release/silt-loadgen"

# Every idle connection is a descriptor in the generator and one in the broker.
want_fds=$((IDLE + 1024))
if (($(ulimit -n) < want_fds)); then
  hard=$(ulimit -Hn)
  if [[ $hard != unlimited ]] && ((hard < want_fds)); then
    echo "ulimit -n: hard limit $hard < $want_fds; lowering IDLE to $((hard - 1024))" >&2
    IDLE=$((hard - 1024))
    want_fds=$hard
  fi
  ulimit -n "$want_fds"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/silt-bench.XXXXXX")
RESULTS=${RESULTS:-$work/results.jsonl}
: >"$RESULTS"
broker_pid=""
cleanup() {
  if [[ -n $broker_pid ]] && kill -0 "$broker_pid" 2>/dev/null; then
    kill -TERM "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
  fi
  rm -rf "$work/silt-data" "$work"/silt-data.*
}
trap cleanup EXIT

wait_port() { # port pid: until the port accepts or the process is gone (30 s at most)
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

start_broker() { # name -> sets broker_pid and port
  port=$("$LOADGEN" free-port)
  case $1 in
    mosquitto)
      {
        echo "listener $port 127.0.0.1"
        echo "allow_anonymous true"
        echo "max_queued_messages 0"
        echo "persistence false"
        echo "log_dest stderr"
        echo "log_type error"
        echo "log_type warning"
        [[ -n ${MOSQUITTO_EXTRA:-} ]] && printf '%s\n' "$MOSQUITTO_EXTRA"
      } >"$work/mosquitto.conf"
      mosquitto -c "$work/mosquitto.conf" 2>>"$work/mosquitto.log" &
      ;;
    rumqttd)
      # Its own defaults (rumqttd.toml of the crate), on loopback and without the 1 ms delay
      # between accepted connections, which would cap connects at 1,000/s.
      cat >"$work/rumqttd.toml" <<EOF
id = 0
[router]
id = 0
max_connections = $((IDLE + 1024))
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10
[v4.1]
name = "v4-1"
listen = "127.0.0.1:$port"
next_connection_delay_ms = 0
    [v4.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 20480
    max_inflight_count = 100
    dynamic_filters = true
EOF
      "$RUMQTTD" -c "$work/rumqttd.toml" 2>>"$work/rumqttd.log" >/dev/null &
      ;;
    silt)
      rm -rf "$work/silt-data"
      SILT_LOG=warn "$SILT" serve --mqtt "127.0.0.1:$port" --kafka 127.0.0.1:0 --admin 127.0.0.1:0 --data-dir "$work/silt-data" \
        ${SILT_CONFIG:+--config "$SILT_CONFIG"} 2>>"$work/silt.log" &
      ;;
  esac
  broker_pid=$!
  wait_port "$port" "$broker_pid" || { echo "$1 did not start; log:" >&2; tail -20 "$work/$1.log" >&2; exit 1; }
}

stop_broker() {
  kill -TERM "$broker_pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$broker_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
  broker_pid=""
}

SCENARIOS=${SCENARIOS:-idle idle-subscribe fan-in-qos0 fan-in-qos1 fan-in-qos1-paced fan-out-qos0 fan-out-qos1 drain}
want() { [[ " $SCENARIOS " == *" $1 "* ]]; }

run() { # scenario args...: against mosquitto, then Silt, each freshly started
  local name
  for name in $BROKERS silt; do
    start_broker "$name"
    "$LOADGEN" "$@" --addr "127.0.0.1:$port" --broker "$name" --broker-pid "$broker_pid" \
      --threads "$LOADGEN_THREADS" >>"$RESULTS" || echo "($name: $1 failed, see the line above)" >&2
    stop_broker
  done
}

flow=(--duration "$DURATION" --payload "$PAYLOAD")
started=$(date +%s)
want idle && run idle --connections "$IDLE" --settled "$SETTLED"
want idle-subscribe && run idle --connections "$IDLE" --settled "$SETTLED" --subscribe
want fan-in-qos0 && run fan-in --publishers "$PUBLISHERS" --qos 0 "${flow[@]}"
want fan-in-qos1 && run fan-in --publishers "$PUBLISHERS" --qos 1 "${flow[@]}"
if want fan-in-qos1-paced; then
  "$LOADGEN" disk-sync --dir "$work" --duration "$DURATION" >"$work/disk.json" || echo "(disk-sync failed)" >&2
  run fan-in --publishers "$PUBLISHERS" --qos 1 --rate "$RATE" "${flow[@]}"
fi
want fan-out-qos0 && run fan-out --subscribers "$SUBSCRIBERS" --qos 0 "${flow[@]}"
want fan-out-qos1 && run fan-out --subscribers "$SUBSCRIBERS" --qos 1 "${flow[@]}"
want drain && run drain --messages "$DRAIN" --payload "$PAYLOAD"
elapsed=$(($(date +%s) - started))

echo
echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr);" \
  "$(mosquitto -h 2>/dev/null | head -1); $("${RUMQTTD:-false}" --version 2>/dev/null); Silt config: ${SILT_CONFIG:-default (fsync always)};" \
  "generator threads: $LOADGEN_THREADS; scenarios took ${elapsed} s."
echo
refs=()
for name in $BROKERS; do refs+=(--reference "$name"); done
"$LOADGEN" table "${refs[@]}" --subject silt "$RESULTS"
if [[ -s $work/disk.json ]]; then
  echo
  python3 - "$work/disk.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["sync_latency_us"]
print(f"The disk under the data directories, {d['case']} for {d['syncs'] / d['syncs_per_s']:.0f} s "
      f"({d['syncs']} syncs): p50 {s['p50'] / 1e3:.2f} ms, p99 {s['p99'] / 1e3:.2f} ms, "
      f"p99.9 {d['sync_p999_us'] / 1e3:.2f} ms, max {s['max'] / 1e3:.2f} ms; "
      f"{d['syncs_over_10ms']} took over 10 ms.")
PY
fi
echo
echo "JSON lines: $RESULTS"
