#!/usr/bin/env bash
# Build the djl_handlers wheel into dist/, then an LMI container image with docker/Dockerfile.
#
#   docker/build.sh [--tag NAME] [--base-image IMAGE] [--extras EXTRAS] [--model-dir DIR]
#                   [--entry-point MODULE] [--no-embedded-model] [--skip-wheel] [--dry-run]
#                   [-- EXTRA DOCKER BUILD ARGS...]
#
# Environment: PYTHON (interpreter that builds the wheel; default .venv/bin/python, else python3),
# DOCKER (the container CLI; default docker, podman works too). See docker/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=djl-handlers-lmi:latest
BASE_IMAGE=""
EXTRAS=hf
MODEL_DIR=serving.properties.examples/hf-rolling-batch
ENTRY_POINT=""
EMBEDDED_MODEL=1
SKIP_WHEEL=0
DRY_RUN=0
EXTRA_ARGS=()

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --tag) TAG=$2; shift 2 ;;
    --base-image) BASE_IMAGE=$2; shift 2 ;;
    --extras) EXTRAS=$2; shift 2 ;;
    --model-dir) MODEL_DIR=${2%/}; shift 2 ;;
    --entry-point) ENTRY_POINT=$2; shift 2 ;;
    --no-embedded-model) EMBEDDED_MODEL=0; shift ;;
    --skip-wheel) SKIP_WHEEL=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA_ARGS=("$@"); break ;;
    *) echo "build.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

if [ ! -f "$MODEL_DIR/serving.properties" ]; then
  echo "build.sh: $MODEL_DIR/serving.properties not found (a relative --model-dir is taken from the repository root)" >&2
  exit 2
fi
# A model directory outside serving.properties.examples/ is staged into dist/model/, the only other
# place docker/Dockerfile.dockerignore lets into the build context.
case "$MODEL_DIR" in
  serving.properties.examples/*) ;;
  *)
    rm -rf dist/model && mkdir -p dist/model
    cp -R "$MODEL_DIR"/. dist/model/
    MODEL_DIR=dist/model
    ;;
esac

# The embedded model is converted at build time with the hf extra's torch, transformers 5 and gguf;
# an image built without them cannot convert it, and a recipe that names it cannot run without it.
if [ "$EMBEDDED_MODEL" = "1" ] && [[ ",$EXTRAS," != *,hf,* && ",$EXTRAS," != *,deepspeed,* ]]; then
  echo "build.sh: --extras '$EXTRAS' cannot convert the embedded model (it needs the hf or deepspeed extra:" \
       "torch, transformers 5, gguf); add --no-embedded-model and use a model directory whose" \
       "option.model_id names your weights (e.g. serving.properties.examples/lmi-dist)" >&2
  exit 2
fi
if [ "$EMBEDDED_MODEL" = "0" ] && grep -Eq '^[[:space:]]*option\.embedded_model[[:space:]]*[=:]' "$MODEL_DIR/serving.properties"; then
  echo "build.sh: $MODEL_DIR uses option.embedded_model, which --no-embedded-model leaves out of the image" >&2
  exit 2
fi

if [ "$SKIP_WHEEL" != "1" ]; then
  if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
  fi
  mkdir -p dist
  # Build into a fresh folder and replace the old wheel only once the new one exists. -I keeps the
  # working directory off sys.path: a leftover build/ folder (setuptools' in-tree build) would
  # otherwise be imported as the "build" package.
  staging=$(mktemp -d dist/.wheel-XXXXXX)
  trap 'rm -rf "$staging"' EXIT
  echo "build.sh: building the wheel with $PYTHON"
  if "$PYTHON" -I -c "import build.__main__" 2>/dev/null; then
    "$PYTHON" -I -m build --wheel --outdir "$staging" .
  else
    "$PYTHON" -I -m pip wheel --no-deps --no-build-isolation --wheel-dir "$staging" .
  fi
  built=("$staging"/djl_handlers-*.whl)
  if [ ! -f "${built[0]}" ]; then
    echo "build.sh: the wheel build produced no $staging/djl_handlers-*.whl; dist/ is unchanged" >&2
    exit 1
  fi
  rm -f dist/djl_handlers-*.whl
  mv "${built[@]}" dist/
fi
shopt -s nullglob
wheels=(dist/djl_handlers-*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
  echo "build.sh: expected exactly one dist/djl_handlers-*.whl, found ${#wheels[@]}" >&2
  exit 1
fi

cmd=("${DOCKER:-docker}" build -f docker/Dockerfile -t "$TAG"
     --build-arg "EXTRAS=$EXTRAS" --build-arg "MODEL_DIR=$MODEL_DIR"
     --build-arg "EMBEDDED_MODEL=$EMBEDDED_MODEL")
if [ -n "$BASE_IMAGE" ]; then cmd+=(--build-arg "BASE_IMAGE=$BASE_IMAGE"); fi
if [ -n "$ENTRY_POINT" ]; then cmd+=(--build-arg "ENTRY_POINT=$ENTRY_POINT"); fi
cmd+=("${EXTRA_ARGS[@]}" .)

echo "build.sh: ${cmd[*]}"
if [ "$DRY_RUN" = "1" ]; then
  exit 0
fi
DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-1} "${cmd[@]}"
