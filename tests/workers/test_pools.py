"""RedlockTask in every worker pool: prefork, solo, threads, gevent and eventlet.

Real ``celery worker`` subprocesses (started through the public launcher
:class:`celery_redlock.testing.CeleryProcess`) run tests/apps/poolapp.py against a real Redis
broker, 5 real lock nodes and a third Redis, the observer, that the task bodies report
to. Safety is judged from the observer (occupancy, body intervals, heartbeats) and
from direct reads of the lock nodes, never from the lock's own word.

For every pool: (a) same-key tasks run one at a time, each once; (b) the watchdog
keeps a lease through a body longer than its TTL; (c) a warm shutdown releases the lock.
For gevent and eventlet also: (d) a CPU-bound body longer than its TTL keeps its lock
while a duplicate on another worker waits; (e) a herd of 50 greenlets starting at once,
while other greenlets compute, sees no false "lock nodes unavailable" (and, without a
worker, 50 first rounds beside a greenlet that computes in slices see none); a lease lost
while a greenlet computes is not held at once, its on_lost callback waits for the hub.
Where the pool
enforces hard time limits (prefork, gevent; Celery has none for threads, solo and
eventlet), (f) a body killed by one leaves no lock behind for long, and no one runs
while it still runs.

Every bound is derived from the TTL (2 s) and event order, not from how fast a loaded
2-core machine is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
from celery.exceptions import TimeLimitExceeded
from celery.result import AsyncResult

from celery_redlock import LockContended
from celery_redlock.testing import CeleryProcess, RedisNodes
from tests.apps import poolapp
from tests.support.observe import until
from tests.support.observed import intervals, max_occupancy, overlaps, runs
from tests.support.workers import (
    CHECKOUT,
    Launch,
    Stack,
    started_at,
    wait_all,
)

pytestmark = pytest.mark.slow

TTL_NS = int(poolapp.TTL * 1e9)


@dataclass(frozen=True)
class Pool:
    """How a pool is run here: ``workers`` workers of ``concurrency`` each."""

    name: str
    workers: int
    concurrency: int


POOLS = {
    "prefork": Pool("prefork", 2, 2),
    "solo": Pool("solo", 2, 1),
    "threads": Pool("threads", 2, 4),
    "gevent": Pool("gevent", 2, 10),
    "eventlet": Pool("eventlet", 2, 10),
}


def every_pool() -> list[Any]:
    """``POOLS`` as pytest params."""
    return [pytest.param(pool, id=name) for name, pool in POOLS.items()]


def green_pools() -> list[Any]:
    return [pytest.param(POOLS[name], id=name) for name in ("gevent", "eventlet")]


# -- servers and workers --------------------------------------------------------------------


StartWorkers = Callable[..., list[CeleryProcess]]


@pytest.fixture
def start_workers(launch: Launch) -> StartWorkers:
    """``start(pool, count=, concurrency=, queues=)``: that many ready workers of
    ``pool`` (w1, w2, ...); every one is SIGKILLed at teardown."""

    def start(
        pool: Pool,
        count: Optional[int] = None,
        concurrency: Optional[int] = None,
        queues: Sequence[Sequence[str]] = (),
    ) -> list[CeleryProcess]:
        return launch(
            "poolapp",
            pool.workers if count is None else count,
            queues=queues,
            pool=pool.name,
            concurrency=pool.concurrency if concurrency is None else concurrency,
        )

    return start


# -- what the observer saw ------------------------------------------------------------------


def acquire_times(stack: Stack, counter: str) -> list[float]:
    """Seconds each ``before_start`` took (one per attempt), as the workers measured."""
    return [int(ns) / 1e9 for ns in stack.observer.lrange(f"acquire:{counter}", 0, -1)]


def heartbeats(stack: Stack, counter: str) -> list[int]:
    return [int(ns) for ns in stack.observer.lrange(f"beats:{counter}", 0, -1)]


# -- helpers --------------------------------------------------------------------------------


def send(stack: Stack, task: str, queue: Optional[str] = None, **kwargs: Any) -> AsyncResult:
    return stack.client.send_task(f"poolapp.{task}", kwargs=kwargs, queue=queue)


def log_lines(workers: Sequence[CeleryProcess], pattern: str) -> list[str]:
    return [line for worker in workers for line in worker.lines(pattern)]


def holding_nodes(stack: Stack, key: str) -> int:
    """How many lock nodes hold ``key`` now, read directly with redis-py."""
    return sum(node.client().exists(key) for node in stack.nodes)


class Renewals:
    """Watches a key's PTTL on every node from the test process: a PTTL that went up
    since the last look on a majority of nodes is a renewal the nodes saw."""

    def __init__(self, stack: Stack, key: str) -> None:
        self.clients = [node.client() for node in stack.nodes]
        self.key = key
        self.last = [-2] * len(self.clients)
        self.seen = 0

    def look(self) -> None:
        now = [client.pttl(self.key) for client in self.clients]
        went_up = sum(n > last >= 0 for n, last in zip(now, self.last))
        self.seen += went_up >= len(self.clients) // 2 + 1
        self.last = now

    def watch_until(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"not done within {timeout}s"
            self.look()
            time.sleep(0.05)


# -- (a) same-key contention ----------------------------------------------------------------


@pytest.mark.parametrize("pool", every_pool())
def test_same_key_tasks_run_each_once_and_never_two_at_a_time(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    workers = start_workers(pool)
    results = [send(stack, "hold", tag="same", seconds=0.01, counter="same") for _ in range(30)]
    wait_all(results, timeout=120)
    states = {r.id: r.state for r in results}
    assert [s for s in states.values() if s != "SUCCESS"] == [], states
    executions = runs(stack.observer, "same")
    assert executions == dict.fromkeys(states, 1)  # each task exactly once
    spans = intervals(stack.observer, "same")
    assert overlaps(spans) == []
    assert max_occupancy(stack.observer, "same") == 1
    contended = log_lines(workers, r"WARNING/.*\] lock contended: ")
    print(
        f"{pool.name} {pool.workers}x-c{pool.concurrency}: {len(results)} tasks ran once each, "
        f"max inside 1, {len(contended)} contentions, "
        f"{len({s.pid for s in spans})} processes"
    )


# -- (b) the watchdog -----------------------------------------------------------------------


@pytest.mark.parametrize("pool", every_pool())
def test_watchdog_keeps_the_lock_through_a_body_longer_than_its_ttl(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    workers = start_workers(pool)
    key = poolapp.lock_key("watch")
    renewals = Renewals(stack, key)
    first = send(stack, "hold", tag="watch", seconds=2.5 * poolapp.TTL, counter="watch")
    began = started_at(stack, "watch", first)
    # The lease was won before the body began: unrenewed, it is gone by began + TTL.
    unrenewed_gone = began + TTL_NS + 500_000_000
    renewals.watch_until(lambda: time.monotonic_ns() >= unrenewed_gone, timeout=30)
    duplicate = send(stack, "hold_fail", tag="watch", counter="dup")
    renewals.watch_until(first.ready, timeout=60)
    wait_all([duplicate], timeout=30)
    outcome = first.get(timeout=1)
    assert outcome["held"] is True
    assert duplicate.state == "FAILURE"
    assert isinstance(duplicate.result, LockContended), duplicate.result
    assert runs(stack.observer, "dup") == {}  # the duplicate's body never ran
    assert renewals.seen >= 1  # the nodes saw the lease renewed
    assert log_lines(workers, "lock lost") == []
    print(
        f"{pool.name}: {2.5 * poolapp.TTL:g}s body, ttl {poolapp.TTL:g}s: renewals seen on the "
        f"nodes {renewals.seen}, lease.extensions {outcome['extensions']}, duplicate refused"
    )


# -- (c) warm shutdown ----------------------------------------------------------------------


@pytest.mark.parametrize("pool", every_pool())
def test_warm_shutdown_finishes_the_body_and_releases_its_lock(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    (worker,) = start_workers(pool, count=1)
    key = poolapp.lock_key("warm")
    result = send(stack, "hold_long_ttl", tag="warm", seconds=1.5, counter="warm")
    started_at(stack, "warm", result)
    assert holding_nodes(stack, key) >= 3
    worker.stop()  # SIGTERM to the main process, wait for its exit
    assert worker.returncode == 0, worker.tail()  # it exited by itself: warm
    assert result.get(timeout=10)["held"] is True  # the body ran to its end
    # A 60 s lease off a majority within the hang guard, far inside its TTL: released,
    # not expired. (The release round returns at quorum; the reading waits for it.)
    until(lambda: holding_nodes(stack, key) < 3, f"{key} off a majority after a warm shutdown")
    held_after = holding_nodes(stack, key)
    print(f"{pool.name}: warm shutdown, key left on {held_after} of 5 nodes")


# -- (d) CPU-bound bodies under gevent / eventlet -------------------------------------------


@pytest.mark.parametrize("pool", green_pools())
def test_cpu_bound_body_longer_than_its_ttl_keeps_its_lock_from_a_waiting_duplicate(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    # Each worker consumes its own queue: the duplicate must go to the one not computing.
    workers = start_workers(pool, queues=[["q1"], ["q2"]])
    computing = 3.5 * poolapp.TTL  # a watchdog that never ran lets the lease go at 1 TTL
    first = send(stack, "hold", queue="q1", tag="cpu", cpu=computing, counter="cpu")
    started_at(stack, "cpu", first)
    duplicate = send(stack, "hold", queue="q2", tag="cpu", counter="cpu")  # retries
    wait_all([first, duplicate], timeout=120)
    assert first.state == duplicate.state == "SUCCESS"
    spans = intervals(stack.observer, "cpu")
    assert [s.task_id for s in spans] == [first.id, duplicate.id]
    assert overlaps(spans) == [], f"the duplicate began {(spans[1].start - spans[0].start) / 1e9}s"
    assert max_occupancy(stack.observer, "cpu") == 1
    assert first.result["held"] is True
    assert log_lines(workers, "lock lost") == []
    print(
        f"{pool.name}: {computing:g}s CPU-bound body, ttl {poolapp.TTL:g}s, "
        f"lease.extensions {first.result['extensions']}; duplicate began "
        f"{(spans[1].start - spans[0].end) / 1e9:.3f}s after it ended"
    )


# -- (e) a herd of greenlets ----------------------------------------------------------------


@pytest.mark.parametrize("pool", green_pools())
def test_herd_of_50_greenlets_starting_at_once_sees_no_false_outage(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    # Queued before the worker starts: all 50 arrive at once, and their rounds are the
    # worker's first. Each body computes 100 ms (two node_timeouts) without yielding,
    # so the hub is busy while other greenlets' rounds wait. Default node_timeout, 50 ms;
    # the lock nodes are healthy all along.
    herd = [
        send(stack, "hold", tag=f"herd{i}", cpu=0.1, seconds=0.2, counter="herd") for i in range(50)
    ]
    (worker,) = start_workers(pool, count=1, concurrency=50)
    wait_all(herd, timeout=120)
    unavailable = worker.lines(r"lock nodes unavailable")
    lost = worker.lines(r"lock lost")
    rounds = acquire_times(stack, "herd")
    print(
        f"{pool.name} -c 50: {len(herd)} tasks, {len(rounds)} acquire attempts, "
        f"{len(unavailable)} false outages, {len(lost)} leases lost, "
        f"slowest acquire {max(rounds, default=0):.3f}s"
    )
    assert [r.state for r in herd] == ["SUCCESS"] * len(herd)
    assert set(runs(stack.observer, "herd").values()) == {1}
    assert unavailable == []
    # 50 x 100 ms of CPU on one hub: each body lasts longer than its 2 s TTL, and only
    # renewals (ttl/3) that do not wait for the hub keep every lease.
    assert lost == []
    assert all(r.result["held"] for r in herd)


def run_green_rounds(*args: str) -> dict[str, Any]:
    """Run tests/apps/green_rounds.py in a process of its own; its JSON report."""
    done = subprocess.run(
        [sys.executable, str(CHECKOUT / "tests" / "apps" / "green_rounds.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=CHECKOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("hub", ["gevent", "eventlet"])
def test_50_first_rounds_beside_a_greenlet_computing_in_100ms_slices_see_no_false_outage(
    redis_nodes: RedisNodes, hub: str
) -> None:
    """The herd's cause, without a worker: in a monkey-patched process, 50 greenlets each
    try once to take a key of their own, the process's first rounds, while another
    greenlet computes in slices of two node_timeouts. Healthy nodes: every try wins.
    A node_timeout of 0.5 s (slices of 1 s), not the default 50 ms: a loaded machine's
    scheduler can hold a healthy 50 ms round past its timeout, a real outage."""
    report = run_green_rounds(hub, ",".join(redis_nodes.urls), "50", "node_timeout=0.5")
    print(f"{hub}: 50 first rounds beside a busy greenlet: {report}")
    assert report["errors"] == []
    assert report["unavailable"] == 0
    assert report["won"] == 50


@pytest.mark.parametrize("hub", ["gevent", "eventlet"])
def test_a_lease_lost_while_a_greenlet_computes_is_not_held_at_once_and_calls_back_on_the_hub(
    redis_nodes: RedisNodes, hub: str
) -> None:
    """The renewal thread is a real OS thread: it finds the lease lost (its key deleted
    from every node) while a greenlet computes without yielding, and ``held`` turns
    False in that greenlet at once; the ``on_lost`` callback waits for the hub."""
    report = run_green_rounds(hub, ",".join(redis_nodes.urls), "lost")
    print(f"{hub}: lease lost while computing: {report}")
    # ``held`` is the lease's validity: it turns False at the latest one TTL (1 s) after
    # the last renewal, which began before the deletion, while the greenlet never
    # yields. When the greenlet reads its clock after that is the scheduler's business
    # (no bound); that it saw False before its 30 s guard is the fact.
    assert report["held_false_after_s"] is not None
    assert report["callback_before_yield"] is False
    assert report["callback_thread_is_hub"] is True


# -- (f) hard time limits -------------------------------------------------------------------


@pytest.mark.parametrize("pool", [pytest.param(POOLS[n], id=n) for n in ("prefork", "gevent")])
def test_hard_time_limit_leaves_no_lock_behind_and_no_one_runs_beside_the_killed_body(
    stack: Stack, start_workers: StartWorkers, pool: Pool
) -> None:
    start_workers(pool, count=1)
    limited = send(stack, "hold_limited", tag="limit", seconds=60, beat=True, counter="limit")
    started_at(stack, "limit", limited)
    waiter = send(stack, "hold", tag="limit", counter="limit")  # retries meanwhile
    wait_all([limited], timeout=60)
    assert limited.state == "FAILURE"
    assert isinstance(limited.result, TimeLimitExceeded), limited.result
    # Released, or left to expire: either way free within one TTL (and a retry's wait).
    wait_all([waiter], timeout=poolapp.TTL + 30)
    assert waiter.state == "SUCCESS", waiter.result
    (span,) = intervals(stack.observer, "limit")
    last_beat = max(heartbeats(stack, "limit"))
    assert span.task_id == waiter.id
    assert span.start > last_beat  # nothing ran while the killed body still ran
    print(
        f"{pool.name}: time limit {poolapp.TIME_LIMIT:g}s; waiter began "
        f"{(span.start - last_beat) / 1e9:.3f}s after the killed body's last heartbeat"
    )
