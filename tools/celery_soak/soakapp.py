"""The Celery app the soak's ``celery worker`` subprocesses run.

Made by tests/apps/factory.py (configured from ``BROKER_URL``, ``REDLOCK_NODES``,
``OBSERVER_URL``), its bodies report to the observer as factory's do
(:func:`~tests.apps.factory.enter`: occupancy, runs per task id, starts, intervals
under the counter ``soak:{tag}``), and also:

- ``hosts``: hash, pid -> the worker's hostname (which worker a body ran in);
- ``inbody``: hash, pid -> task id while a body runs (the soak picks a pool child
  to SIGKILL inside a body here);
- ``fenced:{tag}``: written through the lease's fence on entry and on exit
  (:func:`celery_redlock.fencing.fenced_set`); ``refused``: list of
  ``"task_id tag fence where"`` for every write the fence refused (a stale holder).

A body SIGKILLed by a fault never DECRs its occupancy, so ``max:{counter}`` stays
raised after one: the report judges overlaps from the intervals (a killed body's
ends at its kill), and shows the counter only as it was left.

Every task is acked late and rejected (so redelivered) when its worker is lost. The
Redis transport's visibility timeout is 10 s, longer than the longest fault that
pauses a worker, and unacked messages are swept every second.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_redlock import RedlockTask
from celery_redlock.fencing import fenced_set
from tests.apps.factory import enter, observer, redlock_task, worker_app

#: Every task locks ``redlock:soak:{tag}``: the three modes contend on the same keys.
KEY_TEMPLATE = "soak:{tag}"
#: Seconds an unacked message stays invisible before the broker hands it out again.
VISIBILITY_TIMEOUT = 10
#: Lock retry pacing (seconds): far below the visibility timeout.
RETRY_BACKOFF = 0.1
RETRY_BACKOFF_MAX = 1.0
#: Lease length per contention mode, seconds: small, so that faults matter.
TTLS = {"retry": 3.0, "skip": 2.0, "fail": 4.0}
MAX_TTL = max(TTLS.values())

app = worker_app(
    "soakapp",
    RETRY_BACKOFF,
    RETRY_BACKOFF_MAX,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


def counter(tag: str) -> str:
    """The observer counter of the bodies that lock ``tag``."""
    return f"soak:{tag}"


def _fenced_write(task: RedlockTask, tag: str, where: str) -> bool:
    lease = task.redlock
    if lease is None or lease.fence is None:
        return True
    client = observer()
    written = fenced_set(client, f"fenced:{tag}", task.request.id, lease.fence)
    if not written:
        client.rpush("refused", f"{task.request.id} {tag} {lease.fence} {where}")
    return written


def soak_body(task: RedlockTask, tag: str, seconds: float) -> dict[str, Any]:
    """Report entry, write through the fence, sleep, write again, report exit."""
    visit = enter(task, counter(tag))
    pid = str(os.getpid())
    visit.client.hset("hosts", pid, str(task.request.hostname))
    visit.client.hset("inbody", pid, visit.task_id)
    first = _fenced_write(task, tag, "entry")
    time.sleep(seconds)
    last = _fenced_write(task, tag, "exit")
    visit.client.hdel("inbody", pid)
    visit.leave()
    visit.client.hincrby(f"effects:{counter(tag)}", visit.task_id, 1)
    return {"pid": visit.pid, "runs": visit.runs, "fenced": [first, last]}


def _task(mode: str) -> Any:
    return redlock_task(
        app,
        mode,
        soak_body,
        KEY_TEMPLATE,
        redlock_ttl=TTLS[mode],
        redlock_on_contended=mode,
        redlock_fencing=True,
    )


retry = _task("retry")
skip = _task("skip")
fail = _task("fail")

#: The task name of each contention mode.
TASK_NAMES = {mode: f"soakapp.{mode}" for mode in TTLS}
