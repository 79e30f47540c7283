#!/usr/bin/env bash
# llama.cpp's reader (llama-gguf FILE r n) must accept synth output. Runs only where a
# llama-gguf binary is given by SLUICE_LLAMA_GGUF or found on PATH; skips otherwise.
set -euo pipefail
sluice=${1:?usage: llama_gguf_reader.sh SLUICE}
bin=${SLUICE_LLAMA_GGUF:-$(command -v llama-gguf || true)}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "SKIP: llama-gguf not found (set SLUICE_LLAMA_GGUF=/path/to/llama-gguf)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$sluice" synth tiny --type q4_k_m -o "$tmp/dense.gguf"
"$sluice" synth tiny --experts 4 --experts-used 2 --rope-scaling --type q8_0 -o "$tmp/moe.gguf"
"$sluice" synth tiny --arch qwen2 --experts 6 --ffn 128 --shared-ffn 384 --route-skew 1 -o "$tmp/qwen2moe.gguf"
"$sluice" synth tiny --arch qwen3 --experts 8 --head-dim 128 -o "$tmp/qwen3moe.gguf"
for f in "$tmp/dense.gguf" "$tmp/moe.gguf" "$tmp/qwen2moe.gguf" "$tmp/qwen3moe.gguf"; do
  "$bin" "$f" r n >"$tmp/log" 2>&1 || { tail -20 "$tmp/log"; echo "FAIL: llama-gguf rejected $f"; exit 1; }
  grep -q "n_tensors" "$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
  echo "llama-gguf read $f: $(grep -m1 'n_tensors' "$tmp/log")"
done
