"""celery-redlock: mutually exclusive Celery tasks on a Redlock quorum of Redis masters.

Public API only; see README.md for a guide.
"""

from __future__ import annotations

from .errors import ConfigurationError, LockContended, LockLost, QuorumUnavailable, RedlockError
from .redlock import HolderInfo, Lease, NodeHolding, Redlock

__all__ = [
    "ConfigurationError",
    "HolderInfo",
    "Lease",
    "LockContended",
    "LockLost",
    "NodeHolding",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
]

__version__ = "0.1.0"
