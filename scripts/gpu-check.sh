#!/usr/bin/env bash
# One GPU check, run on the GPU machine from the repository root: build (or use a carried build),
# GPU tests, compute-sanitizer memcheck on a short test run, GPU benchmarks, and a short summary
# table printed last.
#
#   scripts/gpu-check.sh [--prebuilt DIR] [--quick] [--out DIR] [--skip STEP]...
#
#   --prebuilt DIR  use the binaries in DIR (built elsewhere with scripts/gpu-check.sh --package DIR
#                   on a machine with nvcc and GoogleTest): every gpu_*_test, bench_gpu_gemv, a
#                   static `sluice` with CUDA, optionally llama-bench (CPU), llama-bench-cuda or
#                   llama-src.tar.xz (built here in the background by scripts/llama-cuda.sh), and
#                   smollm2-trunc.gguf (a depth-truncated real model for the parity test).
#                   Falls back to building the GPU tests here if they do not run on this machine.
#   --package DIR   (on the build machine) build the GPU binaries (static deps, sm_$ARCH) in
#                   build-gpu-static and pack what a device call carries into DIR (< 64 MiB):
#                   bins.tar.xz (stripped binaries), smollm2-trunc.gguf (the default model cut
#                   to TRUNC_LAYERS layers, default 3; the streaming placement test needs >= 4) and llama-src.tar.xz (LLAMA_SRC, default /work/llama.cpp); exit.
#   --carried DIR   (on the GPU machine) unpack a --package DIR and run as --prebuilt.
#   --quick         benchmarks without the 128256-row output matrix.
#   --bench-arg A   pass A to bench_gpu_gemv (e.g. --variants; repeatable).
#   --out DIR       logs, CSV and the summary (default: $OUT if set, else out/gpu-check).
#   --skip STEP     skip a step: build, test, memcheck, bench, model, profile, cpu, hybrid, moe, serve, spec,
#                   stream, real, golden (repeatable).
#
# On the lent GPU machine (no package registry) the measured runs used scripts/gpu-kit.sh: `pack`
# here (Debian build deps as .deb, fio, llama.cpp's source), `build` there (static sluice, GPU
# tests, vram_hold; llama.cpp in the background); then this script with --prebuilt build-gpu/bin
# or the bench/e2e scripts directly (docs/STREAMING.md gives the commands of each table).
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
CARRIED=""
QUICK=""
BENCH_ARGS=()
OUT_DIR="${OUT:-$ROOT/out/gpu-check}"
SKIP=" "
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prebuilt) PREBUILT=$2; shift 2 ;;
    --package) PACKAGE=$2; shift 2 ;;
    --carried) CARRIED=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --bench-arg) BENCH_ARGS+=("$2"); shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --skip) SKIP+="$2 "; shift 2 ;;
    *) echo "usage: $0 [--prebuilt DIR | --carried DIR] [--package DIR] [--quick] [--bench-arg A]... [--out DIR] [--skip STEP]..." >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
BUILD_DIR="$ROOT/build-cuda"
JOBS=$(nproc 2>/dev/null || echo 4)
ARCH="${SLUICE_CUDA_ARCH:-90}"
TEST_DIR=""
BENCH_BIN=""
SLUICE_BIN=""
LLAMA_CUDA=""
LLAMA_BUILD_PID=""
EXTRA_CMAKE=()
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
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${gtest_args[@]}" "${EXTRA_CMAKE[@]}" >"$OUT_DIR/configure.log" 2>&1 || return 1
  local tests; tests=$(cd tests/gpu && ls *_test.cpp | sed 's/^/gpu_/; s/\.cpp$//')
  # shellcheck disable=SC2086
  ninja -C "$BUILD_DIR" -j "$JOBS" $tests bench_gpu_gemv sluice >"$OUT_DIR/build.log" 2>&1 || return 1
  TEST_DIR="$BUILD_DIR/tests/gpu"
  BENCH_BIN="$BUILD_DIR/bench/gpu/bench_gpu_gemv"
  SLUICE_BIN="$BUILD_DIR/bin/sluice"
}

step_build() {
  if [[ -n "$PREBUILT" ]] && "$PREBUILT/gpu_gemv_test" --gtest_list_tests >/dev/null 2>&1; then
    TEST_DIR="$PREBUILT"
    BENCH_BIN="$PREBUILT/bench_gpu_gemv"
    SLUICE_BIN="$PREBUILT/sluice"
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
  [[ -d "$TEST_DIR" ]] || { record test FAIL "no test binaries"; return; }
  local t0=$SECONDS rc=0 bin name passed=0 skippedn=0 failed=""
  [[ -f "$PREBUILT/smollm2-trunc.gguf" ]] && export SLUICE_GPU_REAL_MODEL="$PREBUILT/smollm2-trunc.gguf"
  for bin in "$TEST_DIR"/gpu_*_test; do
    name=$(basename "$bin")
    echo "== $name"
    "$bin" >"$OUT_DIR/$name.log" 2>&1 || { rc=1; failed+=" $name"; }
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" "$OUT_DIR/$name.log" | tail -6
    passed=$((passed + $(grep -c "^\[       OK \]" "$OUT_DIR/$name.log")))
    skippedn=$((skippedn + $(grep -c "^\[  SKIPPED \]" "$OUT_DIR/$name.log")))
  done
  # Per format: worst exact error over every shape; worst end-to-end error over the shapes with
  # >= 64 outputs (the ones the test bounds).
  grep -h "^PARITY" "$OUT_DIR"/gpu_gemv_test.log 2>/dev/null | awk '{f=$2; split($4,r,"="); split($6,t,"="); split($7,a,"="); split($8,b,"=");
      if (a[2]+0 > ex[f]+0) ex[f]=a[2]; if (r[2]*t[2] >= 64 && b[2]+0 > ee[f]+0) ee[f]=b[2]; n[f]++}
      END {for (f in n) printf "  %-5s cases=%-3d max exact=%.2e  max e2e=%.2e\n", f, n[f], ex[f], ee[f]}' \
    | sort >"$OUT_DIR/parity.txt"
  # mmq (int8 tensor-core small-batch products): worst exact error per format.
  grep -h "^MMQ" "$OUT_DIR"/gpu_mmq_test.log 2>/dev/null | awk '{f=$2; split($6,a,"="); if (a[2]+0 > ex[f]+0) ex[f]=a[2]; n[f]++}
      END {for (f in n) printf "  mmq %-5s cases=%-3d max exact=%.2e\n", f, n[f], ex[f]}' | sort >>"$OUT_DIR/parity.txt"
  grep -h -B1 "^  hidden:\|^  greedy:" "$OUT_DIR"/gpu_model_parity_test.log 2>/dev/null | grep -v "^--" >"$OUT_DIR/model_parity.txt"
  if [[ $rc -eq 0 ]]; then
    record test ok "$passed passed, $skippedn skipped, $((SECONDS - t0)) s"
  else
    for name in $failed; do
      grep -E "^\[  FAILED  \]|Failure|Expected|Which is|seed" "$OUT_DIR/$name.log" | head -30
    done
    record test FAIL "failed:$failed; logs in $OUT_DIR"
  fi
}

