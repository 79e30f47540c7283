#!/usr/bin/env bash
# The real models (SmolLM2 135M Q4_1, Gemma 3 270M Q4_K_M) on the GPU machine: CUDA against
# llama.cpp's fixtures (issue 13), decode speed against llama.cpp's CUDA build (issue 12), and
# speculative decoding, layer skip and early exit on the GPU (issue 15).
#
# The GPU machine takes at most 64 MiB per call (working tree included) and the two models are
# 351 MB, so they travel compressed in parts over consecutive calls to one warm machine:
#   here:  scripts/gpu-real-models.sh pack [PART_MB]     zstd both models, tar, split into
#                                                        .mp1/ .mp2/ ... (git-ignored; the first
#                                                        part is smaller: it travels with the kit)
#   call 1 (carry .gpukit .whl .mp1): scripts/gpu-real-models.sh setup .gpukit
#                                     copies the source to /tmp/src and starts the build there in
#                                     its own process session (it outlives the call): gpu-kit.sh
#                                     build (sluice, GPU tests, llama.cpp CUDA) plus the golden tests
#   calls 2..N (carry .mpK):          scripts/gpu-real-models.sh part .mpK
#   last call:                        scripts/gpu-real-models.sh run "$OUT"
# `run` assembles the models (sha256 checked), waits for the build and runs every step; where
# models/ already holds both files (a machine with a normal checkout) it needs no parts.
# Env for `run`: THREADS (default nproc), STEPS (default "parity golden ppl chat speed spec skip"),
# BUILD (the CUDA build directory, default /tmp/src/build-gpu: sluice, gpu_* and golden_* tests),
# LLAMA_BENCH (llama.cpp's CUDA llama-bench, default /tmp/llama-cuda/llama-bench-cuda).
# scripts/gpu-check.sh step `real` calls `run` on a machine whose models/ holds both files.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
src=/tmp/src
parts=/tmp/model-parts
smol=smollm2-135m-instruct-q4_1.gguf
gemma=gemma-3-270m-q4_k_m.gguf

