"""The module paths of 0.1 still import, as the modules they became, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from celery_redlock._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module_with_a_deprecation_warning(old: str) -> None:
    new = importlib.import_module(f"celery_redlock.{MOVED[old]}")
    # A fresh interpreter: the alias is made on first import, and warns then.
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        f"try:\n    importlib.import_module('celery_redlock.{old}')\n"
        "except DeprecationWarning as warned:\n    print(warned)\n"
        "warnings.simplefilter('ignore')\n"
        f"m = importlib.import_module('celery_redlock.{old}')\n"
        "print(m.__name__, m.__spec__.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith(f"celery_redlock.{old} moved to {new.__name__}")
    assert out[1] == f"{new.__name__} {new.__name__}"  # the module keeps its own spec


def test_from_imports_of_an_old_path_get_the_same_objects() -> None:
    from celery_redlock import Redlock, RedlockTask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # its own test checks it
        assert importlib.import_module("celery_redlock.task").RedlockTask is RedlockTask
        assert importlib.import_module("celery_redlock.redlock").Redlock is Redlock
