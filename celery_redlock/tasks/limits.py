"""Limits and rates for tasks, the Celery side (``redlock_limit``, ``redlock_rate``).

task.py calls two things here, in this order, before a body starts:

- :func:`take_lease` -- the run-time lease: the key's mutex (``redlock_limit=1``,
  the default), one of its N permits (``redlock_limit=N``, lock/permits.py), or
  none (``"unlimited"``, a rate only). A refusal is ``LockContended`` as ever, its
  ``limit`` naming what was reached; task.py retries, skips or fails the copy.
- :func:`admit_start` -- a start under ``redlock_rate``: counted on the nodes and
  the body runs, or the copy comes back when the window admits it. A copy over the
  rate is never skipped or failed for it and spends no lock retry: it is published
  again (same task id, same lock-retry count) with a countdown to the turn the
  nodes handed it (``Redlock.admit(reserve=True)``: turns a slot's lifetime / R
  apart), so copies refused together come back at the rate, not all together --
  never later than half the broker's visibility timeout (a message held longer is
  handed out again: a second copy), when it is told a new turn. Eager mode waits
  inline.

The permit is taken before the start is counted: a start counted for a copy that
then found every permit taken would be a place in the window nobody used.

Imports lock/redlock.py, lock/permits.py, contention.py, headers.py, options.py,
signals.py, errors.py and Celery; never task.py.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Optional

from celery.exceptions import Ignore

from .. import signals
from ..errors import LockContended, RedlockError
from ..lock.permits import Terms
from ..lock.redlock import Lease, Redlock
from ..lock.validate import UNLIMITED
from .contention import acquire_or_contended
from .headers import kept_headers
from .options import TaskOptions
from .republish import copy_signature, publish_again

__all__ = [
    "LONGEST_COUNTDOWN",
    "RATE_SPREAD",
    "admit_start",
    "give_back",
    "longest_countdown",
    "take_lease",
]

# The name the task's own lines go under: users filter on it.
logger = logging.getLogger("celery_redlock.task")

#: A copy over the rate comes back at the turn the nodes handed it (turns are a
#: slot's lifetime / R apart, so a backlog comes back at the rate, not at once),
#: plus a random share of one spacing up to this fraction.
RATE_SPREAD = 0.5


def take_lease(
    redlock: Redlock, key: str, options: TaskOptions, holder: str, patience: float,
    wait: float = 0.0,
) -> Optional[Lease]:  # fmt: skip
    """The run-time lease (None with ``redlock_limit="unlimited"``); raises
    ``LockContended`` or ``QuorumUnavailable`` when not won. ``wait``
    (``redlock_wait_timeout``): first wait up to that long for it here, woken the
    moment it frees (the lock's blocking acquire). Then retrying copies make one
    attempt; skipping or failing ones make sure first (contention.py)."""
    if options.limit == UNLIMITED:
        return None
    limit = int(options.limit)
    if wait > 0:
        try:
            return redlock.try_acquire(
                key, ttl=options.ttl, timeout=wait, holder=holder, limit=limit
            )
        except LockContended:
            if options.on_contended == "retry":
                raise  # waited its time: retried as any contended copy
    if options.on_contended == "retry":
        return redlock.try_acquire(key, ttl=options.ttl, blocking=False, holder=holder, limit=limit)
    # A loaded worker can stretch a round past node_timeout: an "outage" seen then is
    # tried again for the same patience as a split, before it is retried later.
    return acquire_or_contended(
        redlock, key, options.ttl, holder, patience, retry_unavailable=True, limit=limit
    )


def admit_start(
    task: Any, key: str, options: TaskOptions, redlock: Redlock, holder: str,
    lease: Optional[Lease],
) -> None:  # fmt: skip
    """Count this start under the task's rate, or bring the copy back when the
    window admits it (``Ignore``, published again; ``lease`` released first). Raises
    ``QuorumUnavailable`` (``lease`` released) when too few nodes answered."""
    if options.rate is None:
        return
    request = task.request
    try:
        wait = redlock.admit(
            key, options.rate, holder=holder, timeout=None if request.is_eager else 0,
            reserve=True,
        )  # fmt: skip
    except RedlockError:
        give_back(lease, key)
        raise
    if wait == 0.0:
        return
    give_back(lease, key)
    terms = str(Terms.rate(options.rate))
    count, period = options.rate
    countdown = wait + random.uniform(0.0, period / count * RATE_SPREAD)
    # Held past the broker's visibility timeout, a countdown is handed out again (a
    # second copy): come back earlier and be told a new turn instead.
    countdown = min(countdown, longest_countdown(task.app))
    logger.info(
        "rate reached: task %s[%s] key %s: %s, next start in %.1fs -> comes back in %.1fs",
        task.name, request.id, key, terms, wait, countdown,
    )  # fmt: skip
    signals.lock_contended.send(
        sender=task, task_id=request.id, key=key, holder=None, ttl=wait, action="wait",
        countdown=countdown, attempt=None, limit=terms,
    )  # fmt: skip
    raise _come_back(task, countdown, LockContended(key, None, wait, limit=terms))


#: The longest countdown a copy over the rate is given, whatever its turn: RabbitMQ
#: closes a channel holding an unacked message 30 minutes (its default
#: ``consumer_timeout``), and a worker holds a countdown's message unacked.
LONGEST_COUNTDOWN = 25 * 60.0


def longest_countdown(app: Any) -> float:
    """How long a copy may wait in a worker for its countdown without the broker
    handing its message out again: half the Redis/SQS ``visibility_timeout`` (kombu's
    default: one hour), at most ``LONGEST_COUNTDOWN``."""
    options = app.conf.broker_transport_options or {}
    try:
        visibility = float(options.get("visibility_timeout", 3600))
    except (TypeError, ValueError):
        visibility = 3600.0
    return max(0.05, min(visibility / 2, LONGEST_COUNTDOWN))


def give_back(lease: Optional[Lease], key: str) -> None:
    """Give the permit back before leaving (it would free at its TTL anyway)."""
    if lease is None:
        return
    try:
        lease.release()
    except Exception:
        logger.warning("releasing lock %s failed; it expires within its TTL", key, exc_info=True)


def _come_back(task: Any, countdown: float, exc: LockContended) -> Ignore:
    """Publish this copy again in ``countdown`` s: same task id, same headers (its
    lock retries unspent), without a hand-off waiter's ids (those were this
    message's own)."""
    headers = kept_headers(task.request)
    signature = copy_signature(task, headers)
    why = f"comes back in {countdown:.1f}s"
    return publish_again(task, signature, headers, countdown, why, exc)
