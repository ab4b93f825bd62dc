#!/usr/bin/env bash
# Put DJL Serving's real front end (ai.djl.serving.ModelServer) and DJL's Python engine into
# tests/djl_serving/lib/ (git-ignored), and extract the engine jar's djl_python/ and
# djl_python_engine.py into lib/python/ (parity tests read them).
#
# 1. Maven Central: ai.djl.serving:serving + ai.djl.python:python at DJL_SERVING_VERSION
#    (default 0.34.0) through ./pom.xml. Machines elsewhere get it; this project's machines get no
#    ai.djl.serving:* artifact (Maven refuses in ~2 s).
# 2. Else build the same front end from DJL Serving's own source: DJL_SERVING_SRC (default
#    $ROOT/../shared/third_party/djl-serving-0.34.0, also looked up next to the origin of a local clone and
#    next to the main checkout when
#    this is a git worktree) holds djl-serving-0.34.0-src.tgz and a pom.xml; Maven compiles
#    wlm/prometheus/serving into one jar (~15 s with a warm ~/.m2) and copies the runtime jars.
#
# DJL_SERVING_MODE=central|source forces one way. Idempotent: skips when lib/.complete matches.
# Quiet: Maven's output goes to a log that is printed only when it fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LIB="$HERE/lib"
MODE="${DJL_SERVING_MODE:-auto}"
VERSION="${DJL_SERVING_VERSION:-0.34.0}"
LOG="${TMPDIR:-/tmp}/djl-fetch.$$.log"
STAMP_KEY="v2 $(sha256sum "$HERE/pom.xml" | cut -c1-16) mode=$MODE version=$VERSION"
MVN=(mvn -q -B -Dstyle.color=never -Dorg.slf4j.simpleLogger.defaultLogLevel=error)

ready() {
  [[ -f "$LIB/.complete" && "$(head -1 "$LIB/.complete")" == "$STAMP_KEY" ]] \
    && compgen -G "$LIB/serving-*.jar" >/dev/null && compgen -G "$LIB/python-*.jar" >/dev/null \
    && [[ -f "$LIB/python/djl_python_engine.py" ]]
}
ready && exit 0

command -v mvn >/dev/null || { echo "fetch.sh: mvn not found (Maven and Java 17 are needed)" >&2; exit 1; }
trap 'rm -f "$LOG"' EXIT

fail() {  # fail(message): print Maven's log tail and exit
  echo "fetch.sh: $1" >&2
  [[ -s "$LOG" ]] && grep -v '^\s*$' "$LOG" | tail -25 >&2
  exit 1
}

source_dir() {  # the first folder that holds the source tgz
  local candidates=()
  [[ -n "${DJL_SERVING_SRC:-}" ]] && candidates+=("$DJL_SERVING_SRC")
  candidates+=("$ROOT/../shared/third_party/djl-serving-$VERSION")
  local common
  if common="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)"; then
    candidates+=("$(dirname "$common")/../shared/third_party/djl-serving-$VERSION")
  fi
  local origin  # a clone made elsewhere (e.g. in a temporary folder) of a local checkout
  if origin="$(git -C "$ROOT" remote get-url origin 2>/dev/null)" && [[ -d "$origin" ]]; then
    candidates+=("$origin/../shared/third_party/djl-serving-$VERSION")
  fi
  for dir in "${candidates[@]}"; do
    if [[ -f "$dir/djl-serving-$VERSION-src.tgz" && -f "$dir/pom.xml" ]]; then
      (cd "$dir" && pwd)
      return 0
    fi
  done
  return 1
}

from_central() {
  "${MVN[@]}" -f "$HERE/pom.xml" "-Ddjl.version=$VERSION" dependency:copy-dependencies >"$LOG" 2>&1
}

from_source() {
  local src build="$LIB/build"
  src="$(source_dir)" || fail "no djl-serving-$VERSION-src.tgz: set DJL_SERVING_SRC (see tests/djl_serving/README.md)"
  mkdir -p "$build/src"
  tar xzf "$src/djl-serving-$VERSION-src.tgz" -C "$build/src"
  cp "$src/pom.xml" "$build/pom.xml"
  "${MVN[@]}" -f "$build/pom.xml" -DskipTests package >"$LOG" 2>&1 || return 1
  mv "$build"/lib/*.jar "$LIB/"
  local jar
  jar="$(compgen -G "$build/target/*.jar" | head -1)"
  [[ -n "$jar" ]] || return 1
  mv "$jar" "$LIB/serving-$VERSION-source.jar"  # the name fetch.sh and djl_server.py look for
  rm -rf "${build:?}/target" "${build:?}/lib"
}

rm -rf "$LIB"
mkdir -p "$LIB"
KIND=""
if [[ "$MODE" != "source" ]]; then
  if from_central && compgen -G "$LIB/serving-*.jar" >/dev/null; then
    KIND="maven-central $VERSION"
  else
    [[ "$MODE" == "central" ]] && fail "ai.djl.serving:serving:$VERSION is not available from Maven Central"
    rm -rf "$LIB"
    mkdir -p "$LIB"
  fi
fi
if [[ -z "$KIND" ]]; then
  from_source || fail "building DJL Serving $VERSION from source failed"
  KIND="source $VERSION"
fi

JAR="$(compgen -G "$LIB/python-*.jar" | head -1)" || true
[[ -n "$JAR" ]] || fail "no ai.djl.python:python jar in $LIB"
python3 - "$JAR" "$LIB/python" <<'PY'
import sys
import zipfile

jar, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(jar) as zf:
    names = [n for n in zf.namelist() if n.startswith("djl_python/") or n == "djl_python_engine.py"]
    zf.extractall(dest, names)
PY
printf '%s\n%s\n' "$STAMP_KEY" "$KIND" >"$LIB/.complete"
echo "fetch.sh: DJL Serving ModelServer ready in $LIB ($KIND)"
