#!/usr/bin/env bash
# Mixture-of-experts decode and prefill with FREE GiB of the GPU free (issue 11's setting): sluice's
# expert placement under each miss policy, and llama.cpp's llama-bench with -ngl 99 and each
# --n-cpu-moe value of NCMOE, in one call and under the same memory hog.
#
#   SLUICE=bin LLAMA=llama-bench-cuda HOLD=vram_hold bench/e2e/moe_bench.sh MODEL OUTDIR FREE_GIB [SLUICE FLAGS]
#
# Env: TG (decoded tokens, default 64), NCMOE (llama.cpp --n-cpu-moe values, comma-separated),
# POLICIES (default "cost cpu copy"), THREADS, PP (prefill tokens for pp, default 512; 0 skips),
# PROMPT (sluice run's prompt, default "The").
set -uo pipefail
model=${1:?usage: moe_bench.sh MODEL OUTDIR FREE_GIB}
dir=${2:?usage: moe_bench.sh MODEL OUTDIR FREE_GIB}
free=${3:?usage: moe_bench.sh MODEL OUTDIR FREE_GIB}
shift 3
extra=("$@")  # more sluice flags (e.g. --expert-cache 2G)
: "${SLUICE:?set SLUICE}" "${HOLD:?set HOLD}"
tg=${TG:-64}
pp=${PP:-512}
prompt=${PROMPT:-The}
threads=${THREADS:-$(nproc)}
mkdir -p "$dir"
fifo=$(mktemp -u) && mkfifo "$fifo"
"$HOLD" "$free" >"$fifo" 2>&1 &
hold_pid=$!
read -r line <"$fifo"; rm -f "$fifo"
trap 'kill $hold_pid 2>/dev/null; wait $hold_pid 2>/dev/null' EXIT
echo "$line"
tag=$(basename "$model" .gguf)
budget="$((free - 1))G"
common=(-m "$model" --backend cuda --vram-budget "$budget" -t "$threads" "${extra[@]}")
for policy in ${POLICIES:-cost cpu copy}; do
  echo "== sluice --expert-misses $policy ${extra[*]}: run -p (${#prompt} characters) -n $tg --temp 0"
  "$SLUICE" run "${common[@]}" --expert-misses "$policy" -p "$prompt" -n "$tg" --temp 0 \
    >"$dir/${tag}_${policy}.out" 2>"$dir/${tag}_${policy}.txt"
  grep -E "^(load|prefill|decode|experts|weights)" "$dir/${tag}_${policy}.txt"
  grep -iE "error" "$dir/${tag}_${policy}.txt" | head -3
done
if [[ $pp -gt 0 ]]; then
  echo "== sluice prefill pp$pp (bench, 2 reps)"
  "$SLUICE" bench "${common[@]}" -p "$pp" -n 0 -r 2 2>&1 | grep -E "pp$pp|rror" | head -4
fi
if [[ -n ${LLAMA:-} && -x ${LLAMA:-} && -n ${NCMOE:-} ]]; then
  # One llama-bench per value: a value whose layers do not fit makes llama-bench stop.
  for n in ${NCMOE//,/ }; do
    echo "== llama.cpp -ngl 99 --n-cpu-moe $n -p $pp -n $tg"
    timeout 300 "$LLAMA" -m "$model" -ngl 99 -ncmoe "$n" -p "$pp" -n "$tg" -r 1 -t "$threads" 2>&1 |
      grep -E "^\| .*(pp|tg)[0-9]|rror|failed" | head -4
  done
fi
