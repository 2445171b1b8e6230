"""The optional compiled build's switch (setup.py, ``CELERY_REDLOCK_COMPILE``).

The compiled build itself is made and tested in CI (``.ci/run``: from the sdist, the
core lock tests and the asyncio driver's on it); here, what the switch accepts and
what it says otherwise, and that the tests here run on the pure-Python package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import celery_redlock
from celery_redlock import wire

ROOT = Path(__file__).resolve().parents[2]


def setup_py(value: str) -> subprocess.CompletedProcess[str]:
    """``setup.py --version`` (it reads the switch first) with the switch at ``value``."""
    env = {**os.environ, "CELERY_REDLOCK_COMPILE": value}
    return subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_tests_here_run_on_the_pure_python_package() -> None:
    assert wire.COMPILED is False
    assert wire.__file__ is not None and wire.__file__.endswith(".py")


@pytest.mark.parametrize("value", ["", "0"])
def test_unset_or_zero_builds_the_pure_python_package(value: str) -> None:
    done = setup_py(value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == celery_redlock.__version__


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_any_other_value_is_refused_naming_the_switch_and_what_it_takes(value: str) -> None:
    done = setup_py(value)
    assert done.returncode != 0
    assert "CELERY_REDLOCK_COMPILE must be 1 (compile) or 0 / unset (pure Python)" in done.stderr
    assert repr(value) in done.stderr


def test_compiling_without_mypyc_says_what_to_install(tmp_path: Path) -> None:
    # A Python that cannot import mypyc: the repository's setup.py run with an
    # import hook that hides it.
    hide = tmp_path / "sitecustomize.py"
    hide.write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mypyc' or name.startswith('mypyc.'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    env = {**os.environ, "CELERY_REDLOCK_COMPILE": "1", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "needs mypyc where the package is built" in done.stderr
    assert "--no-build-isolation" in done.stderr
