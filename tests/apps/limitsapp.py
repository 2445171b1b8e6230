"""The Celery app that tests/workers/test_limits_workers.py runs in real ``celery
worker`` subprocesses: tasks with ``redlock_limit``, ``redlock_rate`` and
``redlock_cooldown``.

Made by tests/apps/factory.py (environment, observer, task bodies: see there). Every
body is :func:`~tests.apps.factory.pool_body`: it reports its entry, its stay and its
exit to the observer, which is how the tests judge the limit and the rate. Messages
are acknowledged late and rejected when their worker is lost, so a body killed
with its prefork child runs again: every task a test sends ends SUCCESS.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from celery import Celery

from celery_redlock import RedlockTask
from celery_redlock.tasks.options import DEFAULTS
from tests.apps import factory
from tests.apps.factory import observer, pool_body, redlock_task, worker_app

#: At most this many bodies of one tag at once.
LIMIT = 3
#: At most this many starts of one tag per second.
RATE = 20
#: One start per this many seconds per tag (the cooled task), others skipped.
COOLDOWN = 3.0
#: The lease of the limited tasks, seconds: a killed holder's permit frees within it.
TTL = 2.0

#: Prefetch: a gevent worker's consumer raises its prefetch for each countdown it
#: holds only between two reads of the broker (up to 2 s apart), so a low one
#: starves it of the copies that come back (docs/guides/limits.md).
PREFETCH = 4
#: Seconds an unacked message stays invisible. A copy over the rate waits at most
#: half of it for its turn (tasks/limits.py), so the 10 s backlog of the rate test
#: comes back by turns, not capped.
VISIBILITY_TIMEOUT = 30

app = worker_app(
    "limitsapp", 0.05, 0.3, factory.BACKEND_URL, task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=PREFETCH,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)  # fmt: skip

lock_key = partial(factory.lock_key, "lim:{tag}")


class AdmittedTask(RedlockTask):
    """Notes on the observer (``admitted:{counter}``, monotonic ns) the moment its
    ``before_start`` returned: the start was admitted and nothing was awaited since.
    A body may begin later than that under a busy gevent hub, so the rate is judged
    on these times; the bodies' own starts are reported beside them."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        super().before_start(task_id, args, kwargs)
        admitted = time.monotonic_ns()
        if not getattr(self.request, "redlock_skipped", None):
            counter = (kwargs or {}).get("counter", "occ")
            observer().rpush(f"admitted:{counter}", admitted)


def _task(name: str, template: str, **options: Any) -> Any:
    def run(
        self: Any, tag: str, seconds: float = 0.0, counter: str = "occ", cpu: float = 0.0
    ) -> dict[str, Any]:
        return pool_body(self, tag, seconds, counter, cpu)

    return redlock_task(app, name, run, template, **{"redlock_ttl": TTL, **options})


#: N at a time: copies over the limit retry.
limited = _task("limited", "lim:{tag}", redlock_limit=LIMIT)
#: N at a time, and a release runs the earliest waiting copy at once (hand-off), with
#: the lock retries paced as shipped (1 s doubling to 60 s): the fallback is then the
#: safety net it is meant to be. Paced like the app's other tasks (0.05-0.3 s, for the
#: fault tests' pace) every waiter polls some 5 times a second, and on a 2-CPU machine
#: the polls, not the wakes, take most freed permits (docs/guides/limits.md).
limited_handoff = _task(
    "limited_handoff", "limh:{tag}", redlock_limit=LIMIT, redlock_handoff=True,
    redlock_retry_backoff=DEFAULTS["redlock_retry_backoff"],
    redlock_retry_backoff_max=DEFAULTS["redlock_retry_backoff_max"],
)  # fmt: skip
#: N at a time, and a copy over the limit waits in its worker (up to 30 s) for a
#: permit, starting the moment one frees.
limited_waiting = _task(
    "limited_waiting", "limw:{tag}", redlock_limit=LIMIT, redlock_wait_timeout=30
)
#: R starts per second, no limit on how many at once.
rated = _task(
    "rated", "rate:{tag}", base=AdmittedTask, redlock_limit="unlimited",
    redlock_rate=f"{RATE}/s",
)  # fmt: skip
#: One start per COOLDOWN seconds per tag; a copy inside the cooldown is skipped.
cooled = _task(
    "cooled", "cool:{tag}", base=AdmittedTask, redlock_limit="unlimited",
    redlock_cooldown=COOLDOWN, redlock_on_contended="skip",
)  # fmt: skip

#: Queue once, sent by the test's callers through a client task made with the same
#: options (:func:`client_task`): queue once happens in the caller. ``replaced``: a
#: duplicate enqueue replaces the queued copy (a debounce with the callers'
#: countdown); ``until_end``: the place is kept until the run ends.
QUEUE_ONCE_OPTIONS: dict[str, dict[str, Any]] = {
    "replaced": {"redlock_dedupe_queued": True, "redlock_on_queued": "replace"},
    "until_end": {"redlock_dedupe_queued": True, "redlock_queued_until": "end"},
}


def _versioned(
    self: Any, tag: str, version: int, seconds: float = 0.0, counter: str = "repl"
) -> dict[str, Any]:
    observer().hset(f"versions:{counter}", self.request.id, version)
    return pool_body(self, tag, seconds, counter, 0.0)


def _queue_once_task(target: Celery, name: str) -> Any:
    return redlock_task(
        target, name, _versioned, f"{name}:{{tag}}", redlock_ttl=TTL, **QUEUE_ONCE_OPTIONS[name]
    )


replaced = _queue_once_task(app, "replaced")
until_end = _queue_once_task(app, "until_end")


def client_task(name: str, broker_url: str, nodes: list[str]) -> Any:
    """Task ``name`` of :data:`QUEUE_ONCE_OPTIONS` in a caller's process (its body
    never runs there): an app on the test's broker and lock nodes with this app's name
    and key prefix, so its queue places and fates are the workers'."""
    client = factory.worker_app("limitsapp", 0.05, 0.3, backend=broker_url)
    client.conf.update(broker_url=broker_url, redlock_nodes=nodes)
    return _queue_once_task(client, name)
