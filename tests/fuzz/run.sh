#!/usr/bin/env bash
# Runs the GGUF reader fuzzer for a bounded time: tests/fuzz/run.sh BUILD_DIR SECONDS
# BUILD_DIR is a fuzz build (scripts/build.sh fuzz); it is configured and the fuzzer built here
# if needed. Starts from a copy of the committed seed corpus; prints executions and findings;
# exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
seconds=${2:-60}

if [ ! -f "$build/CMakeCache.txt" ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=ON -DSLUICE_BENCH=OFF >/dev/null
fi
cmake --build "$build" --target gguf_fuzz -j "${SLUICE_JOBS:-$(nproc)}"
fuzzer="$build/bin/gguf_fuzz"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/findings"
cp tests/fuzz/corpus/* "$work/corpus/"

set +e
"$fuzzer" "$work/corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work/findings/" >"$work/log" 2>&1
rc=$?
set -e

execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || echo 0)
cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1 || true)
findings=$(find "$work/findings" -type f | wc -l)
echo "gguf_fuzz: ${seconds}s, ${execs:-0} executions, ${cov:-cov: ?}, corpus $(ls "$work/corpus" | wc -l) files, findings ${findings}, exit ${rc}"
if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
  tail -n 60 "$work/log"
  mkdir -p "$build/fuzz-findings"
  cp "$work"/findings/* "$build/fuzz-findings/" 2>/dev/null || true
  echo "gguf_fuzz: FAILED; reproducers in $build/fuzz-findings (run: $fuzzer FILE)" >&2
  exit 1
fi
