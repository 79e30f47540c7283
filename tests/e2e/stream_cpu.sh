#!/usr/bin/env bash
# CPU streaming through the CLI: greedy output with --ram-budget (a quarter of the weights, 2 and
# 3 slots) identical to the default (packed where the CPU packs) all-resident run, peak RSS within the budget, the budget minimum;
# --trace writes a well-formed trace (and bench/plot/timeline.py renders it when matplotlib is
# importable, else exit 77 = skipped); perplexity, chat and bench take the streaming flags and give
# the same numbers as without them.
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
# Three slots at a quarter do not fit where the CPU repacks streamed layers (AVX-512: a fourth
# layer-sized buffer to repack into, 65.4 MiB needed against 58.6): the 3-slot runs get a third.
third=$((bytes / 3))
# Both runs use the CPU backend's default layout: where it repacks Q4_K / Q6_K into its packed
# layout (AVX-512), the streamer repacks its RAM-resident and disk-streamed layers the same way,
# so the comparisons below are bit for bit with packing on (the streamer's unit test also runs
# the packed path under SLUICE_QUANT_ISA=ref on CPUs without AVX-512).
# -c 256 keeps the KV cache to a few MiB so RSS is dominated by weights.
common=(-m "$model" -p "the quick brown fox" -n 24 --temp 0 --seed 1 -c 256 -t 2)

# Runs sluice, prints stdout to $1, and the child's peak RSS in bytes (ru_maxrss) on stdout.
run_rss() {
  local out=$1; shift
  python3 - "$out" "$bin" "$@" <<'PY'
import resource, subprocess, sys
out = sys.argv[1]
# Bytes, not text: a synthetic model's greedy output need not be valid UTF-8.
r = subprocess.run(sys.argv[2:], capture_output=True)
open(out, "wb").write(r.stdout)
open(out + ".err", "wb").write(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if r.returncode == 0 else -r.returncode - 1000)
PY
}

case $case_name in
  greedy_matches_resident)
    run_rss "$tmp/ref" run "${common[@]}" >/dev/null
    for slots in 2 3; do
      budget=$quarter; ((slots == 3)) && budget=$third
      run_rss "$tmp/s$slots" run "${common[@]}" --ram-budget "$budget" --slots "$slots" >/dev/null
      cmp -s "$tmp/ref" "$tmp/s$slots" || fail "slots $slots: output differs: $(head -c 200 "$tmp/s$slots") vs $(head -c 200 "$tmp/ref")"
      grep -q "^stream: .*from disk per decoded token" "$tmp/s$slots.err" || fail "no stream stats line"
    done
    echo "ok: identical greedy output with 2 slots at budget $quarter, 3 at $third";;
  rss_within_budget)
    # The process's own floor: the binary and its shared libraries, measured by a command that
    # loads no weights (a CUDA build opens cuBLAS only for a CUDA backend, so the floor is small).
    base=$(run_rss "$tmp/base" inspect "$model")
    ref=$(run_rss "$tmp/ref" run "${common[@]}")
    got=$(run_rss "$tmp/s" run "${common[@]}" --ram-budget "$quarter")
    (( base > 0 && ref > 0 && got > 0 )) || fail "run failed: $(cat "$tmp/s.err")"
    # Slack 64 MiB over floor + budget: tokenizer tables, activations ([512 tokens x widths] f32,
    # ~25 MiB here), KV cache at -c 256 (~2 MiB), allocator overhead. Reads are O_DIRECT, so
    # streamed bytes never enter the page cache or RSS.
    limit=$((base + quarter + 64 * 1024 * 1024))
    echo "floor $base, budget $quarter, peak RSS streamed $got, all-resident $ref, limit $limit"
    (( got <= limit )) || fail "peak RSS $got above floor + budget + 64 MiB ($limit)"
    (( ref - got > bytes / 2 )) || fail "streaming should save more than half the weights ($ref vs $got)"
    echo ok;;
  budget_below_minimum)
    "$bin" run "${common[@]}" --ram-budget 8M >"$tmp/o" 2>"$tmp/e"; rc=$?
    [[ $rc == 2 ]] || fail "exit $rc, expected 2: $(cat "$tmp/e")"
    grep -q "too small: at least" "$tmp/e" || fail "message lacks the minimum: $(cat "$tmp/e")"
    echo ok;;
  skip_layers_read_less)
    # --skip-layers under --ram-budget: the left-out layers are not read (disk bytes per token and
    # the plan's disk total shrink by about their share: 3 of 16 equal layers), the output equals
    # the resident run with the same --skip-layers.
    skip=(--skip-layers 3,7,11)
    run_rss "$tmp/ref" run "${common[@]}" "${skip[@]}" >/dev/null
    run_rss "$tmp/all" run "${common[@]}" --ram-budget "$quarter" --no-probe >/dev/null
    run_rss "$tmp/s" run "${common[@]}" --ram-budget "$quarter" --no-probe "${skip[@]}" >/dev/null
    cmp -s "$tmp/ref" "$tmp/s" || fail "output differs from the resident run with the same --skip-layers"
    mb() { sed -nE 's/^stream: +([0-9.]+) MB from disk per decoded token.*/\1/p' "$1"; }
    all=$(mb "$tmp/all.err"); got=$(mb "$tmp/s.err")
    [[ -n $all && -n $got ]] || fail "no stream stats line: $(cat "$tmp/s.err")"
    echo "disk per token: $all MB without, $got MB with ${skip[*]}"
    # 16 layers of ~15 MiB, some resident: leaving out 3 must save at least 2 layers' reads.
    awk -v a="$all" -v g="$got" 'BEGIN { exit !(a - g > 25) }' || fail "disk bytes per token $all -> $got"
    "$bin" run "${common[@]}" --ram-budget "$quarter" --no-probe "${skip[@]}" --plan >"$tmp/p" 2>&1 || fail "--plan: $(cat "$tmp/p")"
    grep -q "predicted token time" "$tmp/p" || fail "no prediction with --skip-layers"
    echo ok;;
  plan_prints)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --plan >"$tmp/o" 2>"$tmp/e" || fail "--plan failed: $(cat "$tmp/e")"
    grep -q "predicted token time" "$tmp/o" || fail "no prediction: $(cat "$tmp/o")"
    grep -q "C:disk" "$tmp/o" || fail "no disk units"
    echo ok;;
  trace_well_formed)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --no-probe --trace "$tmp/t.csv" >/dev/null 2>"$tmp/e" ||
      fail "run --trace failed: $(cat "$tmp/e")"
    grep -q "^trace: .* events -> $tmp/t.csv" "$tmp/e" || fail "no trace line: $(cat "$tmp/e")"
    grep -q "^tiers: *disk .*MB/token.*RAM .*MB/token" "$tmp/e" || fail "no per-tier stats: $(cat "$tmp/e")"
    python3 - "$tmp/t.csv" <<'PY' || fail "malformed trace"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
