"""How an acquire round's replies read: granted, or why not.

Pure judging of replies, shared by every driver (no sockets, no clock): whether a
node granted the lock (``is_granted``), and for a lost round whether someone holds
the key -- who, and when a quorum of its keys frees -- or too few nodes answered
(``why_not``). ``Attempt`` carries the outcome to the retry loop, and to the caller
(``Attempt.outcome``: the lease, None, or the error to raise).

Imports lease.py, stored.py, commands.py and errors.py; must not import redlock.py
or Celery.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Optional, TypeVar, Union

from ..errors import LockContended, QuorumUnavailable
from .commands import lease_name, lock_keys
from .lease import LeaseState
from .stored import split_value

__all__ = ["Attempt", "is_granted", "why_not"]

#: The kind of lease an attempt wins (``Lease``, ``AsyncLease``).
L = TypeVar("L", bound=LeaseState)


def is_granted(reply: object) -> bool:
    """A node's acquire reply said yes (1, or ``{1, counter}`` when fenced)."""
    return reply == 1 or (isinstance(reply, list) and len(reply) == 2 and reply[0] == 1)


@dataclass
class Attempt(Generic[L]):
    """What one acquire round achieved: the lease, or why it failed (for the retry
    loop and the errors it raises)."""

    lease: Optional[L] = None
    holder: Optional[str] = None
    holder_ttl: Optional[float] = None
    unavailable: Optional[QuorumUnavailable] = None

    def outcome(self, key: Union[str, Sequence[str]], contended: bool) -> Optional[L]:
        """The lease; ``QuorumUnavailable`` when too few nodes answered; when not
        won, ``None``, or ``LockContended`` (holder, its remaining TTL) if
        ``contended``. ``key``: the acquire's (one key, or a set named as its lease)."""
        if self.unavailable is not None:
            raise self.unavailable
        if self.lease is None and contended:
            name = key if isinstance(key, str) else lease_name(lock_keys(key))
            raise LockContended(name, self.holder, self.holder_ttl)
        return self.lease


def why_not(key: str, results: list[object], addresses: Sequence[str], need: int) -> Attempt[Any]:
    """Contention (someone holds the key) or an outage (too few nodes answered)?
    ``results``: each node's reply, in the order of ``addresses``; ``need``: the quorum."""
    count = len(results)
    refusals = [r for r in results if isinstance(r, list) and len(r) == 2 and r[0] != 1]
    errors = {addresses[i]: r for i, r in enumerate(results) if isinstance(r, BaseException)}
    if errors and len(refusals) <= count - need:
        # The refusals alone did not rule out a quorum: the silent nodes did.
        return Attempt(unavailable=QuorumUnavailable(key, errors, need))
    holders = Counter(split_value(r[0])[1] or "unknown" for r in refusals)
    holder = holders.most_common(1)[0][0] if holders else None
    # The lock frees when enough refusing nodes expire to make a quorum with the
    # others: that is the k-th shortest remaining TTL among the refusals.
    ttls = sorted(int(r[1]) for r in refusals if isinstance(r[1], int) and r[1] >= 0)
    missing = need - (count - len(refusals))
    holder_ttl = None
    if 0 < missing <= len(ttls):
        holder_ttl = ttls[missing - 1] / 1000.0
    elif not refusals:
        holder_ttl = 0.0  # won a quorum too late (slow round): nobody holds it
    return Attempt(holder=holder, holder_ttl=holder_ttl)
