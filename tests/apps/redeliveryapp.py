"""The Celery app that the ``celery worker`` subprocesses of test_redelivery run.

Made by tests/apps/factory.py, like tests/apps/workerapp.py, and its task bodies are
workerapp's (:func:`~tests.apps.factory.occupy`): they report occupancy, executions
per task id and monotonic intervals to the observer Redis, which the lock never sees.

What differs from workerapp is the broker: the Redis transport's
``visibility_timeout`` is 2 s, and unacked messages are swept every second (kombu
sweeps every 10 s x 10 calls by default), so an ``acks_late`` message whose task
runs longer than 2 s is handed to another worker while the first still runs it.
Workers run with ``worker_prefetch_multiplier = 1``: a busy ``-c 1`` worker has its
one unacked message and takes no other, so the redelivery goes to the idle worker.

Lock retries are kept short (at most 0.3 s): a retry waiting for its ETA is an
unacked message too, and one held past the visibility timeout would be duplicated.
"""

from __future__ import annotations

from functools import partial

from tests.apps import factory
from tests.apps.factory import occupy_task, worker_app

#: Every task below locks ``redlock:hold:{tag}``, as workerapp's do.
KEY_TEMPLATE = "hold:{tag}"
#: Seconds an unacked message stays invisible before the broker hands it out again.
VISIBILITY_TIMEOUT = 2
#: Lock retry pacing (seconds): far below the visibility timeout.
RETRY_BACKOFF = 0.05
RETRY_BACKOFF_MAX = 0.3

app = worker_app(
    "redeliveryapp",
    RETRY_BACKOFF,
    RETRY_BACKOFF_MAX,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    worker_prefetch_multiplier=1,
    task_create_missing_queues=True,
)


#: The lock key every task here takes for a tag.
lock_key = partial(factory.lock_key, KEY_TEMPLATE)


_occupy_task = partial(occupy_task, app, key_template=KEY_TEMPLATE)


#: Retries while the key is held; a 2 s lease renewed by the watchdog.
hold = _occupy_task("hold", redlock_ttl=2.0)
#: Acked after it returns, so a run longer than the visibility timeout is redelivered.
long_acks_late = _occupy_task("long_acks_late", redlock_ttl=2.0, acks_late=True)
#: The same, skipping a duplicate that meets the lock instead of retrying it.
long_acks_late_skip = _occupy_task(
    "long_acks_late_skip", redlock_ttl=2.0, acks_late=True, redlock_on_contended="skip"
)
#: Requeued when its pool child dies (reject_on_worker_lost), skipping duplicates; a
#: 6 s lease, so the requeued copy surely meets the dead run's lease.
killed_skip = _occupy_task(
    "killed_skip", redlock_ttl=6.0, acks_late=True, reject_on_worker_lost=True,
    redlock_on_contended="skip",
)  # fmt: skip
#: SoftTimeLimitExceeded is raised in the body after 1 s; a 30 s lease.
soft_limited = _occupy_task("soft_limited", redlock_ttl=30.0, soft_time_limit=1.0)
#: The child is SIGKILLed after 1 s (hard limit); a 3 s lease.
hard_limited = _occupy_task("hard_limited", redlock_ttl=3.0, time_limit=1.0)
