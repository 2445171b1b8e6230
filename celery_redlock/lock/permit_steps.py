"""The steps of a permit round: a lease on one of a key's N permits, or a start under
a rate (permits.py says what is sent and what the replies mean).

Written as the rest of the lock's operations are (rules.py): generators that yield
``Ask`` rounds and ``Pause`` waits, driven by the sync and asyncio drivers alike, and
tested with scripted replies (tests/lock/test_permits.py).

Reads the lock's rules through the ``LockRules`` protocol below (rules.py calls
these, so it is not imported); imports acquire_replies, permits, quorum, settings,
steps and stored. No sockets, no Celery.
"""

from __future__ import annotations

import functools
import random
import secrets
from typing import Any, Callable, Optional, Protocol, TypeVar

from ..errors import ConfigurationError, QuorumUnavailable
from ..wire.resp import Command
from .acquire_replies import (
    CONTENDED,
    GRANTED,
    SPLIT,
    UNAVAILABLE,
    Attempt,
    refused_on,
    verdict,
)  # fmt: skip
from .lease import LeaseState
from .permits import (
    PermitRound,
    Terms,
    acquire_permit_command,
    drop_permits_command,
    is_full,
    is_permit_granted,
    read_permit_round,
    settled,
)
from .quorum import CLOCK_PRECISION
from .settings import Settings
from .steps import Ask, Steps
from .stored import new_value, permit_slot

__all__ = ["RATE_SLACK", "admit_steps", "permit_attempt_steps"]

L = TypeVar("L", bound=LeaseState)


class LockRules(Protocol):
    """What these steps read of the lock's rules (rules.LockRules, which calls them)."""

    settings: Settings
    addresses: tuple[str, ...]
    quorum: int
    clock: Callable[[], float]

    def fence_steps(
        self, keys: tuple[str, ...], value: str, granted: list[object], deadline: float,
        undo: Callable[[], Any],
    ) -> Steps[Optional[int]]: ...  # fmt: skip


#: How long a rate's round may take and its start still count from the round's
#: beginning (seconds): a start's slot lives its period plus this, so the next start
#: on that slot comes a full period after ours. A slower round wastes its slot (it
#: is counted, never run) and tries again: a rate's precision never rests on a round
#: being fast.
RATE_SLACK = 0.02


def permit_attempt_steps(
    rules: LockRules, owner: object, lease_class: Callable[..., L], key: str,
    terms: Terms, ttl: float, holder: str, chosen: Optional[str],
) -> Steps[Attempt[L]]:  # fmt: skip
    """One round for a permit of ``key`` (and a fenced lock's fence round): a lease on
    the slot a quorum gave us, or why not; a lost round is undone on every node."""
    settings = rules.settings
    token = chosen or secrets.token_urlsafe(20)
    value = f"{token}|{holder}"
    undo = functools.partial(drop_permits_command, key, terms, value, ttl)
    started = rules.clock()
    start = random.randrange(terms.count)
    command = acquire_permit_command(key, terms, value, ttl, settings.fencing, start)
    results = yield _ask(rules, command, undo)
    read = yield from _read(rules, key, terms, results, undo)
    deadline = started + ttl - settings.margin(ttl)
    if read.slot is not None and rules.clock() < deadline:
        if read.strays:  # nodes that gave us another slot: free it there
            keep = drop_permits_command(key, terms, value, ttl, keep=read.slot)
            yield Ask(keep, 0.0, wait=False, deliver=True)
        slot = (permit_slot(key, terms.kind, read.slot),)
        fence = None
        if settings.fencing:
            granted: list[object] = [[1, counter] for counter in read.counters]
            fence = yield from rules.fence_steps(slot, value, granted, deadline, undo)
        if fence is not None or not settings.fencing:
            lease = lease_class(
                owner, rules.clock, key, token, holder, ttl, started, deadline, fence,
                settings.max_hold, keys=slot,
            )  # fmt: skip
            return Attempt(lease)
    if not read.clean:
        yield Ask(undo(), 0.0, wait=False, deliver=True)
    return _why_not(rules, key, terms, results, read)


