"""Fixtures of the real-worker tests: the servers of one test and its workers
(tests/support/workers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServerFactory
from tests.support.appfixture import free_results
from tests.support.workers import Launch, Stack, app_env, launch_workers, stop_workers


@pytest.fixture
def stack(redis_server_factory: RedisServerFactory, redis_nodes: RedisNodes) -> Iterator[Stack]:
    """A broker (and result backend), 5 lock nodes, an observer, and a client app."""
    broker = redis_server_factory()
    observer_server = redis_server_factory()
    client = Celery(
        "celery_workers_client", broker=broker.url, backend=broker.url, set_as_current=False
    )
    client.conf.broker_connection_retry_on_startup = True
    try:
        yield Stack(
            broker=broker,
            nodes=redis_nodes,
            observer_server=observer_server,
            observer=observer_server.client(decode_responses=True),
            client=client,
        )
    finally:
        free_results()
        client.close()


@pytest.fixture
def launch(stack: Stack, tmp_path: Path) -> Iterator[Launch]:
    """``launch(app, count, **options)``: that many more ready workers of
    ``tests.apps.<app>`` (w1, w2, ... across calls; ``options`` as for
    :func:`~tests.support.workers.launch_workers`). Every worker's process group is
    SIGKILLed at teardown, whatever the test did."""
    workers: list[CeleryProcess] = []
    env = app_env(stack.broker.url, stack.nodes, stack.observer_server.url)

    def start(app: str, count: int, **options: Any) -> list[CeleryProcess]:
        names = [f"w{len(workers) + i + 1}" for i in range(count)]
        started = launch_workers(app, names, tmp_path, env, **options)
        workers.extend(started)
        return started

    try:
        yield start
    finally:
        stop_workers(workers)
