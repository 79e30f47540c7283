#!/usr/bin/env bash
# Mixture of experts on the CPU with --ram-budget through the CLI (the RAM expert cache,
# docs/STREAMING.md): greedy output at a quarter of the file identical to the all-resident run,
# with and without prefetch, and with every expert repacked (SLUICE_QUANT_ISA=ref); peak RSS within the budget; --plan prints the cache's sizing; a budget
# below the minimum names it; --trace holds one expert row per use and bench/plot/experts.py
# renders it (exit 77 = skipped without matplotlib).
# Usage: stream_moe.sh CASE SLUICE_BIN SOURCE_DIR
set -u
case_name=$1; bin=$2; src=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ~60 MiB qwen3moe-shaped file: 4 layers x 32 experts (top-4), routed experts ~90% of the bytes.
model=$tmp/moe.gguf
"$bin" synth custom -o "$model" --arch qwen3 --experts 32 --experts-used 4 --layers 4 --dim 1024 --ffn 512 \
  --heads 8 --kv-heads 4 --vocab 2048 --seed 3 >/dev/null 2>&1 || fail "synth"
bytes=$(stat -c %s "$model"); quarter=$((bytes / 4))
common=(-m "$model" -p "the quick brown fox" -n 24 --temp 0 --seed 1 -c 256 -t 2 --no-probe)

run_rss() {
  local out=$1; shift
  python3 - "$out" "$bin" "$@" <<'PY'
import resource, subprocess, sys
out = sys.argv[1]
r = subprocess.run(sys.argv[2:], capture_output=True)
open(out, "wb").write(r.stdout)
open(out + ".err", "wb").write(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if r.returncode == 0 else -r.returncode - 1000)
PY
}

