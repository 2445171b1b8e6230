"""``celery -A app redlock ARGS`` as the CLI tests run it: the real ``celery`` program
in a subprocess (``run_celery``), or the ``redlock`` click group in-process with the
context object Celery's own group builds (``invoke``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redlock.cli import redlock

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


def make_app(urls: Sequence[str]) -> Celery:
    app = Celery("cli_tests", broker="memory://", set_as_current=False)
    app.conf.redlock_nodes = list(urls)
    return app


def invoke(urls: Sequence[str], *args: str, input: Optional[str] = None) -> Result:
    """``celery -A app redlock ARGS`` in-process, with Celery's context object: faster
    than ``run_celery``, and a test can answer the --force prompt."""
    obj = CLIContext(app=make_app(urls), no_color=True, workdir=None)
    return CliRunner().invoke(redlock, list(args), obj=obj, input=input, catch_exceptions=False)


def doc(output: str) -> Any:
    return json.loads(output)