assert rows[0] == ["t_start_us", "t_end_us", "lane", "layer", "tensor", "tier", "bytes"], rows[0]
lanes = {}
for r in rows[1:]:
    assert len(r) == 7, r
    s, e, layer, n = int(r[0]), int(r[1]), int(r[3]), int(r[6])
    assert 0 <= s <= e and n >= 0, r
    assert r[5] in ("disk", "ram"), r
    lanes.setdefault(r[2], []).append((s, e, layer))
assert "load" in lanes and "cpu" in lanes, sorted(lanes)
assert any(l.startswith("disk slot ") for l in lanes), sorted(lanes)
# 16 layers computed in order, once per pass (prompt + 23 decode steps = 24 passes).
cpu = lanes["cpu"]
assert len(cpu) == 16 * 24, len(cpu)
assert [x[2] for x in cpu[:16]] == list(range(16))
assert all(a[1] <= b[0] for a, b in zip(cpu, cpu[1:])), "compute rows overlap"
print("ok:", {k: len(v) for k, v in lanes.items()})
PY
    "$bin" run "${common[@]}" --trace "$tmp/t2.csv" >/dev/null 2>"$tmp/e2"; rc=$?
    [[ $rc == 2 ]] && grep -q "needs --ram-budget" "$tmp/e2" || fail "--trace without --ram-budget: exit $rc: $(cat "$tmp/e2")"
    "$bin" run "${common[@]}" --ram-budget "$quarter" --trace /nonexistent-dir/t.csv >/dev/null 2>"$tmp/e3"; rc=$?
    [[ $rc == 2 ]] && grep -q "/nonexistent-dir/t.csv" "$tmp/e3" || fail "unwritable trace: exit $rc: $(cat "$tmp/e3")"
    echo ok;;
  timeline_png)
    python3 -c "import matplotlib" 2>/dev/null || { echo "matplotlib not importable: skipped"; exit 77; }
    "$bin" run "${common[@]:0:4}" -n 4 --temp 0 -c 256 -t 2 --ram-budget "$quarter" --no-probe --trace "$tmp/t.csv" >/dev/null 2>"$tmp/e" ||
      fail "run --trace failed: $(cat "$tmp/e")"
    python3 "$src/bench/plot/timeline.py" "$tmp/t.csv" -o "$tmp/t.png" >"$tmp/o" 2>&1 || fail "timeline.py: $(cat "$tmp/o")"
    head -c 8 "$tmp/t.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "not a PNG"
    (( $(stat -c %s "$tmp/t.png") > 10000 )) || fail "PNG suspiciously small"
    printf 'bad,header\n' >"$tmp/bad.csv"
    python3 "$src/bench/plot/timeline.py" "$tmp/bad.csv" -o "$tmp/b.png" >/dev/null 2>&1; rc=$?
    [[ $rc == 2 ]] || fail "malformed trace: exit $rc, expected 2"
    echo ok;;
  perplexity_matches_resident)
    ppl=(perplexity -m "$model" -f "$src/tests/e2e/data/ppl.txt" -c 64 --chunks 2 -t 2)
    "$bin" "${ppl[@]}" >"$tmp/ref" 2>"$tmp/ref.err" || fail "perplexity: $(cat "$tmp/ref.err")"
    "$bin" "${ppl[@]}" --ram-budget "$third" --slots 3 --trace "$tmp/t.csv" >"$tmp/s" 2>"$tmp/s.err" ||
      fail "streamed perplexity: $(cat "$tmp/s.err")"
    grep -q "^Final estimate: PPL" "$tmp/ref" || fail "no estimate"
    cmp -s "$tmp/ref" "$tmp/s" || fail "PPL differs: $(tail -1 "$tmp/s") vs $(tail -1 "$tmp/ref")"
    grep -q "^stream: .*from disk per pass" "$tmp/s.err" || fail "no stream stats: $(cat "$tmp/s.err")"
    grep -q "^trace: " "$tmp/s.err" || fail "no trace line"
    echo "ok: $(tail -1 "$tmp/s")";;
  chat_matches_resident)
    printf 'hello there\nand again\n' | "$bin" chat "${common[@]:0:2}" --chat-template chatml --temp 0 -n 8 -c 256 -t 2 >"$tmp/ref" 2>"$tmp/ref.err" ||
      fail "chat: $(cat "$tmp/ref.err")"
    printf 'hello there\nand again\n' | "$bin" chat "${common[@]:0:2}" --chat-template chatml --temp 0 -n 8 -c 256 -t 2 --ram-budget "$quarter" \
      >"$tmp/s" 2>"$tmp/s.err" || fail "streamed chat: $(cat "$tmp/s.err")"
    cmp -s "$tmp/ref" "$tmp/s" || fail "chat output differs"
    grep -q "^stream: .*from disk per decoded token" "$tmp/s.err" || fail "no stream stats"
    echo ok;;
  bench_with_budget)
    "$bin" bench -m "$model" -p 8 -n 4 -r 1 -t 2 --json >"$tmp/ref" 2>"$tmp/ref.err" || fail "bench: $(cat "$tmp/ref.err")"
    "$bin" bench -m "$model" -p 8 -n 4 -r 1 -t 2 --json --ram-budget "$quarter" >"$tmp/s" 2>"$tmp/s.err" ||
      fail "streamed bench: $(cat "$tmp/s.err")"
    python3 - "$tmp/ref" "$tmp/s" <<'PY' || fail "bench JSON"
