#!/usr/bin/env bash
# Make a docker engine answer on this machine and give it the docker executor's default image
# (turnrl-sandbox:bookworm). Idempotent, as root, on Debian/Ubuntu; what .ci/run does before the tests:
#   1. apt-get install docker.io and debootstrap when dockerd / debootstrap are missing;
#   2. start dockerd in the background (log: $DOCKERD_LOG) unless an engine already answers, and
#      wait until it does;
#   3. `python -m turnrl build-docker-image`: skipped when the engine has the image; the Debian root
#      filesystem is cached under ~/.cache/turnrl/docker, so only the first build runs debootstrap.
# Usage: scripts/docker_engine.sh [PYTHON]   (default .venv/bin/python, with turnrl installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/turnrl-dockerd.log}

seconds() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(seconds)" 'BEGIN { printf "%.1f", b - a }'; }
# the Python SDK is what the executor uses: ask the engine through it, at $DOCKER_HOST or the default socket
engine_answers() { "$PY" -c 'import docker; docker.from_env().ping()' >/dev/null 2>&1; }

[ -x "$PY" ] || { echo "docker_engine.sh: $PY is not a python with turnrl installed (run 'make install' first)" >&2; exit 1; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    || { echo "docker_engine.sh: need ${missing[*]}: install them as root (apt-get install ${missing[*]})" >&2; exit 1; }
  echo "installing ${missing[*]} ..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if engine_answers; then
  echo "a docker engine answers"
else
  [ -z "${DOCKER_HOST:-}" ] || { echo "docker_engine.sh: nothing answers at DOCKER_HOST=$DOCKER_HOST; unset it to start a local engine" >&2; exit 1; }
  start=$(seconds)
  nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 120); do
    engine_answers && break
    kill -0 $! 2>/dev/null || { echo "docker_engine.sh: dockerd exited; its log ends:" >&2; tail -20 "$DOCKERD_LOG" >&2; exit 1; }
    sleep 0.5
  done
  engine_answers || { echo "docker_engine.sh: dockerd does not answer after 60 s; log: $DOCKERD_LOG" >&2; exit 1; }
  echo "started dockerd (pid $!, log $DOCKERD_LOG) in $(elapsed "$start") s"
fi

start=$(seconds)
"$PY" -m turnrl build-docker-image
echo "image ready in $(elapsed "$start") s"
