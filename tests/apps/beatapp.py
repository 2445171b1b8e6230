"""The Celery app that test_beat's real ``celery beat`` and ``celery worker`` run.

Configured from the environment (read by tests/apps/factory.py, whose observer
client it uses):

- ``BROKER_URL``: the broker (a redis-server of the test's own);
- ``REDLOCK_NODES``: the lock nodes, comma-separated Redis URLs;
- ``OBSERVER_URL``: a third Redis the task reports to -- the witness the test
  trusts, not the beats' own logs;
- ``BEAT_INTERVAL``: the period of the beat entries, seconds (default 1);
- ``BEAT_ENTRIES``: how many entries (default 1): ``count``, then ``count1``,
  ``count2``... -- several ticks a period, each raced by every beat.

Every entry runs :func:`count`: it INCRs ``executions`` and pushes
``"{tick} {entry} {task_id}"`` (tick and entry from the message headers the winning
beat set) on the list ``runs``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from tests.apps.factory import BROKER_URL, REDLOCK_NODES, observer

INTERVAL = float(os.environ.get("BEAT_INTERVAL", "1"))
ENTRY = "count"
ENTRIES = [ENTRY] + [f"{ENTRY}{i}" for i in range(1, int(os.environ.get("BEAT_ENTRIES", "1")))]

app = Celery("beatapp", broker=BROKER_URL, set_as_current=False)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    redlock_nodes=REDLOCK_NODES,
    # Rounds to 5 nodes answer in about a millisecond; the margin is for a loaded
    # 2-core machine running three beats, a worker and seven redis-servers.
    redlock_node_timeout=0.25,
    beat_schedule={name: {"task": "beatapp.count", "schedule": INTERVAL} for name in ENTRIES},
)


def _count(self: Any) -> None:
    tick = getattr(self.request, "redlock_beat_tick", None)
    entry = getattr(self.request, "redlock_beat_entry", None)
    client = observer()
    client.incr("executions")
    client.rpush("runs", f"{tick} {entry} {self.request.id}")


# Not decorator syntax: Celery's app.task is untyped.
count = app.task(name="beatapp.count", bind=True)(_count)
