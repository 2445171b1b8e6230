"""Telling "someone holds the lock" from "the vote split", by asking again.

A refusal alone does not prove someone holds the lock: when callers race, the vote
can split so that nobody wins a quorum (one node may be down besides: the round's
verdict is then ``SPLIT``, lock/acquire_replies.py, not an outage), and each
loser's refusals name another loser. A caller that gives up on such a refusal -- a
task that skips, an enqueue that points at a "queued" copy, a beat that leaves a
tick to "another beat" -- drops work nobody does. :func:`acquire_confirmed` trusts
a holder only when a quorum of nodes agrees on it, and otherwise tries again after
a short random pause, until a deadline. :func:`retry_countdown` says how long a
copy that met a held lock waits before it tries again, :func:`verdict` what a
task's copy that met it does, and :func:`report` logs and signals that verdict.

Used by task.py, queue_once.py and beat.py. Imports redlock.py, errors.py,
signals.py and (for types) options.py: no Celery.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import signals
from ..errors import LockContended, QuorumUnavailable
from ..lock.redlock import Lease, Redlock

if TYPE_CHECKING:
    from .options import TaskOptions

__all__ = [
    "Refused",
    "Verdict",
    "acquire_confirmed",
    "acquire_or_contended",
    "retry_countdown",
    "verdict",
]


@dataclass(frozen=True)
class Refused:
    """The lock was not won by the deadline."""

    #: The holder a quorum of nodes agrees on, or None: the vote split until the end.
    holder: Optional[str]
    #: That holder's remaining TTL in seconds, when known.
    ttl: Optional[float]
    #: The last refusal (its holder is one node's word only).
    last: LockContended


def acquire_confirmed(
    redlock: Redlock,
    key: str,
    ttl: Union[float, Callable[[], float]],
    holder: str,
    give_up: float,
    *,
    retry_unavailable: bool = False,
    pause: tuple[float, float] = (0.001, 0.02),
    on_split: Optional[Callable[[], None]] = None,
    limit: int = 1,
) -> Union[Lease, Refused]:
    """Our lease, or :class:`Refused` once a quorum names a holder or ``give_up``
    (``time.monotonic()``) has passed.

    ``ttl``: seconds, or a function giving them for each attempt. ``pause``: the
    range of the random pause between attempts, seconds. ``retry_unavailable``:
    retry QuorumUnavailable too until ``give_up`` (a loaded client can stretch a
    round past ``node_timeout``); else it is raised at once. ``on_split``: called
    before each retry of a split vote (the caller's log line). ``limit``: the key's
    permits (lock/permits.py); all taken on a quorum is a refusal as sure as a
    holder a quorum agrees on.
    """
    while True:
        lease_ttl = ttl() if callable(ttl) else ttl
        try:
            return redlock.try_acquire(
                key, ttl=lease_ttl, blocking=False, holder=holder, limit=limit
            )
        except LockContended as exc:
            if exc.limit is not None:  # every permit taken, on a quorum
                return Refused(exc.holder, exc.ttl, exc)
            # A limited key's other refusal is a split: nobody to ask about.
            info = redlock.holder(key) if limit == 1 else None
            if info is not None and info.holder:
                return Refused(info.holder, info.ttl, exc)
            if time.monotonic() > give_up:
                return Refused(None, None, exc)
            if on_split is not None:
                on_split()
        except QuorumUnavailable:
            if not retry_unavailable or time.monotonic() > give_up:
                raise
        time.sleep(random.uniform(*pause))


#: How long a starting task keeps trying when nobody won the vote (seconds).
SPLIT_VOTE_PATIENCE = 0.5


def acquire_or_contended(
    redlock: Redlock,
    key: str,
    ttl: float,
    holder: str,
    patience: float,
    *,
    retry_unavailable: bool = False,
    limit: int = 1,
) -> Lease:
    """Our lease, or ``LockContended`` naming the holder a quorum agrees on (with a
    ``limit``: every permit taken on a quorum), after trying for at most
    ``patience`` seconds; when none did by then, ``LockContended`` with
    ``split=True`` (and the last refusal's holder, one node's word)."""
    give_up = time.monotonic() + patience
    result = acquire_confirmed(
        redlock, key, ttl, holder, give_up, retry_unavailable=retry_unavailable, limit=limit
    )
    if isinstance(result, Refused):
        raise LockContended(
            key,
            result.holder or result.last.holder,
            result.ttl or result.last.ttl,
            # Nobody holds a quorum: try again, never drop.
            split=result.holder is None and result.last.limit is None,
            limit=result.last.limit,
        )
    return result


#: A contended retry waits at least this fraction of the holder's remaining TTL.
HOLDER_TTL_FRACTION = 0.1
#: ...and never less than this (seconds): a zero countdown would spin on the broker.
MIN_COUNTDOWN = 0.05


def retry_countdown(
    attempt: int,
    backoff: float,
    backoff_max: float,
    holder_ttl: Optional[float],
    rng: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds before lock retry ``attempt`` (1-based): exponential backoff with full
    jitter, at least a fraction of the holder's remaining TTL, capped at ``backoff_max``.

    Full jitter spreads a herd of duplicates over the whole window instead of
    waking them together; the TTL floor keeps them from polling a lock that is
    certainly held for a long while yet.
    """
    ceiling = min(backoff_max, backoff * 2 ** (attempt - 1))
    countdown = rng(0.0, ceiling)
    if holder_ttl is not None and holder_ttl > 0:
        countdown = max(countdown, holder_ttl * HOLDER_TTL_FRACTION)
    return min(backoff_max, max(MIN_COUNTDOWN, countdown))


@dataclass(frozen=True)
class Verdict:
    """What a task's copy that met a held lock (or no quorum) does next."""

    #: "retry" (published again after ``countdown``), "skip" or "fail".
    action: str
    #: Seconds before the retry; None unless retrying.
    countdown: Optional[float]
    #: The log line's words for it, e.g. "retry in 1.2s (attempt 2/5)".
    then: str
    #: The lock retries ran out (``on_retries_exhausted`` chose the action).
    exhausted: bool


def verdict(
    options: TaskOptions,
    attempt: int,
    holder_ttl: Optional[float],
    *,
    outage: bool,
    eager: bool,
    eager_left: Optional[float],
    split: bool = False,
) -> Verdict:
    """Lock retry ``attempt`` (1-based) of a copy that met a held lock (``outage``: no
    quorum answered; ``split``: a quorum answered but nobody holds the lock): the
    task's ``on_contended`` while retries last, then its ``on_retries_exhausted``. A
    split and an outage are always retried -- skipping would drop a copy that nobody
    runs, as if someone held the lock -- and an outage that outlasts the retries
    fails (``QuorumUnavailable``), never skips. ``eager``: the caller waits inline --
    an outage fails at once, and the wait ends when ``eager_left`` (seconds, None:
    its bound has passed) runs out."""
    if outage and split:
        raise ValueError("a copy's lock round is an outage or a split vote, not both")
    action = "retry" if split or outage else options.on_contended
    if action == "retry" and eager and outage:
        action = "fail"  # an outage surfaces at once: the caller is waiting inline
    exhausted = action == "retry" and (
        attempt > options.max_retries or (eager and eager_left is None)
    )
    if exhausted:
        action = "fail" if outage else options.on_retries_exhausted
    countdown = None
    if action == "retry":
        countdown = retry_countdown(
            attempt, options.retry_backoff, options.retry_backoff_max, holder_ttl
        )
        if eager_left is not None:  # the last try comes just after the wait's bound
            countdown = min(countdown, max(0.0, eager_left) + MIN_COUNTDOWN)
        then = f"retry in {countdown:.1f}s (attempt {attempt}/{options.max_retries})"
    elif exhausted:
        then = f"{'skipped' if action == 'skip' else 'failed'} (lock retries exhausted)"
    else:
        then = "skipped" if action == "skip" else "failed"
    return Verdict(action, countdown, then, exhausted)


# The name the task's own lines go under: users filter on it.
logger = logging.getLogger("celery_redlock.task")


def report(
    task: Any,
    key: str,
    exc: Exception,
    holder: Optional[str],
    ttl: Optional[float],
    decided: Verdict,
    attempt: int,
) -> None:
    """Log the copy's ``decided`` verdict on meeting ``exc`` (an outage at ERROR,
    contention at WARNING) and send ``lock_contended``."""
    request = task.request
    split = isinstance(exc, LockContended) and exc.split
    left = f"{ttl:.1f}s" if ttl is not None else "unknown"
    who, then = holder or "unknown", decided.then
    if isinstance(exc, QuorumUnavailable):
        logger.error(
            "lock nodes unavailable: task %s[%s] key %s: %s -> %s",
            task.name, request.id, key, exc, then,
        )  # fmt: skip
    elif split:
        logger.warning(
            "lock contended: task %s[%s] key %s: vote split, nobody holds a quorum "
            "(last refused by %s) -> %s",
            task.name, request.id, key, who, then,
        )  # fmt: skip
    elif isinstance(exc, LockContended) and exc.limit:
        logger.warning(
            "lock contended: task %s[%s] key %s: %s taken by %s and others (one frees "
            "in %s) -> %s",
            task.name, request.id, key, exc.limit, who, left, then,
        )  # fmt: skip
    else:
        logger.warning(
            "lock contended: task %s[%s] key %s held by %s (%s left) -> %s",
            task.name, request.id, key, who, left, then,
        )  # fmt: skip
    signals.lock_contended.send(
        sender=task, task_id=request.id, key=key, holder=holder, ttl=ttl,
        action=decided.action, countdown=decided.countdown,
        attempt=attempt if decided.action == "retry" else None,
        limit=exc.limit if isinstance(exc, LockContended) else None,
    )  # fmt: skip
