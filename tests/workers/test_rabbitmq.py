"""Real workers with RabbitMQ as the broker: the lock does not lean on a Redis broker.

A private ``rabbitmq-server`` node (celery_redlock.testing.rabbitmq) carries the
messages; lock nodes, result backend and observer are redis-servers of the test's
own. Skipped only when the rabbitmq-server binary is missing (CI installs it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, ContextManager

import pytest
import redis
from celery import Celery

from celery_redlock.skipped import SKIPPED, is_skipped
from celery_redlock.testing import (
    RabbitMQNode,
    RedisNodes,
    RedisServerFactory,
    find_rabbitmq_server,
)
from tests.apps import limitsapp
from tests.support.observed import (
    effects,
    intervals,
    max_occupancy,
    most_in_window,
    overlaps,
    runs,
)
from tests.support.workers import app_env, launch_workers, stop_workers, wait_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_rabbitmq_server() is None,
        reason="rabbitmq-server is not installed (apt-get install rabbitmq-server)",
    ),
]


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[RabbitMQNode]:
    node = RabbitMQNode.start()
    try:
        yield node
    finally:
        node.stop()


#: Two workers of ``tests/apps/<app>`` (given the app and their concurrency) on the
#: RabbitMQ broker, with a Redis result backend and an observer of their own: a
#: context manager yielding a client app and the observer.
Stack = Callable[[str, int], ContextManager[tuple[Celery, redis.Redis]]]


@pytest.fixture
def stack(
    rabbitmq: RabbitMQNode,
    redis_server_factory: RedisServerFactory,
    redis_nodes: RedisNodes,
    tmp_path: Path,
) -> Stack:
    @contextlib.contextmanager
    def started(app: str, concurrency: int) -> Iterator[tuple[Celery, redis.Redis]]:
        backend = redis_server_factory()
        observer_server = redis_server_factory()
        env = app_env(rabbitmq.url, redis_nodes, observer_server.url, BACKEND_URL=backend.url)
        workers = launch_workers(app, ["w1", "w2"], tmp_path, env, concurrency=concurrency)
        client = Celery(f"rabbitmq_{app}", broker=rabbitmq.url, backend=backend.url)
        client.conf.broker_connection_retry_on_startup = True
        try:
            yield client, observer_server.client(decode_responses=True)
        finally:
            client.close()
            stop_workers(workers)

    return started


def test_same_key_tasks_and_skip_mode_with_a_rabbitmq_broker(stack: Stack) -> None:
    with stack("workerapp", 2) as running:
        client, observer = running
        # Same key, 4 processes: each task runs once, one at a time (retry mode).
        same = [
            client.send_task(
                "workerapp.hold", kwargs={"tag": "rmq", "seconds": 0.02, "counter": "rmq"}
            )
            for _ in range(30)
        ]
        wait_all(same, timeout=120)
        assert [r.state for r in same if r.state != "SUCCESS"] == []
        assert runs(observer, "rmq") == {r.id: 1 for r in same}
        assert overlaps(intervals(observer, "rmq")) == []
        assert max_occupancy(observer, "rmq") == 1

        # Skip mode: a copy sent while the key is held ends SUCCESS with the marker.
        holder = client.send_task(
            "workerapp.hold",
            kwargs={"tag": "skip", "seconds": 60, "counter": "skip", "until": "go"},
        )
        deadline = time.monotonic() + 60
        while not observer.llen("starts:skip"):
            assert time.monotonic() < deadline, "the holder never started"
            time.sleep(0.05)
        skipped = client.send_task(
            "workerapp.hold_skip", kwargs={"tag": "skip", "seconds": 0, "counter": "skip"}
        )
        value = skipped.get(timeout=60)
        assert skipped.ready() and skipped.state == "SUCCESS"
        assert is_skipped(value) and value["redlock"] == SKIPPED
        assert value["key"] == "redlock:hold:skip"
        observer.set("go", 1)
        assert holder.get(timeout=60)["held"] is True
        assert effects(observer, "skip") == {holder.id: 1}  # the skipped body never ran


def test_a_limit_and_a_rate_hold_with_a_rabbitmq_broker(stack: Stack) -> None:
    # The hand-off wakes and a rate's come-backs are messages the workers publish:
    # here through RabbitMQ (a countdown is held unacked in the worker, as on Redis).
    with stack("limitsapp", 4) as running:
        client, observer = running
        limited = [
            client.send_task(
                "limitsapp.limited_handoff",
                kwargs={"tag": "rmq", "seconds": 0.2, "counter": "rmq-limit"},
            )
            for _ in range(20)
        ]
        rated = [
            client.send_task(
                "limitsapp.rated", kwargs={"tag": "rmq", "seconds": 0, "counter": "rmq-rate"}
            )
            for _ in range(60)
        ]
        wait_all(limited + rated, timeout=120)
        assert [r.state for r in limited + rated if r.state != "SUCCESS"] == []
        assert max_occupancy(observer, "rmq-limit") == limitsapp.LIMIT
        assert runs(observer, "rmq-limit") == {r.id: 1 for r in limited}
        assert runs(observer, "rmq-rate") == {r.id: 1 for r in rated}
        admitted = sorted(int(t) for t in observer.lrange("admitted:rmq-rate", 0, -1))
        assert len(admitted) == len(rated)
        assert most_in_window(admitted, 1_000_000_000) <= limitsapp.RATE
