"""The Celery app that test_handoff_workers runs in real prefork ``celery worker``
subprocesses: same-key tasks with hand-off to waiting duplicates on and off.

Configured from the environment like tests/apps/poolapp.py (``BROKER_URL``,
``REDLOCK_NODES``, ``OBSERVER_URL``), whose body (occupancy, runs, starts, intervals on
the observer, a Redis the lock never sees) it reuses. It also counts, on the observer,
every task message a worker publishes (lock retries, fallbacks, wakes):
``published:{counter}``, from Celery's ``after_task_publish`` signal.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import after_task_publish

from tests.apps.poolapp import BROKER_URL, REDLOCK_NODES, TimedRedlockTask, body
from tests.apps.workerapp import observer

KEY_TEMPLATE = "handoff:{tag}"
KEY_PREFIX = "redlock"
#: The lease of every task here, seconds (a SIGKILLed holder's lock frees within it).
TTL = 2.0

app = Celery("handoffapp", broker=BROKER_URL, backend=BROKER_URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    redlock_nodes=REDLOCK_NODES,
    redlock_key_prefix=KEY_PREFIX,
    redlock_retry_backoff=1.0,
    redlock_retry_backoff_max=4.0,
    redlock_max_retries=10_000,
)


def _task(name: str, **options: Any) -> Any:
    def run(
        self: TimedRedlockTask, tag: str, seconds: float = 0.0, counter: str = "occ"
    ) -> dict[str, Any]:
        return {**body(self, tag, seconds, counter, 0.0), "task_id": self.request.id}

    run.__name__ = name
    return app.task(
        name=f"handoffapp.{name}",
        shared=False,
        bind=True,
        base=TimedRedlockTask,
        redlock_key=KEY_TEMPLATE,
        redlock_ttl=TTL,
        **options,
    )(run)


#: Same-key tasks with hand-off to waiting duplicates.
handoff = _task("handoff", redlock_handoff=True)
#: The same without it (fallback retries only), for the figures.
plain = _task("plain", redlock_handoff=False)


def _count_published(sender: Any = None, body: Any = None, **_: Any) -> None:
    if not str(sender or "").startswith("handoffapp."):
        return
    kwargs = body[1] if isinstance(body, (list, tuple)) and len(body) > 1 else {}
    counter = (kwargs or {}).get("counter")
    if counter:
        observer().incr(f"published:{counter}")


after_task_publish.connect(_count_published, weak=False)