case "$cmd" in
  pack)
    mb=${2:-44}
    tmp=$(mktemp -d)
    for m in "$smol" "$gemma"; do
      [[ -f models/$m ]] || { echo "gpu-real-models: models/$m missing (scripts/fetch-models.sh)" >&2; exit 1; }
      zstd -q -3 -T0 -f -o "$tmp/$m.zst" "$(readlink -f "models/$m")"
      (cd models && sha256sum -b "$(readlink -f "$m")" | awk -v n="$m" '{print $1 "  " n}') >>"$tmp/SHA256"
    done
    tar -C "$tmp" -cf "$tmp/all.tar" "$gemma.zst" "$smol.zst" SHA256
    rm -rf .mp[0-9]*
    first=$(( mb - 8 ))  # call 1 also carries the ~8 MB build kit
    head -c $(( first * 1000000 )) "$tmp/all.tar" >"$tmp/p1"
    mkdir -p .mp1 && mv "$tmp/p1" .mp1/part01
    tail -c +$(( first * 1000000 + 1 )) "$tmp/all.tar" | split -b $(( mb * 1000000 )) -d -a 2 --numeric-suffixes=2 - "$tmp/part"
    for f in "$tmp"/part*; do k=$((10#${f##*part})); mkdir -p ".mp$k" && mv "$f" ".mp$k/part$(printf %02d "$k")"; done
    rm -rf "$tmp"
    du -b .mp[0-9]* | sort -V
    ;;
  setup)
    kit=${2:-.gpukit}
    rm -rf "$src" && mkdir -p "$src" "$parts"
    # The source as it is now, away from the working tree the next calls copy over.
    tar --exclude='./.mp[0-9]*' --exclude=./build-gpu --exclude=./.git -cf - . | tar -C "$src" -xf -
    for d in .mp[0-9]*; do [[ -d $d ]] && mv "$d"/* "$parts"/; done
    if [[ -d .whl ]]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; fi
    setsid nohup bash -c "cd $src && bash scripts/gpu-kit.sh build $kit && \
      ninja -C build-gpu -j \$(nproc) golden_golden_llama_cpp_test golden_gemma3_perplexity_test; \
      echo \$? >/tmp/src-build.rc" >/tmp/src-build.log 2>&1 </dev/null &
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ls -la "$parts"
    ;;
  part)
    mkdir -p "$parts" && mv "${2:?part directory}"/* "$parts"/ && ls -la "$parts"
    tail -2 /tmp/src-build.log 2>/dev/null
    ;;
  run)
    out=${2:-/tmp/real-out}
    mkdir -p "$out"
    [[ -d $src ]] || src=$PWD
    export SLUICE_SOURCE_DIR=$src PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    mkdir -p "$src/models"
    if [[ ! -f $src/models/$gemma || ! -f $src/models/$smol ]]; then
      if [[ -f models/$gemma && -f models/$smol ]]; then
        cp -L "models/$gemma" "models/$smol" "$src/models/"
      else
        (cd "$parts" && cat $(ls part* | sort -V) | tar -xf - -C "$src/models") || { echo "gpu-real-models: parts incomplete" >&2; exit 1; }
        (cd "$src/models" && for m in "$gemma" "$smol"; do zstd -q -d -f "$m.zst" && rm "$m.zst"; done && sha256sum -c SHA256) ||
          { echo "gpu-real-models: assembled models do not match their sha256" >&2; exit 1; }
      fi
    fi
    t0=$(date +%s)
    while [[ ! -f /tmp/src-build.rc ]] && [[ -f /tmp/src-build.log ]] && (( $(date +%s) - t0 < 420 )); do sleep 5; done
    if [[ -f /tmp/src-build.rc && $(cat /tmp/src-build.rc) != 0 ]]; then tail -40 /tmp/src-build.log; exit 1; fi
    while pgrep -f "llama-cuda.sh build" >/dev/null && (( $(date +%s) - t0 < 480 )); do sleep 5; done
    B=${BUILD:-$src/build-gpu}; S=$B/bin/sluice; L=${LLAMA_BENCH:-/tmp/llama-cuda/llama-bench-cuda}
    M1=$src/models/$smol; M2=$src/models/$gemma
    threads=${THREADS:-$(nproc)}
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$out/machine.txt"
    export CUDA_MODULE_LOADING=EAGER
    calibrate() {  # per-layer skip scores (MODEL.calib) for --skip-layers N and the self-draft
      for m in "$M1" "$M2"; do
        [[ -f $m.calib ]] || "$S" calibrate -m "$m" -b cuda -f "$src/tests/fixtures/perplexity/sluice_docs.txt" -n 256 \
          >"$out/calib-$(basename "$m").log" 2>&1
      done
    }
    for step in ${STEPS:-parity golden ppl chat speed spec skip}; do
      echo "=== $step"
      case $step in
        parity)  # CUDA vs the CPU backend, layer by layer, on both real models
          "$B/tests/gpu/gpu_model_parity_test" --gtest_filter='ModelParityReal.*:CudaGraphs.*' 2>&1 | tee "$out/parity.log" | grep -E "^\[ |hidden|greedy|Failure"
          "$B/tests/gpu/gpu_model_streaming_test" 2>&1 | tee "$out/streaming.log" | grep -E "^\[ |Failure" ;;
        golden)  # greedy tokens and logits against llama.cpp's fixtures, on CUDA
          SLUICE_REQUIRE_MODELS=1 SLUICE_GOLDEN_BACKEND=cuda "$B/tests/golden_golden_llama_cpp_test" \
            --gtest_filter='GoldenLlamaCpp.Gemma3_270M:GoldenLlamaCpp.SmolLM2Q4_1' 2>&1 | tee "$out/golden.log" | grep -E "^\[|Failure|differ" ;;
        ppl)  # perplexity against llama.cpp's number, on CUDA
          SLUICE_REQUIRE_MODELS=1 SLUICE_GOLDEN_BACKEND=cuda "$B/tests/golden_gemma3_perplexity_test" 2>&1 | tee "$out/ppl.log" | grep -E "^\[|Failure" ;;
        chat)  # the chat template on CUDA: two greedy turns
          printf 'What is the boiling point of water?\nAnd in Fahrenheit?\n' |
            "$S" chat -m "$M2" -b cuda --temp 0 -n 48 2>&1 | tee "$out/chat.log" | tail -12 ;;
        speed)  # resident decode and prefill against llama.cpp's CUDA build
          for m in "$M1" "$M2"; do
            SLUICE=$S LLAMA_BENCH=$L BACKEND=cuda REPS=5 bash bench/e2e/compare.sh "$m" "$threads" 2>&1 | tee -a "$out/speed.log"
          done ;;
        spec)  # speculative decoding on CUDA: self-draft and a pruned draft model, 8 prompts
          python3 tools/draft/prune_layers.py "$M1" /tmp/smol-draft.gguf --keep 0,1,2,3,4,5,6,7,8,9,10,11,18,19,20,21,22,23,24,27,28,29 >/dev/null &&
          python3 tools/draft/prune_layers.py "$M2" /tmp/gemma-draft.gguf --keep 0,1,2,3,4,5,6,7,9,10,11,12,13,15,16,17 >/dev/null
          calibrate
          SLUICE=$S THREADS=$threads DRAFT=/tmp/smol-draft.gguf bash bench/e2e/spec_cpu.sh "$M1" 48 -b cuda 2>&1 | tee "$out/spec-smollm2.log" | grep summary
          SLUICE=$S THREADS=$threads DRAFT=/tmp/gemma-draft.gguf SKIP=2 bash bench/e2e/spec_cpu.sh "$M2" 48 -b cuda 2>&1 | tee "$out/spec-gemma3.log" | grep summary ;;
        skip)  # layer skip and early exit on CUDA: perplexity (calibrate's table) and decode tok/s
          calibrate
          for m in "$M1" "$M2"; do
            name=$(basename "$m")
            cat "$out/calib-$name.log" 2>/dev/null | tail -20
            for f in "" "--skip-layers 1" "--skip-layers 2" "--skip-layers 4" "--early-exit 0.995" "--early-exit 0.99"; do
              # shellcheck disable=SC2086
              r=$("$S" bench -m "$m" -b cuda -p 0 -n 64 -r 7 $f 2>&1 | grep -E "tg64|decode" | tail -1)
              echo "$name ${f:-baseline}: $r" | tee -a "$out/skip.log"
            done
            for f in "--early-exit 0.995" "--early-exit 0.99"; do
              # shellcheck disable=SC2086
              p=$("$S" perplexity -m "$m" -b cuda -f "$src/tests/fixtures/perplexity/sluice_docs.txt" -c 64 --chunks 4 $f 2>&1 | grep -E "Final estimate")
              echo "$name perplexity $f: $p" | tee -a "$out/skip.log"
            done
            p=$("$S" perplexity -m "$m" -b cuda -f "$src/tests/fixtures/perplexity/sluice_docs.txt" -c 64 --chunks 4 2>&1 | grep -E "Final estimate")
            echo "$name perplexity baseline: $p" | tee -a "$out/skip.log"
          done ;;
        *) echo "gpu-real-models: unknown step $step" >&2 ;;
      esac
    done
    echo "gpu-real-models: done in $(( $(date +%s) - t0 )) s"
    ;;
  *)
    sed -n 2,20p "$0" >&2
    exit 2
    ;;
esac
