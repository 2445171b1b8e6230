"""celery-redlock for asyncio: ``AsyncRedlock`` and ``AsyncLease``.

The same lock as ``celery_redlock.Redlock`` (same nodes, arguments, errors and
stored values), with coroutines: for FastAPI or aiohttp services that share locks
with Celery workers. ``redlock.py`` holds the lock, ``nodes.py`` the round on the
event loop, ``connection.py`` one node's connection, ``wake.py`` a blocked
acquire's hearing of releases. Must not import Celery.
"""

from __future__ import annotations

from .redlock import AsyncLease, AsyncRedlock

__all__ = ["AsyncLease", "AsyncRedlock"]
