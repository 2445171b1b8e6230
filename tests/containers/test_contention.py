"""Two worker containers contend for the same keys; the observer counts the bodies
inside per key, and never sees two."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_redlock.testing.containers.nodes import RedisNodeContainer

pytestmark = [pytest.mark.containers, pytest.mark.slow]


def _host(worker: Any) -> str:
    """The container's hostname, what a task body's ``socket.gethostname()`` says."""
    return str(worker.hostname()).partition("@")[2]


def test_two_worker_containers_never_run_one_key_twice_at_once(
    redlock_worker_factory: Any, celery_setup_app: Celery, observer: RedisNodeContainer
) -> None:
    first = redlock_worker_factory("first")
    second = redlock_worker_factory("second")
    tags = ["a", "b"]
    results = [
        celery_setup_app.send_task("containers.hold", kwargs={"tag": tags[i % 2], "seconds": 0.3})
        for i in range(12)
    ]
    hosts = [result.get(timeout=120) for result in results]
    with observer.client() as client:
        assert [client.get(f"max:{tag}") for tag in tags] == [b"1", b"1"]
        assert [client.get(f"inside:{tag}") for tag in tags] == [b"0", b"0"]
    # Both workers ran bodies: the contention was real, not one worker taking all.
    assert set(hosts) == {_host(first), _host(second)}
