#!/usr/bin/env bash
# Fetch the DJL jars the real-server tests run into tests/djl_serving/lib/ (git-ignored),
# and extract DJL's own djl_python package into lib/python/ for parity tests.
#
# Idempotent: skips when lib/.complete matches this pom and mode. Quiet (-q -B).
# Exits non-zero when nothing usable could be fetched.
#
# Which jars: first the whole DJL Serving front end (profile `serving`) at each version in
# DJL_SERVING_VERSIONS (default "0.36.0 0.35.0"); when Maven Central serves none of them, the
# real DJL Python engine alone (ai.djl.python:python at the pom's djl.version) for
# PyEngineFront.java. DJL_SERVING_MODE=engine skips the first tries; =serving forbids the fallback.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$HERE/lib"
MODE="${DJL_SERVING_MODE:-auto}"
LOG="${TMPDIR:-/tmp}/djl-fetch.$$.log"
VERSIONS="${DJL_SERVING_VERSIONS:-0.36.0 0.35.0}"
STAMP_KEY="$(sha256sum "$HERE/pom.xml" | cut -c1-16) mode=$MODE versions=$VERSIONS"

if [[ -f "$LIB/.complete" && "$(head -1 "$LIB/.complete")" == "$STAMP_KEY" ]] \
    && compgen -G "$LIB/python-*.jar" >/dev/null && [[ -d "$LIB/python/djl_python" ]]; then
  exit 0
fi

command -v mvn >/dev/null || { echo "fetch.sh: mvn not found" >&2; exit 1; }
rm -rf "$LIB"

copy() {  # copy(args...) -> 0 when Maven copied the dependencies
  mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies "$@" >"$LOG" 2>&1
}

KIND=""
if [[ "$MODE" != "engine" ]]; then
  for v in $VERSIONS; do
    if copy -Pserving "-Ddjl.version=$v"; then KIND="serving $v"; break; fi
    rm -rf "$LIB"
  done
fi
if [[ -z "$KIND" ]]; then
  if [[ "$MODE" == "serving" ]]; then
    echo "fetch.sh: ai.djl.serving:serving ($VERSIONS) not available; see $LOG" >&2
    exit 1
  fi
  if ! copy; then
    echo "fetch.sh: Maven failed; see $LOG" >&2
    tail -20 "$LOG" >&2
    exit 1
  fi
  KIND="engine"
fi

JAR="$(compgen -G "$LIB/python-*.jar" | head -1)"
[[ -n "$JAR" ]] || { echo "fetch.sh: no ai.djl.python:python jar in $LIB" >&2; exit 1; }
python3 - "$JAR" "$LIB/python" <<'PY'
import sys
import zipfile

jar, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(jar) as zf:
    names = [n for n in zf.namelist() if n.startswith("djl_python/") or n == "djl_python_engine.py"]
    zf.extractall(dest, names)
PY
printf '%s\n%s\n' "$STAMP_KEY" "$KIND" >"$LIB/.complete"
rm -f "$LOG"
echo "fetch.sh: DJL jars ready in $LIB ($KIND)"
