#!/usr/bin/env bash
# One GPU check, run on the GPU machine from the repository root: build (or use a carried build),
# GPU tests, compute-sanitizer memcheck on a short test run, GPU benchmarks, and a short summary
# table printed last.
#
#   scripts/gpu-check.sh [--prebuilt DIR] [--quick] [--out DIR] [--skip STEP]...
#
#   --prebuilt DIR  use gpu_gemv_test and bench_gpu_gemv from DIR (built elsewhere, e.g. with
#                   scripts/gpu-check.sh --package DIR on a machine with nvcc and GoogleTest);
#                   falls back to building here if they do not run on this machine.
#   --package DIR   (on the build machine) build the GPU binaries into build-cuda and copy them
#                   to DIR, then exit.
#   --quick         benchmarks without the 128256-row output matrix.
#   --bench-arg A   pass A to bench_gpu_gemv (e.g. --variants; repeatable).
#   --out DIR       logs, CSV and the summary (default: $OUT if set, else out/gpu-check).
#   --skip STEP     skip a step: build, test, memcheck, bench (repeatable).
#
# Building here needs CMake, Ninja, nvcc, and GoogleTest: from the system if installed, else from
# a GoogleTest source tree in build-deps/googletest (copy of /usr/src/googletest; build-* is
# git-ignored, so pass it as a carried path) that is built and installed under /tmp first.
#
# Extending: each step is a function step_<name> appended to STEPS; it writes its log under
# $OUT_DIR and calls `record <name> <ok|FAIL|skipped> <note>` for the summary. Whole-model runs
# go in as further steps (e.g. step_model_8b) without touching the others.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PREBUILT=""
PACKAGE=""
QUICK=""
BENCH_ARGS=()
OUT_DIR="${OUT:-$ROOT/out/gpu-check}"
SKIP=" "
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prebuilt) PREBUILT=$2; shift 2 ;;
    --package) PACKAGE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --bench-arg) BENCH_ARGS+=("$2"); shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --skip) SKIP+="$2 "; shift 2 ;;
    *) echo "usage: $0 [--prebuilt DIR] [--package DIR] [--quick] [--bench-arg A]... [--out DIR] [--skip STEP]..." >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
BUILD_DIR="$ROOT/build-cuda"
JOBS=$(nproc 2>/dev/null || echo 4)
ARCH="${SLUICE_CUDA_ARCH:-90}"
TEST_BIN=""
BENCH_BIN=""
SUMMARY=()
FAILED=0

record() {  # name status note
  SUMMARY+=("$(printf '%-10s %-8s %s' "$1" "$2" "$3")")
  [[ "$2" == FAIL ]] && FAILED=1
  return 0
}
skipped() { [[ "$SKIP" == *" $1 "* ]]; }

build_here() {
  local gtest_args=()
  if [[ -d build-deps/googletest ]] && ! ls /usr/lib/x86_64-linux-gnu/libgtest.a >/dev/null 2>&1 \
       && ! ls /usr/local/lib/libgtest.a >/dev/null 2>&1; then
    echo "== building GoogleTest from build-deps/googletest"
    cmake -S build-deps/googletest -B /tmp/sluice-gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX=/tmp/sluice-gtest >"$OUT_DIR/gtest-build.log" 2>&1 &&
      cmake --build /tmp/sluice-gtest-build -j "$JOBS" >>"$OUT_DIR/gtest-build.log" 2>&1 &&
      cmake --install /tmp/sluice-gtest-build >>"$OUT_DIR/gtest-build.log" 2>&1 || return 1
    gtest_args=(-DGTest_ROOT=/tmp/sluice-gtest)
  fi
  echo "== configuring and building (sm_$ARCH, -j$JOBS)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${gtest_args[@]}" >"$OUT_DIR/configure.log" 2>&1 || return 1
  ninja -C "$BUILD_DIR" -j "$JOBS" gpu_gemv_test bench_gpu_gemv >"$OUT_DIR/build.log" 2>&1 || return 1
  TEST_BIN="$BUILD_DIR/tests/gpu/gpu_gemv_test"
  BENCH_BIN="$BUILD_DIR/bench/gpu/bench_gpu_gemv"
}

