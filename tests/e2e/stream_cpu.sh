#!/usr/bin/env bash
# CPU streaming through the CLI: greedy output with --ram-budget (a quarter of the weights, 2 and
# 3 slots) identical to the all-resident run, peak RSS within the budget, the budget minimum.
# Usage: stream_cpu.sh CASE SLUICE_BIN SOURCE_DIR
set -u
case_name=$1; bin=$2; src=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ~234 MiB synthetic llama (16 layers of 15 MiB): large enough that a quarter budget is clearly
# below the all-resident footprint.
model=$tmp/synth.gguf
"$bin" synth custom -o "$model" --layers 16 --dim 1536 --ffn 4096 --heads 12 --kv-heads 4 --vocab 2048 --seed 7 \
  >/dev/null 2>&1 || fail "synth"
bytes=$(stat -c %s "$model"); quarter=$((bytes / 4))
# -c 256 keeps the KV cache to a few MiB so RSS is dominated by weights.
common=(-m "$model" -p "the quick brown fox" -n 24 --temp 0 --seed 1 -c 256 -t 2)

# Runs sluice, prints stdout to $1, and the child's peak RSS in bytes (ru_maxrss) on stdout.
run_rss() {
  local out=$1; shift
  python3 - "$out" "$bin" "$@" <<'PY'
import resource, subprocess, sys
out = sys.argv[1]
r = subprocess.run(sys.argv[2:], capture_output=True, text=True)
open(out, "w").write(r.stdout)
open(out + ".err", "w").write(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if r.returncode == 0 else -r.returncode - 1000)
PY
}

case $case_name in
  greedy_matches_resident)
    run_rss "$tmp/ref" run "${common[@]}" >/dev/null
    for slots in 2 3; do
      run_rss "$tmp/s$slots" run "${common[@]}" --ram-budget "$quarter" --slots "$slots" >/dev/null
      cmp -s "$tmp/ref" "$tmp/s$slots" || fail "slots $slots: output differs: $(head -c 200 "$tmp/s$slots") vs $(head -c 200 "$tmp/ref")"
      grep -q "^stream: .*from disk per decoded token" "$tmp/s$slots.err" || fail "no stream stats line"
    done
    echo "ok: identical greedy output with 2 and 3 slots at budget $quarter";;
  rss_within_budget)
    ref=$(run_rss "$tmp/ref" run "${common[@]}")
    got=$(run_rss "$tmp/s" run "${common[@]}" --ram-budget "$quarter")
    (( ref > 0 && got > 0 )) || fail "run failed: $(cat "$tmp/s.err")"
    # Slack 64 MiB over the budget: the binary and its libraries (~10 MiB), tokenizer tables,
    # activations ([512 tokens x widths] f32, ~25 MiB here), KV cache at -c 256 (~2 MiB), allocator
    # overhead. Reads are O_DIRECT, so streamed bytes never enter the page cache or RSS.
    limit=$((quarter + 64 * 1024 * 1024))
    echo "budget $quarter, peak RSS streamed $got, all-resident $ref, limit $limit"
    (( got <= limit )) || fail "peak RSS $got above budget + 64 MiB ($limit)"
    (( ref - got > bytes / 2 )) || fail "streaming should save more than half the weights ($ref vs $got)"
    echo ok;;
  budget_below_minimum)
    "$bin" run "${common[@]}" --ram-budget 8M >"$tmp/o" 2>"$tmp/e"; rc=$?
    [[ $rc == 2 ]] || fail "exit $rc, expected 2: $(cat "$tmp/e")"
    grep -q "too small: at least" "$tmp/e" || fail "message lacks the minimum: $(cat "$tmp/e")"
    echo ok;;
  plan_prints)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --plan >"$tmp/o" 2>"$tmp/e" || fail "--plan failed: $(cat "$tmp/e")"
    grep -q "predicted token time" "$tmp/o" || fail "no prediction: $(cat "$tmp/o")"
    grep -q "C:disk" "$tmp/o" || fail "no disk units"
    echo ok;;
  *) fail "unknown case $case_name";;
esac