step_memcheck() {
  [[ -d "$TEST_DIR" ]] || { record memcheck FAIL "no test binaries"; return; }
  if ! command -v compute-sanitizer >/dev/null; then
    for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
      [[ -x $d/compute-sanitizer ]] && PATH="$d:$PATH"
    done
  fi
  command -v compute-sanitizer >/dev/null || { record memcheck FAIL "compute-sanitizer not found"; return; }
  echo "== compute-sanitizer memcheck (small shapes)"
  local filter='*tiny*:*odd_rows*:*unaligned*:*batch2*:*batch5*:GemvActivation*:GemvArgs*'
  local cs=(compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 20)
  local rc=0
  "${cs[@]}" "$TEST_DIR/gpu_gemv_test" --gtest_filter="$filter" >"$OUT_DIR/memcheck.log" 2>&1 || rc=$?
  # A short whole-model run through the CUDA backend: every op kind, prefill and graph-replayed decode.
  if [[ $rc -eq 0 && -x "$SLUICE_BIN" && -f "$PREBUILT/smollm2-trunc.gguf" ]]; then
    "${cs[@]}" "$SLUICE_BIN" run -m "$PREBUILT/smollm2-trunc.gguf" -p "The capital of France is" -n 6 --temp 0 \
      --backend cuda >>"$OUT_DIR/memcheck.log" 2>&1 || rc=$?
  fi
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
  # Every launch shape of the formats with a direct kernel (variant 2, their default at 1..2
  # tokens) next to the staged shapes 0 and 1.
  "$BENCH_BIN" --variants --formats q4_k,q5_k >"$OUT_DIR/gemv_bench_variants.txt" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then record bench ok "$OUT_DIR/gemv_bench.txt, $OUT_DIR/gemv_bench_variants.txt"; else record bench FAIL "exit $rc"; fi
}

# Waits for the background llama.cpp CUDA build (once); sets LLAMA_CUDA when it succeeded.
wait_llama() {
  if [[ -n "$LLAMA_BUILD_PID" ]]; then
    # A device call has a time limit: wait for the rival's build until LLAMA_DEADLINE seconds into
    # this script (default 420), then go on without it.
    echo "== waiting for the llama.cpp CUDA build (until ${LLAMA_DEADLINE:-420} s)"
    while kill -0 "$LLAMA_BUILD_PID" 2>/dev/null && ((SECONDS < ${LLAMA_DEADLINE:-420})); do sleep 5; done
    if kill -0 "$LLAMA_BUILD_PID" 2>/dev/null; then
      pkill -P "$LLAMA_BUILD_PID" 2>/dev/null; kill "$LLAMA_BUILD_PID" 2>/dev/null
      echo "llama.cpp CUDA build not finished in time" >>"$OUT_DIR/llama-cuda-build.log"
    elif wait "$LLAMA_BUILD_PID"; then
      LLAMA_CUDA=/tmp/llama-cuda/llama-bench-cuda
    fi
    tail -3 "$OUT_DIR/llama-cuda-build.log"
  fi
  LLAMA_BUILD_PID=""
}

