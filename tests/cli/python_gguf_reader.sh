#!/usr/bin/env bash
# python's gguf package (an independent implementation) must read synth output: every tensor
# present with our shapes and types, dequantizing to finite values of the intended scale.
set -euo pipefail
sluice=${1:?usage: python_gguf_reader.sh SLUICE}
PY=${PYTHON:-python3}
if ! "$PY" -c "import gguf, numpy" 2>/dev/null; then
  if [ -n "${SLUICE_REQUIRE_MODELS:-}" ]; then echo "python gguf package missing (pip install gguf)" >&2; exit 1; fi
  echo "SKIP: python gguf package not installed (pip install gguf)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$sluice" synth tiny --type q4_k_m -o "$tmp/dense.gguf" --seed 3
"$sluice" synth custom --layers 2 --dim 256 --ffn 512 --heads 4 --kv-heads 2 --vocab 700 --experts 4 --experts-used 2 \
  --arch qwen3 --head-dim 128 --rope-scaling --type q6_k -o "$tmp/moe.gguf"
"$sluice" synth tiny --arch qwen2 --type f16 -o "$tmp/qwen2.gguf"
"$sluice" synth tiny --arch qwen2 --experts 6 --experts-used 2 --ffn 128 --shared-ffn 384 --route-skew 1 \
  --type q4_k_m -o "$tmp/qwen2moe.gguf"
"$PY" - "$tmp/dense.gguf" "$tmp/moe.gguf" "$tmp/qwen2.gguf" "$tmp/qwen2moe.gguf" <<'PYEOF'
import sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

for path in sys.argv[1:]:
    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    n_layer = r.fields[f"{arch}.block_count"].contents()
    names = {t.name: t for t in r.tensors}
    assert "token_embd.weight" in names and "output_norm.weight" in names, path
    assert f"blk.{n_layer - 1}.attn_q.weight" in names, path
    vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    assert vocab == r.fields[f"{arch}.vocab_size"].contents(), path
    for t in r.tensors:
        d = dequantize(t.data, t.tensor_type)
        assert np.isfinite(d).all(), (path, t.name)
        if t.name.endswith("attn_q.weight"):
            fan_in = int(t.shape[0])
            sd = float(np.std(d))
            assert abs(sd - fan_in ** -0.5) < 0.15 * fan_in ** -0.5, (path, t.name, sd)
    print(f"{path}: {arch}, {len(r.tensors)} tensors, {n_layer} layers, vocab {vocab}: ok")
PYEOF
