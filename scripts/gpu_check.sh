#!/usr/bin/env bash
# GPU check of the HF engine: one command, about 8 minutes on one CUDA GPU, in this order (the most
# telling first, so that a machine that runs out of time loses the least):
#   1. the mixed workload's 32 requests in fp32, with the decode step captured as CUDA graphs
#      (--decode-graphs cuda_graphs, option.decode_graphs) and without: tok/s and TTFT vs one static
#      generate() batch, and tokens that must equal generate() of each request alone (exit 1 otherwise);
#   2. pytest -m gpu tests/gpu: the HF handler on CUDA (rolling, dynamic, streaming, served over HTTP;
#      fp32 answers equal generate()), and the real vLLM / TensorRT-LLM adapters where installed;
#   3. a 512-request version in bf16 (batch <= 256), with graphs and without, then the 32 requests in
#      bf16 (bf16 tokens may drift where two are within rounding: reported, not failed).
#
#   scripts/gpu_check.sh --prepare  where PyPI and the embedded model are at hand: writes the git-ignored
#       build/gpu-check/ (a few MB: the embedded model's tokenizer files and the pure-Python wheels of
#       requirements/gpu-check.txt) to carry to a machine whose Python has only torch, transformers,
#       accelerate and peft, and no network;
#   scripts/gpu_check.sh            on the GPU machine, in the repository root: installs the carried wheels
#       its Python lacks into build/gpu-check/site (put on PYTHONPATH; its own Python is left alone),
#       builds the SmolLM2-135M-shaped random model (seed 0) from the carried tokenizer where the
#       embedded model is missing, then runs the steps;
#   scripts/gpu_check.sh --dry-run  everything but CUDA, on any machine: the prerequisites, the wheels,
#       the model, the steps listed, one tiny CPU run of benchmarks.gpu_check and pytest's collection.
# Interpreter: $PYTHON, else .venv/bin/python, else python3. Model: $DJL_HANDLERS_GPU_MODEL, else the
# embedded model, else the random one (benchmarks/gpu_model.py); each result names the one it ran.
# Results: benchmarks/results/gpu-check-<date>.jsonl (one JSON object per run; GPU_CHECK_OUT=DIR writes there
# instead). GPU_CHECK_STEP_S (240) bounds each step and GPU_CHECK_TOTAL_S (540) the whole check, so that a
# hung step cannot use up a time-limited machine: a step with under 30 s left is skipped (exit 1).
# GPU_CHECK_EXTRA_SHAPE=llama-1b adds, last, the random llama-1b in bf16 at 32 requests (about 2 minutes more).
# Nothing is downloaded except by --prepare.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-run}
case "$MODE" in
  run|--dry-run|--prepare) ;;
  *) echo "usage: scripts/gpu_check.sh [--prepare | --dry-run]" >&2; exit 2 ;;
esac
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
CARRY=build/gpu-check
MODELS=build/gpu-check-models  # random models built here, beside (not in) the folder to carry
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$MODE" = --prepare ]; then
  rm -rf "$CARRY"
  mkdir -p "$CARRY/wheels" "$CARRY/tokenizer"
  "$PY" - "$CARRY/tokenizer" <<'EOF'
import shutil, sys
from pathlib import Path
from djl_handlers.model.architectures import TOKENIZER_FILES
from djl_handlers.model.embedded import embedded_model_dir

source = embedded_model_dir()
for name in TOKENIZER_FILES:
    if (source / name).is_file():
        shutil.copyfile(source / name, Path(sys.argv[1]) / name)
print(f"gpu_check: tokenizer files of {source.name} copied")
EOF
  # py3-none-any wheels only, installable on any Python from 3.10 up, whatever the machine's.
  "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps --implementation py \
    --abi none --platform any --python-version 3.10 -r requirements/gpu-check.txt -d "$CARRY/wheels"
  echo "gpu_check: $(find "$CARRY/wheels" -name '*.whl' | wc -l) wheels; $CARRY holds $(du -sh "$CARRY" | cut -f1)"
  echo "gpu_check: carry $CARRY to the GPU machine and run scripts/gpu_check.sh there (--dry-run first, anywhere)"
  exit 0
fi

# Prerequisites first, so that a missing package, device or model costs seconds, not GPU time.
"$PY" -c "import torch, transformers, sys; print(f'gpu_check: {sys.executable}: Python {sys.version.split()[0]}, '
  f'torch {torch.__version__}, transformers {transformers.__version__}, CUDA available: {torch.cuda.is_available()}')" \
  || { echo "gpu_check: $PY lacks torch or transformers" >&2; exit 1; }
