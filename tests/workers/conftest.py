"""Fixtures of the real-worker tests: the servers of one test (tests/support/workers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock.testing import RedisNodes, RedisServerFactory
from tests.support.appfixture import free_results
from tests.support.workers import Stack


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