# Whole models resident on the GPU, sluice vs llama.cpp CUDA (all layers offloaded), on synthetic
# Llama-3-8B shapes, the 1B, SmolLM2 and Gemma 3 270M shapes, and on GPUs of >= 100 GB (H200) the
# Llama-3-70B shape, in /dev/shm: tg128 and pp512 tok/s, weight GB/s and the ratio to this GPU's
# copy bandwidth (issue: decode >= llama.cpp and >= 75% of the HBM roofline, prefill >= 0.7x).
step_model() {
  [[ -x "$SLUICE_BIN" ]] || { record model skipped "no sluice binary"; return; }
  wait_llama
  local dir=/dev/shm/sluice-gpu-models
  mkdir -p "$dir"
  : >"$OUT_DIR/model_compare.txt"
  local name args
  # The 8B shape in three formats, then the small models (launch-bound: graph replay matters).
  while read -r name args; do
    # shellcheck disable=SC2086
    "$SLUICE_BIN" synth $args --seed 1 -o "$dir/$name.gguf" >>"$OUT_DIR/model_synth.log" 2>&1 ||
      { record model FAIL "synth $name"; return; }
    echo "### $name ($args), CUDA, pp512 tg128" | tee -a "$OUT_DIR/model_compare.txt"
    if [[ -n "$LLAMA_CUDA" && -x "$LLAMA_CUDA" ]]; then
      SLUICE="$SLUICE_BIN" LLAMA_BENCH="$LLAMA_CUDA" BACKEND=cuda PP=512 TG=128 REPS=3 \
        bash bench/e2e/compare.sh "$dir/$name.gguf" 1 >>"$OUT_DIR/model_compare.txt" 2>>"$OUT_DIR/model_compare.err" ||
        { tail -5 "$OUT_DIR/model_compare.err"; record model FAIL "compare $name"; return; }
    else
      "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 512 -n 128 -r 3 --backend cuda >>"$OUT_DIR/model_compare.txt" 2>&1 ||
        { record model FAIL "bench $name"; return; }
    fi
    if [[ $name == 8b-q4_k_m || $name == smollm2-shape || $name == 1b-q4_k_m ]]; then
      echo "graphs off (A/B; graph replay is the default):" >>"$OUT_DIR/model_compare.txt"
      "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 --backend cuda --no-graphs >>"$OUT_DIR/model_compare.txt" 2>&1
    fi
    if [[ $name == 8b-q4_k_m || $name == 1b-q4_k_m ]]; then
      echo "staged Q4_K GEMV (A/B; SLUICE_CUDA_GEMV_DIRECT=0, the direct kernel is the default):" >>"$OUT_DIR/model_compare.txt"
      SLUICE_CUDA_GEMV_DIRECT=0 "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 --backend cuda >>"$OUT_DIR/model_compare.txt" 2>&1
    fi
    if [[ $name == 8b-q4_k_m || $name == 8b-q8_0 || $name == 8b-q6_k || $name == 1b-q4_k_m ]]; then
      echo "Q6_K / Q8_0 in GGUF order (A/B; SLUICE_CUDA_GROUPED=0, the grouped layout is the default):" >>"$OUT_DIR/model_compare.txt"
      SLUICE_CUDA_GROUPED=0 "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 --backend cuda >>"$OUT_DIR/model_compare.txt" 2>&1
    fi
    if [[ $name == 8b-q4_k_m || $name == 8b-q6_k || $name == 8b-q8_0 ]]; then
      # The two decode-step changes of 2026-12-07 (docs/benchmarks.md, "Two decode-step changes
      # kept"), each off in turn and both off: the split attention at short contexts, the separate
      # RoPE + KV-store launch.
      local ab single qkv
      for ab in "0 1" "256 0" "0 0"; do
        read -r single qkv <<<"$ab"
        echo "A/B: SLUICE_CUDA_ATTN_SINGLE_KEYS=$single SLUICE_CUDA_QKV_ROPE=$qkv (defaults 256 and 1):" >>"$OUT_DIR/model_compare.txt"
        SLUICE_CUDA_ATTN_SINGLE_KEYS=$single SLUICE_CUDA_QKV_ROPE=$qkv "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 \
          --backend cuda 2>&1 | grep -a "tg128" >>"$OUT_DIR/model_compare.txt"
      done
      # The coalesced lane maps of the direct GEMV (docs/benchmarks.md, "Coalesced lane maps"):
      # off = one piece per lane everywhere.
      echo "A/B: SLUICE_CUDA_GEMV_COALESCED=0 (default 1):" >>"$OUT_DIR/model_compare.txt"
      SLUICE_CUDA_GEMV_COALESCED=0 "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 --backend cuda 2>&1 |
        grep -a "tg128" >>"$OUT_DIR/model_compare.txt"
      # What each kind of kernel costs in the token's context: the time saved without its launches
      # (outputs meaningless; docs/benchmarks.md, "Decode on the H100").
      echo "kernel kinds left out (--skip-kernels; the tg128 gained is their cost in context):" >>"$OUT_DIR/model_compare.txt"
      local sk
      for sk in gemv norm,addnorm rope attn glu norm,addnorm,rope,attn,glu; do
        echo "left out: $sk" >>"$OUT_DIR/model_compare.txt"
        "$SLUICE_BIN" bench -m "$dir/$name.gguf" -p 0 -n 128 -r 3 --backend cuda --skip-kernels "$sk" 2>&1 |
          grep -a "tg128" >>"$OUT_DIR/model_compare.txt"
      done
    fi
    rm -f "$dir/$name.gguf"
  done <<'MODELS'
8b-q4_k_m llama-3-8b --type q4_k_m
8b-q8_0 llama-3-8b --type q8_0
8b-q6_k llama-3-8b --type q6_k
1b-q4_k_m custom --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256 --tied-output --rope-theta 500000 --type q4_k_m
smollm2-shape custom --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied-output --rope-theta 100000 --type q4_1
smollm2-real-types custom --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied-output --rope-theta 100000 --type q4_1 --embd-type q8_0
gemma3-270m-shape custom --arch gemma3 --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --type q4_k_m --tied-output --sliding-window 512 --rope-theta 1000000
MODELS
  # The 70B shape resident (issue: >= 1.2x llama.cpp on an H200): only where the GPU holds it.
  local total_mib; total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [[ ${total_mib:-0} -ge 100000 && -n "$LLAMA_CUDA" && -x "$LLAMA_CUDA" ]]; then
    "$SLUICE_BIN" synth llama-3-70b --type q4_k_m --seed 1 -o "$dir/70b-q4_k_m.gguf" >>"$OUT_DIR/model_synth.log" 2>&1 &&
      { echo "### 70b-q4_k_m (llama-3-70b --type q4_k_m), CUDA, pp512 tg32" | tee -a "$OUT_DIR/model_compare.txt"
        SLUICE="$SLUICE_BIN" LLAMA_BENCH="$LLAMA_CUDA" BACKEND=cuda PP=512 TG=32 REPS=3 \
          bash bench/e2e/compare.sh "$dir/70b-q4_k_m.gguf" 1 >>"$OUT_DIR/model_compare.txt" 2>>"$OUT_DIR/model_compare.err"
        echo "staged Q4_K GEMV (A/B; SLUICE_CUDA_GEMV_DIRECT=0):" >>"$OUT_DIR/model_compare.txt"
        SLUICE_CUDA_GEMV_DIRECT=0 "$SLUICE_BIN" bench -m "$dir/70b-q4_k_m.gguf" -p 0 -n 32 -r 3 --backend cuda >>"$OUT_DIR/model_compare.txt" 2>&1
        echo "Q6_K in GGUF order (A/B; SLUICE_CUDA_GROUPED=0):" >>"$OUT_DIR/model_compare.txt"
        SLUICE_CUDA_GROUPED=0 "$SLUICE_BIN" bench -m "$dir/70b-q4_k_m.gguf" -p 0 -n 32 -r 3 --backend cuda >>"$OUT_DIR/model_compare.txt" 2>&1; }
    rm -f "$dir/70b-q4_k_m.gguf"
  fi
  record model ok "$OUT_DIR/model_compare.txt${LLAMA_CUDA:+ (with llama.cpp CUDA)}"
}

