"""The optional compiled build: ``CELERY_REDLOCK_COMPILE=1`` compiles the wire layer
(``celery_redlock/wire``, every module of it) with mypyc; without it, the package is
pure Python, as it always is by default. Everything else about the package is in
pyproject.toml.

The compiled wire runs the same code, with the same types checked at run time, in C:
about a third less CPU per lock operation (docs/operations/compiled.md). It needs mypy
(which ships mypyc), the package's own dependencies (mypyc checks the types against
redis-py's) and a C compiler where it is built::

    pip install mypy 'setuptools>=77' wheel 'redis>=4.6'
    export CELERY_REDLOCK_COMPILE=1
    pip install --no-build-isolation --no-binary celery-redlock celery-redlock

(or ``pip install --no-build-isolation .`` in a checkout). ``wire.COMPILED`` says which
build is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

COMPILE_ENV = "CELERY_REDLOCK_COMPILE"


def compiled_modules() -> list[str]:
    """The modules mypyc compiles: the whole wire package (a class compiled in one
    module cannot be subclassed in an interpreted one)."""
    wire = Path(__file__).resolve().parent / "celery_redlock" / "wire"
    return sorted(str(path.relative_to(wire.parent.parent)) for path in wire.glob("*.py"))


def ext_modules() -> list[object]:
    wanted = os.environ.get(COMPILE_ENV, "")
    if wanted in ("", "0"):
        return []
    if wanted != "1":
        raise SystemExit(
            f"{COMPILE_ENV} must be 1 (compile) or 0 / unset (pure Python), got {wanted!r}"
        )
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            f"{COMPILE_ENV}=1 needs mypyc where the package is built: pip install mypy "
            "'setuptools>=77' wheel 'redis>=4.6', then build with --no-build-isolation"
        ) from None
    # Only the compiled modules' own type errors stop the build (the rest of the
    # package is checked by the project's mypy run, with Celery installed).
    return list(mypycify(["--follow-imports=silent", *compiled_modules()], opt_level="3"))


setup(ext_modules=ext_modules())
