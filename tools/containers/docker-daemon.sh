#!/usr/bin/env bash
# A Docker daemon and the stand-in base images, for the container checks
# (compose-check.sh, container-checks.sh source this file; it can also run alone).
#
#   tools/containers/docker-daemon.sh start    # dockerd if none answers, + base images
#   tools/containers/docker-daemon.sh stop     # stops a dockerd that `start` started
#
# Sourced, it defines:
#   docker_up      a daemon that answers: the one running, else dockerd started here
#                  (overlay2, else vfs; cgroupfs driver), stopped again by docker_down
#   docker_down    stops the dockerd docker_up started (none started: nothing)
#   base_images    redis:7 and python:3.12-slim, built by build-base-images.sh when
#                  absent (from the Debian mirror: no registry needed)
#   cannot REASON  prints "<what> skipped: REASON" and exits 3 (what this machine lacks)
# Set CHECK_NAME before sourcing to name the check in that line.
set -euo pipefail

containers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dockerd_log=/tmp/redlock-dockerd.log
dockerd_pidfile=/tmp/redlock-dockerd.pid
started_pid=""

cannot() { echo "${CHECK_NAME:-container check} skipped: $*" >&2; exit 3; }

docker_down() {
  if [ -n "$started_pid" ]; then
    kill "$started_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$started_pid" 2>/dev/null || break; sleep 0.5; done
    echo "== dockerd (pid $started_pid) stopped"
    rm -f "$dockerd_pidfile"
    started_pid=""
  fi
}

docker_up() {
  docker info >/dev/null 2>&1 && return 0
  command -v dockerd >/dev/null 2>&1 || cannot "no Docker daemon answers and dockerd is not installed (apt-get install docker.io)"
  [ "$(id -u)" = 0 ] || cannot "no Docker daemon answers, and starting dockerd needs root"
  for driver in overlay2 vfs; do
    dockerd --storage-driver "$driver" --exec-opt native.cgroupdriver=cgroupfs >"$dockerd_log" 2>&1 &
    started_pid=$!
    for _ in $(seq 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 "$started_pid" 2>/dev/null || break
      sleep 0.5
    done
    if docker info >/dev/null 2>&1; then
      echo "$started_pid" >"$dockerd_pidfile"
      echo "== dockerd started (pid $started_pid, storage driver $driver)"
      return 0
    fi
    docker_down
  done
  cannot "dockerd did not start (it needs root, cgroups and overlayfs or vfs); its last lines: $(tail -3 "$dockerd_log" | tr '\n' ' ')"
}

base_images() {
  for image in redis:7 python:3.12-slim; do
    if ! docker image inspect "$image" >/dev/null 2>&1; then
      command -v debootstrap >/dev/null 2>&1 || cannot "no $image image, and debootstrap (to build one) is not installed"
      [ "$(id -u)" = 0 ] || cannot "no $image image, and debootstrap (to build one) needs root"
    fi
  done
  "$containers_dir/build-base-images.sh" || cannot "building the stand-in base images failed (is the Debian mirror or PyPI unreachable from here? its output is above)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  CHECK_NAME="${CHECK_NAME:-docker-daemon.sh}"
  case "${1:-}" in
    start)
      docker_up
      base_images
      # Left running for what comes next; `stop` ends it.
      started_pid=""
      ;;
    stop)
      if [ -f "$dockerd_pidfile" ]; then
        started_pid=$(cat "$dockerd_pidfile")
        docker_down
      else
        echo "no dockerd started by this script is running"
      fi
      ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
  esac
fi
