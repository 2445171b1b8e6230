"""How an acquire round's replies read: granted, or why not.

Pure judging of replies, shared by every driver (no sockets, no clock): whether a
node granted the lock (``is_granted``), what a round's results say (``verdict``, the
one definition of a round's verdict), and for a lost round who holds the key and
when a quorum of its keys frees (``why_not``). ``Attempt`` carries the outcome to
the retry loop, and to the caller (``Attempt.outcome``: the lease, None, or the
error to raise).

A round's verdict, for N nodes and a quorum Q (``verdict``):

- ``GRANTED``: Q nodes said yes;
- ``UNAVAILABLE``: more than N - Q nodes *failed* (an error or a timeout): fewer
  than a quorum could answer, an outage -- the only verdict that raises
  ``QuorumUnavailable`` and counts toward ``retry_count``;
- ``CONTENDED``: a quorum answered and Q of the answers name one other holder;
- ``SPLIT``: a quorum answered and nobody holds a quorum (racing callers split the
  nodes, one node may be down besides): nobody won, try again.

A node the round stopped waiting for (``NOT_AWAITED``) counts as answered: the
round was decided before it replied, it did not fail. So one node down and two
callers splitting the other four 2-2 is ``SPLIT``, whatever order the replies came
in -- not an outage (a round that stopped at its third "no" reads
{error, refused, refused, NOT_AWAITED, NOT_AWAITED} and is a split too).

Imports lease.py, stored.py, commands.py, quorum.py and errors.py; must not import
redlock.py or Celery.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from ..errors import LockContended, QuorumUnavailable
from .commands import lease_name, lock_keys
from .lease import LeaseState
from .quorum import enough_no
from .stored import split_value

__all__ = [
    "CONTENDED",
    "GRANTED",
    "SPLIT",
    "UNAVAILABLE",
    "VERDICTS",
    "Attempt",
    "is_granted",
    "is_refused",
    "refused_for",
    "verdict",
    "why_not",
]

GRANTED = "granted"
CONTENDED = "contended"
SPLIT = "split"
UNAVAILABLE = "unavailable"
#: Every verdict a round can have (see the module docstring).
VERDICTS = (GRANTED, CONTENDED, SPLIT, UNAVAILABLE)

#: The kind of lease an attempt wins (``Lease``, ``AsyncLease``).
L = TypeVar("L", bound=LeaseState)


def is_granted(reply: object) -> bool:
    """A node's acquire reply said yes (1, or ``{1, counter}`` when fenced)."""
    return reply == 1 or (isinstance(reply, list) and len(reply) == 2 and reply[0] == 1)


def is_refused(reply: object) -> bool:
    """A node's acquire reply said no (the holder's value and TTL, or our token's
    tombstone): the script ran and set nothing of ours there."""
    return isinstance(reply, list) and not is_granted(reply)


def verdict(
    results: Sequence[object],
    quorum: int,
    is_yes: Callable[[object], bool] = is_granted,
    holder_of: Callable[[object], Optional[str]] = lambda reply: None,
) -> str:
    """The verdict of one round (see the module docstring): ``results`` in node
    order (a reply, an exception, or ``NOT_AWAITED``); ``quorum`` of them decide;
    ``is_yes``: a reply that grants; ``holder_of``: who a refusing reply names
    (None: nobody, or unknown); a quorum naming the same one is ``CONTENDED``."""
    if not isinstance(quorum, int) or isinstance(quorum, bool) or not 1 <= quorum <= len(results):
        raise ValueError(
            f"quorum must be an int from 1 to the number of results ({len(results)}), "
            f"got {quorum!r}"
        )
    failed = sum(1 for r in results if isinstance(r, BaseException))
    if sum(1 for r in results if not isinstance(r, BaseException) and is_yes(r)) >= quorum:
        return GRANTED
    if failed >= enough_no(len(results), quorum):
        return UNAVAILABLE
    named = Counter(
        who
        for r in results
        if not isinstance(r, BaseException) and not is_yes(r)
        for who in (holder_of(r),)
        if who is not None
    )
    if named and named.most_common(1)[0][1] >= quorum:
        return CONTENDED
    return SPLIT


def refused_for(reply: object) -> Optional[str]:
    """The lease an acquire refusal (``[value, pttl]``) names: its stored value, token
    and all (two holders may describe themselves alike); None for anything else."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] != 1:
        value = reply[0]
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value if isinstance(value, str) else None
    return None


@dataclass
class Attempt(Generic[L]):
    """What one acquire round achieved: the lease, or why it failed (for the retry
    loop and the errors it raises)."""

    lease: Optional[L] = None
    #: The holder most refusals named (one node's word unless ``CONTENDED``).
    holder: Optional[str] = None
    holder_ttl: Optional[float] = None
    unavailable: Optional[QuorumUnavailable] = None
    #: The round's verdict (``GRANTED``, ``CONTENDED``, ``SPLIT``, ``UNAVAILABLE``).
    verdict: str = GRANTED
    #: A key with several permits: what was reached when all were taken
    #: (``"limit 5/5"``, ``"rate 100/m"``); None for a mutex.
    limit: Optional[str] = None
    #: ``CONTENDED`` only: the nodes (by index) that refused this round; what frees
    #: elsewhere alone cannot let the next attempt win (wake.py).
    refused_on: Optional[frozenset[int]] = None

    @property
    def split(self) -> bool:
        """Nobody won a quorum although a quorum answered: try again."""
        return self.verdict == SPLIT

    def outcome(self, key: Union[str, Sequence[str]], contended: bool) -> Optional[L]:
        """The lease; ``QuorumUnavailable`` when too few nodes answered; when not
        won, ``None``, or ``LockContended`` (holder, its remaining TTL) if
        ``contended``. ``key``: the acquire's (one key, or a set named as its lease)."""
        if self.unavailable is not None:
            raise self.unavailable
        if self.lease is None and contended:
            name = key if isinstance(key, str) else lease_name(lock_keys(key))
            raise LockContended(
                name, self.holder, self.holder_ttl, split=self.split, limit=self.limit
            )
        return self.lease


def why_not(key: str, results: list[object], addresses: Sequence[str], need: int) -> Attempt[Any]:
    """Contention, a split vote or an outage (``verdict``)? ``results``: each node's
    reply, in the order of ``addresses``; ``need``: the quorum. A round with a
    quorum of grants that still lost (too late, or its fence failed) is a split:
    nobody holds the key."""
    count = len(results)
    refusals = [r for r in results if isinstance(r, list) and len(r) == 2 and r[0] != 1]
    judged = verdict(results, need, is_granted, refused_for)
    if judged == UNAVAILABLE:
        errors = {addresses[i]: r for i, r in enumerate(results) if isinstance(r, BaseException)}
        return Attempt(unavailable=QuorumUnavailable(key, errors, need), verdict=UNAVAILABLE)
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
    judged = SPLIT if judged == GRANTED else judged  # won, but too late to hold
    return Attempt(
        holder=holder, holder_ttl=holder_ttl, verdict=judged,
        refused_on=refused_on(results, is_refused) if judged == CONTENDED else None,
    )  # fmt: skip


def refused_on(results: list[object], refused: Callable[[object], bool]) -> frozenset[int]:
    """The indexes of the nodes whose reply in ``results`` is a refusal."""
    return frozenset(i for i, r in enumerate(results) if refused(r))
