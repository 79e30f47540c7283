#!/usr/bin/env bash
# Regenerates the golden fixtures under tests/fixtures/golden/ from llama.cpp, the correctness
# oracle. Not run by CI (CI only compares against the committed data).
#
# llama.cpp comes from the llama-cpp-python source package (vendor/llama.cpp):
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
#   cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
#   cmake --build build-cpu --target llama llama-quantize
# usage: tools/golden/make_fixtures.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD [SLUICE_BIN] [WHICH]
#   WHICH: all (default), smollm2 (the Q4_1 model as published), gemma3 (Gemma 3 270M Q4_K_M as
#   published), requant (SmolLM2 requantized by llama-quantize into the formats below), synth
#   (tools/golden/synth_models.txt). Fixtures are
#   made once, on one machine: regenerating a set on another CPU changes llama.cpp's f32 order.
# ONLY=REGEX regenerates only the fixtures whose name matches (e.g. ONLY='moe' for the MoE models),
# leaving the others as committed.
# BACKEND=cuda (on the GPU machine, LLAMA_CPP_BUILD a llama.cpp build with -DGGML_CUDA=ON) makes
# the synthetic models' fixtures with every layer offloaded to the GPU, into
# tests/fixtures/golden-cuda/ (what sluice's CUDA backend is compared with; llama_fixture.cpp says
# how their noise is measured). scripts/gpu-check.sh step golden compares sluice's CUDA backend
# with them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:?llama.cpp source dir}
bld=${2:?llama.cpp build dir}
sluice=${3:-$root/build/bin/sluice}
which=${4:-all}
backend=${BACKEND:-cpu}
out=$root/tests/fixtures/golden
[ "$backend" = cuda ] && out=$root/tests/fixtures/golden-cuda
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tool=$tmp/llama_fixture  # not in the llama.cpp build: several checkouts may share one build
libs=$(find "$bld" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
extra=""
if [ "$backend" = cuda ]; then
  # The CUDA runtime libraries exactly as llama.cpp's own llama-bench links them.
  extra=$(ninja -C "$bld" -t commands bin/llama-bench | tail -1 | tr ' ' '\n' |
    grep -E '^-L|^-l|^-Wl,-rpath|^/.*\.so(\.[0-9]+)*$|^/.*\.a$' | grep -v "^$bld\|libllama\|libggml\|libcommon\|libmtmd" | tr '\n' ' ') || true
  [ -n "$which" ] && [ "$which" != all ] && [ "$which" != synth ] && { echo "BACKEND=cuda makes only the synth fixtures" >&2; exit 2; }
  which=synth
  export LLAMA_FIXTURE_NGL=99
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
fi
# shellcheck disable=SC2086
g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$here/llama_fixture.cpp" \
  -Wl,--start-group $libs -Wl,--end-group $extra -fopenmp -lpthread -ldl -o "$tool"

gen() {  # gen NAME MODEL PROMPTS N_GEN
  if [ -n "${ONLY:-}" ] && ! [[ $1 =~ $ONLY ]]; then return 0; fi
  "$tool" "$2" "$3" "$4" "$out/$1.json" "$out/$1.logits.f32" 2>"$tmp/$1.log" || { tail -20 "$tmp/$1.log" >&2; exit 1; }
  sha=$(sha256sum "$2" | cut -d' ' -f1)
  python3 - "$out/$1.json" "$sha" "$(basename "$2")" <<'PY'
import json, sys
p, sha, name = sys.argv[1:]
d = json.load(open(p))
d["model"] = name
d["model_sha256"] = sha
json.dump(d, open(p, "w"), separators=(",", ":"))
PY
  echo "fixture $1: $(basename "$2")"
}

smollm2=$root/models/smollm2-135m-instruct-q4_1.gguf
if [ "$which" = all ] || [ "$which" = smollm2 ]; then
  gen smollm2 "$smollm2" "$here/prompts_smollm2.txt" 64
fi

# Gemma 3 270M Q4_K_M as published (scripts/fetch-models.sh assembles it): 8 prompts x 32 greedy
# tokens; the last prompt (719 tokens) is longer than the 512-token sliding window. Made on a
# 2-core x86 VM without AVX-512 (2026-11-25). Its perplexity fixture
# (tests/fixtures/perplexity/gemma3-270m.json) records the llama-perplexity command it ran.
if [ "$which" = all ] || [ "$which" = gemma3 ]; then
  gen gemma3-270m "$root/models/gemma-3-270m-q4_k_m.gguf" "$here/prompts_gemma3.txt" 32
  cpu=$(grep -q ' avx512f ' /proc/cpuinfo && echo "x86-64 AVX-512" || echo "x86-64 AVX2 (no AVX-512)")
  python3 - "$out/gemma3-270m.json" "$cpu" <<'PY'
import json, sys
p, cpu = sys.argv[1:]
d = json.load(open(p))
d["cpu"] = cpu
d["command"] = "llama_fixture gemma-3-270m-q4_k_m.gguf tools/golden/prompts_gemma3.txt 32"
json.dump(d, open(p, "w"), separators=(",", ":"))
PY
fi

# Real weights in the K-quant formats: SmolLM2 Q4_1 requantized by llama.cpp's quantize tool,
# exactly (2 threads; the output does not depend on them):
#   llama-quantize --allow-requantize smollm2-135m-instruct-q4_1.gguf smollm2-<ftype>.gguf <FTYPE> 2
# The files (88-145 MB) are not committed: the golden test writes the same bytes with
# tests/golden/llama_quantize.h (a port of llama-quantize's type choice and ggml's reference
# quantizers) and checks the sha256 recorded here before comparing. Each fixture records the
# command ("requantize"), the source's sha256 and the CPU flags llama.cpp ran with ("cpu").
if [ "$which" = all ] || [ "$which" = requant ]; then
  cpu=$(grep -q ' avx512f ' /proc/cpuinfo && echo "x86-64 AVX-512" || echo "x86-64 AVX2 (no AVX-512)")
  for ftype in Q4_K_M Q5_K_M Q6_K Q8_0 Q2_K; do
    name=smollm2-$(echo "$ftype" | tr 'A-Z' 'a-z')
    model=$tmp/$name.gguf
    "$bld/bin/llama-quantize" --allow-requantize "$smollm2" "$model" "$ftype" 2 >"$tmp/$name.log" 2>&1 ||
      { cat "$tmp/$name.log" >&2; exit 1; }
    gen "$name" "$model" "$here/prompts_smollm2.txt" 64
    python3 - "$out/$name.json" "$ftype" "$(basename "$smollm2")" "$(sha256sum "$smollm2" | cut -d' ' -f1)" "$cpu" <<'PY'
import json, sys
p, ftype, src, src_sha, cpu = sys.argv[1:]
d = json.load(open(p))
d["requantize"] = f"llama-quantize --allow-requantize {src} {d['model']} {ftype} 2"
d["source_sha256"] = src_sha
d["cpu"] = cpu
json.dump(d, open(p, "w"), separators=(",", ":"))
PY
  done
fi

# Synthetic random-weight models of the other architectures and formats, written
# deterministically by `sluice synth --seed` (the golden test regenerates them and checks the
# sha256 recorded here before comparing).
if [ "$which" != all ] && [ "$which" != synth ]; then exit 0; fi
[ -f "$here/synth_models.txt" ] || exit 0
while read -r name args; do
  [ -z "$name" ] && continue
  case "$name" in \#*) continue ;; esac
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
  # shellcheck disable=SC2086
  "$sluice" synth $args -o "$tmp/$name.gguf" >/dev/null
  gen "$name" "$tmp/$name.gguf" "$here/prompts_synth.txt" 64
  python3 - "$out/$name.json" "$args" "${gpu:-}" <<'PY'
import json, sys
p, args, gpu = sys.argv[1:]
d = json.load(open(p))
d["synth_args"] = args
if gpu:
    d["gpu"] = gpu
    d["command"] = "LLAMA_FIXTURE_NGL=99 llama_fixture MODEL tools/golden/prompts_synth.txt 64 (llama.cpp CUDA build)"
json.dump(d, open(p, "w"), separators=(",", ":"))
PY
done < "$here/synth_models.txt"
