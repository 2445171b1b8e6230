"""A Celery app for tests that run an embedded worker against real Redis servers.

Broker and result backend on one test Redis, lock nodes from ``redis_nodes``, quick
lock retries. When the test ends, two things older Celery releases (seen with 5.3)
would carry into the next test are cleared:

- results still waiting for the garbage collector are freed while that Redis still
  runs: a result freed after its backend stopped spends 20 s reconnecting in
  ``AsyncResult.__del__``, stalling whatever runs next;
- the process-wide event loop of the stopped embedded worker: the next worker would
  reuse it, with the old worker's timer, and never run a message with a countdown.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

from celery import Celery
from kombu.asynchronous import set_event_loop

from celery_redlock.testing import RedisCluster, RedisServer


def worker_test_app(
    name: str, broker: RedisServer, nodes: RedisCluster, backoff: float, backoff_max: float
) -> Iterator[Celery]:
    """Yield the app (use with ``yield from`` in a fixture)."""
    app = Celery(name, broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.task_create_missing_queues = True
    app.conf.redlock_nodes = nodes.urls
    app.conf.redlock_retry_backoff = backoff
    app.conf.redlock_retry_backoff_max = backoff_max
    app.conf.result_extended = True
    app.conf.broker_connection_retry_on_startup = True
    yield app
    gc.collect()
    set_event_loop(None)
