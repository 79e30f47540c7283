#!/usr/bin/env bash
# Configures and builds one build directory: scripts/build.sh [release|asan|fuzz] (default release).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
jobs=${SLUICE_JOBS:-$(nproc)}
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  # CUDA code is compiled (and its tests skip) in the release build; the sanitizer build is host-only.
  # Line tables only (-g1): sanitizer stack traces keep function, file and line; a quarter less compile
  # time than full debug info (measured on a 2-core VM: a test file 26.2 s -> 19.8 s).
  # SLUICE_SLOW_TESTS=OFF: the executables whose tests are all labelled slow are not built (scripts/test.sh
  # runs no slow test in this build); the tests and src/app are compiled at -O1 (CMakeLists.txt, SLUICE_HARNESS_OPT).
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=ON -DSLUICE_BENCH=OFF -DSLUICE_CUDA=OFF -DSLUICE_SLOW_TESTS=OFF
          "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG") ;;
  fuzz) dir=build-fuzz; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
          -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=ON -DSLUICE_TESTS=ON -DSLUICE_BENCH=OFF) ;;
  *) echo "build.sh: unknown build kind '$kind' (release, asan, fuzz)" >&2; exit 2 ;;
esac
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# SLUICE_CUDA_ARCHS (e.g. 90): the CUDA architectures to compile for; unset: the default list of
# CMakeLists.txt (every supported GPU). scripts/test.sh sets it on machines without a GPU, where
# CUDA code is only compiled, to one architecture.
if [ -n "${SLUICE_CUDA_ARCHS:-}" ]; then
  flags+=(-DCMAKE_CUDA_ARCHITECTURES="$SLUICE_CUDA_ARCHS")
elif [ -f "$dir/CMakeCache.txt" ] && grep -q "^CMAKE_CUDA_ARCHITECTURES:" "$dir/CMakeCache.txt"; then
  flags+=(-UCMAKE_CUDA_ARCHITECTURES)  # back to the default list
fi
if [ ! -f "$dir/CMakeCache.txt" ] || [ -n "${SLUICE_CUDA_ARCHS:-}" ] || [[ " ${flags[*]} " == *" -UCMAKE_CUDA_ARCHITECTURES "* ]]; then
  cmake --no-warn-unused-cli -S . -B "$dir" "${gen[@]}" "${flags[@]}" >/dev/null
fi
cmake --build "$dir" -j "$jobs"
