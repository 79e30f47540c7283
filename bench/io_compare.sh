#!/usr/bin/env bash
# Disk tier, one table: sluice's reader (bench_io: io_uring O_DIRECT at several queue depths,
# pread, buffered), the start-up disk probe's figure (what the planner uses), and fio reading the
# same file the same way (io_uring, O_DIRECT, 4 MiB sequential requests, queue depths 1, 8, 32):
# fio's best row is the device's bound for the disk tier. Same machine, same run.
#
# usage: bench/io_compare.sh FILE [BUILD_DIR]
# env:   FIO=/path/to/fio  fio binary or wrapper script (default: fio on PATH); without one the
#                          fio rows are skipped with a note
#        RUNS=3            bench_io runs per row (median)
#        MAX_BYTES=N       read only the first N bytes (bench_io --max-bytes, fio --size)
# The commands run are echoed to stderr with a leading "+ ".
set -euo pipefail
file=${1:?usage: io_compare.sh FILE [BUILD_DIR]}
build=${2:-build}
fio=${FIO:-fio}
runs=${RUNS:-3}
size_bench=() size_fio=()
if [ -n "${MAX_BYTES:-}" ]; then
  size_bench=(--max-bytes "$MAX_BYTES")
  size_fio=(--size="$MAX_BYTES")
fi

show() { printf '+' >&2; printf ' %q' "$@" >&2; printf '\n' >&2; }  # the command, as it can be pasted

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
refs=()
notes=()
if command -v "$fio" >/dev/null 2>&1; then
  for qd in 1 8 32; do
    json="$tmp/fio_qd$qd.json"
    cmd=("$fio" --name=seq --filename="$file" --rw=read --bs=4M --direct=1 --ioengine=io_uring --iodepth="$qd"
      --readonly --output-format=json --output="$json" ${size_fio[@]+"${size_fio[@]}"})
    show "${cmd[@]}"
    if "${cmd[@]}" >"$tmp/fio.out" 2>&1 && [ -s "$json" ]; then
      if command -v python3 >/dev/null 2>&1; then
        bw=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.2f" % (j["jobs"][0]["read"]["bw_bytes"]/1e9))' "$json")
      else  # jobs[0].read comes first in fio's JSON
        bw=$(grep -m1 '"bw_bytes"' "$json" | tr -dc '0-9' | awk '{printf "%.2f", $1 / 1e9}')
      fi
      refs+=(--ref "fio io_uring O_DIRECT, qd $qd=$bw")
    else
      notes+=("fio qd $qd failed (no row): $(grep -m1 -i 'err\|fail' "$tmp/fio.out" || head -1 "$tmp/fio.out")")
    fi
  done
else
  notes+=("fio not found ('$fio'; set FIO=/path/to/fio or apt-get install fio): fio rows skipped")
fi

cmd=("$build/bench/bench_io" "$file" --runs "$runs" --probe ${size_bench[@]+"${size_bench[@]}"} ${refs[@]+"${refs[@]}"})
show "${cmd[@]}"
"${cmd[@]}"
for n in ${notes[@]+"${notes[@]}"}; do echo "note: $n"; done