def admit_steps(
    rules: LockRules, key: str, terms: Terms, holder: str, reserve: bool = False
) -> Steps[float]:
    """One try to start under ``terms`` (a rate): 0.0 when a start was admitted (and
    counted) now; else the seconds until the window admits one (nothing counted) --
    with ``reserve``, until the turn the nodes handed this caller, which comes back
    then. Raises ``QuorumUnavailable`` when too few nodes answered."""
    settings = rules.settings
    assert terms.period is not None
    hold = terms.period * (1 + settings.drift_factor) + RATE_SLACK + CLOCK_PRECISION
    value = new_value(holder)
    undo = functools.partial(drop_permits_command, key, terms, value, hold)
    started = rules.clock()
    start = random.randrange(terms.count)
    # Turns a slot's lifetime / R apart: the pace at which slots really free.
    spacing = hold / terms.count if reserve else 0.0
    command = acquire_permit_command(key, terms, value, hold, False, start, spacing)
    results = yield _ask(rules, command, undo)
    read = yield from _read(rules, key, terms, results, undo)
    if read.slot is not None:
        if read.strays:
            keep = drop_permits_command(key, terms, value, hold, keep=read.slot)
            yield Ask(keep, 0.0, wait=False, deliver=True)
        if rules.clock() - started <= RATE_SLACK:
            return 0.0
        # Too slow to start now: the slot stays counted (it cannot be told apart
        # from a start), and the next try comes at once.
        return CLOCK_PRECISION
    if not read.clean:
        yield Ask(undo(), 0.0, wait=False, deliver=True)
    attempt: Attempt[Any] = _why_not(rules, key, terms, results, read)
    if attempt.unavailable is not None:
        raise attempt.unavailable
    if attempt.verdict == CONTENDED and read.turn is not None:
        return max(read.turn, CLOCK_PRECISION)
    if attempt.verdict == CONTENDED and read.holder_ttl is not None:
        return max(read.holder_ttl, CLOCK_PRECISION)
    return random.uniform(0.5, 1.5) * min(settings.retry_delay, terms.period)


def _ask(rules: LockRules, command: Command, undo: Callable[[], Command]) -> Ask:
    """A permit round: decided once one slot has a quorum, or none can have one."""
    return Ask(
        command, rules.settings.node_timeout, is_permit_granted, undo=undo,
        settled=settled(rules.quorum),
    )  # fmt: skip


def _read(
    rules: LockRules, key: str, terms: Terms, results: list[object],
    undo: Callable[[], Any],
) -> Steps[PermitRound]:  # fmt: skip
    """The round read; callers that disagree on the terms get the round undone and
    ``ConfigurationError``."""
    try:
        return read_permit_round(key, terms, results, rules.quorum)
    except ConfigurationError:
        yield Ask(undo(), 0.0, wait=False, deliver=True)
        raise


def _why_not(
    rules: LockRules, key: str, terms: Terms, results: list[object], read: PermitRound
) -> Attempt[Any]:
    """All taken (``CONTENDED``), a split vote, or an outage (acquire_replies.py)."""
    judged = verdict(
        results, rules.quorum, is_permit_granted, lambda r: "full" if is_full(r) else None
    )
    if judged == UNAVAILABLE:
        errors = {
            address: r
            for address, r in zip(rules.addresses, results)
            if isinstance(r, BaseException)
        }
        failed = QuorumUnavailable(key, errors, rules.quorum)
        return Attempt(unavailable=failed, verdict=UNAVAILABLE)
    if judged == GRANTED:
        judged = SPLIT  # a quorum gave slots, but not one slot (or too late)
    limit = f"{terms}/{terms.count}" if terms.period is None else str(terms)
    contended = judged == CONTENDED
    return Attempt(
        holder=read.holder,
        holder_ttl=read.holder_ttl,
        verdict=judged,
        limit=limit if contended else None,
        refused_on=refused_on(results, is_full) if contended else None,
    )
