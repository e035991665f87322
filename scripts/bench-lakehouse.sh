#!/usr/bin/env bash
# Silt's lakehouse view (topics written as Iceberg tables) beside pyarrow writing the same rows,
# in one run on this machine; prints Markdown tables. What each phase measures is described in
# scripts/bench_lakehouse.py, which runs them:
#
#   scripts/bench-lakehouse.sh                         # the full run (about 4 minutes, plus the build)
#   ROWS=200000 FRESH_S=20 scripts/bench-lakehouse.sh  # a quick one
#
# Settings (environment): ROWS (rows of the backlog and live phases, 1000000), PUBLISHERS
# (publisher processes, 8), WINDOW (QoS 1 publishes in flight per publisher, 32), RATE (msgs/s of
# the freshness phase, 1000), FRESH_S (its seconds of publishing, 60), KEEP=1 (keep the scratch
# directory under TMPDIR: logs, configs, tables).
#
# Publishers are a raw-socket MQTT 3.1.1 client in the helper (paho-mqtt is several times
# slower), one process per connection; their CPU use is reported beside Silt's, since on a
# small machine they share its cores. Readers: DuckDB with the iceberg extension from the venv's
# wheels (never downloaded), pyiceberg for the manifests.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -q -p silt -p silt-loadgen
# Wherever cargo puts its builds (CARGO_TARGET_DIR, build.target-dir, or ./target).
target_dir=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

# The readers (DuckDB 1.5.5 with its extension wheels, pyiceberg, pyarrow), as scripts/test.sh
# installs them.
if [[ ! -x .venv/bin/python ]] ||
  ! .venv/bin/python -c "import duckdb, duckdb_extension_iceberg, duckdb_extension_httpfs, duckdb_extension_avro, pyiceberg, pyiceberg_core, pyarrow, pytest, requests" 2>/dev/null; then
  echo "creating .venv with tests/requirements.txt" >&2
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
fi

exec .venv/bin/python scripts/bench_lakehouse.py run --silt "$target_dir/release/silt" \
  --loadgen "$target_dir/release/silt-loadgen" \
  --rows "${ROWS:-1000000}" --publishers "${PUBLISHERS:-8}" --window "${WINDOW:-32}" \
  --rate "${RATE:-1000}" --fresh-s "${FRESH_S:-60}" ${KEEP:+--keep}
