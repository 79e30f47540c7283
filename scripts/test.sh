#!/usr/bin/env bash
# Builds and runs every test: a release build, then an AddressSanitizer + UndefinedBehavior
# sanitizer build (halt on error), then the GGUF reader fuzzer for a bounded time.
# Installs missing dependencies first (scripts/setup.sh), so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SLUICE_REQUIRE_MODELS=1
jobs=${SLUICE_JOBS:-$(nproc)}

# Without a GPU the CUDA code is compiled but never run: one architecture is enough (a quarter of
# the nvcc time of the default list). With one, the default list, as scripts/run.sh builds.
if ! nvidia-smi -L >/dev/null 2>&1; then export SLUICE_CUDA_ARCHS=${SLUICE_CUDA_ARCHS:-90}; fi

# Time on the 2-core CI VM (no GPU): 2679 s (44.6 min) before these build-time measures: a unity
# build of src/app with CLI11 included only where a command line is built, tests and src/app at
# -O1 in the sanitizer build (which leaves out the executables of slow-only tests), and COST on the
# long tests so that `ctest -j` starts them first. After them: 2402 s (40.0 min; with a test PCH
# since reverted) on a busier VM, where unchanged objects compiled 15-25% slower and the fuzzer
# ran 17% fewer executions than in the 2679 s run. Compile CPU seconds (ninja log sums): release
# 1291 -> 1140, sanitizer 2002 -> 1551.
echo "== release build =="
bash scripts/build.sh release
(cd build && ctest --output-on-failure -j "$jobs")

echo "== sanitizer build (ASan + UBSan) =="
bash scripts/build.sh asan
# Tests labelled slow (real-model perplexity, speculative runs, the load test; the executables
# whose every test is slow are not even built here: scripts/build.sh asan), the golden
# Gemma 3 perplexity run (a whole-text evaluation, minutes under ASan; its code paths are the
# other golden tests') and the five requantized-SmolLM2 golden runs (each requantizes the model
# with the llama-quantize port, ~30 s in release; the same K-quant model paths run under ASan in
# the synthetic golden tests, GoldenSynth) run in the release build only. So do the two real-model
# golden runs, teacher-forced over 8 prompts each (232 s and 157 s under ASan): their forward
# passes run under ASan in GoldenSynth (every arch), ModelSynthetic.Gemma3DecodeMatchesScalarReference
# and ParitySmolLM2 (the real SmolLM2 file), their tokenizers in the tokenizer tests. The tokenizer's
# timing test on pathological inputs (31 s under ASan) is a speed check; the other tokenizer tests
# take the same code under ASan.
(cd build-asan && ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --output-on-failure -j "$jobs" -LE slow \
    -E 'Gemma3PerplexityWithinOnePercent|GoldenRequantized|GoldenLlamaCpp\.(SmolLM2Q4_1|Gemma3_270M)$|PathologicalLongRunsAreNotQuadratic')

if [ -f tests/fuzz/CMakeLists.txt ]; then
  echo "== fuzzing the GGUF reader (${SLUICE_FUZZ_SECONDS:-60} s) =="
  bash tests/fuzz/run.sh build-fuzz "${SLUICE_FUZZ_SECONDS:-60}"  # builds only the fuzzer (clang)
fi
echo "test.sh: all test stages passed"