# Models larger than the GPU budget (issue: streaming S2/S3). A Llama-3-70B-shape Q4_K_M (~42 GB)
# with --vram-budget 16G: S2 keeps every streamed layer in pinned RAM (file in /dev/shm), S3 caps
# pinned RAM so the rest is read from disk (file on the machine's disk; O_DIRECT bypasses the page
# cache). Next to it, llama.cpp with the largest -ngl that fits 16 GB computing the rest on the CPU.
# STREAM_TG (default 8) decoded tokens per run.
step_stream() {
  [[ -x "$SLUICE_BIN" ]] || { record stream skipped "no sluice binary"; return; }
  local tg=${STREAM_TG:-8} shm=/dev/shm/sluice-70b.gguf disk=$ROOT/../sluice-70b-disk.gguf
  wait_llama
  : >"$OUT_DIR/stream.txt"
  "$SLUICE_BIN" synth llama-3-70b --type q4_k_m --seed 1 -o "$shm" >>"$OUT_DIR/stream.log" 2>&1 ||
    { record stream FAIL "synth 70b"; return; }
  echo "== S2: 70B Q4_K_M, --vram-budget 16G, streamed layers in pinned RAM"
  { echo "### S2: llama-3-70b q4_k_m (file in /dev/shm), --vram-budget 16G, tg$tg";
    "$SLUICE_BIN" run -m "$shm" --backend cuda --vram-budget 16G --plan -p x -n 1 2>&1 | head -40
    "$SLUICE_BIN" run -m "$shm" --backend cuda --vram-budget 16G -p "The" -n "$tg" --temp 0 2>&1 | tail -14
  } >>"$OUT_DIR/stream.txt" 2>&1
  if [[ -n "$LLAMA_CUDA" && -x "$LLAMA_CUDA" ]]; then
    # 16 GiB minus the output head (~0.7 GB), KV cache and compute buffers: 26 of 80 layers
    # (0.53 GB each) is the largest offload that fits.
    { echo "### llama.cpp, same file, -ngl 26 (26 of 80 layers on the GPU, the rest on 16 CPU threads)";
      timeout 300 "$LLAMA_CUDA" -m "$shm" -ngl 26 -p 0 -n "$tg" -r 1 -t "$(nproc)" 2>&1 | tail -4
    } >>"$OUT_DIR/stream.txt" 2>&1
  fi
  if df --output=avail -B1 "$ROOT/.." | tail -1 | awk '{exit !($1 > 50e9)}'; then
    echo "== S3: same model on disk, pinned RAM capped at 8G"
    cp "$shm" "$disk" && rm -f "$shm" && sync
    { echo "### S3: same file on disk, --vram-budget 16G --ram-budget 8G, tg$tg";
      "$SLUICE_BIN" run -m "$disk" --backend cuda --vram-budget 16G --ram-budget 8G --plan -p x -n 1 2>&1 | head -40
      "$SLUICE_BIN" run -m "$disk" --backend cuda --vram-budget 16G --ram-budget 8G -p "The" -n "$tg" --temp 0 \
        --trace "$OUT_DIR/s3_trace.csv" 2>&1 | tail -14
    } >>"$OUT_DIR/stream.txt" 2>&1
    rm -f "$disk"
  else
    echo "S3 skipped: under 50 GB free on disk" >>"$OUT_DIR/stream.txt"
  fi
  rm -f "$shm"
  record stream ok "$OUT_DIR/stream.txt"
}

