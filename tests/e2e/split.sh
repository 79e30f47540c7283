#!/usr/bin/env bash
# Split GGUF models through the CLI: SmolLM2-135M split into 3 shards in gguf-split's format
# (tests/gguf_split_util.h, by the test_gguf_split tool) gives the single file's greedy output,
# all resident and streamed under --ram-budget; `sluice inspect` lists the shards; a missing,
# corrupt or foreign shard, or a later shard given with -m, exits 2 naming the file.
# matches_llama_gguf_split: the tool's shards are byte-identical to llama.cpp's llama-gguf-split
# (needs LLAMA_CPP_BUILD=<llama.cpp build dir>; skipped otherwise).
# Usage: split.sh CASE SLUICE_BIN SPLIT_TOOL SOURCE_DIR
set -uo pipefail
case_name=$1; bin=$2; tool=$3; src=$4
model="$src/models/smollm2-135m-instruct-q4_1.gguf"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL [$case_name]: $*" >&2; exit 1; }
if [ ! -f "$model" ]; then
  if [ -n "${SLUICE_REQUIRE_MODELS:-}" ]; then fail "missing model $model"; fi
  echo "SKIP [$case_name]: model not installed: $model (run scripts/fetch-models.sh)"; exit 77
fi
# 272 tensors, 100 per shard: 3 shards; layers 10 and 21 are cut by the boundaries.
"$tool" --split-max-tensors 100 "$model" "$tmp/smol" >/dev/null || fail "splitting failed"
first=$tmp/smol-00001-of-00003.gguf
second=$tmp/smol-00002-of-00003.gguf
[ -f "$tmp/smol-00003-of-00003.gguf" ] || fail "expected 3 shards: $(ls "$tmp")"
run=(run -p "The capital of France is" -n 32 --temp 0 -c 256 -t 2)
# expect_rc RC PATTERN ARGS...: exit code RC and PATTERN (grep -E) in stderr.
expect_rc() {
  local want=$1 pattern=$2; shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "sluice $* exited $rc, expected $want: $(cat "$tmp/err")"
  grep -qE -- "$pattern" "$tmp/err" || fail "stderr of 'sluice $*' lacks /$pattern/: $(cat "$tmp/err")"
}

case $case_name in
  greedy_matches_single)
    "$bin" "${run[@]}" -m "$model" >"$tmp/ref" 2>"$tmp/ref.err" || fail "single file: $(cat "$tmp/ref.err")"
    "$bin" "${run[@]}" -m "$first" >"$tmp/res" 2>"$tmp/res.err" || fail "split resident: $(cat "$tmp/res.err")"
    cmp -s "$tmp/ref" "$tmp/res" || fail "resident split output differs: $(cat "$tmp/res") vs $(cat "$tmp/ref")"
    # 72 MiB: the 28.7 MiB embedding table, on CPUs that repack matrices (AVX-512) its 30.4 MiB
    # repacked copy as the tied output head, plus a few layers; the rest stream from the shards.
    "$bin" "${run[@]}" -m "$first" --ram-budget 72M --no-probe >"$tmp/str" 2>"$tmp/str.err" ||
      fail "split streamed: $(cat "$tmp/str.err")"
    grep -q "^stream: .*from disk per decoded token" "$tmp/str.err" || fail "not streamed: $(cat "$tmp/str.err")"
    cmp -s "$tmp/ref" "$tmp/str" || fail "streamed split output differs: $(cat "$tmp/str") vs $(cat "$tmp/ref")"
    echo "ok: identical greedy output (32 tokens) single file, 3 shards resident, 3 shards at --ram-budget 72M";;
  inspect_lists_shards)
    "$bin" inspect "$first" >"$tmp/o" 2>"$tmp/e" || fail "inspect: $(cat "$tmp/e")"
    grep -q "^split: 3 shards" "$tmp/o" || fail "no split line: $(head -5 "$tmp/o")"
    for k in 1 2 3; do grep -q "smol-0000$k-of-00003.gguf" "$tmp/o" || fail "shard $k not listed"; done
    grep -qE "^  blk\.29\.ffn_up\.weight .* 3$" "$tmp/o" || fail "tensor table lacks the shard column"
    "$bin" inspect --json "$first" >"$tmp/j" || fail "inspect --json"
    python3 - "$tmp/j" <<'PY' || fail "inspect --json: bad shards"
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["shards"]) == 3, j["shards"]
assert sum(s["tensors"] for s in j["shards"]) == len(j["tensors"]) == 272
assert [t["shard"] for t in j["tensors"]].count(2) == 72
PY
    echo ok;;
  missing_shard)
    rm "$tmp/smol-00003-of-00003.gguf"
    expect_rc 2 "smol-00003-of-00003.gguf: shard 3 of 3 of .* is missing" run -m "$first" -p hi -n 1
    echo ok;;
  corrupt_shard)
    truncate -s -1000 "$second"
    expect_rc 2 "smol-00002-of-00003.gguf: .*truncated.*shard 2 of 3" run -m "$first" -p hi -n 1
    printf 'GGUF\x03\0\0\0garbage' >"$second"
    expect_rc 2 "smol-00002-of-00003.gguf: " run -m "$first" -p hi -n 1
    echo ok;;
  foreign_shard)
    # A shard of another model, split the same way (3 shards), in place of shard 2.
    "$bin" synth custom -o "$tmp/other.gguf" --layers 2 --dim 256 --ffn 512 --heads 4 --kv-heads 2 --vocab 512 \
      --seed 3 >/dev/null 2>&1 || fail "synth"
    "$tool" --split-max-tensors 8 "$tmp/other.gguf" "$tmp/other" >/dev/null || fail "splitting other"
    [ -f "$tmp/other-00002-of-00003.gguf" ] || fail "other model: expected 3 shards: $(ls "$tmp")"
    cp "$tmp/other-00002-of-00003.gguf" "$second"
    expect_rc 2 "smol-00002-of-00003.gguf: metadata key 'split.tensors.count': .*another model" run -m "$first" -p hi -n 1
    echo ok;;
  later_shard_given)
    expect_rc 2 "smol-00002-of-00003.gguf: is shard 2 of 3 .*open the first shard, .*smol-00001-of-00003.gguf" \
      run -m "$second" -p hi -n 1
    echo ok;;
  matches_llama_gguf_split)
    split=${LLAMA_CPP_BUILD:-}/bin/llama-gguf-split
    [ -x "$split" ] || { echo "SKIP: set LLAMA_CPP_BUILD to a llama.cpp build with llama-gguf-split"; exit 77; }
    "$split" --split --split-max-tensors 100 "$model" "$tmp/llama" >/dev/null 2>&1 || fail "llama-gguf-split failed"
    for k in 1 2 3; do
      cmp "$tmp/llama-0000$k-of-00003.gguf" "$tmp/smol-0000$k-of-00003.gguf" || fail "shard $k differs from llama-gguf-split's"
    done
    echo "ok: 3 shards byte-identical to llama-gguf-split's";;
  *) fail "unknown case";;
esac
