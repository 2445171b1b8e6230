#!/usr/bin/env bash
# The monitoring kit's checks with promtool required: the metric names every rule and
# dashboard query uses, `promtool check rules` and `promtool test rules`
# (tests/ops/test_monitoring.py). Installs Debian's prometheus package (which ships
# promtool) when promtool is missing and apt is usable as root.
#
# Exit codes: 0 passed; 3 promtool cannot be had here (the reason is printed);
# anything else: the tests failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    started=$(date +%s)
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus) >/tmp/promtool-apt.log 2>&1 \
      || echo "apt-get install prometheus failed (see /tmp/promtool-apt.log)"
    echo "== apt-get install prometheus: $(($(date +%s) - started))s"
  fi
fi
if ! command -v promtool >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "promtool is not on PATH and there is no apt-get to install it" >&2
  elif [ "$(id -u)" != 0 ]; then
    echo "promtool is not on PATH and apt-get needs root to install it" >&2
  else
    echo "promtool is not on PATH and apt-get could not install prometheus" >&2
  fi
  exit 3
fi
echo "== $(promtool --version 2>&1 | head -1)"
REDLOCK_PROMTOOL_REQUIRED=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/ops/test_monitoring.py
