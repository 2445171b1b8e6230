#!/usr/bin/env bash
# Builds the sdist and the wheel as a release is built, and checks what they hold:
#
#   1. `python -m build` (the sdist, then the wheel from the unpacked sdist: no git) and
#      `twine check --strict`, with build and twine in a venv of their own; a build that
#      warns of anything deprecated fails (setuptools turns those into errors later);
#   2. the sdist holds the package, LICENSE, README.md, CHANGELOG.md, pyproject.toml,
#      setup.py, py.typed and the test suite with what it imports or reads (MANIFEST.in),
#      every one of those files git tracks; the wheel holds the package, py.typed and
#      LICENSE, and nothing else at its top;
#   3. a fresh venv gets the wheel with the `test` extra, and the sdist's tests run against
#      it, away from the checkout (its celery_redlock/ and egg-info removed, so the
#      package can only come from the venv): every shipped test module is collected, and
#      a smoke set runs.
#
# Usage: tools/release/check-dist.sh (PYTHON=python3.9 to build and test on another
# Python; PINS="celery==5.3.0 ..." to install those versions beside the wheel, as CI
# does for the declared floor). The work folder is removed when every check passed,
# kept otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
echo "== check-dist on $("$python" --version)${PINS:+, with $PINS}"
started=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/celery-redlock-dist.XXXXXX")
trap 'rc=$?; if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "check-dist: failed; its files are in $work" >&2; fi' EXIT
fail() { echo "check-dist: $*" >&2; exit 1; }

# The tests the installed wheel runs: the core lock tests, real prefork workers
# contending for one key, Sentinel-managed nodes, and that the version is the metadata's.
smoke=(
  tests/lock/test_redlock.py
  "tests/workers/test_pools.py::test_same_key_tasks_run_each_once_and_never_two_at_a_time[prefork]"
  tests/wire/test_sentinel.py
  tests/workers/test_django_beat.py
  tests/ops/test_release.py
  # The one test of volume (~40 s) runs in the test command; here the install is checked.
  --deselect tests/lock/test_redlock.py::test_mutual_exclusion_under_contention_checked_by_an_independent_counter
)

echo "== build and twine (a venv of their own)"
"$python" -m venv "$work/tools"
"$work/tools/bin/pip" install -q build twine
"$work/tools/bin/python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; fail "python -m build failed"; }
if grep -i 'deprecat' "$work/build.log"; then fail "the build warns of something deprecated (above)"; fi
"$work/tools/bin/twine" check --strict "$work"/dist/*
sdist=$(ls "$work"/dist/*.tar.gz)
wheel=$(ls "$work"/dist/*.whl)

echo "== the sdist: $(basename "$sdist")"
tar -tzf "$sdist" | cut -d/ -f2- | grep -v '/$' | sort >"$work/sdist.txt"
for file in LICENSE README.md CHANGELOG.md pyproject.toml setup.py MANIFEST.in PKG-INFO \
  celery_redlock/__init__.py celery_redlock/py.typed tests/conftest.py; do
  grep -qxF "$file" "$work/sdist.txt" || fail "the sdist lacks $file"
done
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Every tracked file of the package and of what the tests need; measurements aside.
  git ls-files celery_redlock tests tools bench example_project docker-compose.yml \
    | grep -vE '^(tools/soak-results|bench/results)/' | sort >"$work/tracked.txt"
  missing=$(comm -23 "$work/tracked.txt" "$work/sdist.txt")
  [ -z "$missing" ] || fail "the sdist lacks files git tracks: $missing"
fi
stray=$(grep -E '(^|/)(__pycache__|\.ci|\.venv[^/]*)/|\.(pyc|so)$' "$work/sdist.txt" || true)
[ -z "$stray" ] || fail "the sdist holds what it should not: $stray"
echo "$(wc -l <"$work/sdist.txt") files, tests/ included"

echo "== the wheel: $(basename "$wheel")"
"$python" - "$wheel" <<'EOF'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = {name.split("/")[0] for name in names}
info = next(top for top in tops if top.endswith(".dist-info"))
assert tops == {"celery_redlock", info}, f"the wheel's top holds {sorted(tops)}"
for name in ("celery_redlock/py.typed", f"{info}/licenses/LICENSE"):
    assert name in names, f"the wheel lacks {name}"
metadata = zipfile.ZipFile(sys.argv[1]).read(f"{info}/METADATA").decode()
assert "License-Expression: MIT" in metadata.splitlines(), "no License-Expression: MIT"
print(f"{len(names)} files, LICENSE and py.typed included")
EOF

echo "== the wheel installed in a fresh venv, with the test extra"
"$python" -m venv "$work/venv"
# shellcheck disable=SC2086  # PINS: requirement specifiers, one word each
"$work/venv/bin/pip" install -q "$wheel[test]" ${PINS:-}
# A fresh venv resolves the newest releases of every dependency (but PINS): say which.
"$work/venv/bin/pip" list 2>/dev/null | grep -iE '^(celery|kombu|redis|django|django-celery-beat) ' \
  | tr -s ' ' | paste -sd, -
smoke_dir="$work/smoke"
mkdir "$smoke_dir"
tar -xzf "$sdist" -C "$smoke_dir" --strip-components=1
rm -rf "$smoke_dir/celery_redlock" "$smoke_dir"/*.egg-info
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# From the folder pytest runs in, as pytest sees it (cwd first on sys.path, as with
# `python -m pytest`, and pyproject's pythonpath = ["."] is that folder too).
imported=$(cd "$smoke_dir" && "$work/venv/bin/python" -c 'import celery_redlock; print(celery_redlock.__file__)')
echo "celery_redlock imported from $imported"
case "$imported" in
  "$site"/celery_redlock/*) ;;
  *) fail "celery_redlock did not come from the venv's site-packages ($site)" ;;
esac

echo "== the sdist's tests against the installed wheel"
(cd "$smoke_dir" && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider --collect-only) \
  >"$work/collect.log" 2>&1 || { tail -40 "$work/collect.log"; fail "the shipped tests do not collect"; }
tail -1 "$work/collect.log"
(cd "$smoke_dir" && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "${smoke[@]}")

echo "== check-dist: passed in $(($(date +%s) - started)) s"
