"""Renewing many leases in one round: the watchdog's batch.

One round per lease does not scale: 1,000 leases renewed every second cost a
thousand rounds a second, and with nodes 10 ms away a thousand serial rounds no
longer fit in the interval (most of the leases were lost). Here every lease due at
about the same time is renewed by one round per lock: each node gets one
``EXTEND_MANY`` call per ``CHUNK`` leases (pipelined, one deadline for the whole
round) and answers with one 0/1 per lease. Each lease keeps its own outcome, counted
by its own ``Round`` inside a ``Batch`` and read by the same arithmetic as a single
``extend`` (extend_replies.py): validity counts from the round's start, one lease that a
majority refused is marked lost alone, one whose nodes were slow is tried again.

While its round runs, each lease's lock is held (``Lease._hold_for_extension``), so
that no ``extend`` or ``release`` of the same lease interleaves, as with
``Lease.extend``; only then: a lease renewed in a round of its own (re-entered, a set
of keys) is not held during the shared round, nor the shared round's leases during
its round, so a release waits for its own lease's command alone. Leases whose lock
cannot renew in batches are extended one by one.

Imports lease.py, extend_replies.py, wire/node_set.py, scripts.py, commands.py
(``ms``), quorum.py (``is_one``, ``enough_no``) and wire/background.py; not redlock.py (the lock
imports the watchdog, which imports this module), nor Celery.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Final, Protocol, Sequence, runtime_checkable

from ..wire.background import in_hub
from ..wire.node_set import Batch, Command, NodeSet
from . import scripts
from .commands import ms
from .extend_replies import extension_outcome, extension_ttl
from .lease import Extension, Lease
from .quorum import enough_no, is_one

__all__ = ["CHUNK", "BatchOwner", "extend_batch", "renew"]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.renewals")

#: Leases per EXTEND_MANY call: keeps each script short on the node (a few hundred
#: microseconds) and its arguments far below Redis' limits.
CHUNK: Final = 500


@runtime_checkable
class BatchOwner(Protocol):
    """A lock that renews many of its leases in one round (``Redlock`` is one)."""

    def _extend_leases(self, leases: Sequence[Lease]) -> list[Extension]:
        """Extend each lease by its own ttl, in one round; one outcome per lease."""

    def _extend_lease(self, lease: Lease, ttl: float) -> Extension:
        """Extend one lease (its own round)."""


def extend_batch(
    nodes: NodeSet,
    leases: Sequence[Lease],
    *,
    quorum: int,
    node_timeout: float,
    margin: Callable[[float], float],
    clock: Callable[[], float],
) -> list[Extension]:
    """One round extending every lease by its own ttl; one ``Extension`` per lease,
    as ``Lease.extend``'s round would give it (see extend_replies.py)."""
    started = clock()
    outcomes: list[Extension] = [Extension()] * len(leases)
    asked: list[tuple[int, float]] = []  # (index in leases, ttl asked for)
    for index, lease in enumerate(leases):
        ttl = extension_ttl(lease, lease.ttl, started, margin)
        if isinstance(ttl, Extension):
            outcomes[index] = ttl
        else:
            asked.append((index, ttl))
    if not asked:
        return outcomes
    commands = []
    for first in range(0, len(asked), CHUNK):
        chunk = asked[first : first + CHUNK]
        args: list[object] = []
        for index, ttl in chunk:
            args += (leases[index].value, ms(ttl))
        keys = [leases[index].keys[0] for index, _ in chunk]  # a permit: its slot
        commands.append(Command(scripts.EXTEND_MANY, keys, args))  # type: ignore[arg-type]
    tally = Batch(
        len(nodes),
        [min(CHUNK, len(asked) - first) for first in range(0, len(asked), CHUNK)],
        is_yes=is_one,
        enough_yes=quorum,
        enough_no=enough_no(len(nodes), quorum),
    )
    latest = max(leases[index].deadline for index, _ in asked)
    nodes.batch_round(commands, tally, min(node_timeout, latest - started))
    finished = clock()
    for (index, ttl), results in zip(asked, tally.finish()):
        outcomes[index] = extension_outcome(
            results, quorum, ttl, started, finished, leases[index].deadline, margin(ttl),
            node_timeout,
        )  # fmt: skip
    return outcomes


def renew(leases: Sequence[Lease]) -> list[bool]:
    """Extend every lease by its own ttl: one round per lock for the leases it
    granted, one by one for a lock that cannot batch. True per lease extended;
    False when not (lost, released, retry later: as ``Lease.extend``)."""
    extended = [False] * len(leases)
    by_owner: dict[int, list[int]] = {}
    for index, lease in enumerate(leases):
        if isinstance(lease.owner, BatchOwner):
            by_owner.setdefault(id(lease.owner), []).append(index)
        else:
            extended[index] = _extend_one(lease)
    for indexes in by_owner.values():
        # Each lease's lock is held only while its own command is in flight, so a
        # release (a greenlet's, on the hub's OS thread) waits for one round at
        # most. A re-entered lease (reentry.py) extends its holds with its key, a set
        # of keys (commands.py) all of them at once: each its own round, under its
        # own lock alone so no hold is counted meanwhile. The others share a round.
        alone = [i for i in indexes if not _batchable(leases[i])]
        plain = []
        for i in (i for i in indexes if _batchable(leases[i])):
            if not leases[i]._hold_for_extension():
                continue
            if _batchable(leases[i]):
                plain.append(i)
            else:  # re-entered since it was sorted: let go, renew it alone below
                leases[i]._let_go()
                alone.append(i)
        if plain:
            group = [leases[i] for i in plain]
            for i, lease, outcome in zip(plain, group, _outcome(group)):
                extended[i] = lease._finish_extension(outcome)
        for i in alone:
            if leases[i]._hold_for_extension():
                extended[i] = leases[i]._finish_extension(_outcome([leases[i]])[0])
    return extended


def _batchable(lease: Lease) -> bool:
    """Whether ``EXTEND_MANY`` renews ``lease``: one key, never re-entered."""
    return lease.hold is None and len(lease.keys) == 1


def _outcome(group: list[Lease]) -> list[Extension]:
    """Each lease's extension (one batch round; one plain round for one re-entered
    lease); every lease of ``group`` has one lock, held for extension."""
    owner = group[0].owner
    assert isinstance(owner, BatchOwner)
    try:
        if len(group) == 1 and not _batchable(group[0]):
            return [owner._extend_lease(group[0], group[0].ttl)]
        return owner._extend_leases(group)
    except Exception as exc:  # never let one lock's failure kill the thread
        in_hub(
            functools.partial(logger.error, "renewing %d locks failed", len(group), exc_info=exc)
        )
        return [_failed(lease, owner, exc) for lease in group]


def _failed(lease: Lease, owner: object, exc: Exception) -> Extension:
    """A renewal that raised: tried again while a round can still end in time, as
    after slow nodes; lost with the error as its reason once none can."""
    reason = f"renewal failed: {exc!r}"
    retry_by = lease.deadline - 2 * float(getattr(owner, "node_timeout", 0.0))
    if retry_by <= time.monotonic():
        return Extension(reason=reason)
    return Extension(reason=reason, retry_by=retry_by)


def _extend_one(lease: Lease) -> bool:
    try:
        return lease.extend()
    except Exception as exc:  # never let one lease kill the thread that serves them all
        in_hub(functools.partial(logger.error, "renewing lock %s failed", lease.key, exc_info=exc))
        return False
