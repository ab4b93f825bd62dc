#!/usr/bin/env bash
# llama.cpp's `llama-server`, built from source, and the embedded model as GGUF files: the baseline of
# `python -m benchmarks.llama_cpp` (docs/benchmarks.md, "Against llama.cpp's llama-server").
# Benchmarks only: neither .ci/run nor `make test` calls this.
#
#   1. the llama-cpp-python sdist from PyPI (`pip download --no-binary :all:`): its vendor/llama.cpp
#      is llama.cpp's C++ source and convert_hf_to_gguf.py (no other registry or git host needed);
#   2. cmake, the `llama-server` target only, built for this CPU (-DGGML_NATIVE=ON), no libcurl,
#      under `nice -n 15` with 2 jobs (a few minutes to ~20 on 2 cores); with LLAMA_CPP_ISA=avx2 a
#      second build (build-<version>-avx2) for x86-64-v3 instead (AVX2, FMA, F16C, BMI2, no AVX-512):
#      the baseline of `python -m benchmarks.llama_cpp --isa avx2` on an AVX-512 CPU;
#   3. the embedded model's fp32 folder (scripts/setup.sh makes it) converted with the vendored
#      convert_hf_to_gguf.py to F32, BF16 and Q8_0 GGUF files; no weights come from a hub.
#
# Everything goes to $LLAMA_CPP_HOME (default ~/.cache/djl_handlers/llama.cpp), outside the checkout.
# Idempotent: a second run only checks. Prints the paths at the end (the benchmark finds them itself).
#   LLAMA_CPP_PYTHON_VERSION  the sdist's version (default below)
#   LLAMA_CPP_ISA             native (default) or avx2 (see 2.)
#   PYTHON                    the interpreter that runs the converter (default .venv/bin/python: it has
#                             torch, transformers, numpy; the converter uses the vendored gguf-py)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
HOME_DIR=${LLAMA_CPP_HOME:-$HOME/.cache/djl_handlers/llama.cpp}
PY=${PYTHON:-.venv/bin/python}
SRC="$HOME_DIR/llama_cpp_python-$VERSION"
LLAMA="$SRC/vendor/llama.cpp"
ISA=${LLAMA_CPP_ISA:-native}
case "$ISA" in
  native) BUILD="$HOME_DIR/build-$VERSION"; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2) BUILD="$HOME_DIR/build-$VERSION-avx2"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
  *) echo "setup_llama_cpp: LLAMA_CPP_ISA=$ISA: expected native or avx2" >&2; exit 2 ;;
esac
SERVER="$BUILD/bin/llama-server"
GGUF_DIR="$HOME_DIR/gguf-$VERSION"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$HOME_DIR"

if [ ! -f "$LLAMA/CMakeLists.txt" ]; then
  sdist="$HOME_DIR/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    echo "setup_llama_cpp: downloading the llama-cpp-python==$VERSION sdist (~75 MB)"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$HOME_DIR"
  fi
  tar -xzf "$sdist" -C "$HOME_DIR"
fi

if [ ! -x "$SERVER" ]; then
  command -v cmake >/dev/null || { echo "setup_llama_cpp: cmake is missing (apt-get install cmake)" >&2; exit 1; }
  echo "setup_llama_cpp: building llama-server ($ISA) into $BUILD (niced, 2 jobs)"
  nice -n 15 cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${ISA_FLAGS[@]}" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$HOME_DIR/cmake-$VERSION-$ISA.log"
  nice -n 15 cmake --build "$BUILD" --config Release --target llama-server -j2
fi
"$SERVER" --version 2>&1 | head -n 2

MODEL=$("$PY" -c "from djl_handlers.model.embedded import embedded_model_dir; print(embedded_model_dir())")
mkdir -p "$GGUF_DIR"
for type in f32 bf16 q8_0; do
  out="$GGUF_DIR/smollm2-135m-instruct-$type.gguf"
  if [ ! -s "$out" ]; then
    echo "setup_llama_cpp: converting $MODEL to $type GGUF"
    nice -n 10 "$PY" "$LLAMA/convert_hf_to_gguf.py" "$MODEL" --outtype "$type" --outfile "$out.part"
    mv "$out.part" "$out"
  fi
  echo "setup_llama_cpp: $out"
done
echo "setup_llama_cpp: $SERVER"
