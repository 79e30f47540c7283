#!/usr/bin/env bash
# sluice synth --route-skew: tools/synth/route_skew.py (python gguf, independent of sluice) routes
# token_embd rows through the written routers and checks the popularity: with S = 1 the most
# popular of 16 experts gets > 3x the median's selections and every rank is near r^-1 in every
# layer; with S = 0 (the unbiased random router) it is roughly flat at layer 0.
set -euo pipefail
sluice=${1:?usage: route_skew.sh SLUICE}
PY=${PYTHON:-python3}
if ! "$PY" -c "import gguf, numpy" 2>/dev/null; then
  if [ -n "${SLUICE_REQUIRE_MODELS:-}" ]; then echo "python gguf package missing (pip install gguf)" >&2; exit 1; fi
  echo "SKIP: python gguf package not installed (pip install gguf)"
  exit 77
fi
check=${SLUICE_SOURCE_DIR:-$(dirname "$0")/../..}/tools/synth/route_skew.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape=(custom --arch qwen3 --layers 3 --dim 256 --ffn 64 --heads 4 --kv-heads 2 --vocab 2000 --experts 16
  --experts-used 2 --type q4_k_m)
"$sluice" synth "${shape[@]}" --route-skew 1 -o "$tmp/s1.gguf" >/dev/null 2>&1
"$sluice" synth "${shape[@]}" -o "$tmp/s0.gguf" >/dev/null 2>&1
"$PY" "$check" "$tmp/s1.gguf" --layers all --min-top-over-median 3 --max-log-error 0.3
"$PY" "$check" "$tmp/s0.gguf" --layers 0 --max-top-over-median 1.6
