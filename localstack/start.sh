#!/usr/bin/env bash
# Starts LocalStack's S3 on loopback, without Docker (host mode), for a Silt node to use as its
# bucket during development; prints the `silt serve` line. Stop it with localstack/stop.sh.
#
# First use creates a Python 3.13 venv and installs the pinned LocalStack into it
# (localstack/requirements.txt; PyPI only). `start.sh --install-only` does just that.
#
# Settings (environment):
#   SILT_LOCALSTACK_PORT    gateway port on 127.0.0.1 (default 4566)
#   SILT_LOCALSTACK_DIR     its pid file, log and working files (default: .localstack in the checkout)
#   SILT_LOCALSTACK_BUCKET  bucket to create (default silt)
#   SILT_LOCALSTACK_VENV    the venv (default: .venv-localstack in the checkout)
#   SILT_LOCALSTACK_PYTHON  a Python 3.13 interpreter (default: python3.13 on PATH, else pyenv's)
#   SILT_LOCALSTACK_TIMEOUT seconds to wait for S3 to answer (default 120)
#
# LocalStack's open-source runtime keeps S3 in memory (objects over 512 KiB are spooled to files
# under SILT_LOCALSTACK_DIR/tmp): persistence across restarts is a LocalStack Pro feature, so
# every object is gone once it stops.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
port="${SILT_LOCALSTACK_PORT:-4566}"
dir="${SILT_LOCALSTACK_DIR:-$repo/.localstack}"
bucket="${SILT_LOCALSTACK_BUCKET:-silt}"
venv="${SILT_LOCALSTACK_VENV:-$repo/.venv-localstack}"
timeout="${SILT_LOCALSTACK_TIMEOUT:-120}"
requirements="$here/requirements.txt"
stamp="$venv/.silt-requirements.txt"

die() { printf 'localstack/start.sh: %s\n' "$*" >&2; exit 1; }

find_python() {
  # A pyenv shim named python3.13 exists even when 3.13 is not the selected version (and then
  # fails), so each candidate is run, not just found.
  local c pyenv_root
  pyenv_root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for c in "${SILT_LOCALSTACK_PYTHON:-}" "$(command -v python3.13 || true)" \
    "$pyenv_root"/versions/3.13*/bin/python3.13; do
    [[ -n $c && -x $c ]] || continue
    if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
      printf '%s\n' "$c"
      return 0
    fi
  done
  return 1
}

install() {
  if [[ -x $venv/bin/python ]] &&
    ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
    [[ -f $venv/pyvenv.cfg ]] || die "$venv exists and is not a venv: remove it or set SILT_LOCALSTACK_VENV"
    echo "localstack: $venv is not a working Python 3.13 venv; creating it again"
    rm -rf "$venv"
  fi
  if [[ ! -x $venv/bin/python ]]; then
    local python
    python="$(find_python)" || die "LocalStack needs Python 3.13 and none was found: install it
  (e.g. 'pyenv install 3.13') or name one with SILT_LOCALSTACK_PYTHON=/path/to/python3.13"
    echo "localstack: creating $venv with $python"
    "$python" -m venv "$venv"
  fi
  if ! cmp -s "$requirements" "$stamp"; then
    echo "localstack: installing localstack/requirements.txt into $venv"
    local started=$SECONDS
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
    echo "localstack: installed in $((SECONDS - started)) s"
  fi
}

install
[[ ${1:-} == --install-only ]] && exit 0
[[ $# -eq 0 ]] || die "unknown argument ${1} (the only one is --install-only)"

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
pidfile="$dir/localstack.pid"
log="$dir/localstack.log"
endpoint="http://127.0.0.1:$port"

if [[ -f $pidfile ]]; then
  pid="$(cat "$pidfile")"
  if [[ $pid =~ ^[0-9]+$ ]] && grep -qs 'localstack.runtime.main' "/proc/$pid/cmdline"; then
    die "already running (pid $pid, $pidfile): localstack/stop.sh first"
  fi
  rm -f "$pidfile"
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  die "127.0.0.1:$port is taken by another process: choose a port with SILT_LOCALSTACK_PORT"
fi

# Objects spooled to disk by an earlier run are unreachable now (its S3 lived in memory).
rm -rf "$dir/tmp"
mkdir -p "$dir/tmp" "$dir/config"

# The user's AWS_* settings (an endpoint, a profile) are for the client side; LocalStack's own
# clients must not follow them.
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^AWS_' || true)

started=$SECONDS
# SERVICES=s3 with eager loading: the health check reports s3 "running" once it can answer.
# OVERRIDE_IN_DOCKER=0: host mode even where /.dockerenv exists (LocalStack would otherwise
#   take the machine for its container and use /var/lib/localstack and /etc/localstack).
# FILESYSTEM_ROOT, CONFIG_DIR, TMP: everything it writes stays under $dir (TMP, not TMPDIR, which
#   LocalStack warns about as a deprecated setting of its own).
# Nothing from the internet: no TLS certificate download (a self-signed one is made), no DNS
#   server (it looks up an upstream resolver), no analytics events.
SERVICES=s3 EAGER_SERVICE_LOADING=1 \
  GATEWAY_LISTEN="127.0.0.1:$port" GATEWAY_SERVER=hypercorn \
  OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$dir/fs" CONFIG_DIR="$dir/config" TMP="$dir/tmp" \
  SKIP_SSL_CERT_DOWNLOAD=1 DNS_ADDRESS=0 DISABLE_EVENTS=1 \
  nohup env -u TMPDIR -u TEMP "$venv/bin/python" -m localstack.runtime.main >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

# Ready means: the health endpoint says s3 is up, the bucket exists, and a signed PUT then GET
# of a probe object returns the same bytes.
if ! "$venv/bin/python" - "$pid" "$endpoint" "$bucket" "$timeout" <<'EOF'; then
import json, os, sys, time, urllib.request
import boto3, botocore.exceptions
from botocore.config import Config

pid, endpoint, bucket, timeout = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
s3 = boto3.session.Session().client(
    "s3", endpoint_url=endpoint, region_name="us-east-1",
    aws_access_key_id="test", aws_secret_access_key="test",
    config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                  connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}))
deadline = time.monotonic() + timeout
last = None
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"LocalStack exited during start-up ({last!r})")
    try:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=2) as r:
            state = json.load(r)["services"].get("s3")
        if state not in ("running", "available"):
            raise RuntimeError(f"health: s3 {state}")
        try:
            s3.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] != 404:
                raise
            s3.create_bucket(Bucket=bucket)
        key, body = f"_start-probe/{os.getpid()}", os.urandom(64)
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        if s3.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
            raise RuntimeError("the probe object read back different bytes")
        s3.delete_object(Bucket=bucket, Key=key)
        sys.exit(0)
    except Exception as e:  # not up yet
        last = e
        time.sleep(0.25)
sys.exit(f"S3 did not answer within {timeout:.0f} s ({last!r})")
EOF
  echo "---- $log (last lines) ----" >&2
  tail -n 40 "$log" >&2 || true
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  die "LocalStack did not start"
fi

cat <<EOF
LocalStack S3 is up at $endpoint after $((SECONDS - started)) s (pid $pid, log $log), bucket "$bucket".
It keeps objects in memory: they are gone when it stops.
Start Silt against it with:

  AWS_ENDPOINT_URL=$endpoint AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test silt serve --object-store s3://$bucket/silt

Stop it with localstack/stop.sh (same SILT_LOCALSTACK_DIR).
EOF
