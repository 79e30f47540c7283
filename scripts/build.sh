#!/usr/bin/env bash
# Configures and builds one build directory: scripts/build.sh [release|asan|fuzz] (default release).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}
jobs=${SLUICE_JOBS:-$(nproc)}
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  # CUDA code is compiled (and its tests skip) in the release build; the sanitizer build is host-only.
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=ON -DSLUICE_BENCH=OFF -DSLUICE_CUDA=OFF) ;;
  fuzz) dir=build-fuzz; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
          -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=ON -DSLUICE_TESTS=ON -DSLUICE_BENCH=OFF) ;;
  *) echo "build.sh: unknown build kind '$kind' (release, asan, fuzz)" >&2; exit 2 ;;
esac
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
[ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" "${gen[@]}" "${flags[@]}" >/dev/null
cmake --build "$dir" -j "$jobs"
