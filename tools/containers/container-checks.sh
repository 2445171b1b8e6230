#!/usr/bin/env bash
# Everything that needs Docker, run for real: the shipped docker-compose.yml
# (compose-check.sh's check), then the pytest-celery container tests (tests/containers:
# lock-node, worker and beat containers). One Docker daemon for both: started here
# when none answers and stopped at the end (docker-daemon.sh).
#
#   tools/containers/container-checks.sh [pytest arguments for tests/containers]
#
# The container tests run with REDLOCK_CONTAINERS_REQUIRED=1: a test that would skip
# for want of Docker, an image or pytest-celery fails instead, and a run that skipped
# anything fails too. Exit status: 0 both passed; the compose check's status when it
# failed (1, 2); pytest's when the tests failed; 3 when this machine cannot run a
# Docker daemon or build the base images (the reason is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"

CHECK_NAME="container checks"
# shellcheck source=tools/containers/docker-daemon.sh
source tools/containers/docker-daemon.sh
trap docker_down EXIT

docker_up
base_images

started=$(date +%s)
echo "== compose stack: up --build, a lock node and a worker killed mid-run, verdict, down -v"
"$python" -m tools.containers.compose_check
echo "== compose stack: $(($(date +%s) - started))s"

started=$(date +%s)
echo "== container tests (pytest-celery components): tests/containers"
report=$(mktemp /tmp/redlock-containers.XXXXXX.xml)
REDLOCK_CONTAINERS_REQUIRED=1 "$python" -m pytest -p no:cacheprovider -rs \
  --junitxml="$report" tests/containers "$@"
skipped=$("$python" -c 'import sys, xml.etree.ElementTree as t; print(sum(int(s.get("skipped", 0)) for s in t.parse(sys.argv[1]).iter("testsuite")))' "$report")
rm -f "$report"
if [ "$skipped" != 0 ]; then
  echo "container tests: $skipped skipped; here every one must run" >&2
  exit 1
fi
echo "== container tests: $(($(date +%s) - started))s"

left=$(docker ps -aq --filter label=celery-redlock.test)
if [ -n "$left" ]; then
  echo "container tests left containers behind: $left" >&2
  exit 1
fi
