"""pytest-celery's own entry point, ``celery_setup``, with the kit's fixtures: its
worker is a container of ours, locking on the node containers."""

from __future__ import annotations

from typing import Any

import pytest

from celery_redlock.testing.containers.nodes import RedisNodeContainer, RedlockNodeCluster

pytestmark = [pytest.mark.containers, pytest.mark.slow]


def test_celery_setup_runs_a_redlock_task_in_its_worker_container(
    celery_setup: Any, observer: RedisNodeContainer, redlock_node_cluster: RedlockNodeCluster
) -> None:
    (worker,) = celery_setup.worker_cluster
    result = celery_setup.app.send_task("containers.hold", kwargs={"tag": "s", "seconds": 0.1})
    assert result.get(timeout=60) == str(worker.hostname()).partition("@")[2]
    assert celery_setup.app.conf.redlock_nodes == redlock_node_cluster.host_urls
    with observer.client() as client:
        assert client.get("max:s") == b"1"
