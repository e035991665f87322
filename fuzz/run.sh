#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 300), one after another, from its corpus and
# seeds. Fails if any target finds a crash (or stops early), and says where its artifacts are.
# Not part of CI (too slow): run by hand before a release. See README.md.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail

cd "$(dirname "$0")"
seconds="${1:-300}"
shift || true

# Fuzz builds go to fuzz/target, never to a shared CARGO_TARGET_DIR: the sanitizer flags
# would force a rebuild of everything there.
unset CARGO_TARGET_DIR
# The stable toolchain accepts cargo-fuzz's sanitizer flags with this.
export RUSTC_BOOTSTRAP=1
# Recovery fsyncs its files: keep the log_segment target's on a memory file system if any.
if [[ -z "${TMPDIR:-}" && -d /dev/shm && -w /dev/shm ]]; then
    export TMPDIR=/dev/shm
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

echo "== building ${targets[*]}"
for t in "${targets[@]}"; do
    cargo fuzz build "$t"
done

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    dirs=("corpus/$t")
    if [[ -d "seeds/$t" ]]; then dirs+=("seeds/$t"); fi
    log="artifacts/$t.log"
    marker="artifacts/$t/.started"
    touch "$marker"
    echo "== $t for ${seconds}s from ${dirs[*]} (log: fuzz/$log)"
    status=0
    cargo fuzz run "$t" "${dirs[@]}" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^Done [0-9]+ runs' "$log" | sed 's/^/   /' || true
    found=$(find "artifacts/$t" -type f -newer "$marker" \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \))
    if [[ $status -ne 0 || -n "$found" ]]; then
        echo "   FAILED (exit $status): ${found:-see the log}"
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | head -5 | sed 's/^/   /' || true
        failed+=("$t")
    fi
done

echo
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "FAILED: ${failed[*]}"
    for t in "${failed[@]}"; do
        echo "  $t: artifacts in fuzz/artifacts/$t/, log in fuzz/artifacts/$t.log"
        echo "    reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t artifacts/$t/<crash-file>"
    done
    exit 1
fi
echo "all ${#targets[@]} targets ran ${seconds}s each without a crash (artifacts, if any: fuzz/artifacts/)"
