#!/usr/bin/env bash
# One command for a fresh machine: install dependencies, build, fetch the default model
# (SmolLM2-135M-Instruct, the smallest real model) and generate text from a prompt.
# Extra arguments go to `sluice run`, e.g. scripts/run.sh -p "Tell me a joke" -n 64
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
prompt="What is the capital of France? Answer in one sentence."
if (($#)); then
  exec ./build/bin/sluice run -m models/smollm2-135m-instruct-q4_1.gguf "$@"
fi
exec ./build/bin/sluice run -m models/smollm2-135m-instruct-q4_1.gguf -p "$prompt" -n 64 --chat --temp 0
