"""Every error celery-redlock raises, under one root.

::

    RedlockError                      root: ``except RedlockError`` catches them all
     +-- ConfigurationError           bad argument or setting (also a ValueError);
     |    |                           the message names it and what is accepted
     |    +-- LockKeyError            a task's arguments cannot make a lock key
     |                                (names the task and the argument)
     +-- LockContended                another holder has the lock (holder, ttl)
     +-- LockLost                     a lease we held is no longer guaranteed
     +-- QuorumUnavailable            too few nodes answered (per-node errors)

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = [
    "ConfigurationError",
    "LockContended",
    "LockKeyError",
    "LockLost",
    "QuorumUnavailable",
    "RedlockError",
]


class RedlockError(Exception):
    """Root of every celery-redlock error."""


class ConfigurationError(RedlockError, ValueError):
    """An argument or setting is malformed; the message names it and what is accepted."""


class LockKeyError(ConfigurationError):
    """A lock key cannot be made from a task's arguments: an argument that has no
    canonical form, an unknown template field, an oversized argument. The message
    names the task and the argument."""


class LockContended(RedlockError):
    """The lock is held by someone else.

    ``holder`` is the holder's description as stored with its token (for a task:
    ``task-id@hostname:pid``), ``ttl`` its remaining time to live in seconds as seen
    by the nodes that refused us (``None`` when unknown).
    """

    def __init__(self, key: str, holder: Optional[str] = None, ttl: Optional[float] = None) -> None:
        self.key = key
        self.holder = holder
        self.ttl = ttl
        who = holder or "unknown holder"
        left = f", {ttl:.3f}s left" if ttl is not None else ""
        super().__init__(f"lock {key!r} is held by {who}{left}")

    def __reduce__(self) -> tuple[type[LockContended], tuple[str, Optional[str], Optional[float]]]:
        # Celery pickles exceptions into the result backend: keep the fields.
        return (type(self), (self.key, self.holder, self.ttl))


class LockLost(RedlockError):
    """A lease is no longer held: its validity ran out, an extension failed or its
    token is gone. Work guarded by it must stop (or be fenced)."""

    def __init__(self, key: str, reason: str = "validity ran out") -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"lock {key!r} was lost: {reason}")

    def __reduce__(self) -> tuple[type[LockLost], tuple[str, str]]:
        return (type(self), (self.key, self.reason))


class QuorumUnavailable(RedlockError):
    """Fewer than a majority of the nodes could answer in time.

    ``errors`` maps each failing node (its address) to what went wrong there.
    """

    def __init__(self, key: str, errors: Mapping[str, BaseException], needed: int) -> None:
        self.key = key
        self.errors = dict(errors)
        self.needed = needed
        detail = "; ".join(
            str(err) if str(err).startswith(node) else f"{node}: {err}"
            for node, err in self.errors.items()
        )
        super().__init__(
            f"lock {key!r}: a quorum of {needed} nodes could not be reached ({detail})"
        )

    def __reduce__(
        self,
    ) -> tuple[type[QuorumUnavailable], tuple[str, dict[str, BaseException], int]]:
        return (type(self), (self.key, self.errors, self.needed))
