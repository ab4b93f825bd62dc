#!/usr/bin/env bash
# lm-evaluation-harness (`lm_eval`, an OpenAI-API client LMI users point at their endpoints) in its
# own venv, .venv-lm-eval (git-ignored), for tests/integration/test_lm_eval_client.py and
# benchmarks/lm_eval_compare.py. It reads the main .venv's packages through a .pth file, so torch and
# transformers (which it needs for its tokenizer) are not downloaded twice; only lm_eval and its own
# dependencies (datasets, evaluate, ...) are installed. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LM_EVAL_VENV:-.venv-lm-eval}
LM_EVAL_VERSION=${LM_EVAL_VERSION:-0.4.13}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x .venv/bin/python ]; then
  echo "setup_lm_eval: run scripts/setup.sh first (.venv is missing)" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  .venv/bin/python -m venv "$VENV"
fi
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
main=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$main" > "$site/zz_main_venv.pth"
if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('lm_eval') != '$LM_EVAL_VERSION')" 2>/dev/null; then
  echo "setup_lm_eval: lm_eval $LM_EVAL_VERSION already in $VENV"
  exit 0
fi
echo "setup_lm_eval: installing lm_eval[api]==$LM_EVAL_VERSION into $VENV"
"$VENV/bin/python" -m pip install -q "lm_eval[api]==$LM_EVAL_VERSION"
"$VENV/bin/lm_eval" --help > /dev/null
echo "setup_lm_eval: done"
