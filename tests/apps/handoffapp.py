"""The Celery app that tests/workers/test_handoff_workers.py runs in real
``celery worker`` subprocesses: same-key tasks with hand-off to waiting duplicates on
and off.

Made by tests/apps/factory.py; the body is poolapp's
(:func:`~tests.apps.factory.pool_body`: occupancy, runs, starts, intervals on the
observer, a Redis the lock never sees). It also counts, on the observer, every task
message a worker publishes (lock retries, fallbacks, wakes): ``published:{counter}``,
from Celery's ``after_task_publish`` signal.
"""

from __future__ import annotations

from typing import Any

from celery.signals import after_task_publish

from tests.apps.factory import TimedRedlockTask, observer, pool_body, redlock_task, worker_app

KEY_TEMPLATE = "handoff:{tag}"
#: The lease of every task here, seconds (a SIGKILLed holder's lock frees within it).
TTL = 2.0

app = worker_app("handoffapp", 1.0, 4.0)


def _task(name: str, **options: Any) -> Any:
    def run(
        self: TimedRedlockTask, tag: str, seconds: float = 0.0, counter: str = "occ"
    ) -> dict[str, Any]:
        return {**pool_body(self, tag, seconds, counter, 0.0), "task_id": self.request.id}

    return redlock_task(
        app, name, run, KEY_TEMPLATE, base=TimedRedlockTask, redlock_ttl=TTL, **options
    )


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