# Hybrid execution (docs/STREAMING.md, "Hybrid execution"): the CPU computes some pinned-RAM layers
# while the copy engine streams the others. S2 in detail (plan, traced hybrid run, pure-streaming
# run with the same prompt, pp512, llama.cpp -ngl 28,30) by bench/e2e/hybrid_s2.sh, then the sweep of
# free VRAM (HYBRID_POINTS, default 8 12 16 24 32 48 GiB) against llama.cpp's best -ngl by
# bench/e2e/hybrid_sweep.sh, plotted by bench/plot/sweep.py. A holder process
# (tools/gpu/vram_hold) keeps the rest of the GPU, so both engines see the same free memory. Runs
# after the llama.cpp build: a compile on every core halves the CPU executor's rate.
step_hybrid() {
  [[ -x "$SLUICE_BIN" ]] || { record hybrid skipped "no sluice binary"; return; }
  local shm=/dev/shm/sluice-70b.gguf hold=/tmp/sluice-vram-hold dir="$OUT_DIR/hybrid"
  nvcc -O2 -o "$hold" tools/gpu/vram_hold.cu >"$OUT_DIR/hybrid.log" 2>&1 || { record hybrid FAIL "vram_hold build"; return; }
  wait_llama
  mkdir -p "$dir"
  [[ -f $shm ]] || "$SLUICE_BIN" synth llama-3-70b --type q4_k_m --seed 1 -o "$shm" >>"$OUT_DIR/hybrid.log" 2>&1 ||
    { record hybrid FAIL "synth 70b"; return; }
  export CUDA_MODULE_LOADING=EAGER  # kernels loaded with the context, inside the memory it leaves
  { echo "### S2: 70B Q4_K_M, 16 GiB free (holder), hybrid vs pure streaming vs llama.cpp"
    SLUICE="$SLUICE_BIN" LLAMA="$LLAMA_CUDA" HOLD="$hold" bash bench/e2e/hybrid_s2.sh "$shm" "$dir" 16
    echo "### sweep of free VRAM"
    # shellcheck disable=SC2086
    SLUICE="$SLUICE_BIN" LLAMA="$LLAMA_CUDA" HOLD="$hold" TG=16 REPS=2 LOGDIR="$dir" \
      bash bench/e2e/hybrid_sweep.sh "$shm" "$dir/sweep.csv" ${HYBRID_POINTS:-8 12 16 24 32 48}
    python3 bench/plot/sweep.py "$dir/sweep.csv" -o "$dir/sweep.png"
    # Long prompts (docs/STREAMING.md, "Tokens per pass"): every pass copies the streamed layers,
    # so a 2048-token prompt in passes of 512 copies them four times, in one pass of 2048 once.
    echo "### long prompt: pp2048 by tokens per pass, 16 GiB free"
    local fifo hp; fifo=$(mktemp -u) && mkfifo "$fifo"
    "$hold" 16 >"$fifo" 2>&1 & hp=$!
    read -r line <"$fifo"; rm -f "$fifo"; echo "$line"
    # What the plan keeps resident and what the process holds at its peak (docs/benchmarks.md,
    # "The backend's scratch sized for the pass").
    echo "## sluice pp512 + tg32, peak VRAM"
    ( while sleep 0.2; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; done ) \
      >"$dir/vram.txt" 2>&1 & local mp=$!
    "$SLUICE_BIN" bench -m "$shm" -b cuda --vram-budget auto -p 512 -n 32 -r 2 2>&1 | grep -E "^\||^stream:|^vram:"
    kill "$mp"; wait "$mp" 2>/dev/null
    echo "peak MiB of any process but the holder: $(grep -av "^$hp," "$dir/vram.txt" | awk -F, '{print $2+0}' | sort -n | tail -1)"
    for ub in 512 2048; do
      echo "## sluice --ubatch $ub"
      "$SLUICE_BIN" bench -m "$shm" -b cuda --vram-budget auto -p 2048 -n 0 -r 2 --ubatch "$ub" 2>&1 |
        grep -E "^\||^stream:|^copies:"
      if [[ -n "$LLAMA_CUDA" && -x "$LLAMA_CUDA" ]]; then
        echo "## llama.cpp -ngl 30 -b $ub -ub $ub"
        timeout 300 "$LLAMA_CUDA" -m "$shm" -ngl 30 -p 2048 -n 0 -r 2 -b "$ub" -ub "$ub" -t "$(nproc)" 2>&1 | tail -3
      fi
    done
    kill "$hp"; wait "$hp" 2>/dev/null
  } >"$OUT_DIR/hybrid.txt" 2>&1
  record hybrid ok "$OUT_DIR/hybrid.txt"
}

