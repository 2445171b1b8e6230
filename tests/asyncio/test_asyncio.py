"""``AsyncRedlock`` against real redis-server processes: what only asyncio has
(cancellation, auto-extension as a task, ``async with``) and locks shared with the
synchronous ``Redlock``. The scenarios both drivers share run in test_drivers.py.

What the nodes hold is read by plain clients (the observer). Waits are bounded by
TTLs much longer than them, so a key found gone was removed by a release, not by
its expiry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest
import redis

from celery_redlock import (
    AlreadyHeld,
    ConfigurationError,
    LockContended,
    LockLost,
    QuorumUnavailable,
    Redlock,
)
from celery_redlock.asyncio import AsyncLease, AsyncRedlock
from celery_redlock.testing import FaultProxy, RedisNodes, RedisServer
from tests.support.observe import until
from tests.support.tls_acl import TLSNode, tls_urls, tls_values

T = TypeVar("T")
FOREIGN = b"someone-else-entirely|other-host:1"
NODE_TIMEOUT = 1.0
#: Keys whose release is checked live this long; gone within RELEASED_WITHIN, only a
#: release can have removed them.
KEY_TTL = 30.0
RELEASED_WITHIN = 10.0


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


async def _until(check: Callable[[], bool], within: float, what: str) -> None:
    give_up = time.monotonic() + within
    while not check():
        assert time.monotonic() < give_up, f"{what}: still not so after {within} s"
        await asyncio.sleep(0.01)


def _gone(clients: list[redis.Redis], key: str) -> Callable[[], bool]:
    return lambda: all(c.get(key) is None for c in clients)


# -- sharing locks with the synchronous driver -------------------------------------------


def test_async_and_sync_locks_exclude_each_other_and_name_the_holder(
    redis_nodes: RedisNodes,
) -> None:
    sync = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)

    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        held = sync.acquire("shared", holder="task-7@worker-a:1")
        assert held is not None
        with pytest.raises(LockContended) as caught:
            await redlock.try_acquire("shared", blocking=False)
        assert caught.value.holder == "task-7@worker-a:1"
        sync.hand_over(held)  # its value goes to the service, which releases it
        assert await redlock.release_value("shared", held.value) is True
        lease = await redlock.acquire("shared", holder="api:2")
        assert isinstance(lease, AsyncLease)
        assert sync.acquire("shared", blocking=False) is None
        assert sync.holder("shared").holder == "api:2"
        assert await lease.release() is True
        assert sync.locked("shared") is False

    run(scenario())


# -- the lock block ------------------------------------------------------------------------


def test_auto_extend_keeps_a_short_lease_past_its_ttl(redis_nodes: RedisNodes) -> None:
    clients = _clients(redis_nodes)

    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=3.0, node_timeout=0.5)
        async with redlock.lock("long", auto_extend=True) as lease:
            # Three TTLs: without renewals the key would be gone from every node. A
            # renewal comes every ttl/3, so only a stall of about 2 s loses it.
            await asyncio.sleep(9.0)
            assert lease.held, lease.lost_reason
            assert lease.extensions >= 3
            # Held past the read: a majority had our value then (each node's own
            # renewal may have missed its deadline on a loaded machine).
            on = sum(c.get("long") == lease.value.encode() for c in clients)
            assert lease.held and on >= 3
        assert lease.released
        # The release returned at quorum: the other nodes' deletes follow.
        await _until(_gone(clients, "long"), RELEASED_WITHIN, "released on every node")

    run(scenario())


def test_a_lease_lost_during_an_auto_extended_block_raises_lock_lost_on_leaving(
    redis_nodes: RedisNodes,
) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=3, node_timeout=0.5)
        with pytest.raises(LockLost, match="extension reached 0 of 5"):
            async with redlock.lock("stolen", auto_extend=True) as lease:
                for client in _clients(redis_nodes):
                    client.set("stolen", FOREIGN, px=int(KEY_TTL * 1000))
                # The next renewal (at ttl/3) is refused by every node: lost at once.
                await _until(lambda: lease.lost, RELEASED_WITHIN, "the renewal marked it lost")
        assert [c.get("stolen") for c in _clients(redis_nodes)] == [FOREIGN] * 5

    run(scenario())


def test_async_with_a_lease_releases_it_and_sync_with_is_refused(
    redis_nodes: RedisNodes,
) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        lease = await redlock.acquire("plain")
        assert lease is not None
        with pytest.raises(TypeError, match="async with"), lease:
            pass
        async with lease:
            assert await lease.owned() is True
        assert lease.released
        await _until(_gone(_clients(redis_nodes), "plain"), RELEASED_WITHIN, "released")

    run(scenario())


# -- cancellation ----------------------------------------------------------------------------


def _proxied(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., FaultProxy], slow: int
) -> tuple[list[str], list[FaultProxy]]:
    """URLs of the 5 nodes, the last ``slow`` behind proxies (delayed by the test)."""
    proxies = [fault_proxy_factory(server) for server in list(redis_nodes)[5 - slow :]]
    return list(redis_nodes.urls[: 5 - slow]) + [p.url for p in proxies], proxies


def test_a_cancelled_acquire_releases_what_it_got(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    clients = _clients(redis_nodes)
    urls, proxies = _proxied(redis_nodes, fault_proxy_factory, slow=3)

    async def scenario() -> None:
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=20.0)
        await redlock.holder("warm")  # connections up before the delay
        for proxy in proxies:
            proxy.delay(1.0)
        task = asyncio.ensure_future(redlock.acquire("half", blocking=False))
        # The two direct nodes granted; the round still waits for the slow three.
        await _until(lambda: all(c.get("half") for c in clients[:2]), 10.0, "2 grants")
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Released everywhere, the slow nodes too (their SET first, then the release).
        await _until(_gone(clients, "half"), RELEASED_WITHIN, "released on every node")
        for proxy in proxies:
            proxy.delay(0)
        assert await redlock.acquire("half", blocking=False) is not None

    run(scenario())


def test_a_cancelled_block_releases_its_lease_even_when_cancelled_again(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    clients = _clients(redis_nodes)
    urls, proxies = _proxied(redis_nodes, fault_proxy_factory, slow=3)

    async def scenario() -> None:
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=20.0)
        entered = asyncio.Event()

        async def body() -> None:
            async with redlock.lock("body", auto_extend=True):
                entered.set()
                await asyncio.Event().wait()  # forever, until cancelled

        task = asyncio.ensure_future(body())
        await entered.wait()
        for proxy in proxies:
            proxy.delay(1.0)  # the release now waits on a quorum of slow nodes
        task.cancel()
        await asyncio.sleep(0.2)
        task.cancel()  # a second cancellation, while the release is under way
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(_gone(clients, "body"), RELEASED_WITHIN, "released on every node")

    run(scenario())


def test_a_cancelled_blocking_wait_takes_nothing(redis_nodes: RedisNodes) -> None:
    clients = _clients(redis_nodes)

    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        holder = await redlock.acquire("wait", holder="first:1")
        assert holder is not None
        value = holder.value.encode()
        await _until(
            lambda: [c.get("wait") for c in clients] == [value] * 5, RELEASED_WITHIN, "held"
        )
        task = asyncio.ensure_future(redlock.acquire("wait", timeout=KEY_TTL))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [c.get("wait") for c in clients] == [value] * 5
        assert await holder.release() is True

    run(scenario())


# -- nodes: failures, restarts, scripts, TLS ---------------------------------------------------


def test_a_hung_node_costs_nothing_while_a_quorum_answers(redis_nodes: RedisNodes) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        redis_nodes[0].pause()
        try:
            lease = await redlock.acquire("hung")
            assert lease is not None
            assert await lease.release() is True
            info = await redlock.holder("hung")
            assert isinstance(info.nodes[0].error, redis.TimeoutError)
        finally:
            redis_nodes[0].resume()

    run(scenario())


def test_nodes_silent_for_a_whole_deadline_are_not_waited_for_by_the_next_round(
    redis_nodes: RedisNodes,
) -> None:
    # As the synchronous lock (tests/lock/test_redlock.py): 2 yes, 1 no, two nodes
    # stopped; only the first round waits its deadline for them.
    node_timeout = 2.0
    redis_nodes[2].client().set("silent", FOREIGN)

    async def scenario() -> list[float]:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=node_timeout)
        took = []
        for _ in range(3):
            began = time.monotonic()
            assert await redlock.acquire("silent", blocking=False) is None
            took.append(time.monotonic() - began)
            await asyncio.sleep(0.05)
        info = await redlock.holder("silent")
        for node in info.nodes[:2]:
            assert isinstance(node.error, redis.TimeoutError)
            assert "silent for a round's deadline" in str(node.error)
        redlock.close()
        return took

    for server in redis_nodes[:2]:
        server.pause()
    try:
        took = run(scenario())
    finally:
        for server in redis_nodes[:2]:
            server.resume()
    assert took[0] >= node_timeout
    assert max(took[1:]) < node_timeout / 2, took


def test_many_tasks_at_once_each_win_their_own_key(redis_nodes: RedisNodes) -> None:
    # Their rounds share each node's connection (written together in one loop turn).
    clients = _clients(redis_nodes)

    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)

        async def one(i: int) -> str:
            lease = await redlock.try_acquire(f"many:{i}", blocking=False)
            value = lease.value.encode()
            await _until(  # the round returned at quorum: the other SETs follow
                lambda: [c.get(f"many:{i}") for c in clients] == [value] * 5,
                RELEASED_WITHIN,
                f"many:{i} on every node",
            )
            assert await lease.release() is True
            return lease.value

        values = await asyncio.gather(*(one(i) for i in range(40)))
        assert len(set(values)) == 40
        await _until(
            lambda: all(c.keys("many:*") == [] for c in clients), RELEASED_WITHIN, "all released"
        )

    run(scenario())


def test_a_busy_shared_connection_to_a_slow_node_is_kept_while_it_answers(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., FaultProxy]
) -> None:
    # 32 tasks share each node's connection. Node 0 answers every command, 0.2 s late
    # (a proxy), within the owed age (10 round deadlines: 0.5 s): each round is
    # decided by the others, and node 0's connection owes hundreds of replies while
    # they keep coming. It is busy, not hung: tearing it down failed every other round
    # in flight on it. Node 0 itself says how often it was connected to.
    slow = fault_proxy_factory(redis_nodes[0])
    slow.delay(0.1)
    observer = redis_nodes[0].client()
    accepted = int(observer.info("stats")["total_connections_received"])
    urls = [slow.url, *redis_nodes.urls[1:]]

    async def scenario() -> None:
        redlock = AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=0.05)
        stop = time.monotonic() + 2.5  # several owed ages of traffic

        async def task(t: int) -> None:
            i = 0
            while time.monotonic() < stop:
                i += 1
                try:
                    lease = await redlock.acquire(f"busy:{t}:{i}", blocking=False)
                    if lease is not None:
                        await lease.release()
                except QuorumUnavailable:
                    pass  # a loaded machine may miss 50 ms: not what this test is about

        try:
            await asyncio.gather(*(task(t) for t in range(32)))
        finally:
            redlock.close()

    run(scenario())
    connections = int(observer.info("stats")["total_connections_received"]) - accepted
    assert connections == 1, f"node 0 was connected to {connections} times"


def test_rounds_in_flight_together_each_end_at_their_own_deadline(
    redis_nodes: RedisNodes,
) -> None:
    # One timer serves every round in flight: each ends at its own node_timeout.
    async def scenario() -> None:
        short = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=0.2)
        for server in list(redis_nodes)[:3]:
            server.pause()
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def attempt(delay: float) -> float:
                await asyncio.sleep(delay)
                with pytest.raises(QuorumUnavailable):
                    await short.acquire("late", blocking=False)
                return loop.time() - started

            ends = await asyncio.gather(*(attempt(0.05 * i) for i in range(4)))
            # Each waited its own node_timeout after its start (no earlier: the
            # paused nodes never answer), whatever the others' deadlines.
            assert all(end >= 0.05 * i + 0.2 for i, end in enumerate(ends))
        finally:
            for server in list(redis_nodes)[:3]:
                server.resume()

    run(scenario())


def test_a_restarted_node_is_reconnected_on_a_later_round(redis_nodes: RedisNodes) -> None:
    clients = _clients(redis_nodes)

    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        assert await redlock.locked("r") is False  # connections up
        redis_nodes[0].restart()
        redis_nodes[1].restart()
        # The first round may still meet the two closed connections: 3 answer.
        assert await redlock.force_release("r") == 0
        first = await redlock.acquire("r")  # the two connect meanwhile
        assert first is not None and await first.release() is True
        lease = await redlock.acquire("r")
        assert lease is not None
        # Later rounds reach all five again, on fresh connections.
        value = lease.value.encode()
        await _until(lambda: [c.get("r") for c in clients] == [value] * 5, RELEASED_WITHIN, "all 5")

    run(scenario())


def test_script_flush_falls_back_to_eval(redis_nodes: RedisNodes) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        assert await redlock.locked("flush") is False
        for client in _clients(redis_nodes):
            client.script_flush()
        lease = await redlock.acquire("flush")
        assert lease is not None
        for client in _clients(redis_nodes):
            client.script_flush()
        assert await lease.release() is True  # at a quorum: the others follow (as EVAL)
        await _until(_gone(_clients(redis_nodes), "flush"), RELEASED_WITHIN, "released")

    run(scenario())


def test_password_and_db_from_the_url(redis_server_factory: Callable[..., RedisServer]) -> None:
    servers = [redis_server_factory(password="s3cret-pass") for _ in range(3)]
    urls = [f"redis://:s3cret-pass@127.0.0.1:{s.port}/3" for s in servers]

    async def scenario() -> None:
        lease = await AsyncRedlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT).acquire("db3")
        assert lease is not None
        value = lease.value.encode()
        db3 = [s.client(db=3) for s in servers]
        await _until(lambda: [c.get("db3") for c in db3] == [value] * 3, RELEASED_WITHIN, "db 3")
        assert [s.client(db=0).get("db3") for s in servers] == [None] * 3
        wrong = [u.replace("s3cret-pass", "wrong") for u in urls]
        with pytest.raises(QuorumUnavailable, match=r"WRONGPASS|invalid"):
            await AsyncRedlock(wrong, node_timeout=NODE_TIMEOUT).acquire("x", blocking=False)

    run(scenario())


def test_tls_nodes(tls: list[TLSNode], certs: Any) -> None:
    ca: Path = certs.ca

    async def scenario() -> None:
        redlock = AsyncRedlock(tls_urls(tls, ca), ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        lease = await redlock.acquire("tls:async", holder="api:3")
        assert lease is not None
        value = lease.value.encode()
        await _until(lambda: tls_values(tls, "tls:async") == [value] * 3, RELEASED_WITHIN, "all 3")
        assert (await redlock.holder("tls:async")).holder == "api:3"
        assert await lease.release() is True
        untrusted = AsyncRedlock(tls_urls(tls, certs.other_ca), node_timeout=NODE_TIMEOUT)
        with pytest.raises(QuorumUnavailable, match="certificate verify failed"):
            await untrusted.acquire("tls:closed", blocking=False)

    run(scenario())


def test_one_lock_serves_successive_event_loops(redis_nodes: RedisNodes) -> None:
    redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)

    async def take_and_release() -> None:
        lease = await redlock.acquire("loops")
        assert lease is not None and await lease.release() is True

    run(take_and_release())
    run(take_and_release())  # the first loop's connections are closed: fresh ones
    until(_gone(_clients(redis_nodes), "loops"), "released on every node", RELEASED_WITHIN)


# -- reentrancy: the execution is the asyncio Task -------------------------------------------


def test_two_tasks_of_one_loop_are_two_executions(redis_nodes: RedisNodes) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        held = asyncio.Event()
        done = asyncio.Event()

        async def holder() -> None:
            async with redlock.lock("shared") as lease:
                inner = await redlock.acquire("shared", reentrant=True)  # its own hold
                assert inner is not None and inner.value == lease.value
                with pytest.raises(AlreadyHeld):
                    await redlock.acquire("shared")
                held.set()
                await done.wait()
                assert await inner.release() is True

        async def other() -> None:
            await held.wait()
            # Another task: contention, never AlreadyHeld nor a hold, reentrant or not.
            assert await redlock.acquire("shared", blocking=False, reentrant=True) is None
            with pytest.raises(LockContended):
                await redlock.try_acquire("shared", blocking=False)
            done.set()

        first = asyncio.ensure_future(holder())
        await other()
        await first
        lease = await redlock.acquire("shared", blocking=False)
        assert lease is not None and await lease.release() is True

    run(scenario())


def test_a_child_task_contends_with_its_parent(redis_nodes: RedisNodes) -> None:
    async def scenario() -> None:
        redlock = AsyncRedlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
        lease = await redlock.acquire("parent")
        assert lease is not None
        child = asyncio.ensure_future(redlock.acquire("parent", blocking=False, reentrant=True))
        assert await child is None  # contention: the child is not its parent
        assert await lease.release() is True

    run(scenario())


def test_sentinel_nodes_are_refused_naming_the_node() -> None:
    url = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380?master_name=locks"
    with pytest.raises(ConfigurationError, match=r"nodes\[1\]: .* Sentinel-managed.*use Redlock"):
        AsyncRedlock(["redis://127.0.0.1:7001/0", url])
