"""A blocked acquire is woken by the holder's release (wake.py), against real
redis-server processes, with holders in other processes.

No timing assertions. Where a test shows that the waiter was *woken* rather than
that it polled, the polling path is made unable to finish in time by construction:
``retry_delay`` and the holder's TTL are far longer than the acquire's timeout, so
only a heard release (or, for a crashed holder, the TTL bound) can hand it the lock.
The holder releases only once the waiter's subscription shows on every node
(``PUBSUB NUMSUB``), so the release cannot fall before it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis

from celery_redlock import ConfigurationError, Redlock
from celery_redlock.lock.wake import TAKEN_FOR, Releases, Subscriber, wake_channel, woken
from celery_redlock.testing import RedisNodes, RedisSentinelGroup, RedisServer
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
    wait_for,
)


def _hold_and_die(urls: list[str], key: str, ttl: float, ready: Any) -> None:
    lease = Redlock(urls, ttl=ttl, node_timeout=NODE_TIMEOUT).acquire(key, blocking=False)
    assert lease is not None
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)  # never releases


def _waiter(urls: list[str], **kwargs: Any) -> Redlock:
    options = {"ttl": 10.0, "node_timeout": NODE_TIMEOUT, "retry_delay": NEVER, **kwargs}
    return Redlock(urls, **options)


def test_a_release_in_another_process_wakes_the_blocked_acquire(
    redis_nodes: RedisNodes,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    holder = ctx.Process(
        target=hold_until_waited, args=(redis_nodes.urls, "woken", NEVER, ready, out)
    )
    holder.start()
    try:
        assert ready.wait(HANG_GUARD)
        redlock = _waiter(redis_nodes.urls)
        lease = redlock.acquire("woken", timeout=HANG_GUARD)
        # Polling would have waited retry_delay (or the holder's hour-long TTL).
        assert lease is not None
        assert out.get(timeout=HANG_GUARD) is True  # the holder's release succeeded
        assert redlock.holder("woken").holder == lease.holder
        lease.release()
        redlock.close()
        # Unsubscribed on the way out, and the connections closed.
        wait_for(lambda: not subscribed(redis_nodes.urls, "woken")())
    finally:
        holder.join(HANG_GUARD)


def test_no_timeout_waits_past_retry_count_until_the_holder_releases(
    redis_nodes: RedisNodes,
) -> None:
    waits: list[float] = []
    released = threading.Event()
    holder = Redlock(redis_nodes.urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)
    held = holder.acquire("patient", blocking=False)
    assert held is not None

    def sleep(seconds: float) -> None:  # an injected sleep: the lock polls through it
        waits.append(seconds)
        if len(waits) == 10 and not released.is_set():
            released.set()
            assert held.release()

    redlock = Redlock(
        redis_nodes.urls, ttl=10, node_timeout=NODE_TIMEOUT, retry_count=3,
        retry_delay=0.001, sleep=sleep,
    )  # fmt: skip
    lease = redlock.acquire("patient")  # blocking, timeout=None
    assert lease is not None and released.is_set()
    assert len(waits) >= 10  # far past 1 + retry_count attempts
    lease.release()


def test_no_timeout_is_woken_too(redis_nodes: RedisNodes) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    args = (redis_nodes.urls, "forever", NEVER, ready, out)
    holder = ctx.Process(target=hold_until_waited, args=args)
    holder.start()
    try:
        assert ready.wait(HANG_GUARD)
        with _waiter(redis_nodes.urls).lock("forever", timeout=None) as lease:
            assert lease.held
        assert out.get(timeout=HANG_GUARD) is True
    finally:
        holder.join(HANG_GUARD)


def test_an_infinite_timeout_is_accepted(redis_nodes: RedisNodes) -> None:
    redlock = _waiter(redis_nodes.urls)
    lease = redlock.acquire("inf", timeout=math.inf)
    assert lease is not None
    waiting: list[Any] = []
    thread = threading.Thread(
        target=lambda: waiting.append(redlock.try_acquire("inf2", timeout=float("inf")))
    )
    other = _waiter(redis_nodes.urls).acquire("inf2", blocking=False)
    assert other is not None
    thread.start()
    wait_for(subscribed(redis_nodes.urls, "inf2"))
    assert other.release()
    thread.join(HANG_GUARD)
    assert waiting and waiting[0].held
    with redlock.lock("inf3", timeout=float("inf")) as held:
        assert held.held
    lease.release()
    waiting[0].release()


@pytest.mark.parametrize(
    ("timeout", "blocking", "says"),
    [
        (-1, True, "timeout must be >= 0 seconds, or None / float('inf')"),
        (-math.inf, True, "timeout must be >= 0 seconds, or None / float('inf')"),
        (math.nan, True, "timeout must be a finite number of seconds"),
        ("5", True, "timeout must be a number of seconds"),
        (True, True, "timeout must be a number of seconds"),
        (5, False, "needs blocking=True"),
        (math.inf, False, "needs blocking=True"),
    ],
)
def test_bad_timeouts_are_refused_naming_the_argument(
    redis_nodes: RedisNodes, timeout: Any, blocking: bool, says: str
) -> None:
    redlock = _waiter(redis_nodes.urls)
    with pytest.raises(ConfigurationError, match=r"timeout") as caught:
        redlock.acquire("bad", blocking=blocking, timeout=timeout)
    assert says in str(caught.value)


def test_a_crashed_holder_is_taken_after_its_ttl(redis_nodes: RedisNodes) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_and_die, args=(redis_nodes.urls, "crash", 1.5, ready))
    holder.start()
    assert ready.wait(HANG_GUARD)
    holder.join(HANG_GUARD)
    assert holder.exitcode == -signal.SIGKILL  # it never released
    # Nobody publishes; the wait is bounded by the holder's TTL, not retry_delay.
    lease = _waiter(redis_nodes.urls).acquire("crash", timeout=HANG_GUARD)
    assert lease is not None
    lease.release()


def _blocked(
    redlock: Redlock, key: Any, got: list[Any], timeout: float = HANG_GUARD
) -> threading.Thread:
    thread = threading.Thread(target=lambda: got.append(redlock.acquire(key, timeout=timeout)))
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["force_release", "clear", "set_release", "reentered_release"])
def test_every_kind_of_release_wakes_the_waiter(redis_nodes: RedisNodes, how: str) -> None:
    """An operator's force_release and clear, the release of a set of keys, and the
    last hold of a re-entered lease publish too (each deletes the key). The holder's
    TTL and the waiter's retry_delay are far past the waiter's timeout: only a wake
    hands it the key."""
    urls = redis_nodes.urls
    holder = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)
    key: Any = ["set:a", "set:b"] if how == "set_release" else f"kind:{how}"
    held = holder.acquire(key, blocking=False)
    assert held is not None
    inner = holder.acquire(key, reentrant=True) if how == "reentered_release" else None
    got: list[Any] = []
    wanted = key if isinstance(key, list) else [key]
    # Its timeout runs past the join below: a waiter that was never woken would win
    # only at its timeout's last attempt, after the join gave up on it.
    thread = _blocked(_waiter(urls), wanted[::-1], got, timeout=2 * HANG_GUARD)
    for name in wanted:
        wait_for(subscribed(urls, name))
    if how == "force_release":
        assert holder.force_release(key) == len(urls)
    elif how == "clear":
        assert holder.clear("kind:clea?") == 1
    else:
        if inner is not None:
            assert inner.release()  # one hold of two: the key stays, nobody is woken
        assert held.release()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), f"{how} never woke the blocked acquire"
    assert got and got[0] is not None
    got[0].release()


def _acl_wait(urls: list[str], admin_urls: list[str], key: str) -> tuple[bool, Any]:
    """Hold ``key`` as the ACL user, block a waiter as the same user, release once
    the waiter is in its wait; (the release's outcome, the waiter's lease)."""
    holder = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)
    held = holder.acquire(key, blocking=False)
    assert held is not None
    got: list[Any] = []
    waiter = _waiter(urls, retry_delay=0.05)
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(key, timeout=HANG_GUARD)))
    thread.start()
    # The holder's acquire, then the waiter refused at least twice: it is waiting.
    wait_for(lambda: evalsha_calls(admin_urls) >= 3)
    released = held.release()
    thread.join(HANG_GUARD)
    waiter.close()
    return released, got[0] if got else None


def test_a_node_denying_pubsub_still_releases_and_the_waiter_polls(
    acl_nodes: RedisNodes,
) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL)  # no channels, no pub/sub
    acl_nodes[0].client().acl_log_reset()
    released, lease = _acl_wait(urls, acl_nodes.urls, "redlock:wake:denied")
    assert released is True  # the publish was refused, the release was not
    assert lease is not None  # got it by polling
    assert denied_pubsub(acl_nodes[0])  # both were tried, and refused
    lease.release()


def test_an_acl_user_with_channel_rights_is_woken(
    acl_nodes: RedisNodes,
) -> None:
    urls = set_user(acl_nodes, "locker", "pw", *MINIMAL_ACL, *WAKE_ACL)
    acl_nodes[0].client().acl_log_reset()
    holder = Redlock(urls, ttl=NEVER, node_timeout=NODE_TIMEOUT)
    held = holder.acquire("redlock:wake:allowed", blocking=False)
    assert held is not None
    got: list[Any] = []
    waiter = _waiter(urls)  # retry_delay of an hour: only a heard release is in time
    thread = threading.Thread(
        target=lambda: got.append(waiter.acquire("redlock:wake:allowed", timeout=HANG_GUARD))
    )
    thread.start()
    wait_for(subscribed(acl_nodes.urls, "redlock:wake:allowed"))
    assert held.release()
    thread.join(HANG_GUARD)
    assert got and got[0] is not None
    got[0].release()
    assert not denied_pubsub(acl_nodes[0])  # nothing of pub/sub was denied


#: The herd's guard for every waiter to listen (spawning 6 interpreters on a loaded machine).
HERD_GUARD = HANG_GUARD * 4


def _queue_up(urls: list[str], observer_url: str, key: str, name: str) -> None:
    redlock = _waiter(urls)
    observer = redis.Redis.from_url(observer_url)
    # Past the test's guard for the whole herd to listen, and then for the turns: a
    # waiter that listened first must not give up while the test still waits for others.
    lease = redlock.acquire(key, timeout=2 * HERD_GUARD, holder=name)
    assert lease is not None, name
    if observer.incr("occupancy") != 1:
        observer.incr("overlaps")
    observer.rpush("order", name)
    observer.decr("occupancy")
    assert lease.release()
    redlock.close()


def test_many_waiters_each_get_the_key_once_in_turn(redis_nodes: RedisNodes, tmp_path: Any) -> None:
    waiters = 6
    with RedisServer() as observer:
        first = _waiter(redis_nodes.urls, ttl=NEVER).acquire("herd", blocking=False)
        assert first is not None
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=_queue_up, args=(redis_nodes.urls, observer.url, "herd", f"w{i}"))
            for i in range(waiters)
        ]
        for proc in procs:
            proc.start()
        # Every waiter listens before the first release: only wakes move them on.
        wait_for(subscribed(redis_nodes.urls, "herd", waiters), guard=HERD_GUARD)
        assert first.release()
        for proc in procs:
            proc.join(2 * HERD_GUARD)  # each waiter's own timeout
        assert [proc.exitcode for proc in procs] == [0] * waiters
        client = observer.client()
        order = [n.decode() if isinstance(n, bytes) else n for n in client.lrange("order", 0, -1)]
        assert Counter(order) == {f"w{i}": 1 for i in range(waiters)}
        assert client.get("overlaps") is None


def test_a_named_release_is_taken_once_and_an_unnamed_one_by_everyone() -> None:
    releases = Releases()
    one, other = (b"k\x00wake", b"r1" * 20), (b"k\x00wake", b"r2" * 20)
    a, b = object(), object()  # two waiters of one lock in one process
    assert releases.take([one], now=0.0, taker=a)
    assert not releases.take([one], now=0.1, taker=b)  # the same release, heard by a second waiter
    assert releases.take([one], now=0.1, taker=a)  # heard again by its taker: news to it
    assert releases.take([one, other], now=0.2, taker=b)  # takes the release nobody took
    assert not releases.take([one, other], now=0.3, taker=object())
    assert releases.take([one], now=TAKEN_FOR + 0.5, taker=b)  # read that late: one spare attempt
    assert releases.take([(b"k\x00wake", b"")], now=1.0, taker=a)  # clear, force_release: all
    assert releases.take([(b"k\x00wake", b"")], now=1.0, taker=b)
    assert not releases.take([], now=1.0, taker=a)
    for n in range(1000):  # what it remembers stays bounded
        releases.take([(b"k\x00wake", b"%d" % n)], now=n * TAKEN_FOR, taker=a)
    assert len(releases._taken) <= 300


def _hearing(enough: int) -> Any:
    """What ``woken`` reads of a lock's wake-ups: a fresh registry, how many to hear."""
    return SimpleNamespace(releases=Releases(), heard_enough=enough)


