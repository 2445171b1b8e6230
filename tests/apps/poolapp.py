"""The Celery app that test_pools runs in real ``celery worker`` subprocesses of every
pool: prefork, solo, threads, gevent and eventlet.

Configured from the environment like tests/apps/workerapp.py (``BROKER_URL``,
``REDLOCK_NODES``, ``OBSERVER_URL``), whose observer client and occupancy script it
uses. The task bodies report to the observer, a Redis
the lock never sees, under their ``counter``:

- ``occ:{counter}`` / ``max:{counter}``: occupancy, INCR on entry and DECR on exit, and
  the highest value ever seen (it must stay 1 for one key);
- ``runs:{counter}``: hash, task id -> bodies begun;
- ``starts:{counter}``: list of ``"task_id pid start_ns"``, pushed on entry;
- ``intervals:{counter}``: list of ``"task_id pid start_ns end_ns"``, pushed on exit;
- ``acquire:{counter}``: list of how long ``before_start`` (the lock round, and what
  surrounds it) took, in ns, one entry per attempt. For the report only: safety is
  judged from the occupancy, never from the lock's own timings.

Two kinds of body: ``hold`` sleeps (it yields to the hub under gevent and eventlet),
``spin`` computes without yielding for as long as it is told (a CPU-bound task). Times
are ``time.monotonic_ns()``, one clock for every process on the machine.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_redlock import RedlockTask
from tests.apps.workerapp import (  # the occupancy bookkeeping test_celery_workers uses
    _ENTER,
    observer,
)

BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
OBSERVER_URL = os.environ.get("OBSERVER_URL", BROKER_URL)
REDLOCK_NODES = [
    url.strip() for url in os.environ.get("REDLOCK_NODES", BROKER_URL).split(",") if url.strip()
]

KEY_TEMPLATE = "pool:{tag}"
KEY_PREFIX = "redlock"
#: The lease of every task here, seconds: the watchdog renews it at ttl/3.
TTL = 2.0
#: The hard time limit of ``hold_limited``, seconds.
TIME_LIMIT = 2.0

app = Celery("poolapp", broker=BROKER_URL, backend=BROKER_URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_create_missing_queues=True,
    redlock_nodes=REDLOCK_NODES,
    redlock_key_prefix=KEY_PREFIX,
    redlock_retry_backoff=0.05,
    redlock_retry_backoff_max=0.5,
    redlock_max_retries=10_000,
)


def lock_key(tag: str) -> str:
    """The lock key every task here takes for ``tag``."""
    return f"{KEY_PREFIX}:{KEY_TEMPLATE.format(tag=tag)}"


def compute(seconds: float) -> int:
    """Keep the CPU busy for ``seconds`` without a single yield to a gevent/eventlet hub."""
    deadline = time.monotonic() + seconds
    loops = 0
    while time.monotonic() < deadline:
        loops += sum(range(100)) and 1
    return loops


class TimedRedlockTask(RedlockTask):
    """RedlockTask that reports how long each ``before_start`` (the acquire) took."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        began = time.monotonic_ns()
        try:
            super().before_start(task_id, args, kwargs)
        finally:
            counter = (kwargs or {}).get("counter", "occ")
            observer().rpush(f"acquire:{counter}", time.monotonic_ns() - began)


def _sleep(client: redis.Redis, seconds: float, counter: str, beat: bool) -> None:
    if not beat:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # Heartbeats while the body runs: the last one is no later than its end, even
        # when the body is killed (and never reports its exit).
        client.rpush(f"beats:{counter}", time.monotonic_ns())
        time.sleep(0.01)


def body(
    task: RedlockTask,
    tag: str,
    seconds: float,
    counter: str,
    cpu: float,
    beat: bool = False,
) -> dict[str, Any]:
    """Report entry, compute ``cpu`` seconds, sleep ``seconds`` (with heartbeats when
    ``beat``), report exit."""
    client = observer()
    task_id = task.request.id
    pid = os.getpid()
    client.eval(_ENTER, 2, f"occ:{counter}", f"max:{counter}")
    start = time.monotonic_ns()
    client.hincrby(f"runs:{counter}", task_id, 1)
    client.rpush(f"starts:{counter}", f"{task_id} {pid} {start}")
    if cpu:
        compute(cpu)
    if seconds:
        _sleep(client, seconds, counter, beat)
    lease = task.redlock
    end = time.monotonic_ns()
    client.rpush(f"intervals:{counter}", f"{task_id} {pid} {start} {end}")
    client.decr(f"occ:{counter}")
    return {
        "pid": pid,
        "held": lease is not None and lease.held,
        "extensions": lease.extensions if lease is not None else None,
    }


def _task(name: str, **options: Any) -> Any:
    def run(
        self: RedlockTask,
        tag: str,
        seconds: float = 0.0,
        counter: str = "occ",
        cpu: float = 0.0,
        beat: bool = False,
    ) -> dict[str, Any]:
        return body(self, tag, seconds, counter, cpu, beat)

    run.__name__ = name
    return app.task(
        name=f"poolapp.{name}",
        shared=False,
        bind=True,
        base=TimedRedlockTask,
        redlock_key=KEY_TEMPLATE,
        **{"redlock_ttl": TTL, **options},
    )(run)


#: Retries while the key is held.
hold = _task("hold")
#: Fails with LockContended while the key is held.
hold_fail = _task("hold_fail", redlock_on_contended="fail")
#: A 60 s lease: if it is gone right after a warm shutdown, it was released.
hold_long_ttl = _task("hold_long_ttl", redlock_ttl=60.0)
#: Killed by a hard time limit (prefork: SIGKILL of the child; gevent: a Timeout).
hold_limited = _task("hold_limited", time_limit=TIME_LIMIT)
