"""A Redis Cluster as a lock node under real ``celery worker`` subprocesses: same-key
tasks one at a time while the cluster changes under them (a shard failing over, a
slot migrating, a master SIGKILLed and replaced by its replica).

The verdict is the observer's (a Redis apart from the lock and the cluster): every
task SUCCESS, each body run once, no two bodies of one key inside at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest
from celery import Celery
from celery.result import AsyncResult

from celery_redlock.testing import (
    CeleryProcess,
    RedisNodesFactory,
    RedisServerFactory,
    ShardedCluster,
    ShardedClusterFactory,
)
from celery_redlock.wire.cluster import slot_of, tagged
from tests.apps import workerapp
from tests.support.appfixture import free_results
from tests.support.observed import max_occupancy, starts
from tests.support.workers import app_env, eventually, launch_workers, stop_workers, wait_all
from tests.workers.test_celery_workers import check_exclusive

pytestmark = pytest.mark.slow

TASKS = 60


class ClusterStack:
    """A broker, an observer, a cluster (with replicas), the lock nodes' URLs."""

    def __init__(self, broker_url: str, observer_url: str, cluster: ShardedCluster) -> None:
        self.broker_url = broker_url
        self.observer_url = observer_url
        self.cluster = cluster
        self.client = Celery(
            "cluster_client", broker=broker_url, backend=broker_url, set_as_current=False
        )
        self.observer: Any = None

    def send(self, tag: str, counter: str, seconds: float = 0.02) -> AsyncResult:
        return self.client.send_task(
            "workerapp.hold", kwargs={"tag": tag, "seconds": seconds, "counter": counter}
        )


@pytest.fixture
def cluster_stack(
    redis_server_factory: RedisServerFactory, sharded_cluster_factory: ShardedClusterFactory
) -> Iterator[ClusterStack]:
    broker = redis_server_factory()
    observer = redis_server_factory()
    stack = ClusterStack(broker.url, observer.url, sharded_cluster_factory(3, replicas=1))
    stack.observer = observer.client(decode_responses=True)
    try:
        yield stack
    finally:
        free_results()
        stack.client.close()


def start(
    stack: ClusterStack, nodes: Sequence[str], tmp_path: Path, pool: str = "prefork"
) -> list[CeleryProcess]:
    env = app_env(stack.broker_url, nodes, stack.observer_url)
    concurrency = 2 if pool == "prefork" else 8
    return launch_workers(
        "workerapp", ["w1", "w2"], tmp_path, env, pool=pool, concurrency=concurrency
    )


def shard_of(cluster: ShardedCluster, tag: str) -> int:
    return cluster.shard_of_slot(slot_of(tagged(workerapp.lock_key(tag))))


class MidRun(threading.Thread):
    """Runs ``change`` once 10 bodies of ``counter`` began (the test meanwhile waits
    on its results); ``check`` says it ran without error while bodies still began."""

    def __init__(self, stack: ClusterStack, counter: str, change: Callable[[], object]) -> None:
        super().__init__()
        self.stack, self.counter, self.change = stack, counter, change
        self.error: Optional[BaseException] = None
        self.done_at: Optional[int] = None
        self.start()

    def run(self) -> None:
        try:
            began = lambda: len(starts(self.stack.observer, self.counter)) >= 10  # noqa: E731
            eventually(began, 60, "10 bodies began")
            self.change()
            self.done_at = time.monotonic_ns()
        except BaseException as exc:  # reported by check()
            self.error = exc

    def check(self) -> None:
        self.join(60)
        assert self.error is None, self.error
        assert self.done_at is not None
        after = [s for _, _, s in starts(self.stack.observer, self.counter) if s > self.done_at]
        assert after, "the change came after the last body began: not mid-run"


@pytest.mark.parametrize(
    ("pool", "change"),
    [
        ("prefork", "none"),
        ("prefork", "failover"),
        ("prefork", "slot-migrated"),
        ("gevent", "failover"),
    ],
)
def test_same_key_tasks_run_one_at_a_time_on_a_cluster_node_while_it_changes(
    cluster_stack: ClusterStack, tmp_path: Path, pool: str, change: str
) -> None:
    stack, cluster = cluster_stack, cluster_stack.cluster
    workers = start(stack, [cluster.lock_url], tmp_path, pool)
    try:
        shard = shard_of(cluster, "same")
        changes: dict[str, Callable[[], object]] = {
            "none": lambda: None,
            "failover": lambda: cluster.failover(shard),
            "slot-migrated": lambda: cluster.migrate_slot(
                slot_of(tagged(workerapp.lock_key("same"))), (shard + 1) % 3
            ),
        }
        thread = MidRun(stack, change, changes[change])
        same = [stack.send("same", change) for _ in range(TASKS)]
        # Keys on every shard at once: not serialized by the cluster.
        spread = [stack.send(f"d{i}", f"{change}-spread", seconds=0.3) for i in range(12)]
        wait_all(same + spread, timeout=180)
        thread.check()
        check_exclusive(stack, change, same)
        assert all(r.state == "SUCCESS" for r in spread)
        assert max_occupancy(stack.observer, f"{change}-spread") > 1
        print(f"cluster node, {pool}, {change}: {TASKS} same-key tasks once each, alone")
    finally:
        stop_workers(workers)


def test_a_sigkilled_shard_master_costs_one_vote_of_three_and_nothing_runs_twice(
    cluster_stack: ClusterStack, redis_nodes_factory: RedisNodesFactory, tmp_path: Path
) -> None:
    """A master lost without a handover may take a held key with it (replication is
    asynchronous): beside two plain masters the cluster is one vote of three, so the
    key stays held on a quorum while its replica is promoted."""
    stack, cluster = cluster_stack, cluster_stack.cluster
    plain = redis_nodes_factory(2)
    workers = start(stack, [cluster.lock_url, *plain.urls], tmp_path)
    try:
        shard = shard_of(cluster, "killed")

        def kill_and_promote() -> None:
            cluster.master_of(shard).kill()
            cluster.failover(shard)

        thread = MidRun(stack, "killed", kill_and_promote)
        results = [stack.send("killed", "killed") for _ in range(TASKS)]
        wait_all(results, timeout=180)
        thread.check()
        check_exclusive(stack, "killed", results)
    finally:
        stop_workers(workers)
