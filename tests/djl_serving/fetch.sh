#!/usr/bin/env bash
# Put DJL Serving's real front end (ai.djl.serving.ModelServer) and DJL's Python engine of each
# supported release into its own git-ignored folder, and extract the engine's djl_python/ and
# djl_python_engine.py into <folder>/python/ (parity tests read them):
#
#   0.34.0 -> tests/djl_serving/lib/          (the default release of the compatibility suite)
#   0.36.0 -> tests/djl_serving/lib-0.36.0/   (the newest release)
#
# Usage: fetch.sh [VERSION ...]   (default: every release above; DJL_SERVING_VERSION=V: only V)
#
# Per release:
# 1. Maven Central: ai.djl.serving:serving + ai.djl.python:python at that version through ./pom.xml.
#    Machines elsewhere get it; this project's machines get no ai.djl.serving:* artifact (Maven
#    refuses in ~2 s) and no ai.djl.python:python:0.36.0.
# 2. Else build it from DJL Serving's own source: DJL_SERVING_SRC (only with one version), else
#    $ROOT/../shared/third_party/djl-serving-VERSION (also looked up next to the main checkout when
#    this is a git worktree and next to the origin of a local clone) holds djl-serving-VERSION-src.tgz
#    and a pom.xml; Maven compiles wlm/prometheus/serving into one jar (~10 s with a warm ~/.m2) and
#    copies the runtime jars. 0.34's pom takes the Python engine jar from Maven Central; 0.36's pom
#    also compiles the Python engine (its Java classes and djl_python as resources) into that jar.
#
# DJL_SERVING_MODE=central|source forces one way. Idempotent: skips a release whose .complete
# stamp matches. Quiet: Maven's output goes to a log that is printed only when it fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODE="${DJL_SERVING_MODE:-auto}"
RELEASES=(0.34.0 0.36.0)
PRIMARY=0.34.0  # built into lib/ (what DjlServer uses without a version)
MVN=(mvn -q -B -Dstyle.color=never -Dorg.slf4j.simpleLogger.defaultLogLevel=error)
LOG="${TMPDIR:-/tmp}/djl-fetch.$$.log"
NEW=""  # the folder being built (removed if the script stops early)
trap 'rm -f "$LOG"; [[ -z "$NEW" ]] || rm -rf "$NEW"' EXIT

lib_dir() {  # lib_dir(version): the folder a release is built into
  if [[ "$1" == "$PRIMARY" ]]; then echo "$HERE/lib"; else echo "$HERE/lib-$1"; fi
}

fail() {  # fail(message): print Maven's log tail and exit
  echo "fetch.sh: $1" >&2
  [[ -s "$LOG" ]] && grep -v '^\s*$' "$LOG" | tail -25 >&2
  exit 1
}

source_dir() {  # source_dir(version): the first folder that holds the source tgz
  local version="$1" candidates=() common origin dir
  [[ -n "${DJL_SERVING_SRC:-}" && "$SINGLE" == 1 ]] && candidates+=("$DJL_SERVING_SRC")
  candidates+=("$ROOT/../shared/third_party/djl-serving-$version")
  if common="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)"; then
    candidates+=("$(dirname "$common")/../shared/third_party/djl-serving-$version")
  fi
  # a clone made elsewhere (e.g. in a temporary folder) of a local checkout
  if origin="$(git -C "$ROOT" remote get-url origin 2>/dev/null)" && [[ -d "$origin" ]]; then
    candidates+=("$origin/../shared/third_party/djl-serving-$version")
  fi
  for dir in "${candidates[@]}"; do
    if [[ -f "$dir/djl-serving-$version-src.tgz" && -f "$dir/pom.xml" ]]; then
      (cd "$dir" && pwd)
      return 0
    fi
  done
  return 1
}

from_central() {  # from_central(version, lib)
  "${MVN[@]}" -f "$HERE/pom.xml" "-Ddjl.version=$1" "-Ddjl.lib=$2" \
    dependency:copy-dependencies >"$LOG" 2>&1 && compgen -G "$2/serving-*.jar" >/dev/null
}