# Serving (docs/SERVING.md, issue 14): 8B Q4_K_M resident, the engine's batched decode pass
# (sluice bench --batch-seqs against llama-batched-bench, 128 positions per sequence), then sluice
# serve --parallel 32 against llama-server -np 32 with the same load generator; 70B Q4_K_M with
# 16 GiB free, aggregate decode at 1, 16 and 32 concurrent requests.
step_serve() {
  [[ -x "$SLUICE_BIN" ]] || { record serve skipped "no sluice binary"; return; }
  local hold=/tmp/sluice-vram-hold m8=/dev/shm/sluice-8b.gguf m70=/dev/shm/sluice-70b.gguf
  local server=${LLAMA_CUDA%/*}/llama-server-cuda batched=${LLAMA_CUDA%/*}/llama-batched-bench-cuda
  nvcc -O2 -o "$hold" tools/gpu/vram_hold.cu >"$OUT_DIR/serve.log" 2>&1 || { record serve FAIL "vram_hold build"; return; }
  wait_llama
  [[ -f $m8 ]] || "$SLUICE_BIN" synth llama-3-8b --type q4_k_m --seed 1 -o "$m8" >>"$OUT_DIR/serve.log" 2>&1
  [[ -f $m70 ]] || "$SLUICE_BIN" synth llama-3-70b --type q4_k_m --seed 1 -o "$m70" >>"$OUT_DIR/serve.log" 2>&1
  export CUDA_MODULE_LOADING=EAGER
  { echo "### 8B Q4_K_M resident, batched decode pass: sluice bench --batch-seqs"
    "$SLUICE_BIN" bench -m "$m8" -b cuda -p 0 -n 0 --batch-seqs 1,2,4,8,16,32 --batch-ctx 128 -r 7
    if [[ -x $batched ]]; then
      echo "### llama-batched-bench (S_TG: decode tok/s over all sequences)"
      "$batched" -m "$m8" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8,16,32 -ngl 99 2>&1 | grep -E "^\|"
    fi
    echo "### 8B Q4_K_M resident: sluice serve --parallel 32"
    python3 bench/e2e/serve_bench.py --url http://127.0.0.1:8089 --tokens 128 --concurrency 1,8,32 \
      --server "$SLUICE_BIN serve -m $m8 --port 8089 --parallel 32 -c 2048 -b cuda"
    if [[ -x $server ]]; then
      echo "### llama-server -np 32"
      python3 bench/e2e/serve_bench.py --url http://127.0.0.1:8089 --tokens 128 --concurrency 1,8,32 \
        --server "$server -m $m8 --port 8089 -np 32 -c 65536 -ngl 99"
    fi
    echo "### 70B Q4_K_M, 16 GiB free: sluice serve --vram-budget auto --parallel 32"
    local fifo; fifo=$(mktemp -u) && mkfifo "$fifo"
    "$hold" 16 >"$fifo" 2>&1 & local hp=$!
    read -r line <"$fifo"; rm -f "$fifo"; echo "$line"
    # 128 tokens a request (the issue's setting): 32 requests of a synthetic prompt (30-60 tokens
    # with the synthetic tokenizer) plus 127 generated need 12 blocks of 16 positions each, so the
    # KV pool holds 6144 positions (at 4096, four requests waited for the first 28 to finish).
    python3 bench/e2e/serve_bench.py --url http://127.0.0.1:8089 --tokens 128 --concurrency 1,32 \
      --server "$SLUICE_BIN serve -m $m70 --port 8089 --parallel 32 -c 1024 --kv-positions 6144 --vram-budget auto -b cuda"
    # The prompt cache on the streamed 70B: a chat whose long system message makes every turn's
    # prompt several 512-token prefill passes without the cache (each pass streams the layers).
    # The synthetic tokenizer makes ~5.2 tokens of a word: 400 words are a 2227-token first prompt
    # (1500 words were 7797 tokens, past the context). One sequence: the KV pool of -c 4096 fits.
    echo "### 70B Q4_K_M, 16 GiB free: a 4-turn chat with and without the prompt cache"
    local s70="$SLUICE_BIN serve -m $m70 --port 8089 --parallel 1 -c 4096 --vram-budget auto -b cuda --chat-template llama3"
    python3 bench/e2e/chat_bench.py --port 8089 --turns 4 --tokens 16 --system-words 400 \
      --server "$s70" --server "$s70 --no-prompt-cache"
    kill "$hp"; wait "$hp" 2>/dev/null
  } >"$OUT_DIR/serve.txt" 2>&1
  record serve ok "$OUT_DIR/serve.txt"
}

# Speculative decoding (docs/SPECULATIVE.md, issue 15): verification pass time by K on the 70B
# shape Q4_K_M with a 15 GiB VRAM budget.
step_spec() {
  [[ -x "$SLUICE_BIN" ]] || { record spec skipped "no sluice binary"; return; }
  local m70=/dev/shm/sluice-70b.gguf
  [[ -f $m70 ]] || "$SLUICE_BIN" synth llama-3-70b --type q4_k_m --seed 1 -o "$m70" >"$OUT_DIR/spec.log" 2>&1
  SLUICE="$SLUICE_BIN" REPS=3 bash bench/e2e/spec_bench.sh "$m70" 15G >"$OUT_DIR/spec.txt" 2>&1
  record spec ok "$OUT_DIR/spec.txt"
}

# The real models (SmolLM2 135M, Gemma 3 270M) on CUDA: against llama.cpp's fixtures, decode
# speed against llama.cpp's CUDA build, speculative decoding, layer skip and early exit
# (scripts/gpu-real-models.sh; on the lent machine the models travel in parts, see there).
step_real() {
  local b; b=$(dirname "$(dirname "$SLUICE_BIN")")
  if [[ ! -f models/gemma-3-270m-q4_k_m.gguf || ! -f models/smollm2-135m-instruct-q4_1.gguf ]]; then
    record real skipped "models/ lacks the real models"; return
  fi
  [[ -f "$b/CMakeCache.txt" ]] && ninja -C "$b" golden_golden_llama_cpp_test golden_gemma3_perplexity_test >"$OUT_DIR/real.log" 2>&1
  [[ -x "$b/tests/golden_golden_llama_cpp_test" ]] || { record real skipped "no golden tests in $b"; return; }
  wait_llama
  BUILD="$b" LLAMA_BENCH="${LLAMA_CUDA:-}" bash scripts/gpu-real-models.sh run "$OUT_DIR/real" >>"$OUT_DIR/real.log" 2>&1
  if grep -q "FAILED" "$OUT_DIR/real.log"; then record real FAIL "$OUT_DIR/real.log"; else record real ok "$OUT_DIR/real.log"; fi
}

# The synthetic golden models (every architecture x format, MoE included) on CUDA, against
# llama.cpp's CUDA fixtures (tests/fixtures/golden-cuda, made by tools/golden/make_fixtures.sh with
# BACKEND=cuda), and the agreement over all fixtures next to llama.cpp's own CPU-vs-CUDA agreement.
step_golden() {
  local b; b=$(dirname "$(dirname "$SLUICE_BIN")")
  [[ -f "$b/CMakeCache.txt" ]] && ninja -C "$b" golden_golden_llama_cpp_test >"$OUT_DIR/golden.log" 2>&1
  [[ -x "$b/tests/golden_golden_llama_cpp_test" ]] || { record golden skipped "no golden test in $b"; return; }
  SLUICE_GOLDEN_BACKEND=cuda "$b/tests/golden_golden_llama_cpp_test" \
    --gtest_filter='Models/GoldenSynth.*:GoldenCuda*:GoldenSynthCuda.*' >>"$OUT_DIR/golden.log" 2>&1
  local sums  # GoldenSynthCuda's line: agreement over all fixtures, ours and llama.cpp's CPU vs CUDA
  sums=$(grep -o "all [0-9]* CUDA fixtures: .*" "$OUT_DIR/golden.log" | tail -1)
  if grep -q "^\[  FAILED" "$OUT_DIR/golden.log"; then record golden FAIL "$sums; $OUT_DIR/golden.log"
  else record golden ok "$sums"; fi
}

# Mixtures of experts (docs/STREAMING.md, "Mixture of experts"): Mixtral-8x7B shape with 12 GiB
# free and Qwen3-30B-A3B shape with 8 GiB free, sluice's miss policies against llama.cpp's
# --n-cpu-moe; the Qwen3 shape CPU only; a Zipf 1.0 router with the expert cache capped; eviction
# across layers vs per-layer quotas after a long prompt.
step_moe() {
  [[ -x "$SLUICE_BIN" ]] || { record moe skipped "no sluice binary"; return; }
  local hold=/tmp/sluice-vram-hold dir="$OUT_DIR/moe" mix=/dev/shm/sluice-mixtral.gguf q3=/dev/shm/sluice-qwen3-30b.gguf
  local qz=/dev/shm/sluice-qwen3-30b-zipf1.gguf
  local q="custom --arch qwen3 --layers 48 --dim 2048 --ffn 768 --heads 32 --kv-heads 4 --head-dim 128 --vocab 151936"
  q+=" --experts 128 --experts-used 8 --rope-theta 1000000 --ctx 40960 --type q4_k_m"
  nvcc -O2 -o "$hold" tools/gpu/vram_hold.cu >"$OUT_DIR/moe.log" 2>&1 || { record moe FAIL "vram_hold build"; return; }
  wait_llama
  mkdir -p "$dir"
  [[ -f $mix ]] || "$SLUICE_BIN" synth mixtral-8x7b --type q4_k_m --seed 1 -o "$mix" >>"$OUT_DIR/moe.log" 2>&1
  # shellcheck disable=SC2086
  [[ -f $q3 ]] || "$SLUICE_BIN" synth $q --seed 2 -o "$q3" >>"$OUT_DIR/moe.log" 2>&1
  # shellcheck disable=SC2086
  [[ -f $qz ]] || "$SLUICE_BIN" synth $q --seed 3 --route-skew 1.0 -o "$qz" >>"$OUT_DIR/moe.log" 2>&1
  export CUDA_MODULE_LOADING=EAGER
  { SLUICE="$SLUICE_BIN" LLAMA="$LLAMA_CUDA" HOLD="$hold" TG=32 NCMOE=20,22,24 bash bench/e2e/moe_bench.sh "$mix" "$dir" 12
    SLUICE="$SLUICE_BIN" LLAMA="$LLAMA_CUDA" HOLD="$hold" TG=32 NCMOE=34,38 POLICIES="cost cpu" bash bench/e2e/moe_bench.sh "$q3" "$dir" 8
    echo "### CPU only, two rounds (llama.cpp at 8, 12 and all threads)"
    for r in 1 2; do
      "$SLUICE_BIN" bench -m "$q3" --backend cpu -t "$(nproc)" -p 0 -n 64 -r 3 2>&1 | grep -E "tg64"
      [[ -n ${LLAMA_CUDA:-} ]] &&
        CUDA_VISIBLE_DEVICES= "$LLAMA_CUDA" -m "$q3" -ngl 0 -t "8,12,$(nproc)" -p 0 -n 64 -r 3 2>&1 | grep -E "tg64"
    done
    echo "### Expert eviction after a long prompt: across layers (default) vs per-layer quotas, two rounds"
    local prompt
    prompt=$(sed -n 1,40p README.md | tr '\n' ' ' | cut -c1-1500)
    for r in 1 2; do
      for qq in global layer; do
        SLUICE="$SLUICE_BIN" HOLD="$hold" TG=64 PP=0 POLICIES=cost PROMPT="$prompt" bash bench/e2e/moe_bench.sh "$mix" \
          "$dir/quotas-$qq" 12 --expert-quotas "$qq"
        SLUICE="$SLUICE_BIN" HOLD="$hold" TG=64 PP=0 POLICIES=cost PROMPT="$prompt" bash bench/e2e/moe_bench.sh "$q3" \
          "$dir/quotas-$qq" 8 --expert-quotas "$qq"
      done
    done
    echo "### Zipf 1.0 router, 8 GiB free, expert cache capped"
    for c in 1G 2G 4G; do
      SLUICE="$SLUICE_BIN" HOLD="$hold" TG=32 PP=0 POLICIES=cost bash bench/e2e/moe_bench.sh "$qz" "$dir/zipf-$c" 8 \
        --expert-cache "$c"
    done
  } >"$OUT_DIR/moe.txt" 2>&1
  record moe ok "$OUT_DIR/moe.txt"
}

# Where decode time goes: Nsight Compute's per-kernel durations over a few decode steps of the 8B
# Q4_K_M model (kernels launched one by one, so each is timed alone).
step_profile() {
  [[ -x "$SLUICE_BIN" ]] || { record profile skipped "no sluice binary"; return; }
  local ncu; ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "$ncu" ]] || { record profile skipped "ncu not found"; return; }
  local m=/dev/shm/sluice-gpu-models/8b-profile.gguf
  "$SLUICE_BIN" synth llama-3-8b --type q4_k_m --seed 1 -o "$m" >/dev/null 2>&1 || { record profile FAIL "synth"; return; }
  echo "== ncu: per-kernel time of decode steps"
  # Skip the load and the 2-token prompt, then time about two decode steps' kernels.
  timeout 240 "$ncu" --clock-control none --cache-control none --launch-skip 1400 --launch-count 1400 --print-summary per-kernel \
    --metrics gpu__time_duration.sum "$SLUICE_BIN" run -m "$m" -p "Hello" -n 6 --temp 0 --backend cuda \
    >"$OUT_DIR/profile_raw.txt" 2>&1
  # name, calls, mean us, total us, sorted by total
  awk '/Invocations/ {name=$0; sub(/^ +(void )?/, "", name); sub(/\(const .*|\(unnamed.*|\(attn.*/, "", name); n=$NF}
       /gpu__time_duration.sum/ {printf "%s\t%d\t%.2f\t%.1f\n", name, n, $NF, n*$NF}' "$OUT_DIR/profile_raw.txt" |
    sort -t$'\t' -k4,4nr | awk -F'\t' '{printf "%-90s %6d %9.2f %10.1f\n", substr($1,1,90), $2, $3, $4}' >"$OUT_DIR/profile.txt"
  rm -f "$m"
  if [[ -s "$OUT_DIR/profile.txt" ]]; then record profile ok "$OUT_DIR/profile.txt"; else record profile FAIL "no kernels"; fi
}

