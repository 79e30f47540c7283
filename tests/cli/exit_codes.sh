#!/usr/bin/env bash
# sluice inspect/synth: bad input is a message naming the problem and exit 2; good input exit 0.
set -uo pipefail
sluice=${1:?usage: exit_codes.sh SLUICE}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# expect CODE PATTERN CMD...: exit status CODE and stderr/stdout matching PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $code), output: $out" | head -c 2000
    echo
    fail=1
  else
    echo "ok: $* -> $rc"
  fi
}

printf 'GGML\3\0\0\0' >"$tmp/badmagic.gguf"
head -c 100 /dev/urandom >"$tmp/random.bin"
expect 2 "badmagic.gguf: header: magic" "$sluice" inspect "$tmp/badmagic.gguf"
expect 2 "random.bin" "$sluice" inspect "$tmp/random.bin"
expect 2 "missing.gguf: cannot open" "$sluice" inspect "$tmp/missing.gguf"
expect 2 "not a regular file" "$sluice" inspect "$tmp"
expect 2 "model is required|model" "$sluice" inspect
expect 2 "unknown shape 'llama-9'" "$sluice" synth llama-9 -o "$tmp/x.gguf"
expect 2 "--type 'q9'" "$sluice" synth tiny --type q9 -o "$tmp/x.gguf"
expect 2 "--embd-type 'q9': unknown format" "$sluice" synth tiny --embd-type q9 -o "$tmp/x.gguf"
expect 2 "--kv-heads 3" "$sluice" synth tiny --kv-heads 3 -o "$tmp/x.gguf"
expect 2 "output" "$sluice" synth tiny
expect 1 "cannot create" "$sluice" synth tiny -o "$tmp/no/such/dir/x.gguf"
expect 2 "--shared-ffn: qwen2moe" "$sluice" synth tiny --arch qwen2 --experts 4 -o "$tmp/x.gguf"
expect 2 "--shared-ffn 512: only qwen2moe" "$sluice" synth tiny --experts 4 --shared-ffn 512 -o "$tmp/x.gguf"
expect 2 "--route-skew: needs --experts" "$sluice" synth tiny --route-skew 1 -o "$tmp/x.gguf"
expect 2 "--route-skew -0.5" "$sluice" synth tiny --experts 4 --route-skew -0.5 -o "$tmp/x.gguf"
expect 2 "--head-dim 128" "$sluice" synth tiny --arch qwen2 --head-dim 128 -o "$tmp/x.gguf"
[ -e "$tmp/x.gguf" ] && { echo "FAIL: a rejected synth left a file"; fail=1; }

expect 0 "GB/s" "$sluice" synth tiny --layers 3 --type q8_0 -o "$tmp/ok.gguf"
# Not a terminal: the progress bar is one summary line.
"$sluice" synth tiny --type q8_0 -o "$tmp/p.gguf" 2>"$tmp/p.err" >/dev/null
[ "$(grep -c 'writing .*p.gguf: .* in .* s, .* GB/s' "$tmp/p.err")" = 1 ] && ! grep -q $'\r' "$tmp/p.err" ||
  { echo "FAIL: synth progress on a non-terminal: $(cat -A "$tmp/p.err")"; fail=1; }
expect 0 "qwen2moe-a2.7b" "$sluice" synth --help
expect 0 "block_count = 3" "$sluice" inspect "$tmp/ok.gguf"
"$sluice" inspect --json "$tmp/ok.gguf" >"$tmp/ok.json" || { echo "FAIL: inspect --json"; fail=1; }
if command -v python3 >/dev/null; then
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['layers']) == 3 and j['architecture'] == 'llama', j" \
    "$tmp/ok.json" || { echo "FAIL: inspect --json content"; fail=1; }
fi
# Speculative decoding (docs/SPECULATIVE.md): a draft of another vocabulary is a clear error.
"$sluice" synth tiny --layers 2 --type q8_0 --vocab 300 -o "$tmp/v300.gguf" >/dev/null 2>&1
expect 2 "draft model .*v300.gguf has a vocabulary of 300 tokens, the model .*ok.gguf" \
  "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --draft-model "$tmp/v300.gguf"
expect 2 "exclude each other" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --draft-model "$tmp/ok.gguf" --self-draft
expect 2 "draft-k" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --self-draft --draft-k 0
expect 2 "--draft-layers: 'x' is not a layer id" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --self-draft --draft-layers 1,x
expect 2 "no calibration file" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --skip-layers 1
expect 0 "spec: .* passes" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 6 --temp 0 --self-draft --draft-k 2
expect 0 "spec: .* passes" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 6 --draft-model "$tmp/ok.gguf" --draft-k 3
expect 0 "LOSSY" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 3 --skip-layers 1,
# Tokens per pass (--ubatch): out of range is a flag error; a larger one runs (a 40-token prompt in
# passes of 16); a server step longer than the pass cap is refused before loading.
expect 2 "--ubatch: Value 0 not in range" "$sluice" run -m "$tmp/ok.gguf" -p hi -n 2 --ubatch 0
expect 2 "--ubatch: Value 9000 not in range" "$sluice" bench -m "$tmp/ok.gguf" -p 8 -n 0 --ubatch 9000
expect 0 "pp40" "$sluice" bench -m "$tmp/ok.gguf" -p 40 -n 0 -r 1 --ubatch 16
expect 2 "unknown kernel kind 'rms' .known: norm,addnorm,rope,attn,glu,gemv" "$sluice" bench -m "$tmp/ok.gguf" -p 8 -n 0 -b cuda --skip-kernels norm,rms
expect 2 "it needs --backend cuda" "$sluice" bench -m "$tmp/ok.gguf" -p 8 -n 0 -b cpu --skip-kernels gemv
expect 2 "--batch-tokens 600 is more than --ubatch 512" "$sluice" serve -m "$tmp/ok.gguf" --batch-tokens 600
expect 2 "--ubatch 8 is less than --parallel 16" "$sluice" serve -m "$tmp/ok.gguf" --parallel 16 --ubatch 8
expect 2 "--batch-tokens 4 is less than --parallel 8" "$sluice" serve -m "$tmp/ok.gguf" --parallel 8 --batch-tokens 4
expect 2 "--admit-window: Value 20000 not in range" "$sluice" serve -m "$tmp/ok.gguf" --admit-window 20000
# A truncated synth file is rejected with the tensor named.
head -c 200000 "$tmp/ok.gguf" >"$tmp/trunc.gguf"
expect 2 "trunc.gguf: tensor '.*': offset: .*past the end" "$sluice" inspect "$tmp/trunc.gguf"
exit $fail