from_source() {  # from_source(version, lib)
  local version="$1" lib="$2" src build="$2/build" jar
  src="$(source_dir "$version")" \
    || fail "no djl-serving-$version-src.tgz: set DJL_SERVING_SRC (see tests/djl_serving/README.md)"
  mkdir -p "$build/src"
  tar xzf "$src/djl-serving-$version-src.tgz" -C "$build/src"
  cp "$src/pom.xml" "$build/pom.xml"
  "${MVN[@]}" -f "$build/pom.xml" -DskipTests package >"$LOG" 2>&1 || return 1
  mv "$build"/lib/*.jar "$lib/"
  jar="$(compgen -G "$build/target/*.jar" | head -1)" || true
  [[ -n "$jar" ]] || return 1
  mv "$jar" "$lib/serving-$version-source.jar"  # the name djl_server.py looks for
  rm -rf "${build:?}/target" "${build:?}/lib"
}

fetch_one() {  # fetch_one(version): build or copy one release into its folder, unless it is there
  local version="$1" lib kind="" key
  lib="$(lib_dir "$version")"
  key="v3 $(sha256sum "$HERE/pom.xml" | cut -c1-16) mode=$MODE version=$version"
  if [[ -f "$lib/.complete" && "$(head -1 "$lib/.complete")" == "$key" ]] \
      && compgen -G "$lib/serving-*.jar" >/dev/null && [[ -f "$lib/python/djl_python_engine.py" ]]; then
    return 0
  fi
  NEW="$lib.new.$$"  # built aside, then swapped in: a server using the old folder keeps it until then
  rm -rf "$NEW"
  mkdir -p "$NEW"
  if [[ "$MODE" != "source" ]]; then
    if from_central "$version" "$NEW"; then
      kind="maven-central $version"
    else
      [[ "$MODE" == "central" ]] && fail "ai.djl.serving:serving:$version is not available from Maven Central"
      rm -rf "$NEW"
      mkdir -p "$NEW"
      : >"$LOG"  # Central's refusal is expected here; only the source build's log matters now
    fi
  fi
  if [[ -z "$kind" ]]; then
    from_source "$version" "$NEW" || fail "building DJL Serving $version from source failed"
    kind="source $version"
  fi
  # djl_python/ and djl_python_engine.py from the engine jar (python-*.jar, or 0.36's own build)
  python3 - "$NEW/python" "$NEW"/python-*.jar "$NEW"/serving-*.jar <<'PY' || fail "no jar with DJL's Python engine in $NEW"
import sys
import zipfile
from pathlib import Path

dest, jars = sys.argv[1], [j for j in sys.argv[2:] if Path(j).is_file()]
for jar in jars:
    with zipfile.ZipFile(jar) as zf:
        names = [n for n in zf.namelist() if n.startswith("djl_python/") or n == "djl_python_engine.py"]
        if "djl_python_engine.py" in names:
            zf.extractall(dest, names)
            sys.exit(0)
sys.exit(1)
PY
  printf '%s\n%s\n' "$key" "$kind" >"$NEW/.complete"
  rm -rf "$lib"
  mv "$NEW" "$lib"
  NEW=""
  echo "fetch.sh: DJL Serving ModelServer $version ready in $lib ($kind)"
}

if [[ $# -gt 0 ]]; then
  VERSIONS=("$@")
elif [[ -n "${DJL_SERVING_VERSION:-}" ]]; then
  VERSIONS=("$DJL_SERVING_VERSION")
else
  VERSIONS=("${RELEASES[@]}")
fi
SINGLE=0
[[ ${#VERSIONS[@]} -eq 1 ]] && SINGLE=1
for version in "${VERSIONS[@]}"; do
  [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "not a release version: $version"
done

ready_all=1
for version in "${VERSIONS[@]}"; do
  lib="$(lib_dir "$version")"
  [[ -f "$lib/.complete" && -f "$lib/python/djl_python_engine.py" ]] || ready_all=0
done
[[ "$ready_all" == 1 ]] || command -v mvn >/dev/null \
  || { echo "fetch.sh: mvn not found (Maven and Java 17 are needed)" >&2; exit 1; }
for version in "${VERSIONS[@]}"; do
  fetch_one "$version"
done