def test_after_a_quorum_refused_only_the_refusing_nodes_wake_while_enough_are_heard() -> None:
    """5 nodes, refused by 0-2: a message heard on node 4 alone does not wake, one on
    node 0 does. With two of the three refusing nodes not heard (fewer than N -
    quorum + 1), a quorum might free where none is heard: any node's message wakes."""
    channel = b"k\x00wake"
    subs = {i: Subscriber(cast(Any, None)) for i in range(5)}  # no I/O: what they heard
    for sub in subs.values():
        sub.wanted, sub.watching = {channel}, {channel}
    refused = frozenset({0, 1, 2})
    subs[4].heard = [(channel, b"r1" * 20)]
    assert not woken(subs, _hearing(3), refused, 0.0, object())
    assert subs[4].heard == []  # forgotten either way
    subs[0].heard = [(channel, b"r2" * 20)]
    assert woken(subs, _hearing(3), refused, 0.0, object())
    subs[1].denied = subs[2].denied = True  # their SUBSCRIBE refused: not heard
    subs[4].heard = [(channel, b"r3" * 20)]
    assert woken(subs, _hearing(3), refused, 0.0, object())


def test_a_release_heard_again_from_the_nodes_that_refused_its_taker_wakes_it() -> None:
    """Seen on real nodes (below): a waiter took a release from its first messages
    (nodes 0 and 1) and attempted; its requests reached nodes 2-4 before the release
    did, so the releasing holder refused it there and it waits for those nodes. Their
    messages, the same release, must wake it again; another waiter of the process
    that did not take it is not woken by them."""
    channel = b"k\x00wake"
    release = (channel, b"r1" * 20)
    hearing = _hearing(3)
    taker, other = object(), object()

    def heard_on_the_rest() -> dict[int, Subscriber]:
        subs = {i: Subscriber(cast(Any, None)) for i in range(5)}
        for i, sub in subs.items():
            sub.wanted, sub.watching = {channel}, {channel}
            sub.heard = [release] if i >= 2 else []
        return subs

    first = heard_on_the_rest()
    first[0].heard = first[1].heard = [release]
    assert woken(first, hearing, None, 0.0, taker)  # took it: attempts
    refused = frozenset({2, 3, 4})
    assert not woken(heard_on_the_rest(), hearing, refused, 0.1, other)
    assert woken(heard_on_the_rest(), hearing, refused, 0.1, taker)


