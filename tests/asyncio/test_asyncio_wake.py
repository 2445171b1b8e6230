"""A blocked ``AsyncRedlock`` acquire is woken by the holder's release
(asyncio/wake.py), against real redis-server processes.

No timing assertions, as in test_wake.py: where a test shows that the waiter was
*woken* rather than that it polled, ``retry_delay`` and the holder's TTL are far
longer than the acquire's timeout, so only a heard release can hand it the lock;
and the holder releases only once the waiter's subscription shows on every node
(``PUBSUB NUMSUB``), so the release cannot fall before it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections import Counter
from typing import Any, Callable

import pytest
import redis

from celery_redlock import Redlock
from celery_redlock.asyncio import AsyncRedlock
from celery_redlock.lock.wake import wake_channel
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.observe import until
from tests.support.tls_acl import MINIMAL_ACL, WAKE_ACL, denied_pubsub, evalsha_calls, set_user
from tests.support.wake import (
    HANG_GUARD,
    NEVER,
    NODE_TIMEOUT,
    hold_until_waited,
    steady,
    stray,
    subscribed,
    undo_strays,
)


async def wait_for(check: Callable[[], bool], guard: float = HANG_GUARD) -> None:
    """Wait for ``check`` (an event, not a timing claim) on the event loop."""
    for _ in range(int(guard / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail("the condition was never reached")


def _unsubscribed(urls: list[str], key: str) -> Callable[[], bool]:
    clients = [redis.Redis.from_url(u) for u in urls]
    channel = wake_channel(key)
    return lambda: all(c.pubsub_numsub(channel)[0][1] == 0 for c in clients)


def _waiter(urls: list[str], **kwargs: Any) -> AsyncRedlock:
    options = {"ttl": 10.0, "node_timeout": NODE_TIMEOUT, "retry_delay": NEVER, **kwargs}
    return AsyncRedlock(urls, **options)


def _holder(urls: list[str], key: Any) -> Any:
    lease = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT).acquire(key, blocking=False)
    assert lease is not None
    return lease


def test_a_release_in_another_process_wakes_the_waiting_task(redis_nodes: RedisNodes) -> None:
    urls = redis_nodes.urls
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    holder = ctx.Process(target=hold_until_waited, args=(urls, "woken", NEVER, ready, out))
    holder.start()

    async def main() -> None:
        redlock = _waiter(urls)
        lease = await redlock.acquire("woken", timeout=HANG_GUARD)
        assert lease is not None  # polling would have waited an hour
        assert (await redlock.holder("woken")).holder == lease.holder
        assert await lease.release()
        await wait_for(_unsubscribed(urls, "woken"))  # unsubscribed on the way out
        redlock.close()

    try:
        assert ready.wait(HANG_GUARD)
        asyncio.run(main())
        assert out.get(timeout=HANG_GUARD) is True  # the holder's release succeeded
    finally:
        holder.join(HANG_GUARD)


@pytest.mark.parametrize("how", ["release", "force_release", "set_release"])
def test_every_kind_of_release_wakes_the_waiting_task(redis_nodes: RedisNodes, how: str) -> None:
    """With ``timeout=None`` (until won): a release, an operator's force_release and
    the release of a set of keys each wake it."""
    urls = redis_nodes.urls
    key: Any = ["aset:a", "aset:b"] if how == "set_release" else f"akind:{how}"
    wanted = key if isinstance(key, list) else [key]
    held = _holder(urls, key)
    holder = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)

    async def main() -> None:
        redlock = _waiter(urls)
        waiting = asyncio.ensure_future(redlock.acquire(wanted[::-1], timeout=None))
        for name in wanted:
            await wait_for(subscribed(urls, name))
        if how == "force_release":
            # It counts the nodes that deleted the key (it waits for every node):
            # from the holder's key on every node, not only the acquire's quorum.
            clients = [s.client() for s in redis_nodes]
            value = held.value.encode()
            await wait_for(lambda: [c.get(key) for c in clients] == [value] * len(urls))
            assert await asyncio.to_thread(holder.force_release, key) == len(urls)
        else:
            assert await asyncio.to_thread(held.release)
        lease = await waiting
        assert lease is not None and lease.held
        assert await lease.release()
        redlock.close()

    asyncio.run(main())


def test_a_cancelled_waiting_acquire_leaves_no_subscription_and_no_task(
    redis_nodes: RedisNodes,
) -> None:
    urls = redis_nodes.urls
    held = _holder(urls, "cancelled")

    async def main() -> None:
        redlock = _waiter(urls)
        before = asyncio.all_tasks()
        waiting = asyncio.ensure_future(redlock.acquire("cancelled", timeout=None))
        await wait_for(subscribed(urls, "cancelled"))
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Unsubscribed, not merely disconnected: the lock is not closed yet.
        await wait_for(_unsubscribed(urls, "cancelled"))
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == before
        assert held.release()
        # The pooled connections serve the next waiter, which is woken as well.
        again = _holder(urls, "cancelled")
        second = asyncio.ensure_future(redlock.acquire("cancelled", timeout=HANG_GUARD))
        await wait_for(subscribed(urls, "cancelled"))
        assert await asyncio.to_thread(again.release)
        lease = await second
        assert lease is not None
        assert await lease.release()
        redlock.close()
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == before

    asyncio.run(main())
    clients = [s.client() for s in redis_nodes]  # the release returned at quorum
    until(lambda: all(c.get("cancelled") is None for c in clients), "released on every node")


def test_many_waiting_tasks_each_get_the_key_once(redis_nodes: RedisNodes) -> None:
    urls = redis_nodes.urls
    waiters = 8
    first = _holder(urls, "aherd")
    with RedisServer() as observer_server:
        observer = observer_server.client()

        async def one(redlock: AsyncRedlock, name: str) -> None:
            lease = await redlock.acquire("aherd", timeout=HANG_GUARD, holder=name)
            assert lease is not None, name
            if observer.incr("occupancy") != 1:
                observer.incr("overlaps")
            await asyncio.sleep(0)  # let the other tasks run while it is held
            observer.rpush("order", name)
            observer.decr("occupancy")
            assert await lease.release()

        async def main() -> None:
            redlock = _waiter(urls)  # one lock, many tasks: one listener each
            tasks = [asyncio.ensure_future(one(redlock, f"t{i}")) for i in range(waiters)]
            # Every task listens and made its refused attempts (the first, and the
            # one right after subscribing) before the first release: only wakes move
            # them on.
            await wait_for(subscribed(urls, "aherd", waiters), guard=HANG_GUARD * 4)
            await wait_for(steady(lambda: evalsha_calls(urls)))
            before = evalsha_calls(urls)
            assert await asyncio.to_thread(first.release)
            await asyncio.gather(*tasks)
            # Each release woke one task of the loop, not every task still waiting:
            # the first release, then one acquire and one release per task, and at
            # times an attempt that overtook the release it heard on a node (undone;
            # the undo wakes the next). Each release waking all made 8 + 7 + ... + 1
            # = 36 attempts (96 calls here).
            assert evalsha_calls(urls) - before <= 1 + 3 * waiters
            await wait_for(_unsubscribed(urls, "aherd"))
            redlock.close()

        asyncio.run(main())
        order = [n.decode() if isinstance(n, bytes) else n for n in observer.lrange("order", 0, -1)]
        assert Counter(order) == {f"t{i}": 1 for i in range(waiters)}
        assert observer.get("overlaps") is None


@pytest.mark.parametrize("limit", [1, 2])
def test_a_lost_attempt_undone_where_it_was_granted_wakes_no_task(
    redis_nodes: RedisNodes, limit: int
) -> None:
    """tests/lock/test_wake.py's storm, with waiting tasks: the holders keep a quorum
    and two of five nodes are free; each task's attempt wins those two, is refused
    on the rest and undone. Once both tasks wait, the nodes' count of scripts holds
    still until a holder releases; then each task gets a permit before its timeout
    (with a limit, retry_delay is 5 s: two tasks splitting the last permit back off
    at random by design, at most 7.5 s; a lost wake costs the whole timeout)."""
    urls, key = redis_nodes.urls, f"agranted-where-{limit}"
    retry_delay = NEVER if limit == 1 else 5.0
    stray(urls, key, range(3, 5), limit)
    holder = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)
    holders = [holder.acquire(key, blocking=False, limit=limit) for _ in range(limit)]
    assert all(holders), holders
    undo_strays(urls, key, limit)

    async def one(redlock: AsyncRedlock) -> None:
        lease = await redlock.acquire(key, timeout=HANG_GUARD, limit=limit)
        assert lease is not None
        assert await lease.release()

    async def main() -> None:
        waiters = [_waiter(urls, ttl=NEVER, retry_delay=retry_delay) for _ in range(2)]
        tasks = [asyncio.ensure_future(one(redlock)) for redlock in waiters]
        await wait_for(subscribed(urls, key, 2))
        await wait_for(steady(lambda: evalsha_calls(urls), quiet=1.0), guard=HANG_GUARD * 4)
        for lease in holders:
            assert lease is not None and await asyncio.to_thread(lease.release)
        await asyncio.wait_for(asyncio.gather(*tasks), 2 * HANG_GUARD)  # past their timeout
        for redlock in waiters:
            redlock.close()

    asyncio.run(main())


def test_a_user_without_pubsub_rights_gets_the_lock_by_polling(
    acl_nodes: RedisNodes,
) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL)  # no channels, no pub/sub
    acl_nodes[0].client().acl_log_reset()
    key = "redlock:awake:denied"
    held = _holder(urls, key)

    async def main() -> None:
        redlock = _waiter(urls, retry_delay=0.05)
        waiting = asyncio.ensure_future(redlock.acquire(key, timeout=HANG_GUARD))
        # The holder's acquire, then the waiter refused at least twice: it is waiting.
        await wait_for(lambda: evalsha_calls(acl_nodes.urls) >= 3)
        assert await asyncio.to_thread(held.release)  # its publish refused, not it
        lease = await waiting
        assert lease is not None  # got it by polling
        assert await lease.release()
        redlock.close()

    asyncio.run(main())
    assert denied_pubsub(acl_nodes[0])  # subscribing was tried, and refused


def test_a_user_with_channel_rights_is_woken(acl_nodes: RedisNodes) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL, *WAKE_ACL)
    acl_nodes[0].client().acl_log_reset()
    key = "redlock:awake:allowed"
    held = _holder(urls, key)

    async def main() -> None:
        redlock = _waiter(urls)  # retry_delay of an hour: only a heard release is in time
        waiting = asyncio.ensure_future(redlock.acquire(key, timeout=HANG_GUARD))
        await wait_for(subscribed(acl_nodes.urls, key))
        assert await asyncio.to_thread(held.release)
        lease = await waiting
        assert lease is not None
        assert await lease.release()
        redlock.close()

    asyncio.run(main())
    assert not denied_pubsub(acl_nodes[0])
