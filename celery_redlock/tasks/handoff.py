"""Hand-off to waiting duplicates, the Celery side (``redlock_handoff``, on by default).

task.py calls these:

- :func:`publish_retry` -- a contended copy's lock retry. With hand-off on it also
  registers the copy's waiter id on the lock nodes (lock/waiters.py) with the message
  to run when woken -- a copy that already carries a waiter id registers that same
  id again, at its first place -- publishes its fallback retry as before, and wakes
  the queue itself when the registration found the lock (a permit) free on a quorum:
  a release that came before the registration woke nobody.
- :func:`back_in_queue` -- a *woken* copy that did not win the lock (a newcomer took
  it first) registers its waiter id again and ends, storing nothing: its fallback is
  still due and is the one that counts lock retries.
- :func:`claim_copy` -- a copy carrying a waiter id that has *won the lock* claims
  the id: of a waiter's copies (the fallback, each wake) only the first to hold the
  lock and claim runs; a later one gives the lock back and ends storing nothing
  (``Ignore``: the task id's result is the winner's). Claims are made under the lock,
  so they never race: with a minority of nodes down the claim is still decided.
- :func:`settle_by_claim` -- a contended copy carrying a waiter id reads the claim.
  Another copy's for good: the waiter ran (or runs, or gave up) as that copy, and
  this one ends storing nothing -- no retry, no registration, no wake. A claim that
  is (or may be) its own copy id's was won by an earlier delivery of this very
  message that died in the body (SIGKILL, redelivered by ``acks_late``): only this
  message can still run the waiter, so it keeps its ids -- a wake does not go back
  in the queue, a fallback takes no new copy id. A copy whose own claim round was
  undecided keeps its ids for good, reading nothing (its requests may land late).
- :func:`claim_to_give_up` -- a copy carrying a waiter id whose lock retries ran out
  claims the id before it skips or fails (a woken copy may still run the body).
- :func:`wake_next` -- after a release, pop the earliest waiter and publish its
  message at once, with a fresh copy id.

The protocol and why it is safe: SAFETY.md, "Hand-off to waiting duplicates". The
queue is a hint: nothing here bears on mutual exclusion (the lock does that) and a
lost wake costs only time (the fallback runs).

Imports lock/waiters.py, headers.py, config.py, contention.py, errors.py, limits.py,
options.py, republish.py, redlock.py and Celery; never task.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional, Union

from celery.exceptions import Ignore
from celery.utils import uuid
from kombu.utils.json import dumps, loads

from ..errors import LockContended, QuorumUnavailable
from ..lock import waiters as handoff
from ..lock.redlock import Lease, Redlock
from .config import app_config
from .contention import retry_countdown
from .headers import (
    ARRIVAL_HEADER,
    CLAIM_TRIED_HEADER,
    COPY_HEADER,
    IDS_HEADERS,
    RETRIES_HEADER,
    WAITER_HEADER,
    WOKEN_HEADER,
    header,
    kept_headers,
)
from .limits import give_back
from .options import TaskOptions
from .republish import copy_signature, publish_again

__all__ = [
    "back_in_queue",
    "claim_copy",
    "claim_to_give_up",
    "is_woken",
    "publish_retry",
    "settle_by_claim",
    "wake_next",
]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.waiting")


def _redlock(task: Any, options: TaskOptions) -> Redlock:
    return app_config(task.app).redlock(options.node_timeout, options.fencing)


def claim_copy(task: Any, key: str, options: TaskOptions, lease: Optional[Lease]) -> None:
    """Having won the run-time ``lease``, claim the waiter id this copy carries, if
    any. Returns to go on (no waiter id, or won). Otherwise the lease is given back
    first, and then: another copy has the id -> the next waiter is woken and
    ``Ignore`` raised (this copy stores nothing); the claim is undecided ->
    ``LockContended(split=True)`` when a quorum answered, else the
    ``QuorumUnavailable`` naming the silent nodes: retried with the same ids."""
    request = task.request
    waiter, copy = header(request, WAITER_HEADER), header(request, COPY_HEADER)
    if not waiter or not copy or request.is_eager:
        return
    verdict, errors, _ = _claim(task, key, options, str(waiter), str(copy))
    if verdict == handoff.CLAIM_WON:
        return
    give_back(lease, key)
    if verdict == handoff.CLAIM_LOST:
        logger.info(
            "hand-off: task %s[%s] key %s: waiter %s already ran as another copy -> dropped",
            task.name, request.id, key, waiter,
        )  # fmt: skip
        if lease is not None:
            wake_next(task, key, options, settled=True)
        raise Ignore(f"hand-off: waiter {waiter} of lock {key} is another copy's")
    raise _undecided(task, key, options, verdict, errors)


def claim_to_give_up(task: Any, key: str, options: TaskOptions, attempt: int) -> None:
    """A copy carrying a waiter id is about to skip or fail (its lock retries ran
    out): claim the id first, without the lock (a woken copy of the same waiter may
    be about to run the body). Returns when won: give up. Raises ``Ignore`` when
    another copy has the id (it ran, or gave up), and, when undecided, the ``Ignore``
    of this copy published again with the same ids, spending no lock retry."""
    request = task.request
    waiter, copy = header(request, WAITER_HEADER), header(request, COPY_HEADER)
    if not waiter or not copy or request.is_eager:
        return
    verdict, errors, _ = _claim(task, key, options, str(waiter), str(copy))
    if verdict == handoff.CLAIM_WON:
        return
    if verdict == handoff.CLAIM_LOST:
        logger.info(
            "hand-off: task %s[%s] key %s: waiter %s already ran as another copy -> "
            "dropped instead of giving up",
            task.name, request.id, key, waiter,
        )  # fmt: skip
        raise Ignore(f"hand-off: waiter {waiter} of lock {key} is another copy's")
    exc = _undecided(task, key, options, verdict, errors)
    countdown = retry_countdown(attempt, options.retry_backoff, options.retry_backoff_max, None)
    logger.warning(
        "hand-off: task %s[%s] key %s: %s -> cannot give up yet: retry in %.1fs",
        task.name, request.id, key, exc, countdown,
    )  # fmt: skip
    raise publish_retry(task, key, options, countdown, attempt - 1, exc)


def _claim(task: Any, key: str, options: TaskOptions, waiter: str, copy: str) -> handoff.Claim:
    redlock = _redlock(task, options)
    return handoff.claim(
        redlock.node_set, redlock.quorum, key, waiter, copy, options.handoff_claim_ttl,
        redlock.node_timeout,
    )  # fmt: skip


def _undecided(
    task: Any, key: str, options: TaskOptions, verdict: str, errors: dict[str, object]
) -> Union[LockContended, QuorumUnavailable]:
    """An undecided claim as the error a contended copy handles (it keeps its ids).
    Its requests may land after the round: the request now reads as carrying the
    claim-tried header (a worker's request holds headers as attributes), and so does
    every copy published from it -- they keep the ids for good (settle_by_claim)."""
    task.request.redlock_keeps_ids = True
    setattr(task.request, CLAIM_TRIED_HEADER, 1)
    if verdict == handoff.CLAIM_SPLIT:
        return LockContended(key, None, None, split=True)
    quorum = _redlock(task, options).quorum
    return QuorumUnavailable(key, errors or {"claim": "too few nodes answered"}, quorum)


def publish_retry(
    task: Any, key: str, options: TaskOptions, countdown: float, attempt: int, exc: Exception
) -> Ignore:
    """Publish this task again in ``countdown`` s, counting a lock retry; the
    ``Ignore`` to raise (RETRY is stored first, republish.py).

    Not ``task.retry()``: that would spend the task's own ``max_retries`` budget and
    bump ``request.retries``, which the body may use for its own backoff. With
    hand-off on, the copy also waits in the key's queue under its waiter id (see the
    module docstring); a copy whose claim was undecided, or is its own (see
    :func:`settle_by_claim`), keeps its waiter and copy ids instead, and registers
    nothing.
    """
    request = task.request
    headers = kept_headers(request)
    headers[RETRIES_HEADER] = attempt
    keep = bool(getattr(request, "redlock_keeps_ids", False))
    waiter: Optional[str] = None
    if keep:
        for name in IDS_HEADERS:
            if header(request, name):
                headers[name] = header(request, name)
    elif options.handoff:
        waiter = headers[WAITER_HEADER] = header(request, WAITER_HEADER) or uuid()
    if keep or waiter is not None:  # a copy that waits again keeps its place
        headers[ARRIVAL_HEADER] = header(request, ARRIVAL_HEADER) or int(time.time() * 1000)
    signature = copy_signature(task, headers)
    registration = None
    if waiter is not None:
        registration = _register(
            task, key, options, waiter, headers[ARRIVAL_HEADER], signature, countdown
        )
        headers[COPY_HEADER] = uuid()  # the fallback's own copy id
    # A copy that already carries a waiter id has siblings (its wake, its fallback)
    # that may have run and stored SUCCESS by now: RETRY was stored when the waiter
    # was first published, before any sibling existed, and is not stored again.
    shown = None if header(request, WAITER_HEADER) else exc
    ended = publish_again(
        task, signature, headers, countdown, f"lock retry in {countdown:.1f}s", shown
    )
    _look_again(task, key, options, registration)
    return ended


def settle_by_claim(task: Any, key: str, options: TaskOptions) -> None:
    """A contended copy carrying a waiter id reads the waiter's claim (one round):

    - another copy holds it for good (:func:`~celery_redlock.lock.waiters.claimed_by_another`)
      -> ``Ignore``, storing nothing: that copy ran the waiter, runs it or gave it up,
      and this one could only lose the claim -- after taking a lease a waiter needs, had
      it retried (and its wake, had it gone back in the queue). The task id's result is
      that copy's.
    - the claim is, or may be, its own -> it keeps its waiter and copy ids. Only one
      message carries the claim's copy id, and its run died in the body if it meets
      the lock again (the broker delivered it anew: ``acks_late`` with a killed worker
      or pool child, a visibility timeout): every other copy of the waiter would lose
      the claim and be dropped, so the task would never end. Kept, it retries as a
      fallback does, with the same ids, and wins its claim once it wins the lock.

    A read that fails keeps the ids. A copy whose ids already tried a claim that was
    undecided keeps them without reading: its requests may land after any read (a read
    seeing nil on every node, then its late requests naming it on a quorum), so no read
    can rule it out."""
    request = task.request
    waiter, copy = header(request, WAITER_HEADER), header(request, COPY_HEADER)
    if not waiter or not copy or request.is_eager or getattr(request, "redlock_keeps_ids", False):
        return
    if header(request, CLAIM_TRIED_HEADER):
        request.redlock_keeps_ids = True
        return
    try:
        redlock = _redlock(task, options)
        values = handoff.read_claim(redlock.node_set, key, str(waiter), redlock.node_timeout)
    except Exception:  # cannot tell: keeping the ids loses nothing but the queue's hint
        logger.debug("hand-off: reading the claim of %s failed", key, exc_info=True)
        request.redlock_keeps_ids = True
        return
    winner = handoff.claimed_by_another(values, str(copy), redlock.quorum)
    if winner is not None:
        logger.info(
            "hand-off: task %s[%s] key %s: waiter %s already ran as another copy -> dropped",
            task.name, request.id, key, waiter,
        )  # fmt: skip
        raise Ignore(f"hand-off: waiter {waiter} of lock {key} is another copy's")
    if handoff.may_be_mine(values, str(copy), redlock.quorum):
        request.redlock_keeps_ids = True


def is_woken(task: Any) -> bool:
    """This copy is a wake: published by a release, not a countdown."""
    request = task.request
    return bool(header(request, WOKEN_HEADER)) and not request.is_eager


def back_in_queue(
    task: Any, key: str, options: TaskOptions, holder: Optional[str], ttl: Optional[float]
) -> Ignore:
    """A woken copy that did not win the lock (someone took it first): its waiter id
    goes back in the queue at its first place, and the copy ends storing nothing --
    its fallback is still due, and it is that copy that counts lock retries and
    gives up. The ``Ignore`` to raise."""
    request = task.request
    waiter = str(header(request, WAITER_HEADER))
    left = f"{ttl:.1f}s" if ttl is not None else "unknown"
    logger.info(
        "hand-off: task %s[%s] key %s: woken, but held by %s (%s left) -> back in the queue "
        "as waiter %s",
        task.name, request.id, key, holder or "unknown", left, waiter,
    )  # fmt: skip
    headers = kept_headers(request)
    headers[WAITER_HEADER] = waiter
    headers[ARRIVAL_HEADER] = header(request, ARRIVAL_HEADER) or int(time.time() * 1000)
    signature = copy_signature(task, headers)
    registration = _register(
        task, key, options, waiter, headers[ARRIVAL_HEADER], signature,
        options.retry_backoff_max,
    )  # fmt: skip
    _look_again(task, key, options, registration)
    return Ignore(f"hand-off: woken too early, back in the queue of {key}")


def _look_again(
    task: Any, key: str, options: TaskOptions, registration: Optional[handoff.Registration]
) -> None:
    """The release we wait for may have come before we registered and woken nobody:
    the registration read, on each node, whether the lock (a permit) was still taken
    there (lock/waiters.py, ``register``); where a quorum found it free, wake the
    queue ourselves."""
    if registration is not None and registration.free >= _redlock(task, options).quorum:
        wake_next(task, key, options)


def _register(
    task: Any,
    key: str,
    options: TaskOptions,
    waiter: str,
    arrival: int,
    signature: Any,
    countdown: float,
) -> Optional[handoff.Registration]:
    """Best effort: a copy not registered (or not serialisable as JSON) still has
    its fallback; None then."""
    limit = options.limit if isinstance(options.limit, int) else None  # None: unlimited
    try:
        message = dumps(dict(signature))  # type: ignore[no-untyped-call]
        redlock = _redlock(task, options)
        return handoff.register(
            redlock.node_set, key, waiter, int(arrival), message,
            countdown + options.ttl, redlock.node_timeout, limit,
        )  # fmt: skip
    except Exception:  # the queue is a hint; the fallback is what counts
        logger.debug("hand-off: registering a waiter for %s failed", key, exc_info=True)
        return None


def wake_next(task: Any, key: str, options: TaskOptions, *, settled: bool = False) -> bool:
    """Pop the earliest waiter of ``key`` and publish its message now, with a fresh
    copy id. True when one was published. Never raises: a wake is a hint.

    ``settled``: this copy's waiter id is settled (the copy ran under it, or lost its
    claim); that id's entry, if still queued, is popped and dropped: a wake of it
    would only lose its claim."""
    if task.app.conf.task_always_eager:
        return False  # no broker: a wake would run the waiter inline, here
    own = header(task.request, WAITER_HEADER) if settled else None
    try:
        redlock = _redlock(task, options)
        popped = handoff.pop_next(redlock.node_set, key, redlock.node_timeout)
        if popped is not None and own and popped.waiter == own:
            popped = handoff.pop_next(redlock.node_set, key, redlock.node_timeout)
        if popped is None:
            return False
        signature = task.app.signature(loads(popped.message))  # type: ignore[no-untyped-call]
        headers = dict(signature.options.get("headers") or {})
        headers[COPY_HEADER] = uuid()
        headers[WOKEN_HEADER] = 1
        signature.apply_async(headers=headers)
    except Exception:
        logger.warning("hand-off: waking the next waiter of %s failed", key, exc_info=True)
        return False
    return True