def test_a_release_wakes_one_waiter_of_a_process_not_every_one(
    redis_nodes: RedisNodes,
) -> None:
    """Threads of one process blocked on one key: each release is taken by one of
    them (wake.py, ``Releases``), the others keep waiting. Counted on a node
    (EVALSHA calls), not by the lock. retry_delay and the TTLs are far past the
    acquire's timeout: a release taken by nobody would leave its waiters waiting
    until then, so every thread getting the key in time shows none was lost."""
    urls = redis_nodes.urls
    waiters = 6
    first = _waiter(urls, ttl=NEVER).acquire("one-each", blocking=False)
    assert first is not None
    redlock = _waiter(urls, ttl=NEVER)
    order: list[str] = []

    def queue_up(name: str) -> None:
        lease = redlock.acquire("one-each", timeout=2 * HANG_GUARD, holder=name)
        assert lease is not None, name
        order.append(name)
        assert lease.release()

    threads = [threading.Thread(target=queue_up, args=(f"t{i}",)) for i in range(waiters)]
    for thread in threads:
        thread.start()
    # Each listens and made its two refused attempts (the first, and the one right
    # after subscribing) before the first release: only wakes move them on.
    wait_for(subscribed(urls, "one-each", waiters), guard=HERD_GUARD)
    wait_for(steady(lambda: evalsha_calls(urls)), guard=HERD_GUARD)
    before = evalsha_calls(urls)
    assert first.release()
    for thread in threads:
        thread.join(2 * HANG_GUARD)
    assert sorted(order) == [f"t{i}" for i in range(waiters)]
    # The first release, then one acquire and one release per thread: 13 calls in
    # most runs. Now and then a woken thread's attempt reaches a node before the
    # release it heard did: refused there and undone, it takes that release again when
    # the node's message comes, while its undo's message wakes a sibling, whose
    # attempt races it (in 30 runs: 13 calls in half, 15-23 in most others, 27 once).
    # Woken all at each release, they made 6 + 5 + ... + 1 = 21 attempts (37 calls).
    assert evalsha_calls(urls) - before <= 1 + 5 * waiters
    redlock.close()


