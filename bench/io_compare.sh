#!/usr/bin/env bash
# Disk tier: sluice's reader (bench_io) next to fio reading the same file the same way
# (O_DIRECT, 4 MiB sequential requests, io_uring, queue depth 8), same machine, same run.
# usage: bench/io_compare.sh FILE [BUILD_DIR]
set -euo pipefail
file=${1:?usage: io_compare.sh FILE [BUILD_DIR]}
build=${2:-build}
"$build/bench/bench_io" "$file" --runs 3
if command -v fio >/dev/null; then
  for qd in 1 8; do
    bw=$(fio --name=seq --filename="$file" --rw=read --bs=4M --direct=1 --ioengine=io_uring --iodepth=$qd \
      --readonly --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f" % (j["jobs"][0]["read"]["bw_bytes"]/1e9))')
    printf '| %-28s | %8s |\n' "fio io_uring O_DIRECT, qd $qd" "$bw"
  done
else
  echo "fio not installed (apt-get install fio): no reference row"
fi
