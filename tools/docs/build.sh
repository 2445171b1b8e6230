#!/usr/bin/env bash
# Build the documentation site with warnings as errors: installs the docs extra into
# the project's .venv (made if missing), then runs sphinx-build -W into a temporary
# directory, removed afterwards unless DOCS_OUT names where to keep the HTML.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[docs]'

out="${DOCS_OUT:-}"
if [ -z "$out" ]; then
    out="$(mktemp -d)"
    trap 'rm -rf "$out"' EXIT
fi
# -E: read every page again (an include's source may have changed); nitpicky (conf.py)
# makes an unresolved reference to our own names a warning, and -W an error.
.venv/bin/sphinx-build -W --keep-going -E -q -b html docs "$out"
echo "docs built without warnings${DOCS_OUT:+ in $out}"