import json, sys
ref, got = (json.load(open(p)) for p in sys.argv[1:])
assert [r["test"] for r in got] == ["pp8", "tg4"], got
for a, b in zip(ref, got):
    assert b["backend"] == a["backend"] == "cpu", (a["backend"], b["backend"])
    assert b["weight_bytes_per_token"] == a["weight_bytes_per_token"]
    assert b["avg_ts"] > 0 and "bound_ratio" in b and b["bound_ratio"] is None
PY
    grep -q "^stream: .*from disk per decoded token" "$tmp/s.err" || fail "no stream stats: $(cat "$tmp/s.err")"
    "$bin" bench -m "$model" -p 8 -n 4 -r 1 -t 2 --csv --ram-budget "$quarter" --no-probe >"$tmp/c" 2>/dev/null || fail "csv"
    head -1 "$tmp/c" | grep -q ",weight_gb_s,bound_gb_s,bound_ratio$" || fail "CSV header: $(head -1 "$tmp/c")"
    awk -F, 'NR > 1 && NF != 12 { exit 1 }' "$tmp/c" || fail "CSV rows must have 12 fields"
    "$bin" bench -m "$model" -p 8 -n 4 --ram-budget 8M >/dev/null 2>"$tmp/e"; rc=$?
    [[ $rc == 2 ]] && grep -q "too small: at least" "$tmp/e" || fail "bench budget below minimum: exit $rc"
    echo ok;;
  plan_probe)
    "$bin" run "${common[@]}" --ram-budget "$quarter" --plan >"$tmp/o" 2>"$tmp/e" || fail "--plan: $(cat "$tmp/e")"
    grep -q "disk [0-9.]* GB/s measured: .* O_DIRECT\|disk [0-9.]* GB/s measured: .* buffered" "$tmp/o" ||
      fail "no measured disk bandwidth: $(head -1 "$tmp/o")"
    "$bin" perplexity -m "$model" -f "$src/tests/e2e/data/ppl.txt" --ram-budget "$quarter" --plan --no-probe >"$tmp/o" 2>"$tmp/e" ||
      fail "perplexity --plan: $(cat "$tmp/e")"
    grep -q "default (--no-probe)" "$tmp/o" || fail "--no-probe not reported: $(head -1 "$tmp/o")"
    echo ok;;
  *) fail "unknown case $case_name";;
esac
