"""An acks_late worker container killed mid-body: the other worker reruns the task,
and only once the killed holder's lease has expired on a majority of the nodes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from celery import Celery

from celery_redlock.testing.containers.nodes import RedisNodeContainer, RedlockNodeCluster

pytestmark = [pytest.mark.containers, pytest.mark.slow]


def _host(worker: Any) -> str:
    """The container's hostname, what a task body's ``socket.gethostname()`` says."""
    return str(worker.hostname()).partition("@")[2]


def _runs(observer: RedisNodeContainer, job: str, count: int, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    with observer.client() as client:
        while True:
            runs = [json.loads(run) for run in client.lrange(f"runs:{job}", 0, -1)]
            if len(runs) >= count or time.monotonic() > deadline:
                return runs
            time.sleep(0.1)


def _majority_expiry(cluster: RedlockNodeCluster, key: str) -> float:
    """When the lease on ``key`` is gone from a majority: each node's clock (TIME)
    plus what is left of the key there (PTTL), the quorum-th soonest."""
    ends: list[float] = []
    for node in cluster:
        with node.client() as client:
            pipe = client.pipeline(transaction=False)
            pipe.time().pttl(key)
            (seconds, micros), left_ms = pipe.execute()
        ends.append(float(seconds) + micros / 1e6 + max(int(left_ms), 0) / 1000)
    return sorted(ends)[len(ends) // 2]


def test_a_killed_acks_late_holder_is_rerun_only_after_its_lease_expired_on_a_majority(
    redlock_worker_factory: Any,
    celery_setup_app: Celery,
    observer: RedisNodeContainer,
    redlock_node_cluster: RedlockNodeCluster,
) -> None:
    doomed = redlock_worker_factory("doomed", "prefork", 1)
    result = celery_setup_app.send_task("containers.late", kwargs={"job": "j", "seconds": 120})
    (first,) = _runs(observer, "j", 1, timeout=60)
    assert first["host"] == _host(doomed)
    # Started once the first run holds the lock: the rerun can only be the survivor's.
    survivor = redlock_worker_factory("survivor", "prefork", 1)
    doomed.kill()
    expiry = _majority_expiry(redlock_node_cluster, first["key"])

    runs = _runs(observer, "j", 2, timeout=90)
    assert len(runs) == 2, f"no rerun after the kill: {runs}"
    rerun = runs[1]
    assert rerun["host"] == _host(survivor)
    assert rerun["start"] >= expiry, (
        f"rerun {expiry - rerun['start']:.3f} s before the lease expired on a majority"
    )
    assert result.get(timeout=60) == _host(survivor)
