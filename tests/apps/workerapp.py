"""The Celery app that the real ``celery worker`` subprocesses of
tests/workers/test_celery_workers.py and test_rabbitmq.py run.

Made by tests/apps/factory.py (environment, observer, task bodies: see there). Every
task below locks ``redlock:hold:{tag}``, so tasks of different names contend; its
body is :func:`~tests.apps.factory.occupy`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

from celery.exceptions import MaxRetriesExceededError

from celery_redlock import RedlockTask
from tests.apps import factory
from tests.apps.factory import BACKEND_URL, occupy, occupy_task, redlock_task, worker_app

KEY_TEMPLATE = "hold:{tag}"
#: Lock retry pacing: short, so that contention tests finish in seconds.
RETRY_BACKOFF = 0.05
RETRY_BACKOFF_MAX = 0.5

app = worker_app(
    "workerapp",
    RETRY_BACKOFF,
    RETRY_BACKOFF_MAX,
    backend=BACKEND_URL,
    task_create_missing_queues=True,
    # Only acks_late tasks look at it: a SIGKILLed child's message is requeued.
    task_reject_on_worker_lost=True,
)


#: The lock key every task here takes for a tag.
lock_key = partial(factory.lock_key, KEY_TEMPLATE)


_occupy_task = partial(occupy_task, app, key_template=KEY_TEMPLATE)


#: Retries while the key is held (the default contention mode).
hold = _occupy_task("hold", redlock_ttl=2.0)
#: Retries every 50 ms: it wins a freed lock before ``hold`` (and a redelivery) do.
hold_fast_retry = _occupy_task(
    "hold_fast_retry", redlock_ttl=2.0, redlock_retry_backoff=0.02, redlock_retry_backoff_max=0.05
)
#: Fails with LockContended while the key is held.
hold_fail = _occupy_task("hold_fail", redlock_ttl=2.0, redlock_on_contended="fail")
#: Skipped (SUCCESS, the skipped marker as its result) while the key is held.
hold_skip = _occupy_task("hold_skip", redlock_ttl=2.0, redlock_on_contended="skip")
#: A 1 s lease: only the watchdog keeps it through a longer body.
hold_ttl1 = _occupy_task("hold_ttl1", redlock_ttl=1.0)
#: A 1.5 s lease, for losing the quorum mid-task.
hold_ttl15 = _occupy_task("hold_ttl15", redlock_ttl=1.5)
#: Acked after it returns; a lost child's message is requeued (task_reject_on_worker_lost).
hold_acks_late = _occupy_task("hold_acks_late", redlock_ttl=2.0, acks_late=True)


def _handoff(self: RedlockTask, tag: str) -> dict[str, Any]:
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    lease = self.redlock
    return {"retries": self.request.retries, "held": lease is not None and lease.held}


#: Retries itself once, at once, while holding the lock.
handoff = redlock_task(app, "handoff", _handoff, KEY_TEMPLATE, redlock_ttl=30)


def _fallback_when_retries_run_out(
    self: RedlockTask,
    tag: str,
    seconds: float,
    counter: str = "occ",
    until: Optional[str] = None,
) -> dict[str, Any]:
    try:
        self.retry(countdown=0, max_retries=0)  # no retry left: Celery raises, publishes none
    except MaxRetriesExceededError:
        # The usual fallback: no retry left, so finish (or clean up) here, still locked.
        return occupy(self, tag, seconds, counter, until=until)
    raise AssertionError("Task.retry always raises with throw=True")


#: Calls self.retry() with no retry left and does its work in the fallback.
retry_exhausted = redlock_task(
    app, "retry_exhausted", _fallback_when_retries_run_out, KEY_TEMPLATE, redlock_ttl=30
)
