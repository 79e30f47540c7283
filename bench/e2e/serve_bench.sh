#!/usr/bin/env bash
# Serving throughput of sluice serve against llama.cpp's llama-server on the same model:
#   bench/e2e/serve_bench.sh MODEL.gguf [TOKENS] [CONCURRENCY]    (defaults: 128, 1,8,32)
# Environment: SLUICE (default build/bin/sluice), LLAMA_SERVER (default llama-server; skipped when
# absent), PORT (default 8089), SLUICE_ARGS / LLAMA_ARGS (extra flags, e.g. "-b cuda" / "-ngl 99").
# Each server gets 32 parallel slots and a context of 32 x 2048 positions.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:?usage: serve_bench.sh MODEL.gguf [TOKENS] [CONCURRENCY]}
tokens=${2:-128}
conc=${3:-1,8,32}
port=${PORT:-8089}
sluice=${SLUICE:-$here/../../build/bin/sluice}
llama=${LLAMA_SERVER:-llama-server}

echo "== sluice serve =="
python3 "$here/serve_bench.py" --url "http://127.0.0.1:$port" --tokens "$tokens" --concurrency "$conc" \
  --server "$sluice serve -m $model --port $port --parallel 32 -c 2048 ${SLUICE_ARGS:-}"
if command -v "$llama" >/dev/null; then
  echo "== llama-server -np 32 =="
  python3 "$here/serve_bench.py" --url "http://127.0.0.1:$port" --tokens "$tokens" --concurrency "$conc" \
    --server "$llama -m $model --port $port -np 32 -c $((32 * 2048)) ${LLAMA_ARGS:-}"
else
  echo "llama-server not found (LLAMA_SERVER=...): skipped"
fi
