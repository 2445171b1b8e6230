"""Test setup for the whole suite: the package from this checkout, and its fixtures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# pytest puts tests/ on sys.path, not the checkout: a checkout that was never
# pip-installed must still import celery_redlock.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

import celery_redlock.testing  # noqa: E402


def _serialize_ast_parse() -> None:
    """Let one thread at a time build Python AST objects, on the CPythons that race there.

    CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 share one recursion counter between
    threads converting an AST (python/cpython#106905): two threads parsing at once can
    raise ``SystemError: AST constructor recursion depth mismatch``. Both pytest (to
    show a failing statement) and ``traceback`` (3.11's caret anchors, used by every
    thread that logs an exception, e.g. an embedded worker's) parse source, so a
    failure report could crash pytest itself and lose the report.
    """
    version = sys.version_info[:3]
    if not ((3, 11) <= version < (3, 11, 8) or (3, 12) <= version < (3, 12, 2)):
        return
    import ast
    import functools
    import threading

    parse, one_at_a_time = ast.parse, threading.RLock()

    @functools.wraps(parse)
    def locked_parse(*args: Any, **kwargs: Any) -> Any:
        with one_at_a_time:
            return parse(*args, **kwargs)

    ast.parse = locked_parse


_serialize_ast_parse()

# pytester runs inner pytest sessions (fixture teardown is checked from outside).
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # Installed, the package's pytest11 entry point has registered the fixtures
    # already; registering them twice is an error.
    if not config.pluginmanager.is_registered(celery_redlock.testing):
        config.pluginmanager.register(celery_redlock.testing, "celery_redlock")
