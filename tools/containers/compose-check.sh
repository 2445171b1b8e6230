#!/usr/bin/env bash
# The shipped docker-compose.yml, run for real: starts the Docker daemon when none
# answers (and stops it again at the end), builds the stand-in base images
# (build-base-images.sh), then runs `python -m tools.containers.compose_check`:
# up --build, load with a lock node and a worker killed mid-run, the observer's
# verdict, down -v with nothing left behind.
#
#   tools/containers/compose-check.sh [--duration 30]
#
# PYTHON: the interpreter with celery-redlock and the example's dependencies
# (default .venv/bin/python). Exit status: the check's (0 passed, 1 failed, 2 the
# stack did not come up); 3 when no Docker daemon answers and none could be started,
# or the stand-in base images cannot be built here (the reason is printed: what this
# machine lacks).
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"

started_pid=""
stop_daemon() {
  if [ -n "$started_pid" ]; then
    kill "$started_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$started_pid" 2>/dev/null || break; sleep 0.5; done
    echo "== dockerd (pid $started_pid) stopped"
  fi
}
trap stop_daemon EXIT

cannot() { echo "compose check skipped: $*" >&2; exit 3; }

if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 || cannot "no Docker daemon answers and dockerd is not installed (apt-get install docker.io)"
  [ "$(id -u)" = 0 ] || cannot "no Docker daemon answers, and starting dockerd needs root"
  log=/tmp/redlock-dockerd.log
  for driver in overlay2 vfs; do
    dockerd --storage-driver "$driver" --exec-opt native.cgroupdriver=cgroupfs >"$log" 2>&1 &
    started_pid=$!
    for _ in $(seq 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 "$started_pid" 2>/dev/null || break
      sleep 0.5
    done
    if docker info >/dev/null 2>&1; then
      echo "== dockerd started (pid $started_pid, storage driver $driver)"
      break
    fi
    stop_daemon
    started_pid=""
  done
  docker info >/dev/null 2>&1 || cannot "dockerd did not start (it needs root, cgroups and overlayfs or vfs); its last lines: $(tail -3 "$log" | tr '\n' ' ')"
fi

for image in redis:7 python:3.12-slim; do
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null 2>&1 || cannot "no $image image, and debootstrap (to build one) is not installed"
    [ "$(id -u)" = 0 ] || cannot "no $image image, and debootstrap (to build one) needs root"
  fi
done
tools/containers/build-base-images.sh || cannot "building the stand-in base images failed (is the Debian mirror or PyPI unreachable from here? its output is above)"
"$python" -m tools.containers.compose_check "$@"