@pytest.mark.parametrize("limit", [1, 2])
def test_a_lost_attempt_undone_where_it_was_granted_wakes_no_one(
    redis_nodes: RedisNodes, limit: int
) -> None:
    """The holders keep a quorum, two of five nodes are free (a racing claim there
    kept the holder's round out, then was undone). A waiter's attempt is granted
    there, refused by the holders on the other three, and undone. Before, the undo's
    message woke the next waiter, whose attempt did the same: rounds without end
    until a holder let go (in a gevent worker with a limit of 3, a freed permit then
    waited a p90 of 0.7-1 s). Now, after an attempt a
    quorum refused, a waiter wakes only for messages from the nodes that refused it
    (what frees elsewhere alone cannot let it win): once both wait, the nodes' count
    of scripts holds still (counted there) until a holder releases, and then each
    waiter gets a permit in time: before its timeout, with the TTLs far past it and,
    for the mutex, retry_delay too. Two callers splitting the last permit back off
    at random by design (rules.py), so with a limit retry_delay is 5 s: a split
    costs at most 7.5 s, a lost wake the whole timeout. (A lost wake was found here:
    a waiter whose attempt reached a node before the release it had heard lost
    there, and the same release's message from that node was not its to take;
    wake.py, ``Releases``.)"""
    urls, key = redis_nodes.urls, f"granted-where-{limit}"
    retry_delay = NEVER if limit == 1 else 5.0
    stray(urls, key, range(3, 5), limit)
    holders = [
        _waiter(urls, ttl=NEVER).acquire(key, blocking=False, limit=limit) for _ in range(limit)
    ]
    assert all(holders), holders
    undo_strays(urls, key, limit)
    got: list[str] = []

    def queue_up(name: str) -> None:
        # Its own lock: a process of its own (each process wakes one waiter).
        waiter = _waiter(urls, ttl=NEVER, retry_delay=retry_delay)
        lease = waiter.acquire(key, timeout=HANG_GUARD, limit=limit)
        assert lease is not None, name
        got.append(name)
        assert lease.release()

    threads = [threading.Thread(target=queue_up, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    wait_for(subscribed(urls, key, 2))
    wait_for(steady(lambda: evalsha_calls(urls), quiet=1.0), guard=HERD_GUARD)
    for lease in holders:
        assert lease is not None and lease.release()
    for thread in threads:
        thread.join(2 * HANG_GUARD)  # past the waiters' own timeout
    assert sorted(got) == ["w0", "w1"]


_GREEN_WAIT = """
import sys, time
{patch}
import redis
from celery_redlock import Redlock
from celery_redlock.lock.wake import TAKEN_FOR, Releases, Subscriber, wake_channel, woken
urls = sys.argv[1:]
held = Redlock(urls, ttl={never}, node_timeout={node_timeout}).acquire("green", blocking=False)
assert held is not None, "the holder did not get a free key"
def release_once_the_waiter_listens():
    clients = [redis.Redis.from_url(u) for u in urls]
    give_up = time.monotonic() + {guard}
    while not all(c.pubsub_numsub(wake_channel("green"))[0][1] >= 1 for c in clients):
        assert time.monotonic() < give_up, "the waiter never subscribed"
        {sleep}(0.01)
    assert held.release(), "the holder's release failed"
{spawn}(release_once_the_waiter_listens)
# Only the releasing greenlet can end this wait in time (retry_delay and the holder's
# TTL are past the timeout): a hub blocked by the wait would never run it.
waiter = Redlock(urls, ttl=10, node_timeout={node_timeout}, retry_delay={never})
lease = waiter.acquire("green", timeout={guard})
print("woken" if lease is not None else "not woken")
"""

_HUBS = {
    "gevent": ("from gevent import monkey; monkey.patch_all()\nimport gevent", "gevent"),
    "eventlet": ("import eventlet; eventlet.monkey_patch()", "eventlet"),
}


@pytest.mark.parametrize("hub", sorted(_HUBS))
def test_a_green_waiter_lets_the_hub_run_and_is_woken(redis_nodes: RedisNodes, hub: str) -> None:
    pytest.importorskip(hub, reason=f"{hub} (the test extra) is not installed")
    patch, module = _HUBS[hub]
    script = _GREEN_WAIT.format(
        patch=patch, sleep=f"{module}.sleep", spawn=f"{module}.spawn",
        never=NEVER, node_timeout=NODE_TIMEOUT, guard=HANG_GUARD,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, *redis_nodes.urls],
        capture_output=True, text=True, timeout=HANG_GUARD * 4,  # the waits inside: 2 guards
    )  # fmt: skip
    assert done.stdout.strip() == "woken", done.stderr


def test_a_sentinel_managed_node_is_heard_at_its_master() -> None:
    with RedisSentinelGroup(replicas=1, sentinels=1, password="master-secret") as group:
        holder = Redlock([group.url], ttl=NEVER, node_timeout=NODE_TIMEOUT)
        held = holder.acquire("sentinel:wake", blocking=False)
        assert held is not None
        got: list[Any] = []
        waiter = _waiter([group.url])  # polling would take an hour
        thread = _blocked(waiter, "sentinel:wake", got)
        master = group.master.client()
        wait_for(lambda: master.pubsub_numsub(wake_channel("sentinel:wake"))[0][1] >= 1)
        assert held.release()
        thread.join(HANG_GUARD)
        assert got and got[0] is not None
        got[0].release()
        waiter.close()
