#!/usr/bin/env bash
# Speculative decoding on the GPU benchmark machine (docs/SPECULATIVE.md, issue 15): the
# verification pass time for K = 1, 2, 4, 8, 16 drafted tokens (a pass of K + 1 tokens) on an
# offloaded model, against the one-token decode pass, and the effective tok/s those pass times
# give at acceptance rates 0.5 .. 0.9 (sluice bench --spec-k). Goal (issue 15): on the 70B shape
# Q4_K_M with 16 GiB of VRAM, K = 8 within 1.3x of K = 1.
#
#   bench/e2e/spec_bench.sh MODEL.gguf [VRAM_BUDGET] [extra sluice bench flags...]
#     VRAM_BUDGET default 16G; RAM_BUDGET env: --ram-budget (default: none, pinned RAM as needed)
#   No 70B file? Make the shape: build/bin/sluice synth llama-70b --type q4_k_m -o /tmp/70b.gguf
#   (sluice synth --help lists the shapes; weights are random, timings are what count).
#
# Two tables: (1) one load planned for K + 1 = 17 tokens per pass, every K measured on it (what
# a --draft-k 16 run would see); (2) one load per K, each planned for its own K + 1 (what
# --draft-k K sees; the plan can move layers from the CPU to streaming as the batch grows). Then
# --plan with --draft-k 8 prints the plans for 1 and 9 tokens per pass side by side.
set -euo pipefail
model=${1:?usage: spec_bench.sh MODEL.gguf [VRAM_BUDGET] [flags...]}
vram=${2:-16G}
shift $(( $# >= 2 ? 2 : 1 ))
sluice=${SLUICE:-build/bin/sluice}
budget=(--vram-budget "$vram")
[[ -n ${RAM_BUDGET:-} ]] && budget+=(--ram-budget "$RAM_BUDGET")
reps=${REPS:-5}

echo "== $model, VRAM budget $vram: one load, planned for 17 tokens per pass"
"$sluice" bench -m "$model" "${budget[@]}" -p 0 -n 0 -r "$reps" --spec-k 1,2,4,8,16 "$@"

echo
echo "== one load per K (each planned for K + 1 tokens per pass)"
for k in 1 2 4 8 16; do
  "$sluice" bench -m "$model" "${budget[@]}" -p 0 -n 0 -r "$reps" --spec-k "$k" "$@" | grep -E '^\| +[0-9]+ \|'
done

echo
echo "== plans for 1 and 9 tokens per pass (--draft-k 8)"
"$sluice" run -m "$model" "${budget[@]}" -p x --self-draft --draft-k 8 --plan "$@"
