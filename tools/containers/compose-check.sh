#!/usr/bin/env bash
# The shipped docker-compose.yml, run for real: starts the Docker daemon when none
# answers (and stops it again at the end), builds the stand-in base images
# (docker-daemon.sh, build-base-images.sh), then runs
# `python -m tools.containers.compose_check`: up --build, load with a lock node and a
# worker killed mid-run, the observer's verdict, down -v with nothing left behind.
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

CHECK_NAME="compose check"
# shellcheck source=tools/containers/docker-daemon.sh
source tools/containers/docker-daemon.sh
trap docker_down EXIT

docker_up
base_images
"$python" -m tools.containers.compose_check "$@"
