#!/usr/bin/env bash
# What a call to the GPU machine carries to build and measure there, and how it is unpacked.
# The GPU machine has nvcc, CMake, ninja and Python (matplotlib) but no package registry.
#
#   scripts/gpu-kit.sh pack [DIR]    (here; DIR default .gpukit, git-ignored) Debian build deps as
#                                    .deb files (PCRE2, liburing, CLI11, nlohmann-json, GoogleTest),
#                                    fio with its libraries (fio.tar.xz), and llama.cpp's source
#                                    trimmed to what a CUDA llama-bench needs (from the
#                                    llama-cpp-python sdist, downloaded with pip)
#   scripts/gpu-kit.sh build [DIR]   (GPU machine) unpack the debs into /tmp/sluice-deps, build a
#                                    static sluice with CUDA for this GPU plus the GPU tests into
#                                    build-gpu, tools/gpu/vram_hold, unpack fio to /tmp/fio; start
#                                    llama.cpp's build in the background (/tmp/llama-cuda, log in
#                                    /tmp/llama-cuda-build.log). Idempotent: a second call on the
#                                    same machine only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
kit=${2:-.gpukit}
case "$cmd" in
  pack)
    mkdir -p "$kit/debs"
    # cpp-httplib (sluice serve) is a shared library in Debian: its runtime libraries come along,
    # found at run time through the build's RPATH into the unpacked debs.
    (cd "$kit/debs" && apt-get download libpcre2-dev liburing-dev libcli11-dev nlohmann-json3-dev libgtest-dev \
      libcpp-httplib-dev libcpp-httplib0.11 libbrotli1 libssl3 zlib1g)
    fio_bin=$(command -v fio) || { echo "gpu-kit: fio not installed here (apt-get install fio)" >&2; exit 1; }
    tmp=$(mktemp -d)
    mkdir -p "$tmp/fio/lib" && cp "$fio_bin" "$tmp/fio/"
    for l in $(ldd "$fio_bin" | awk '{print $3}' | grep -v '^$'); do
      case $(basename "$l") in libc.so*|libm.so*|libpthread*|libdl*|librt*|ld-linux*) ;; *) cp -L "$l" "$tmp/fio/lib/" ;; esac
    done
    tar -C "$tmp" -cJf "$kit/fio.tar.xz" fio && rm -rf "$tmp"
    src=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$src"
    tar -C "$src" -xzf "$src"/llama_cpp_python-*.tar.gz
    bash scripts/llama-cuda.sh pack "$src"/llama_cpp_python-*/vendor/llama.cpp "$kit/llama-src.tar.xz"
    rm -rf "$src"
    du -sh "$kit"/*
    ;;
  build)
    deps=/tmp/sluice-deps
    if [[ ! -d $deps/usr ]]; then
      mkdir -p $deps && for d in "$kit"/debs/*.deb; do dpkg -x "$d" $deps; done
    fi
    if [[ -f "$kit/fio.tar.xz" && ! -x /tmp/fio/fio ]]; then
      mkdir -p /tmp && tar -C /tmp -xJf "$kit/fio.tar.xz"
      printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/fio/lib exec /tmp/fio/fio "$@"\n' >/tmp/fio/run && chmod +x /tmp/fio/run
    fi
    if [[ -f "$kit/llama-src.tar.xz" && ! -x /tmp/llama-cuda/llama-bench-cuda ]] && ! pgrep -f "llama-cuda.sh build" >/dev/null; then
      nohup bash scripts/llama-cuda.sh build "$kit/llama-src.tar.xz" /tmp/llama-cuda >/tmp/llama-cuda-build.log 2>&1 &
    fi
    export CPATH=$deps/usr/include LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    [[ -f build-gpu/CMakeCache.txt ]] || cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON \
      -DSLUICE_STATIC_DEPS=ON -DSLUICE_TESTS=ON -DSLUICE_BENCH=ON -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" \
      -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_FIND_ROOT_PATH="$deps" >/tmp/sluice-configure.log 2>&1 ||
      { tail -30 /tmp/sluice-configure.log; exit 1; }
    tests=$(cd tests/gpu && ls *_test.cpp | sed 's/^/gpu_/; s/\.cpp$//')
    # shellcheck disable=SC2086
    ninja -C build-gpu -j "$(nproc)" sluice bench_gpu_gemv $tests >/tmp/sluice-build.log 2>&1 ||
      { grep -E "error|FAILED" -A3 /tmp/sluice-build.log | head -40; exit 1; }
    [[ -x build-gpu/vram_hold ]] || nvcc -O2 -o build-gpu/vram_hold tools/gpu/vram_hold.cu
    echo "gpu-kit: built build-gpu/bin/sluice, the GPU tests, build-gpu/vram_hold"
    ;;
  *)
    echo "usage: $0 pack [DIR] | build [DIR]" >&2
    exit 2
    ;;
esac
