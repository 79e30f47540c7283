#!/usr/bin/env bash
# llama.cpp with CUDA, the rival of the GPU benchmarks, built where it is measured.
#
#   scripts/llama-cuda.sh pack SRC_DIR OUT.tar.xz   (build machine) the parts of llama.cpp's source
#                                                  a CUDA llama-bench and llama-server need (~4 MB),
#                                                  from the llama-cpp-python sdist's vendor/llama.cpp
#   scripts/llama-cuda.sh build SRC.tar.xz DEST    (GPU machine) unpack, build llama-bench, then
#                                                  llama-server without its web UI (the serving
#                                                  benchmark's rival), for this GPU's architecture
#                                                  with every core, copy them to DEST
#
# Building on the GPU machine takes minutes on its 16 cores instead of most of an hour on a 2-core
# build machine, and needs nothing carried but the 4 MB source archive.
set -euo pipefail
case "${1:-}" in
  pack)
    src=$2 out=$3
    excl=()
    for b in cann hexagon hip metal musa opencl openvino sycl vulkan webgpu zdnn zendnn virtgpu et; do
      excl+=(--exclude="ggml/src/ggml-$b")
    done
    # Of the server's UI folder only what its CMake step needs to embed an empty asset table.
    for d in src static tests scripts; do excl+=(--exclude="tools/ui/$d"); done
    tar -C "$src" "${excl[@]}" --exclude="tools/ui/*.json" -cJf "$out" CMakeLists.txt cmake ggml src include common \
      tools vendor LICENSE licenses scripts/ui-assets.cmake
    ls -la "$out"
    ;;
  build)
    archive=$2 dest=$3
    work=/tmp/llama-cuda-src
    rm -rf "$work" && mkdir -p "$work" && tar -C "$work" -xJf "$archive"
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    cmake -S "$work" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_APP=OFF >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
    ninja -C "$work/build" -j "$(nproc)" llama-bench >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
    mkdir -p "$dest" && cp "$work/build/bin/llama-bench" "$dest/llama-bench-cuda"
    ls -la "$dest/llama-bench-cuda"
    # Then the server and llama-batched-bench (the serving benchmarks' rivals); llama-bench is usable meanwhile.
    ninja -C "$work/build" -j "$(nproc)" llama-server llama-batched-bench >"$work/build-server.log" 2>&1 ||
      { tail -30 "$work/build-server.log"; exit 1; }
    cp "$work/build/bin/llama-server" "$dest/llama-server-cuda"
    cp "$work/build/bin/llama-batched-bench" "$dest/llama-batched-bench-cuda"
    ls -la "$dest/llama-server-cuda"
    ;;
  *)
    echo "usage: $0 pack SRC_DIR OUT.tar.xz | build SRC.tar.xz DEST_DIR" >&2
    exit 2
    ;;
esac
