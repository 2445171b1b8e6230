"""The one factory of the Celery apps that real ``celery worker`` subprocesses run
(workerapp, poolapp, handoffapp, redeliveryapp), and the task bodies they share.

Configured from the environment, so one module serves every test's servers:

- ``BROKER_URL``: broker and result backend (a redis-server of the test's own);
- ``BACKEND_URL``: the result backend when the broker is not Redis (RabbitMQ; read by
  workerapp and limitsapp);
- ``REDLOCK_NODES``: the lock nodes, comma-separated Redis URLs;
- ``OBSERVER_URL``: a third Redis the task bodies report to. The lock never sees it:
  it is the independent witness that checks the lock's promises.

Every task body (:func:`occupy`, :func:`pool_body`) writes to the observer, under its
``counter``:

- ``occ:{counter}`` / ``max:{counter}``: occupancy, INCR on entry and DECR on exit, and
  the highest value ever seen (it must stay 1 for one key);
- ``runs:{counter}``: hash, task id -> bodies begun;
- ``starts:{counter}``: list of ``"task_id pid start_ns"``, pushed on entry (the test
  finds the pid of the prefork child to SIGKILL here);
- ``intervals:{counter}``: list of ``"task_id pid start_ns end_ns"``, pushed on exit;
- ``effects:{counter}`` (:func:`occupy` only): hash, task id -> bodies that ran to the
  end (the "effect");
- ``acquire:{counter}`` (:class:`TimedRedlockTask` only): how long each
  ``before_start`` (the lock round, and what surrounds it) took, in ns. For the report
  only: safety is judged from the occupancy, never from the lock's own timings.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on
the machine, so intervals from different workers compare directly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import redis
from celery import Celery

from celery_redlock import RedlockTask

BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
BACKEND_URL = os.environ.get("BACKEND_URL", BROKER_URL)
OBSERVER_URL = os.environ.get("OBSERVER_URL", BROKER_URL)
REDLOCK_NODES = [
    url.strip() for url in os.environ.get("REDLOCK_NODES", BROKER_URL).split(",") if url.strip()
]
KEY_PREFIX = "redlock"


def worker_app(
    name: str, backoff: float, backoff_max: float, backend: str = BROKER_URL, **conf: Any
) -> Celery:
    """The app ``name`` on the test's broker and lock nodes: lock retries paced by
    ``backoff`` .. ``backoff_max`` seconds and never running out; ``conf``: the
    settings that make this app differ."""
    app = Celery(name, broker=BROKER_URL, backend=backend, set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        redlock_nodes=REDLOCK_NODES,
        redlock_key_prefix=KEY_PREFIX,
        redlock_retry_backoff=backoff,
        redlock_retry_backoff_max=backoff_max,
        redlock_max_retries=10_000,
        **conf,
    )
    return app


def lock_key(template: str, tag: str) -> str:
    """The lock key a task whose ``redlock_key`` is ``template`` takes for ``tag``."""
    return f"{KEY_PREFIX}:{template.format(tag=tag)}"


def redlock_task(
    app: Celery,
    name: str,
    run: Callable[..., Any],
    key_template: str,
    base: type[RedlockTask] = RedlockTask,
    **options: Any,
) -> Any:
    """``run`` (its first argument: the task) as the bound task ``{app.main}.{name}``,
    locking ``key_template``."""
    # Not decorator syntax: Celery's app.task is untyped. shared=False: other apps in
    # the pytest process must not get these tasks.
    return app.task(
        name=f"{app.main}.{name}",
        shared=False,
        bind=True,
        base=base,
        redlock_key=key_template,
        **options,
    )(run)


# -- the observer ----------------------------------------------------------------------------

# A body's entry, in one step on the observer (a SIGKILL cannot split it): INCR the
# occupancy and keep its maximum, count the task id's bodies, push the start.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if now > seen then redis.call('SET', KEYS[2], now) end
local runs = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('RPUSH', KEYS[4], ARGV[2])
return {now, runs}
"""
# Its exit, in one step too: push the interval, DECR the occupancy.
_LEAVE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('DECR', KEYS[2])
"""

_observer: Optional[tuple[int, redis.Redis]] = None


def observer() -> redis.Redis:
    """This process's client for the observer (a forked child makes its own)."""
    global _observer
    if _observer is None or _observer[0] != os.getpid():
        _observer = (os.getpid(), redis.Redis.from_url(OBSERVER_URL, decode_responses=True))
    return _observer[1]


