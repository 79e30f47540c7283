#!/usr/bin/env bash
# Next-layer expert prefetch, on and off, on synthetic qwen3moe shapes (random routers and
# --route-skew 1.0): the VRAM expert cache (--vram-budget, cost and copy policies) and the RAM
# expert cache (CPU only, --ram-budget a quarter of the file). Prints each run's decode line and
# expert stats, and whether greedy output matches the run without prefetch.
#
#   bench/e2e/moe_prefetch.sh SLUICE_BIN DIR [VRAM_BUDGET (default 3G)] [SHAPE FLAGS...]
set -uo pipefail
bin=${1:?usage: moe_prefetch.sh SLUICE_BIN DIR [VRAM_BUDGET]}
dir=${2:?usage: moe_prefetch.sh SLUICE_BIN DIR [VRAM_BUDGET]}
vram=${3:-3G}
shift $(( $# >= 3 ? 3 : 2 ))
shape=("$@")
[[ ${#shape[@]} -gt 0 ]] || shape=(--arch qwen3 --experts 128 --experts-used 8 --layers 24 --dim 2048 --ffn 768
  --heads 32 --kv-heads 4 --vocab 32000)
threads=${THREADS:-$(nproc)}
tg=${TG:-64}
mkdir -p "$dir"
prompt="The quick brown fox jumps over the lazy dog"
for skew in 0 1.0; do
  m=$dir/moe_skew$skew.gguf
  [[ -f $m ]] || "$bin" synth custom "${shape[@]}" --route-skew "$skew" --seed 1 -o "$m" >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
  bytes=$(stat -c %s "$m")
  echo "== model $(basename "$m"): $bytes bytes"
  if [[ ${SKIP_GPU:-0} != 1 ]]; then
    for policy in copy cost; do
      for pf in off on; do
        o=$dir/gpu_${skew}_${policy}_$pf
        "$bin" run -m "$m" -p "$prompt" -n "$tg" --temp 0 -t "$threads" --backend cuda --vram-budget "$vram" \
          --expert-misses "$policy" --expert-prefetch "$pf" --no-probe >"$o.txt" 2>"$o.err" || { echo "run failed: $(tail -3 "$o.err")"; continue; }
        same=$(cmp -s "$dir/gpu_${skew}_${policy}_off.txt" "$o.txt" && echo "same output as prefetch off" || echo "OUTPUT DIFFERS from prefetch off")
        echo "gpu --vram-budget $vram --expert-misses $policy --expert-prefetch $pf: $(grep '^decode:' "$o.err"); $same"
        grep -E '^experts( \(decode\)|: decode hit)' "$o.err"
      done
    done
  fi
  for pf in off on; do
    o=$dir/cpu_${skew}_$pf
    "$bin" run -m "$m" -p "$prompt" -n "$tg" --temp 0 -t "$threads" --backend cpu --ram-budget $((bytes / 4)) \
      --expert-prefetch "$pf" --no-probe -c 512 >"$o.txt" 2>"$o.err" || { echo "run failed: $(tail -3 "$o.err")"; continue; }
    same=$(cmp -s "$dir/cpu_${skew}_off.txt" "$o.txt" && echo "same output as prefetch off" || echo "OUTPUT DIFFERS from prefetch off")
    echo "cpu --ram-budget 1/4 --expert-prefetch $pf: $(grep '^decode:' "$o.err"); $same"
    grep -E '^experts( \(decode\)|: decode hit|: resident)' "$o.err"
  done
done
