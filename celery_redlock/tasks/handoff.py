"""Hand-off to waiting duplicates, the Celery side (``redlock_handoff``).

task.py calls three things here:

- :func:`publish_retry` -- a contended copy's lock retry. With hand-off on it also
  registers the copy as a waiter on the lock nodes (lock/waiters.py) with the message to
  run when woken, publishes its fallback retry as before, and looks at the lock once
  more: a release that came before the registration woke nobody, so it wakes the
  queue itself.
- :func:`claim_copy` -- a copy carrying a waiter id (a wake or a fallback) claims it
  before anything else: the loser stops storing nothing (``Ignore``: the task id's
  result is the winner's), an undecided claim is retried with the same ids (as
  contention when the copies split a quorum of nodes, as an outage when too few
  nodes answered).
- :func:`wake_next` -- after a release, pop the earliest waiter and publish its
  message at once, with a fresh copy id.

The protocol and why it is safe: SAFETY.md, "Hand-off to waiting duplicates". The
queue is a hint: nothing here bears on mutual exclusion (the lock does that) and a
lost wake costs only time (the fallback runs).

Imports lock/waiters.py, headers.py, config.py, errors.py, options.py, redlock.py and Celery;
never task.py.
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
from ..lock.redlock import Redlock
from .config import app_config
from .headers import (
    ARRIVAL_HEADER,
    COPY_HEADER,
    RETRIES_HEADER,
    WAITER_HEADER,
    header,
    kept_headers,
)
from .options import TaskOptions
from .republish import copy_signature, publish_again

__all__ = ["claim_copy", "publish_retry", "wake_next"]

# The name the logger had before the package was split into folders: users filter on it.
logger = logging.getLogger("celery_redlock.waiting")


def _redlock(task: Any, options: TaskOptions) -> Redlock:
    return app_config(task.app).redlock(options.node_timeout, options.fencing)


def claim_copy(
    task: Any, key: str, options: TaskOptions
) -> Optional[Union[QuorumUnavailable, LockContended]]:
    """Claim the waiter id this copy carries, if any: None to go on (no waiter id, or
    won); when the claim is undecided, ``LockContended(split=True)`` if a quorum
    answered (the copies split the nodes: contention, retried), else the
    ``QuorumUnavailable`` naming the silent nodes. Raises ``Ignore`` when the
    waiter's other copy won: this one stores nothing."""
    request = task.request
    waiter, copy = header(request, WAITER_HEADER), header(request, COPY_HEADER)
    request.redlock_claim_undecided = False
    if not waiter or not copy or request.is_eager:
        return None
    redlock = _redlock(task, options)
    verdict, errors = handoff.claim(
        redlock.node_set,
        redlock.quorum,
        key,
        str(waiter),
        str(copy),
        options.handoff_claim_ttl,
        redlock.node_timeout,
    )
    if verdict == handoff.CLAIM_LOST:
        logger.info(
            "hand-off: task %s[%s] key %s: waiter %s already ran as another copy -> dropped",
            task.name, request.id, key, waiter,
        )  # fmt: skip
        raise Ignore(f"hand-off: waiter {waiter} of lock {key} is another copy's")
    if verdict == handoff.CLAIM_WON:
        return None
    request.redlock_claim_undecided = True
    if verdict == handoff.CLAIM_SPLIT:
        return LockContended(key, None, None, split=True)
    return QuorumUnavailable(key, errors or {"claim": "too few nodes answered"}, redlock.quorum)


def publish_retry(
    task: Any, key: str, options: TaskOptions, countdown: float, attempt: int, exc: Exception
) -> Ignore:
    """Publish this task again in ``countdown`` s, counting a lock retry; the
    ``Ignore`` to raise (RETRY is stored first, republish.py).

    Not ``task.retry()``: that would spend the task's own ``max_retries`` budget and
    bump ``request.retries``, which the body may use for its own backoff. With
    hand-off on, the copy also waits in the key's queue (see the module docstring);
    a copy whose claim was undecided keeps its waiter and copy ids instead.
    """
    request = task.request
    headers = kept_headers(request)
    headers[RETRIES_HEADER] = attempt
    keep = bool(getattr(request, "redlock_claim_undecided", False))
    waiter: Optional[str] = None
    if keep:
        headers[WAITER_HEADER] = header(request, WAITER_HEADER)
        headers[COPY_HEADER] = header(request, COPY_HEADER)
    elif options.handoff:
        waiter = headers[WAITER_HEADER] = uuid()
    if keep or waiter is not None:  # a copy that waits again keeps its place
        headers[ARRIVAL_HEADER] = header(request, ARRIVAL_HEADER) or int(time.time() * 1000)
    signature = copy_signature(task, headers)
    if waiter is not None:
        _register(task, key, options, waiter, headers[ARRIVAL_HEADER], signature, countdown)
        headers[COPY_HEADER] = uuid()  # the fallback's own copy id
    ended = publish_again(
        task, signature, headers, countdown, f"lock retry in {countdown:.1f}s", exc
    )
    # The release we wait for may have come before we registered and woken nobody.
    # Only a mutex can be read for that (a limit's permits have no one holder to
    # read); a limited copy's fallback covers it, later.
    if waiter is not None and options.limit == 1 and _lock_looks_free(task, key, options):
        wake_next(task, key, options)
    return ended


def _register(
    task: Any,
    key: str,
    options: TaskOptions,
    waiter: str,
    arrival: int,
    signature: Any,
    countdown: float,
) -> None:
    """Best effort: a copy not registered (or not serialisable as JSON) still has
    its fallback."""
    try:
        message = dumps(dict(signature))  # type: ignore[no-untyped-call]
        redlock = _redlock(task, options)
        handoff.register(
            redlock.node_set, key, waiter, int(arrival), message,
            countdown + options.ttl, redlock.node_timeout,
        )  # fmt: skip
    except Exception:  # the queue is a hint; the fallback is what counts
        logger.debug("hand-off: registering a waiter for %s failed", key, exc_info=True)


def _lock_looks_free(task: Any, key: str, options: TaskOptions) -> bool:
    try:
        return _redlock(task, options).holder(key).holder is None
    except Exception:  # a wake is a hint: when in doubt, leave it to the release
        return False


def wake_next(task: Any, key: str, options: TaskOptions) -> bool:
    """Pop the earliest waiter of ``key`` and publish its message now, with a fresh
    copy id. True when one was published. Never raises: a wake is a hint."""
    if task.app.conf.task_always_eager:
        return False  # no broker: a wake would run the waiter inline, here
    try:
        redlock = _redlock(task, options)
        popped = handoff.pop_next(redlock.node_set, key, redlock.node_timeout)
        if popped is None:
            return False
        signature = task.app.signature(loads(popped.message))  # type: ignore[no-untyped-call]
        headers = dict(signature.options.get("headers") or {})
        headers[COPY_HEADER] = uuid()
        signature.apply_async(headers=headers)
    except Exception:
        logger.warning("hand-off: waking the next waiter of %s failed", key, exc_info=True)
        return False
    return True
