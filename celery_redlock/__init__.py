"""celery-redlock: mutually exclusive Celery tasks on a Redlock quorum of Redis masters.

Public API only; the guides are the documentation site's pages, in docs/.
"""

from __future__ import annotations

from . import _moved, signals
from .errors import (
    AlreadyHeld,
    AlreadyQueued,
    ConfigurationError,
    LockContended,
    LockKeyError,
    LockLost,
    QuorumUnavailable,
    RedlockError,
)
from .lock.redlock import HolderInfo, Lease, NodeHolding, Redlock
from .skipped import REPLACED, SKIPPED, is_replaced, is_skipped
from .tasks.task import RedlockTask, redlock_task

__all__ = [
    "REPLACED",
    "SKIPPED",
    "AlreadyHeld",
    "AlreadyQueued",
    "ConfigurationError",
    "HolderInfo",
    "Lease",
    "LockContended",
    "LockKeyError",
    "LockLost",
    "NodeHolding",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
    "RedlockTask",
    "is_replaced",
    "is_skipped",
    "redlock_task",
    "signals",
]

# The one place the version is written: pyproject.toml reads it.
__version__ = "0.1.0"

_moved.install()  # the module paths of 0.1 (celery_redlock.task, ...) still import
