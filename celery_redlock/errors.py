"""Every error celery-redlock raises, under one root.

::

    RedlockError                      root: ``except RedlockError`` catches them all
     +-- ConfigurationError           bad argument or setting (also a ValueError);
     |    |                           the message names it and what is accepted
     |    +-- LockKeyError            a task's arguments cannot make a lock key
     |                                (names the task and the argument)
     +-- LockContended                another holder has the lock (holder, ttl), or
     |    |                           the vote split and nobody has it (split)
     |    +-- AlreadyQueued           a copy of the task is already queued (task_id)
     +-- AlreadyHeld                  this execution holds the key already (no
     |                                reentrant=True): raised at once, never waited on
     +-- LockLost                     a lease we held is no longer guaranteed
     +-- QuorumUnavailable            too few nodes answered (per-node errors)

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = [
    "AlreadyHeld",
    "AlreadyQueued",
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
    ``task-id@worker:pid``), ``ttl`` its remaining time to live in seconds as seen
    by the nodes that refused us (``None`` when unknown). ``split``: True when no
    holder had a quorum either -- racing callers split the vote (one node may be
    down besides) and nobody won; ``holder`` is then one node's word only, and
    trying again soon is the answer. ``limit``: set when the key has more than one
    permit (a limit or a rate) and all were taken: what was reached, e.g.
    ``"limit 5/5"`` or ``"rate 100/m"``; ``holder`` then names the holder of the
    permit that frees first and ``ttl`` when one frees.
    """

    # The fields are the exception's args: Celery's result backends rebuild an
    # exception as ``cls(*args)``, so they survive the trip to the caller.
    def __init__(
        self,
        key: str,
        holder: Optional[str] = None,
        ttl: Optional[float] = None,
        split: bool = False,
        limit: Optional[str] = None,
    ) -> None:
        extra: tuple[object, ...] = (split, limit) if limit else ((True,) if split else ())
        super().__init__(key, holder, ttl, *extra)
        self.key = key
        self.holder = holder
        self.ttl = ttl
        self.split = bool(split)
        self.limit = limit

    def __str__(self) -> str:
        who = self.holder or "unknown holder"
        left = f", {self.ttl:.3f}s left" if self.ttl is not None else ""
        if self.limit and not self.split:
            frees = f"; one frees in {self.ttl:.3f}s" if self.ttl is not None else ""
            return f"lock {self.key!r}: {self.limit} reached (taken by {who}{frees})"
        if self.split:
            return (
                f"lock {self.key!r}: the vote split, nobody holds a quorum "
                f"(last refused by {who}{left})"
            )
        return f"lock {self.key!r} is held by {who}{left}"


class AlreadyQueued(LockContended):
    """A task with ``redlock_dedupe_queued`` is already queued with the same lock key.

    ``task_id`` is the queued copy's id (``app.AsyncResult(task_id)`` follows it).
    """

    def __init__(self, key: str, task_id: Optional[str] = None, ttl: Optional[float] = None):
        super().__init__(key, task_id, ttl)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"a copy of this task is already queued under {self.key!r} (task {self.task_id})"


class AlreadyHeld(RedlockError):
    """This execution (the thread; in Celery, the task run) already holds ``key`` and
    asked for it again without ``reentrant=True``: it would wait for itself."""

    def __init__(self, key: str, execution: str = "") -> None:
        super().__init__(key, execution)
        self.key = key
        self.execution = execution

    def __str__(self) -> str:
        return (
            f"lock {self.key!r} is already held by this execution ({self.execution}); "
            "release it first, or acquire with reentrant=True to count one more hold"
        )


class LockLost(RedlockError):
    """A lease is no longer held: its validity ran out, an extension failed or its
    token is gone. Work guarded by it must stop (or be fenced)."""

    def __init__(self, key: str, reason: str = "validity ran out") -> None:
        super().__init__(key, reason)
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return f"lock {self.key!r} was lost: {self.reason}"


class QuorumUnavailable(RedlockError):
    """Fewer than a majority of the nodes could answer in time.

    ``errors`` maps each failing node (its address) to what went wrong there (an
    exception; a str once the error has crossed a result backend).
    """

    def __init__(self, key: str, errors: Mapping[str, object], needed: int) -> None:
        super().__init__(key, {node: str(err) for node, err in errors.items()}, needed)
        self.key = key
        self.errors = dict(errors)
        self.needed = needed

    def __str__(self) -> str:
        detail = "; ".join(
            str(err) if str(err).startswith(node) else f"{node}: {err}"
            for node, err in self.errors.items()
        )
        return f"lock {self.key!r}: a quorum of {self.needed} nodes could not be reached ({detail})"
