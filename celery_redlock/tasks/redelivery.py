"""A copy that meets its own task id's lock: a redelivery, waiting for the run before it.

Celery hands a message out again while -- or after -- an earlier delivery of the same
task id ran it: the broker's visibility timeout passed while the body still ran, or
the pool child running it was killed and ``task_reject_on_worker_lost`` requeued it.
The copy meets the run-time lock held under its own task id, and the lock alone
cannot say which case it is: a live run renews its lease, a dead one's lease runs out
within ``redlock_ttl``. Dropping the copy would lose a task whose run died (it stays
PENDING forever), so in every ``redlock_on_contended`` mode the copy waits instead,
spending no lock retry and storing no state (the state is the earlier run's):
:func:`wait_for_earlier_run` brings it back once the earlier lease would have run
out. A timeline, skip mode, acks_late and reject_on_worker_lost::

    t0   delivery 1 of task X wins the lock        lock = X@w1, ttl 30 s, renewed
    t5   its pool child is SIGKILLed               nothing released; X requeued
    t5   delivery 2 of X meets X@w1 (25 s left)    waits: back in ~25 s
    t30  the lease runs out; delivery 2 wins it    X is not finished -> runs the body

When it wins the lock, the earlier run has released it -- after storing its result,
which Celery does before ``after_return`` -- or has died. :func:`drop_if_finished_earlier`
reads the result backend: a ready state (SUCCESS, FAILURE, ...) is the earlier run's
and the copy is dropped storing nothing; otherwise the earlier run died, and the copy
runs. Without a stored result (no result backend, ``ignore_result``) a finished run
cannot be told from a dead one and the copy runs again: at least once, never beside
the earlier run.

A copy can also come back after its earlier run has finished and released: the
worker died after the body returned but before its late ack reached the broker (a
gevent or eventlet worker sends acks from its loop, up to a second or two later), so
the broker hands the message out again once ``visibility_timeout`` has passed; or the
worker died between publishing a retry copy and acking the message it retried, so
two copies of one task id are alive. Such a copy meets no lease. It says so itself:
the broker marks a message it hands out again (``redelivered``), a retry carries its
count, and a copy the lock published again its header. Those copies, too, read the
stored state once they hold the lease, and are dropped when the task id already
finished::

    t0   w1 runs X, stores SUCCESS, queues its ack   w1 SIGKILLed before sending it
    t60  X handed out again (redelivered) to w2       w2 wins the lease, reads SUCCESS:
                                                      dropped, the body does not run twice

Imports headers.py, limits.py, options.py, queue_once.py, republish.py, signals.py, skipped.py,
the lock and Celery; never task.py.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Optional

from celery import states
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore

from .. import signals
from ..lock.redlock import Lease
from ..skipped import is_replaced
from . import queue_once
from .headers import (
    AGAIN_HEADER,
    COPY_HEADER,
    EARLIER_RUN_HEADER,
    IDS_HEADERS,
    header,
    kept_headers,
)
from .limits import give_back, longest_countdown
from .options import TaskOptions
from .republish import copy_signature, publish_again

__all__ = ["drop_if_finished_earlier", "is_earlier_run", "wait_for_earlier_run"]

# The name the task's own lines go under: users filter on it.
logger = logging.getLogger("celery_redlock.task")

#: A waiting copy comes back this share of the earlier lease's TTL after it would
#: have run out (at random up to it), so copies of one task do not come back at once.
EARLIER_RUN_SPREAD = 0.1


def is_earlier_run(task: Any, holder: Optional[str]) -> bool:
    """``holder`` (a lock's holder) is another delivery of this very task id."""
    return (holder or "").startswith(f"{task.request.id}@")


def wait_for_earlier_run(
    task: Any, key: str, options: TaskOptions, holder: str, ttl: Optional[float]
) -> Ignore:
    """Log, signal and publish this copy again for when the earlier run's lease
    (``ttl`` s left, as a quorum reported it) would have run out; the ``Ignore`` to
    raise. A live earlier run renews it meanwhile, and the copy waits again."""
    request = task.request
    left = ttl if ttl is not None and ttl > 0 else options.ttl
    countdown = left + random.uniform(0.0, options.ttl * EARLIER_RUN_SPREAD)
    countdown = min(countdown, longest_countdown(task.app))
    logger.warning(
        "lock contended: task %s[%s] key %s held by %s (%.1fs left), an earlier delivery "
        "of this task id -> waits for it: back in %.1fs (no lock retry spent)",
        task.name, request.id, key, holder, left, countdown,
    )  # fmt: skip
    signals.lock_contended.send(
        sender=task, task_id=request.id, key=key, holder=holder, ttl=ttl, action="wait",
        countdown=countdown, attempt=None,
    )  # fmt: skip
    headers = kept_headers(request)
    headers[EARLIER_RUN_HEADER] = 1
    # A hand-off copy keeps its waiter and copy ids: the earlier delivery may be its
    # sibling (the wake or the fallback of the same waiter), and the claim, not only
    # the stored state, must still tell them apart (no result backend, ignore_result).
    for name in IDS_HEADERS:
        if header(request, name):
            headers[name] = header(request, name)
    why = f"waiting for an earlier delivery of this task: back in {countdown:.1f}s"
    return publish_again(task, copy_signature(task, headers), headers, countdown, why, None)


def drop_if_finished_earlier(
    task: Any, key: str, options: TaskOptions, lease: Optional[Lease]
) -> None:
    """A copy that once met its own task id's lock, or says it may be a second copy
    (redelivered, a retry, published again), and has now won ``lease``: raise
    ``Ignore`` (the lease and queue place given back) when an earlier delivery stored
    a ready state; return to run the body (nothing finished, or nothing can tell)."""
    request = task.request
    if request.is_eager or lease is None:
        return
    # A copy that waited for its own id's lease reads the state in any case (its
    # warning says when it cannot); one that only says it may be a second copy, only
    # where a finished run leaves a state.
    earlier_run = header(request, EARLIER_RUN_HEADER)
    if not (earlier_run or (_may_have_run_before(request) and _stores_results(task))):
        return
    state, result = _stored_meta(task)
    if state not in states.READY_STATES:
        return
    if not earlier_run and is_replaced(result):
        return  # replaced in the queue, not run: replace.py ends it, naming its successor
    logger.warning(
        "task %s[%s] key %s: an earlier delivery of this task id already finished (%s) "
        "-> this copy is dropped",
        task.name, request.id, key, state,
    )  # fmt: skip
    give_back(lease, key)
    queue_once.hand_back(task, key, options)
    raise Ignore(f"an earlier delivery of this task already finished ({state})")


def _may_have_run_before(request: Any) -> bool:
    """The message says it may be a second copy: the broker handed it out again, or it
    was published again -- by the task's own retry, by the lock, or as a hand-off wake
    -- while the message it replaced may have stayed unacked with a dying worker."""
    delivery = getattr(request, "delivery_info", None) or {}
    redelivered = delivery.get("redelivered") or header(request, "redelivered")
    again = header(request, AGAIN_HEADER) or header(request, COPY_HEADER)
    return bool(redelivered or again or request.retries)


def _stores_results(task: Any) -> bool:
    """A finished run of this task leaves a state to read (a backend, results kept)."""
    ignored = task.ignore_result or getattr(task.request, "ignore_result", False)
    return not ignored and not isinstance(task.backend, DisabledBackend)


def _stored_meta(task: Any) -> tuple[Optional[str], Any]:
    """The task id's stored state and result; (None, None) when none can be read."""
    request = task.request
    try:
        meta = task.backend.get_task_meta(request.id)
        return str(meta.get("status")), meta.get("result")
    except Exception:  # no backend (NotImplementedError), or it is down: run
        logger.warning(
            "task %s[%s]: cannot read whether an earlier delivery finished; running it",
            task.name, request.id, exc_info=True,
        )  # fmt: skip
        return None, None
