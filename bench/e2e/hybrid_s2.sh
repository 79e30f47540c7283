#!/usr/bin/env bash
# Scenario S2 in detail (docs/STREAMING.md, "Hybrid execution"): the 70B model with FREE GiB of
# the GPU free (default 16), sluice's hybrid plan, a traced hybrid run, the pure-streaming run
# with the same prompt (greedy outputs compared), prefill pp512, and llama.cpp with -ngl values
# around the largest that fits, all in one call.
#
#   SLUICE=bin LLAMA=llama-bench-cuda HOLD=vram_hold bench/e2e/hybrid_s2.sh MODEL OUTDIR [FREE_GIB]
#
# Env: TG (decoded tokens, default 32), NGLS (llama.cpp -ngl list, default "28,30"), THREADS,
# MODES (sluice runs, default "hybrid pure": hybrid = --hybrid auto, traced; pure = --no-hybrid;
# alternate, split, split=SHARE = --hybrid MODE, e.g. MODES="alternate split pure" for the
# row-split A/B).
set -uo pipefail
model=${1:?usage: hybrid_s2.sh MODEL OUTDIR [FREE_GIB]}
dir=${2:?usage: hybrid_s2.sh MODEL OUTDIR [FREE_GIB]}
free=${3:-16}
: "${SLUICE:?set SLUICE}" "${HOLD:?set HOLD}"
tg=${TG:-32}
threads=${THREADS:-$(nproc)}
mkdir -p "$dir"
fifo=$(mktemp -u) && mkfifo "$fifo"
"$HOLD" "$free" >"$fifo" 2>&1 &
hold_pid=$!
read -r line <"$fifo"; rm -f "$fifo"
trap 'kill $hold_pid 2>/dev/null; wait $hold_pid 2>/dev/null' EXIT
echo "$line"
budget="$((free - 1))G"
common=(-m "$model" --backend cuda --vram-budget "$budget" -t "$threads")
echo "== plan (hybrid)"
"$SLUICE" run "${common[@]}" --plan -p x -n 1 >"$dir/s2_plan.txt" 2>&1
grep -E "predicted|prefill|CPU computes|GB/s" "$dir/s2_plan.txt" | head -8
for mode in ${MODES:-hybrid pure}; do
  case $mode in
    pure) flags=(--no-hybrid) ;;
    hybrid) flags=(--trace "$dir/s2_trace.csv") ;;
    *) flags=(--hybrid "$mode") ;;
  esac
  echo "== $mode: run -p The -n $tg --temp 0"
  "$SLUICE" run "${common[@]}" -p "The" -n "$tg" --temp 0 "${flags[@]}" >"$dir/s2_${mode}.out" 2>"$dir/s2_${mode}.txt"
  grep -E "^(load|prefill|decode|stream|copies|plan|hybrid|split):" "$dir/s2_${mode}.txt"
done
# Each run's greedy output against pure streaming's (where both ran).
for mode in ${MODES:-hybrid pure}; do
  [[ $mode == pure || ! -f $dir/s2_pure.out ]] && continue
  if cmp -s "$dir/s2_${mode}.out" "$dir/s2_pure.out"; then
    echo "greedy output identical ($mode vs pure streaming, $tg tokens)"
  else
    echo "greedy output DIFFERS ($mode vs pure streaming):"; head -c 300 "$dir/s2_${mode}.out"; echo; head -c 300 "$dir/s2_pure.out"; echo
  fi
done
python3 "$(dirname "$0")/../plot/timeline.py" "$dir/s2_trace.csv" -o "$dir/s2_timeline.png" >/dev/null 2>&1 &&
  echo "timeline: $dir/s2_timeline.png"
echo "== prefill pp512 (sluice bench, 2 reps)"
"$SLUICE" bench "${common[@]}" -p 512 -n 0 -r 2 2>&1 | grep -E "pp512|backend" | head -4
if [[ -n ${LLAMA:-} && -x ${LLAMA:-} ]]; then
  echo "== llama.cpp -ngl ${NGLS:-28,30} -p 512 -n $tg"
  timeout 400 "$LLAMA" -m "$model" -ngl "${NGLS:-28,30}" -p 512 -n "$tg" -r 1 -t "$threads" 2>&1 | grep -E "^\|"
fi