# CPU inference next to llama.cpp's CPU backend on this machine's idle cores (issue: CPU decode and
# prefill >= 0.8x llama.cpp; issue 13: Gemma 3 270M and SmolLM2 Q4_K_M decode >= 1.0x). Needs a
# carried static `sluice` and `llama-bench` in $PREBUILT (scripts/gpu-check.sh documents how they
# are made); models are synthesized into /dev/shm: the real Gemma 3 270M (253 MB) does not fit a
# carry, so its shape is synthesized (18 layers, 640 wide, 4 heads of 256 over 1 KV head, vocabulary
# 262144, window 512; q4_k_m on 640-wide rows falls back to Q5_0 as in the published file).
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
    if [[ $name == llama-1b-q4_k_m ]]; then
      # Same-run A/B of the prefill tile kernels (SLUICE_CPU_TILE=0: the vec_dot_cols path), alternated.
      echo "pp512 A/B, tile kernels on/off/on/off (tok/s):" >>"$OUT_DIR/cpu_compare.txt"
      for tile in 1 0 1 0; do
        SLUICE_CPU_TILE=$tile "$sl" bench -m "$dir/$name.gguf" -p 512 -n 0 -r 2 -t "$threads" --backend cpu --csv 2>/dev/null |
          awk -F, -v t="$tile" 'NR > 1 {print "  tile=" t ": " $0}' >>"$OUT_DIR/cpu_compare.txt"
      done
    fi
    rm -f "$dir/$name.gguf"
  done <<'MODELS'