@dataclass
class Visit:
    """One body's stay, as reported to the observer."""

    client: redis.Redis
    task_id: str
    pid: int
    counter: str
    occupancy: int
    start: int  # monotonic ns
    runs: int  # bodies of this task id begun, this one included

    def leave(self) -> None:
        end = time.monotonic_ns()
        keys = [f"intervals:{self.counter}", f"occ:{self.counter}"]
        self.client.eval(_LEAVE, 2, *keys, f"{self.task_id} {self.pid} {self.start} {end}")


def enter(task: RedlockTask, counter: str) -> Visit:
    """Report a body's entry: occupancy, runs, starts."""
    client = observer()
    task_id = task.request.id
    pid = os.getpid()
    start = time.monotonic_ns()  # before the entry is told: inside from then on
    keys = [f"occ:{counter}", f"max:{counter}", f"runs:{counter}", f"starts:{counter}"]
    occupancy, runs = client.eval(_ENTER, len(keys), *keys, task_id, f"{task_id} {pid} {start}")
    return Visit(client, task_id, pid, counter, int(occupancy), start, int(runs))


def heartbeats(client: redis.Redis, seconds: float, beats: str, until: Optional[str]) -> None:
    """Sleep ``seconds`` pushing a heartbeat on ``beats:{beats}`` every 10 ms (tests
    check no one else held the lock then; the last one is no later than the body's
    end, even when the body is killed); stop early once the key ``until`` exists."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until is not None and client.exists(until)):
        client.rpush(f"beats:{beats}", time.monotonic_ns())
        time.sleep(0.01)


# -- the bodies ------------------------------------------------------------------------------


def occupy(
    task: RedlockTask,
    tag: str,
    seconds: float,
    counter: str = "occ",
    again_seconds: Optional[float] = None,
    until: Optional[str] = None,
) -> dict[str, Any]:
    """The body of workerapp's and redeliveryapp's tasks: report entry, sleep, report
    exit and the effect.

    ``again_seconds``: how long to sleep when this task id has run before (a
    redelivery), so the first delivery can be long and the second short.
    ``until``: stop sleeping early once the test sets this key on the observer.
    """
    visit = enter(task, counter)
    pause = again_seconds if visit.runs > 1 and again_seconds is not None else seconds
    if until is None:
        time.sleep(pause)
    else:
        heartbeats(visit.client, pause, until, until)
    lease = task.redlock
    held = lease is not None and lease.held
    visit.leave()
    visit.client.hincrby(f"effects:{counter}", visit.task_id, 1)
    return {
        "pid": visit.pid,
        "occupancy": visit.occupancy,
        "held": held,
        "extensions": lease.extensions if lease is not None else None,
        "key": lease.key if lease is not None else None,
        "runs": visit.runs,
    }


def occupy_task(app: Celery, name: str, key_template: str, **options: Any) -> Any:
    """A RedlockTask ``{app.main}.{name}`` whose body is :func:`occupy`."""
    return redlock_task(app, name, occupy, key_template, **options)


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


def pool_body(
    task: RedlockTask,
    tag: str,
    seconds: float,
    counter: str,
    cpu: float,
    beat: bool = False,
) -> dict[str, Any]:
    """The body of poolapp's and handoffapp's tasks: report entry, compute ``cpu``
    seconds, sleep ``seconds`` (with heartbeats on ``beats:{counter}`` when ``beat``),
    report exit."""
    visit = enter(task, counter)
    if cpu:
        compute(cpu)
    if seconds:
        if beat:
            heartbeats(visit.client, seconds, counter, None)
        else:
            time.sleep(seconds)
    lease = task.redlock
    visit.leave()
    return {
        "pid": visit.pid,
        "held": lease is not None and lease.held,
        "extensions": lease.extensions if lease is not None else None,
    }
