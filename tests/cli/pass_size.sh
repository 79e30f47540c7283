#!/usr/bin/env bash
# Tokens per pass (--ubatch) on every CPU path a pass can take: a dense model resident and streamed
# from disk (--ram-budget), a mixture of experts resident and with its RAM expert cache. The same
# windows in passes of 100, 512 and 1024 tokens must give the same perplexity to the last printed
# digit (the CPU backend's rows do not depend on the pass they are in; a pass that dropped, repeated
# or misplaced rows, or an activation buffer sized for 512, would not).
set -euo pipefail
sluice=${1:?usage: pass_size.sh SLUICE}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
text=${SLUICE_SOURCE_DIR:-$(dirname "$0")/../..}/README.md
"$sluice" synth tiny --layers 4 -o "$tmp/dense.gguf" >/dev/null 2>&1
"$sluice" synth tiny --layers 2 --experts 4 -o "$tmp/moe.gguf" >/dev/null 2>&1
fail=0
for setup in "dense.gguf" "dense.gguf --ram-budget 1600K" "moe.gguf" "moe.gguf --ram-budget 2M"; do
  read -r file flags <<<"$setup"
  want=""
  for ub in 512 100 1024; do
    # shellcheck disable=SC2086
    got=$("$sluice" perplexity -m "$tmp/$file" -f "$text" -c 1024 --chunks 2 -t 1 --ubatch "$ub" $flags 2>&1 |
      grep "Final estimate") || { echo "FAIL: $setup --ubatch $ub: no estimate"; fail=1; continue; }
    [ -z "$want" ] && want=$got
    if [ "$got" != "$want" ]; then
      echo "FAIL: $setup --ubatch $ub: '$got', with 512: '$want'"
      fail=1
    else
      echo "ok: $setup --ubatch $ub: $got"
    fi
  done
done
# The flag reaches the model: passes of 100 tokens make more passes than passes of 1024 (the
# streamer counts them).
passes() {
  "$sluice" perplexity -m "$tmp/dense.gguf" -f "$text" -c 1024 --chunks 2 -t 1 --ubatch "$1" --ram-budget 1600K 2>&1 |
    sed -n 's/.* over \([0-9]*\) passes.*/\1/p'
}
p100=$(passes 100)
p1024=$(passes 1024)
if [ -z "$p100" ] || [ -z "$p1024" ] || [ "$p100" -le "$p1024" ]; then
  echo "FAIL: passes with --ubatch 100: '$p100', with 1024: '$p1024'"
  fail=1
else
  echo "ok: $p100 passes with --ubatch 100, $p1024 with 1024"
fi
exit $fail
