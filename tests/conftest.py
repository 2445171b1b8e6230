"""Test setup for the whole suite: the package from this checkout, and its fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# pytest puts tests/ on sys.path, not the checkout: a checkout that was never
# pip-installed must still import celery_redlock.
_CHECKOUT = str(Path(__file__).resolve().parents[1])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

import celery_redlock.testing  # noqa: E402

# pytester runs inner pytest sessions (fixture teardown is checked from outside).
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # Installed, the package's pytest11 entry point has registered the fixtures
    # already; registering them twice is an error.
    if not config.pluginmanager.is_registered(celery_redlock.testing):
        config.pluginmanager.register(celery_redlock.testing, "celery_redlock")
