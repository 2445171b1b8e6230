"""``python -m celery -A tests.apps.cliapp redlock ARGS``, as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def run_celery(urls: Sequence[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``celery`` program in a subprocess, its lock nodes ``urls``
    (tests/apps/cliapp.py reads them from ``REDLOCK_CLI_NODES``)."""
    env = dict(os.environ)
    env["REDLOCK_CLI_NODES"] = ",".join(urls)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "redlock", *args],
        env=env,
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=60,
    )