case $case_name in
  greedy_matches_resident)
    base=$(run_rss "$tmp/base" inspect "$model")
    ref=$(run_rss "$tmp/ref" run "${common[@]}" --backend cpu)
    (( base > 0 && ref > 0 )) || fail "resident run failed: $(cat "$tmp/ref.err")"
    for pf in off on; do
      got=$(run_rss "$tmp/q$pf" run "${common[@]}" --ram-budget "$quarter" --expert-prefetch "$pf")
      (( got > 0 )) || fail "prefetch $pf: run failed: $(cat "$tmp/q$pf.err")"
      cmp -s "$tmp/ref" "$tmp/q$pf" || fail "prefetch $pf: output differs: $(head -c 200 "$tmp/q$pf") vs $(head -c 200 "$tmp/ref")"
      grep -q "^experts (decode): .*hit rate .*disk .* MB" "$tmp/q$pf.err" || fail "no expert stats: $(cat "$tmp/q$pf.err")"
      grep -q "^experts: decode hit rate per layer (%): [0-9]* [0-9]* [0-9]* [0-9]*$" "$tmp/q$pf.err" || fail "no per-layer hit rates"
      # Slack as in stream_cpu.sh: activations, KV cache at -c 256, allocator; experts are read
      # with O_DIRECT and the resident part's file pages are dropped after their copy.
      limit=$((base + quarter + 64 * 1024 * 1024))
      echo "prefetch $pf: floor $base, budget $quarter, peak RSS $got (all-resident $ref), limit $limit"
      [[ ${SLUICE_SKIP_RSS:-0} == 1 ]] || (( got <= limit )) || fail "peak RSS $got above floor + budget + 64 MiB ($limit)"
    done
    grep -q "prefetch: accuracy" "$tmp/qon.err" || fail "no prefetch accuracy with --expert-prefetch on"
    grep -q "prefetch off" "$tmp/qoff.err" || fail "prefetch not off"
    echo "ok: identical greedy output at budget $quarter of $bytes";;
  packed_matches_resident)
    # Under SLUICE_QUANT_ISA=ref the reference kernels have packed layouts, so every expert of this
    # q4_k_m file (Q4_K and Q6_K stacks) is read into a buffer and repacked per expert, on any CPU.
    export SLUICE_QUANT_ISA=ref
    short=(-m "$model" -p "the quick brown fox" -n 8 --temp 0 -c 256 -t 2 --no-probe)
    "$bin" run "${short[@]}" --backend cpu >"$tmp/ref" 2>"$tmp/ref.err" || fail "resident run: $(cat "$tmp/ref.err")"
    "$bin" run "${short[@]}" --ram-budget "$quarter" >"$tmp/q" 2>"$tmp/q.err" || fail "cached run: $(cat "$tmp/q.err")"
    cmp -s "$tmp/ref" "$tmp/q" || fail "packed: output differs: $(head -c 200 "$tmp/q") vs $(head -c 200 "$tmp/ref")"
    "$bin" run "${short[@]}" --ram-budget "$quarter" --plan >"$tmp/p" 2>&1 || fail "--plan: $(cat "$tmp/p")"
    grep -q "read buffers of .* (experts repacked after their read)" "$tmp/p" || fail "experts not repacked: $(cat "$tmp/p")"
    echo ok;;
  plan_prints)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --plan >"$tmp/o" 2>"$tmp/e" || fail "--plan failed: $(cat "$tmp/e")"
    grep -q "RAM expert cache: [0-9]* slots = [0-9]*% of the experts" "$tmp/o" || fail "no cache sizing: $(cat "$tmp/o")"
    grep -q "routed experts: 4 layers x 32 (top-4)" "$tmp/o" || fail "no expert shape: $(cat "$tmp/o")"
    echo ok;;
  budget_below_minimum)
    "$bin" run "${common[@]}" --ram-budget 2M >"$tmp/o" 2>"$tmp/e"; rc=$?
    [[ $rc == 2 ]] || fail "exit $rc, expected 2: $(cat "$tmp/e")"
    grep -q "too small for the expert cache: at least" "$tmp/e" || fail "message lacks the minimum: $(cat "$tmp/e")"
    "$bin" run "${common[@]}" --ram-budget "$quarter" --expert-prefetch sometimes >"$tmp/o" 2>"$tmp/e"; rc=$?
    [[ $rc == 2 ]] || fail "--expert-prefetch sometimes: exit $rc, expected 2"
    grep -q "expert-prefetch" "$tmp/e" || fail "message does not name the flag: $(cat "$tmp/e")"
    echo ok;;
  trace_and_plot)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --trace "$tmp/t.csv" >/dev/null 2>"$tmp/e" ||
      fail "run --trace failed: $(cat "$tmp/e")"
    uses=$(sed -n 's/^experts (decode): \([0-9]*\) uses.*/\1/p' "$tmp/e")
    # 23 decode passes x 4 layers x 4 experts; the prefill's rows come on top.
    [[ $uses == 368 ]] || fail "decode uses $uses, expected 368"
    rows=$(grep -c ',expert,' "$tmp/t.csv")
    (( rows >= uses )) || fail "$rows expert rows for $uses decode uses"
    grep -q '^[0-9]*,[0-9]*,expert,3,blk\.3\.exp\.[0-9]*\.pass\.[0-9]*,\(ram hit\|disk\),[0-9]*$' "$tmp/t.csv" ||
      fail "no well-formed expert row: $(grep expert "$tmp/t.csv" | head -3)"
    python3 -c "import matplotlib" 2>/dev/null || { echo "skip: matplotlib not importable"; exit 77; }
    python3 "$src/bench/plot/experts.py" "$tmp/t.csv" -o "$tmp/e.png" --decode-only --cache-slots 8 >"$tmp/p" 2>&1 ||
      fail "experts.py failed: $(cat "$tmp/p")"
    [[ -s $tmp/e.png ]] || fail "no PNG"
    grep -q "368 uses, 4 layers x 32 experts" "$tmp/p" || fail "plot counted otherwise: $(cat "$tmp/p")"
    echo "x" > "$tmp/bad.csv"
    python3 "$src/bench/plot/experts.py" "$tmp/bad.csv" -o "$tmp/b.png" >/dev/null 2>&1; rc=$?
    [[ $rc == 2 ]] || fail "malformed trace: exit $rc, expected 2"
    echo ok;;
  *) fail "unknown case $case_name";;
esac