smollm2-135m-shape 512 128 3 custom --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --type q4_1 --tied-output
smollm2-135m-q4_k_m 512 128 3 custom --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --type q4_k_m --tied-output
gemma3-270m-shape 512 128 3 custom --arch gemma3 --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --type q4_k_m --tied-output --sliding-window 512 --rope-theta 1000000
llama-1b-q4_k_m 512 128 3 custom --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256 --type q4_k_m
llama-3-8b-q4_k_m 64 32 2 llama-3-8b --type q4_k_m
MODELS
  record cpu ok "$OUT_DIR/cpu_compare.txt"
}

if [[ -n "$PACKAGE" ]]; then
  BUILD_DIR="$ROOT/build-gpu-static"
  EXTRA_CMAKE=(-DSLUICE_STATIC_DEPS=ON -DSLUICE_TESTS=ON -DSLUICE_BENCH=ON)
  build_here || { tail -30 "$OUT_DIR"/*.log; exit 1; }
  stage=$(mktemp -d)
  cp "$TEST_DIR"/gpu_*_test "$BENCH_BIN" "$SLUICE_BIN" "$stage"/ && strip "$stage"/*
  [[ -x build-gpu-prebuilt/llama-bench ]] && cp build-gpu-prebuilt/llama-bench "$stage"/  # CPU rival (step cpu)
  mkdir -p "$PACKAGE"
  tar -C "$stage" -cf - . | xz -T0 -6 >"$PACKAGE/bins.tar.xz" && rm -rf "$stage"
  python3 tools/gpu/truncate_model.py models/smollm2-135m-instruct-q4_1.gguf "$PACKAGE/smollm2-trunc.gguf" ${TRUNC_LAYERS:-3}
  bash scripts/llama-cuda.sh pack "${LLAMA_SRC:-/work/llama.cpp}" "$PACKAGE/llama-src.tar.xz"
  du -sh "$PACKAGE"/*
  exit 0
fi
if [[ -n "$CARRIED" ]]; then
  PREBUILT=/tmp/sluice-prebuilt
  mkdir -p "$PREBUILT" && tar -C "$PREBUILT" -xJf "$CARRIED/bins.tar.xz" && cp "$CARRIED"/*.gguf "$CARRIED"/*.tar.xz "$PREBUILT"/ 2>/dev/null
fi

STEPS=(build test memcheck bench model profile cpu hybrid moe serve spec stream real golden)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 |
  tee "$OUT_DIR/gpu.txt"
# cuBLAS (prefill GEMMs) is a shared library: the toolkit's, else the one the Python stack ships.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib 2>/dev/null); do
  [[ -e $d/libcublas.so.13 ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
# The rival's CUDA build runs in the background while the tests use the GPU.
if [[ -x "$PREBUILT/llama-bench-cuda" ]]; then
  LLAMA_CUDA="$PREBUILT/llama-bench-cuda"
elif [[ -f "$PREBUILT/llama-src.tar.xz" ]] && { ! skipped model || ! skipped stream; }; then
  bash scripts/llama-cuda.sh build "$PREBUILT/llama-src.tar.xz" /tmp/llama-cuda >"$OUT_DIR/llama-cuda-build.log" 2>&1 &
  LLAMA_BUILD_PID=$!
fi
for s in "${STEPS[@]}"; do
  if skipped "$s"; then record "$s" skipped ""; else "step_$s"; fi
done

echo
echo "================ gpu-check summary ($(date -u +%F) $(head -1 "$OUT_DIR/gpu.txt" | cut -d, -f1)) ================"
[[ -s "$OUT_DIR/parity.txt" ]] && { echo "parity (normalized error; tol exact 2e-5, e2e 2e-2 for q8 activations):"; cat "$OUT_DIR/parity.txt"; }
[[ -s "$OUT_DIR/model_parity.txt" ]] && { echo "whole-model parity, CUDA vs CPU backend:"; cat "$OUT_DIR/model_parity.txt"; }
[[ -s "$OUT_DIR/gemv_bench.txt" ]] && cat "$OUT_DIR/gemv_bench.txt"
[[ -s "$OUT_DIR/model_compare.txt" ]] && { echo "Resident models on the GPU, sluice vs llama.cpp CUDA:"; cat "$OUT_DIR/model_compare.txt"; }
[[ -s "$OUT_DIR/hybrid.txt" ]] && { echo "Hybrid execution (CPU + GPU at once, 70B):"; grep -vE '^\s*$' "$OUT_DIR/hybrid.txt" | tail -40; }
[[ -s "$OUT_DIR/stream.txt" ]] && { echo "Streaming (models larger than the GPU budget):"; cat "$OUT_DIR/stream.txt"; }
[[ -s "$OUT_DIR/profile.txt" ]] && { echo "decode kernels (ncu; name, calls, mean us, total us):"; head -16 "$OUT_DIR/profile.txt"; }
[[ -s "$OUT_DIR/cpu_compare.txt" ]] && { echo "CPU inference, sluice vs llama.cpp (same machine, same threads):"; cat "$OUT_DIR/cpu_compare.txt"; }
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