step_build() {
  if [[ -n "$PREBUILT" ]] && "$PREBUILT/gpu_gemv_test" --gtest_list_tests >/dev/null 2>&1; then
    TEST_BIN="$PREBUILT/gpu_gemv_test"
    BENCH_BIN="$PREBUILT/bench_gpu_gemv"
    record build ok "carried binaries from $PREBUILT"
    return
  fi
  [[ -n "$PREBUILT" ]] && echo "== carried binaries do not run here; building"
  local t0=$SECONDS
  if build_here; then
    record build ok "built here in $((SECONDS - t0)) s"
  else
    tail -30 "$OUT_DIR"/*.log
    record build FAIL "see $OUT_DIR/build.log"
  fi
}

step_test() {
  [[ -x "$TEST_BIN" ]] || { record test FAIL "no test binary"; return; }
  echo "== GPU tests"
  local t0=$SECONDS
  "$TEST_BIN" >"$OUT_DIR/test.log" 2>&1
  local rc=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" "$OUT_DIR/test.log" | tail -15
  local passed; passed=$(grep -c "^\[       OK \]" "$OUT_DIR/test.log")
  local skippedn; skippedn=$(grep -c "^\[  SKIPPED \]" "$OUT_DIR/test.log")
  # Per format: worst exact error over every shape; worst end-to-end error over the shapes with
  # >= 64 outputs (the ones the test bounds).
  grep "^PARITY" "$OUT_DIR/test.log" | awk '{f=$2; split($4,r,"="); split($6,t,"="); split($7,a,"="); split($8,b,"=");
      if (a[2]+0 > ex[f]+0) ex[f]=a[2]; if (r[2]*t[2] >= 64 && b[2]+0 > ee[f]+0) ee[f]=b[2]; n[f]++}
      END {for (f in n) printf "  %-5s cases=%-3d max exact=%.2e  max e2e=%.2e\n", f, n[f], ex[f], ee[f]}' \
    | sort >"$OUT_DIR/parity.txt"
  if [[ $rc -eq 0 ]]; then
    record test ok "$passed passed, $skippedn skipped, $((SECONDS - t0)) s"
  else
    grep -E "^\[  FAILED  \]|Failure|Expected|Which is|seed" "$OUT_DIR/test.log" | head -40
    record test FAIL "exit $rc; see $OUT_DIR/test.log"
  fi
}

step_memcheck() {
  [[ -x "$TEST_BIN" ]] || { record memcheck FAIL "no test binary"; return; }
  if ! command -v compute-sanitizer >/dev/null; then
    for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
      [[ -x $d/compute-sanitizer ]] && PATH="$d:$PATH"
    done
  fi
  command -v compute-sanitizer >/dev/null || { record memcheck FAIL "compute-sanitizer not found"; return; }
  echo "== compute-sanitizer memcheck (small shapes)"
  local filter='*tiny*:*odd_rows*:*unaligned*:*batch2*:*batch5*:GemvActivation*:GemvArgs*'
  compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 20 "$TEST_BIN" --gtest_filter="$filter" \
    >"$OUT_DIR/memcheck.log" 2>&1
  local rc=$?
  tail -3 "$OUT_DIR/memcheck.log"
  if [[ $rc -eq 0 ]]; then
    record memcheck ok "$(grep -o 'ERROR SUMMARY: [0-9]* errors' "$OUT_DIR/memcheck.log" | tail -1)"
  else
    record memcheck FAIL "exit $rc; see $OUT_DIR/memcheck.log"
  fi
}

step_bench() {
  [[ -x "$BENCH_BIN" ]] || { record bench FAIL "no bench binary"; return; }
  echo "== GEMV benchmark"
  "$BENCH_BIN" $QUICK "${BENCH_ARGS[@]}" --csv "$OUT_DIR/gemv_bench.csv" >"$OUT_DIR/gemv_bench.txt" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then record bench ok "$OUT_DIR/gemv_bench.txt"; else record bench FAIL "exit $rc"; fi
}

# CPU inference next to llama.cpp's CPU backend on this machine's idle cores (issue: CPU decode and
# prefill >= 0.8x llama.cpp). Needs a carried static `sluice` and `llama-bench` in $PREBUILT
# (scripts/gpu-check.sh documents how they are made); models are synthesized into /dev/shm.
step_cpu() {
  local sl="$PREBUILT/sluice" lb="$PREBUILT/llama-bench"
  [[ -x "$sl" && -x "$lb" ]] || { record cpu skipped "no carried sluice/llama-bench in $PREBUILT"; return; }
  local dir=/dev/shm/sluice-cpu-models threads
  threads=$(nproc)
  mkdir -p "$dir"
  echo "== CPU: sluice vs llama.cpp, $threads threads"
  : >"$OUT_DIR/cpu_compare.txt"
  while read -r name pp tg reps args; do
    "$sl" synth $args --seed 1 -o "$dir/$name.gguf" >>"$OUT_DIR/cpu_synth.log" 2>&1 ||
      { record cpu FAIL "synth $name"; return; }
    echo "### $name ($args), pp$pp tg$tg, $reps reps" | tee -a "$OUT_DIR/cpu_compare.txt"
    SLUICE="$sl" LLAMA_BENCH="$lb" PP=$pp TG=$tg REPS=$reps bash bench/e2e/compare.sh "$dir/$name.gguf" "$threads" \
      >>"$OUT_DIR/cpu_compare.txt" 2>>"$OUT_DIR/cpu_compare.err" || { record cpu FAIL "compare $name"; return; }
    rm -f "$dir/$name.gguf"
  done <<'MODELS'
smollm2-135m-shape 512 128 3 custom --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --type q4_1 --tied-output
llama-1b-q4_k_m 512 128 3 custom --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256 --type q4_k_m
llama-3-8b-q4_k_m 64 32 2 llama-3-8b --type q4_k_m
MODELS
  record cpu ok "$OUT_DIR/cpu_compare.txt"
}

if [[ -n "$PACKAGE" ]]; then
  build_here || { tail -30 "$OUT_DIR"/*.log; exit 1; }
  mkdir -p "$PACKAGE" && cp "$TEST_BIN" "$BENCH_BIN" "$PACKAGE"/ && ls -la "$PACKAGE"
  exit 0
fi

STEPS=(build test memcheck bench cpu)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 |
  tee "$OUT_DIR/gpu.txt"
for s in "${STEPS[@]}"; do
  if skipped "$s"; then record "$s" skipped ""; else "step_$s"; fi
done

echo
echo "================ gpu-check summary ($(date -u +%F) $(head -1 "$OUT_DIR/gpu.txt" | cut -d, -f1)) ================"
[[ -s "$OUT_DIR/parity.txt" ]] && { echo "parity (normalized error; tol exact 2e-5, e2e 2e-2 for q8 activations):"; cat "$OUT_DIR/parity.txt"; }
[[ -s "$OUT_DIR/gemv_bench.txt" ]] && cat "$OUT_DIR/gemv_bench.txt"
[[ -s "$OUT_DIR/cpu_compare.txt" ]] && { echo "CPU inference, sluice vs llama.cpp (same machine, same threads):"; cat "$OUT_DIR/cpu_compare.txt"; }
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
