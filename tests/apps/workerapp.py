"""The Celery app that the real ``celery worker`` subprocesses of test_celery_workers run.

Configured from the environment, so one module serves every test's servers:

- ``BROKER_URL``: broker and result backend (a redis-server of the test's own);
- ``BACKEND_URL``: the result backend when the broker is not Redis (RabbitMQ);
- ``REDLOCK_NODES``: the lock nodes, comma-separated Redis URLs;
- ``OBSERVER_URL``: a third Redis the task bodies report to. The lock never sees it:
  it is the independent witness that checks the lock's promises.

Every task body (see :func:`occupy`) writes to the observer, under its ``counter``:

- ``occ:{counter}`` / ``max:{counter}``: occupancy, INCR on entry and DECR on exit, and
  the highest value ever seen (it must stay 1 for one key);
- ``runs:{counter}``: hash, task id -> executions of the body;
- ``effects:{counter}``: hash, task id -> bodies that ran to the end (the "effect");
- ``starts:{counter}``: list of ``"task_id pid start_ns"``, pushed on entry (the test
  finds the pid of the prefork child to SIGKILL here);
- ``intervals:{counter}``: list of ``"task_id pid start_ns end_ns"``, pushed on exit.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on
the machine, so intervals from different workers compare directly.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery
from celery.exceptions import MaxRetriesExceededError

from celery_redlock import RedlockTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
BACKEND_URL = os.environ.get("BACKEND_URL", BROKER_URL)
OBSERVER_URL = os.environ.get("OBSERVER_URL", BROKER_URL)
REDLOCK_NODES = [
    url.strip() for url in os.environ.get("REDLOCK_NODES", BROKER_URL).split(",") if url.strip()
]

#: Every task below locks ``redlock:hold:{tag}``: tasks of different names contend.
KEY_TEMPLATE = "hold:{tag}"
KEY_PREFIX = "redlock"
#: Lock retry pacing: short, so that contention tests finish in seconds.
RETRY_BACKOFF = 0.05
RETRY_BACKOFF_MAX = 0.5

app = Celery("workerapp", broker=BROKER_URL, backend=BACKEND_URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_create_missing_queues=True,
    redlock_nodes=REDLOCK_NODES,
    redlock_key_prefix=KEY_PREFIX,
    redlock_retry_backoff=RETRY_BACKOFF,
    redlock_retry_backoff_max=RETRY_BACKOFF_MAX,
    redlock_max_retries=10_000,
    # Only acks_late tasks look at it: a SIGKILLed child's message is requeued.
    task_reject_on_worker_lost=True,
)


def lock_key(tag: str) -> str:
    """The lock key every task here takes for ``tag``."""
    return f"{KEY_PREFIX}:{KEY_TEMPLATE.format(tag=tag)}"


# INCR the occupancy and keep its maximum, atomically on the observer.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if now > seen then redis.call('SET', KEYS[2], now) end
return now
"""

_observer: Optional[tuple[int, redis.Redis]] = None


def observer() -> redis.Redis:
    """This process's client for the observer (a forked child makes its own)."""
    global _observer
    if _observer is None or _observer[0] != os.getpid():
        _observer = (os.getpid(), redis.Redis.from_url(OBSERVER_URL, decode_responses=True))
    return _observer[1]


def _sleep(client: redis.Redis, seconds: float, until: Optional[str]) -> None:
    if until is None:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not client.exists(until):
        # A heartbeat while the body runs: tests check no one else held the lock then.
        client.rpush(f"beats:{until}", time.monotonic_ns())
        time.sleep(0.01)


def occupy(
    task: RedlockTask,
    tag: str,
    seconds: float,
    counter: str = "occ",
    again_seconds: Optional[float] = None,
    until: Optional[str] = None,
) -> dict[str, Any]:
    """The body of every occupancy task: report entry, sleep, report exit.

    ``again_seconds``: how long to sleep when this task id has run before (a
    redelivery), so the first delivery can be long and the second short.
    ``until``: stop sleeping early once the test sets this key on the observer.
    """
    client = observer()
    task_id = task.request.id
    pid = os.getpid()
    occupancy = int(client.eval(_ENTER, 2, f"occ:{counter}", f"max:{counter}"))
    start = time.monotonic_ns()
    runs = int(client.hincrby(f"runs:{counter}", task_id, 1))
    client.rpush(f"starts:{counter}", f"{task_id} {pid} {start}")
    _sleep(client, again_seconds if runs > 1 and again_seconds is not None else seconds, until)
    lease = task.redlock
    held = lease is not None and lease.held
    end = time.monotonic_ns()
    client.rpush(f"intervals:{counter}", f"{task_id} {pid} {start} {end}")
    client.decr(f"occ:{counter}")
    client.hincrby(f"effects:{counter}", task_id, 1)
    return {
        "pid": pid,
        "occupancy": occupancy,
        "held": held,
        "extensions": lease.extensions if lease is not None else None,
        "key": lease.key if lease is not None else None,
        "runs": runs,
    }


def occupy_task(celery_app: Celery, prefix: str, name: str, **options: Any) -> Any:
    """A RedlockTask named ``{prefix}.{name}`` whose body is :func:`occupy`."""

    def run(
        self: RedlockTask,
        tag: str,
        seconds: float,
        counter: str = "occ",
        again_seconds: Optional[float] = None,
        until: Optional[str] = None,
    ) -> dict[str, Any]:
        return occupy(self, tag, seconds, counter, again_seconds, until)

    run.__name__ = name
    # Not decorator syntax: Celery's app.task is untyped. shared=False: other apps in
    # the pytest process must not get these tasks.
    return celery_app.task(
        name=f"{prefix}.{name}",
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_key=KEY_TEMPLATE,
        **options,
    )(run)


def _occupy_task(name: str, **options: Any) -> Any:
    return occupy_task(app, "workerapp", name, **options)


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
handoff = app.task(
    name="workerapp.handoff",
    shared=False,
    bind=True,
    base=RedlockTask,
    redlock_key=KEY_TEMPLATE,
    redlock_ttl=30,
)(_handoff)


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
retry_exhausted = app.task(
    name="workerapp.retry_exhausted",
    shared=False,
    bind=True,
    base=RedlockTask,
    redlock_key=KEY_TEMPLATE,
    redlock_ttl=30,
)(_fallback_when_retries_run_out)
