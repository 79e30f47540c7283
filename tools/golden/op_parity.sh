#!/usr/bin/env bash
# Dev-only: builds and runs op_parity (sluice kernels vs a llama.cpp CPU build, bit for bit).
# usage: tools/golden/op_parity.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD SLUICE_BUILD
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:?llama.cpp source dir}
bld=${2:?llama.cpp build dir}
sbld=${3:?sluice build dir}
out=$sbld/op_parity
g++ -O2 -std=c++20 -I"$root/src" -I"$src/ggml/include" "$here/op_parity.cpp" \
  "$sbld/src/backend/libsluice_backend_cpu.a" "$sbld/src/quant/libsluice_quant.a" \
  "$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm -o "$out"
"$out"
