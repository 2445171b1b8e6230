"""Container tests: the kit's fixtures (celery_redlock.testing.containers) for this
folder only, an observer Redis container, and the worker settings the tests share.

A user opts in with ``pytest_plugins = ["celery_redlock.testing.containers"]`` in
their root conftest; here the fixtures are imported instead, so that the rest of the
suite keeps pytest-celery's own broker and backend fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from celery_redlock.testing.containers import nodes
from celery_redlock.testing.containers.fixtures import (  # noqa: F401 (fixtures)
    celery_backend,
    celery_broker,
    celery_setup_app,
    celery_worker_cluster,
    default_redis_backend,
    default_redis_broker,
    docker_client,
    redlock_beat_factory,
    redlock_container_starter,
    redlock_containers,
    redlock_containers_missing,
    redlock_node_cluster,
    redlock_node_count,
    redlock_worker_app,
    redlock_worker_factory,
    redlock_worker_image,
)
from celery_redlock.testing.containers.nodes import RedisNodeContainer
from tests.containers import tasks

#: The broker hands an unacked message out again after 2 s and looks every second
#: (kombu's default: 1 hour, swept every 10 x 10 s), so the killed worker's
#: acks_late task comes back within the test.
TRANSPORT = {"visibility_timeout": 2, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
#: A beat entry every second.
BEAT_SCHEDULE = {"tick": {"task": "containers.tick", "schedule": 1.0}}


@pytest.fixture
def observer(
    redlock_containers: None,  # noqa: F811 (the fixture imported above)
    docker_client: Any,  # noqa: F811
    default_pytest_celery_network: Any,
) -> Iterator[RedisNodeContainer]:
    """A Redis container the lock never sees: the task bodies report there."""
    container = nodes.start(docker_client, RedisNodeContainer, default_pytest_celery_network.name)
    try:
        yield container
    finally:
        nodes.remove(container)


@pytest.fixture
def redlock_worker_tasks() -> set[ModuleType]:
    return {tasks}


@pytest.fixture
def redlock_worker_settings(observer: RedisNodeContainer) -> dict[str, Any]:
    return dict(
        observer_url=observer.url,
        broker_transport_options=TRANSPORT,
        worker_prefetch_multiplier=1,
        # Lock retries well inside the visibility timeout: a retry waiting for its
        # ETA is an unacked message too.
        redlock_retry_backoff=0.05,
        redlock_retry_backoff_max=0.3,
        redlock_max_retries=10_000,
        redlock_node_timeout=0.25,
        beat_schedule=BEAT_SCHEDULE,
    )
