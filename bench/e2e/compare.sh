#!/usr/bin/env bash
# Side-by-side throughput: `sluice bench` and llama.cpp's `llama-bench` on the same model, thread
# count and tests (pp512, tg128, 3 repetitions by default), with the ratio sluice / llama.cpp.
#   bench/e2e/compare.sh [MODEL] [THREADS]
# Environment: SLUICE (default build/bin/sluice), LLAMA_BENCH (default
# /work/llama.cpp/build-cpu/bin/llama-bench), PP (512), TG (128), REPS (3), BACKEND (cpu or cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-models/smollm2-135m-instruct-q4_1.gguf}
threads=${2:-$(nproc)}
sluice=${SLUICE:-build/bin/sluice}
llama_bench=${LLAMA_BENCH:-/work/llama.cpp/build-cpu/bin/llama-bench}
pp=${PP:-512}
tg=${TG:-128}
reps=${REPS:-3}
for f in "$model" "$sluice" "$llama_bench"; do
  [ -e "$f" ] || { echo "compare.sh: not found: $f" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "model $model, backend ${BACKEND:-cpu}, $threads threads, pp$pp tg$tg, $reps repetitions" >&2
# Device: BACKEND=cpu (default; both on `threads` cores) or BACKEND=cuda (sluice's CUDA backend vs
# llama.cpp with every layer offloaded; LLAMA_BENCH must then be a CUDA build).
backend=${BACKEND:-cpu}
sluice_args=(--backend "$backend" -t "$threads")
llama_args=(-t "$threads")
[ "$backend" = cuda ] && llama_args+=(-ngl 99)
"$sluice" bench -m "$model" -p "$pp" -n "$tg" -r "$reps" "${sluice_args[@]}" --json >"$tmp/sluice.json"
"$llama_bench" -m "$model" -p "$pp" -n "$tg" -r "$reps" "${llama_args[@]}" -o json >"$tmp/llama.json" 2>"$tmp/llama.err" ||
  { cat "$tmp/llama.err" >&2; exit 1; }

python3 - "$tmp/sluice.json" "$tmp/llama.json" "$threads" <<'PY'
import json, sys
sluice = {r["test"]: r for r in json.load(open(sys.argv[1]))}
llama = {}
for r in json.load(open(sys.argv[2])):
    name = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    llama[name] = r
print(f"| test  | threads | sluice t/s        | llama.cpp t/s     | ratio | sluice weight GB/s |")
print(f"| ----- | ------: | ----------------: | ----------------: | ----: | -----------------: |")
for test in sorted(set(sluice) | set(llama), key=lambda t: (t[:2] != "pp", t)):
    s, l = sluice.get(test), llama.get(test)
    st = f"{s['avg_ts']:.2f} ± {s['stddev_ts']:.2f}" if s else "-"
    lt = f"{l['avg_ts']:.2f} ± {l['stddev_ts']:.2f}" if l else "-"
    ratio = f"{s['avg_ts'] / l['avg_ts']:.2f}" if s and l else "-"
    gbs = f"{s['weight_gb_s']:.2f}" if s and s.get("weight_gb_s") else "-"
    print(f"| {test:5} | {sys.argv[3]:>7} | {st:>17} | {lt:>17} | {ratio:>5} | {gbs:>18} |")
PY
