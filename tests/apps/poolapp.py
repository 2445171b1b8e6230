"""The Celery app that tests/workers/test_pools.py runs in real ``celery worker``
subprocesses of every pool: prefork, solo, threads, gevent and eventlet.

Made by tests/apps/factory.py (environment, observer, task bodies: see there). Two
kinds of body, both :func:`~tests.apps.factory.pool_body`: ``hold`` sleeps (it
yields to the hub under gevent and eventlet); with ``cpu=`` it computes without
yielding for as long as it is told (a CPU-bound task). Every task reports how long
its acquire took (``acquire:{counter}``, :class:`~tests.apps.factory.TimedRedlockTask`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tests.apps import factory
from tests.apps.factory import TimedRedlockTask, pool_body, redlock_task, worker_app

KEY_TEMPLATE = "pool:{tag}"
#: The lease of every task here, seconds: the watchdog renews it at ttl/3.
TTL = 2.0
#: The hard time limit of ``hold_limited``, seconds.
TIME_LIMIT = 2.0

app = worker_app("poolapp", 0.05, 0.5, task_create_missing_queues=True)


#: The lock key every task here takes for a tag.
lock_key = partial(factory.lock_key, KEY_TEMPLATE)


def _task(name: str, **options: Any) -> Any:
    def run(
        self: TimedRedlockTask,
        tag: str,
        seconds: float = 0.0,
        counter: str = "occ",
        cpu: float = 0.0,
        beat: bool = False,
    ) -> dict[str, Any]:
        return pool_body(self, tag, seconds, counter, cpu, beat)

    return redlock_task(
        app, name, run, KEY_TEMPLATE, base=TimedRedlockTask, **{"redlock_ttl": TTL, **options}
    )


#: Retries while the key is held.
hold = _task("hold")
#: Fails with LockContended while the key is held.
hold_fail = _task("hold_fail", redlock_on_contended="fail")
#: A 60 s lease: if it is gone right after a warm shutdown, it was released.
hold_long_ttl = _task("hold_long_ttl", redlock_ttl=60.0)
#: Killed by a hard time limit (prefork: SIGKILL of the child; gevent: a Timeout).
hold_limited = _task("hold_limited", time_limit=TIME_LIMIT)
