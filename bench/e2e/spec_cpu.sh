#!/usr/bin/env bash
# Speculative decoding on the CPU (docs/SPECULATIVE.md "Measured"): acceptance rate and effective
# speed-up of each draft kind on 8 prompts, greedy, for one model.
#   bench/e2e/spec_cpu.sh MODEL [N_TOKENS] [extra sluice run flags...]
# Env: SLUICE (binary, default build/bin/sluice), THREADS (-t, default 2), K (--draft-k, default 3),
#      SKIP (self-draft's --draft-layers, default 4), DRAFT (a --draft-model file; default: none),
#      CALIB (the model's calibration file from sluice calibrate; default MODEL.calib).
# Prints one row per prompt and mode and a summary: summed decode tokens / summed decode seconds.
set -euo pipefail
model=${1:?usage: spec_cpu.sh MODEL [N_TOKENS] [flags...]}
n=${2:-48}
shift $(( $# >= 2 ? 2 : 1 ))
sluice=${SLUICE:-build/bin/sluice}
threads=${THREADS:-2}
k=${K:-3}
skip=${SKIP:-4}
calib=${CALIB:-$model.calib}
prompts=(
  "The capital of France is Paris. The capital of Italy is"
  "Write a short story about a robot who learns to paint."
  "Explain how a hash table works."
  "def fibonacci(n):"
  "List five fruits that are red:"
  "The quick brown fox jumps over the lazy dog. The quick brown fox"
  "Translate to French: Good morning, how are you?"
  "Once upon a time, in a small village,"
)
modes=("base" "self" )
[[ -n ${DRAFT:-} ]] && modes+=("draft")
declare -A tok sec acc drf
for m in "${modes[@]}"; do tok[$m]=0; sec[$m]=0; acc[$m]=0; drf[$m]=0; done
printf "%-8s %-6s %8s %8s %10s %8s\n" prompt mode tokens "tok/s" "accept" "tok/pass"
for i in "${!prompts[@]}"; do
  for m in "${modes[@]}"; do
    flags=()
    case $m in
      self) flags=(--self-draft --draft-k "$k" --draft-layers "$skip" --calibration "$calib") ;;
      draft) flags=(--draft-model "$DRAFT" --draft-k "$k") ;;
    esac
    out=$("$sluice" run -m "$model" -p "${prompts[$i]}" -n "$n" --temp 0 -t "$threads" "${flags[@]}" "$@" 2>&1 >/dev/null)
    d=$(grep '^decode:' <<<"$out" | head -1)
    t=$(awk '{print $2}' <<<"$d"); s=$(awk '{print $5}' <<<"$d"); r=$(awk '{print $8}' <<<"$d")
    a="-"; p="-"
    if l=$(grep '^spec: .* passes, ' <<<"$out" | head -1); then
      a=$(sed -E 's/.*\(([0-9]+) of ([0-9]+) drafted.*/\1\/\2/' <<<"$l")
      p=$(sed -E 's/.* passes, ([0-9.]+) tokens per pass.*/\1/' <<<"$l")
      acc[$m]=$(( ${acc[$m]} + ${a%/*} )); drf[$m]=$(( ${drf[$m]} + ${a#*/} ))
    fi
    tok[$m]=$(( ${tok[$m]} + t )); sec[$m]=$(awk -v a="${sec[$m]}" -v b="$s" 'BEGIN{print a+b}')
    printf "%-8s %-6s %8s %8s %10s %8s\n" "$((i + 1))" "$m" "$t" "$r" "$a" "$p"
  done
done
echo
base=$(awk -v t="${tok[base]}" -v s="${sec[base]}" 'BEGIN{print t/s}')
for m in "${modes[@]}"; do
  rate=$(awk -v t="${tok[$m]}" -v s="${sec[$m]}" 'BEGIN{print t/s}')
  ar="-"; [[ ${drf[$m]} -gt 0 ]] && ar=$(awk -v a="${acc[$m]}" -v d="${drf[$m]}" 'BEGIN{printf "%.1f%%", 100*a/d}')
  printf "summary %-6s %6.1f tok/s  speed-up %.2fx  acceptance %s\n" "$m" "$rate" "$(awk -v a="$rate" -v b="$base" 'BEGIN{print a/b}')" "$ar"
done