if [ "$MODE" = run ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device')"
fi
if [ -d "$CARRY/wheels" ]; then
  rm -rf "$CARRY/site"
  "$PY" -m benchmarks.gpu_env install "$CARRY/wheels" "$CARRY/site"
  export PYTHONPATH="$PYTHONPATH:$PWD/$CARRY/site"
fi
"$PY" -c "import pytest, httpx, starlette, uvicorn, prometheus_client" \
  || { echo "gpu_check: the tests' packages are missing: run scripts/gpu_check.sh --prepare and carry $CARRY" >&2; exit 1; }
# model DIR [ARGS...]: build or find the model (benchmarks/gpu_model.py); sets MODEL_DIR and MODEL_WHAT.
model() {
  local line
  line=$("$PY" -m benchmarks.gpu_model --tokenizer "$CARRY/tokenizer" --build "$@" | tail -n 1)
  MODEL_DIR=${line%%$'\t'*}
  MODEL_WHAT=${line#*$'\t'}
}
model "$MODELS/smollm2-135m"
export DJL_HANDLERS_GPU_MODEL="$MODEL_DIR"
echo "gpu_check: model $MODEL_WHAT ($MODEL_DIR)"
case "$MODEL_WHAT" in
  random*) echo "gpu_check: random weights of the embedded model's shapes: the same speed (shapes and dtype, not" \
             "values, set it); fp32 equality with generate() is the engine's property, whatever the weights" ;;
esac

summary() {
  "$PY" -c "import json,sys; d=json.loads(sys.stdin.readlines()[-1]); print(' ', d['model'], '| decode graphs', d['decode_graphs'], d['decode_graph_stats'], '| tok/s engine', d['engine']['tok_s'], 'static', d['static']['tok_s'], '| TTFT p50', d['engine']['ttft_p50_s'], 'vs', d['static']['ttft_p50_s'], '| same as generate()', d['identical_to_generate_alone'])"
}
TESTS="pytest -q -p no:cacheprovider -m gpu tests/gpu"
STEPS=("--n 32 --dtype fp32 --decode-graphs cuda_graphs" "--n 32 --dtype fp32" "$TESTS"
       "--n 512 --dtype bf16 --decode-graphs cuda_graphs" "--n 512 --dtype bf16" "--n 32 --dtype bf16")
EXTRA=${GPU_CHECK_EXTRA_SHAPE:-}
if [ "$MODE" = --dry-run ]; then
  for args in "${STEPS[@]}"; do
    if [ "$args" = "$TESTS" ]; then echo "gpu_check: would run $PY -m $TESTS"
    else echo "gpu_check: would run $PY -m benchmarks.gpu_check $args"; fi
  done
  [ -z "$EXTRA" ] || echo "gpu_check: would build the random $EXTRA and run --n 32 --dtype bf16 on it"
  model "$MODELS/llama-tiny" --shape llama-tiny
  echo "gpu_check: tiny CPU run on $MODEL_WHAT"
  DJL_HANDLERS_GPU_MODEL="$MODEL_DIR" "$PY" -m benchmarks.gpu_check --n 2 --dtype fp32 --device cpu --prompt-max 256 --decode-graphs static \
    | "$PY" -c "import json,sys; print(json.dumps(json.load(sys.stdin)))" | summary
  "$PY" -m pytest -q -p no:cacheprovider -m gpu --collect-only tests/gpu | tail -n 1
  echo "gpu_check: dry run passed"
  exit 0
fi

out_dir="${GPU_CHECK_OUT:-benchmarks/results}"
mkdir -p "$out_dir"
out="$out_dir/gpu-check-$(date -u +%Y%m%d).jsonl"
: > "$out"
rm -f "$out_dir"/gpu-check-ref-n*.json  # generate()'s tokens, kept only between the runs of this check
status=0
STEP_LIMIT=${GPU_CHECK_STEP_S:-240}
TOTAL_LIMIT=${GPU_CHECK_TOTAL_S:-540}
# The seconds the next step may take (at most STEP_LIMIT, at most what is left of TOTAL_LIMIT); 0 to skip it.
budget() {
  local left=$((TOTAL_LIMIT - SECONDS))
  if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$STEP_LIMIT" ]; then echo "$left"; else echo "$STEP_LIMIT"; fi
}
bench() {
  local limit
  limit=$(budget)
  if [ "$limit" = 0 ]; then echo "gpu_check: skipped (time budget spent): $*"; status=1; return; fi
  echo "gpu_check: $*"
  local line=""
  line=$(timeout "$limit" "$PY" -m benchmarks.gpu_check "$@" --reference-dir "$out_dir" \
    | "$PY" -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(d))") || status=1
  if [ -n "$line" ]; then echo "$line" >> "$out"; echo "$line" | summary || true
  else echo "gpu_check: no result (timed out or failed)"; fi
}
tests() {
  local limit
  limit=$(budget)
  if [ "$limit" = 0 ]; then echo "gpu_check: skipped (time budget spent): $TESTS"; status=1; return; fi
  echo "gpu_check: $TESTS"
  # shellcheck disable=SC2086
  timeout "$limit" "$PY" -m $TESTS || status=1
}
for args in "${STEPS[@]}"; do
  if [ "$args" = "$TESTS" ]; then tests; continue; fi
  # shellcheck disable=SC2086
  bench $args
done
if [ -n "$EXTRA" ] && [ "$(budget)" != 0 ]; then
  model "$MODELS/$EXTRA" --shape "$EXTRA" --weights-dtype bfloat16
  export DJL_HANDLERS_GPU_MODEL="$MODEL_DIR"
  bench --n 32 --dtype bf16
elif [ -n "$EXTRA" ]; then echo "gpu_check: $EXTRA skipped (time budget spent)"; status=1
fi
echo "gpu_check: results in $out; exit $status"
exit $status
