"""The tasks the worker containers of tests/containers run.

Copied into the containers by source (pytest-celery's way), so this module imports
only what the worker image has: the standard library, celery, redis-py and
celery-redlock. Every body reports to the observer (``observer_url`` in the app's
settings), a Redis the lock never touches, on the observer's clock (``TIME``).
"""

from __future__ import annotations

import json
import socket
import time
from functools import partial
from typing import Any

import redis
from celery._state import connect_on_app_finalize

from celery_redlock import RedlockTask

#: KEYS[1] the occupancy counter, KEYS[2] the highest occupancy seen; returns the
#: occupancy after entering.
ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def observer(task: Any) -> redis.Redis:
    return redis.Redis.from_url(task.app.conf.observer_url)


def observer_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def _hold(self: Any, tag: str, seconds: float) -> str:
    """Inside for ``seconds``, counted in ``inside:{tag}`` (its high mark ``max:{tag}``)."""
    client = observer(self)
    client.eval(ENTER, 2, f"inside:{tag}", f"max:{tag}")
    try:
        time.sleep(seconds)
    finally:
        client.decr(f"inside:{tag}")
    return socket.gethostname()


def _late(self: Any, job: str, seconds: float) -> str:
    """Reports each run (host, start on the observer's clock, lock key) on
    ``runs:{job}``; the first run lasts ``seconds``, a rerun returns at once."""
    client = observer(self)
    run = {"host": socket.gethostname(), "start": observer_time(client), "key": self.redlock.key}
    if client.rpush(f"runs:{job}", json.dumps(run)) == 1:
        time.sleep(seconds)
    return socket.gethostname()


def _tick(self: Any) -> None:
    """Records the tick of every copy that arrives (a plain task: no copy skipped)."""
    tick = getattr(self.request, "redlock_beat_tick", None)
    observer(self).rpush("ticks", f"{tick} {self.request.id}")


#: The app of the worker containers (the kit's ``redlock_worker_app``): only it gets
#: these tasks. ``shared_task`` would add them to every app the test session makes.
WORKER_APP = "redlock_worker_app"


def _register(app: Any) -> None:
    if app.main != WORKER_APP:
        return
    # Not decorator syntax: Celery's app.task is untyped.
    task = partial(app.task, bind=True, shared=False)
    task(
        base=RedlockTask,
        name="containers.hold",
        redlock_key="hold:{tag}",
        redlock_ttl=10.0,
        redlock_on_contended="retry",
    )(_hold)
    task(
        base=RedlockTask,
        name="containers.late",
        acks_late=True,
        redlock_key="late:{job}",
        redlock_ttl=3.0,
        redlock_on_contended="retry",
    )(_late)
    task(name="containers.tick", ignore_result=True)(_tick)


# The app is made after this module is imported (app.py imports the tasks first):
# the tasks are added when it is finalized, as shared_task's are.
connect_on_app_finalize(_register)
