"""The Redlock algorithm against real redis-server processes (no mocks)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from celery_redlock import (
    ConfigurationError,
    LockContended,
    LockLost,
    QuorumUnavailable,
    Redlock,
    RedlockError,
)
from celery_redlock.testing import RedisCluster, RedisServer

FOREIGN = b"someone-else|other-host:1"


def _clients(cluster: RedisCluster) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _keys_everywhere(cluster: RedisCluster, key: str) -> list[object]:
    return [c.get(key) for c in _clients(cluster)]


# -- quorum -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 5])
def test_acquire_succeeds_iff_a_quorum_of_nodes_is_free(
    redis_cluster_factory: Callable[..., RedisCluster], n: int
) -> None:
    cluster = redis_cluster_factory(n)
    clients = _clients(cluster)
    redlock = Redlock(cluster.urls, ttl=10)
    need = n // 2 + 1
    for size in range(n + 1):
        for taken in itertools.combinations(range(n), size):
            key = f"q:{n}:{'-'.join(map(str, taken)) or 'none'}"
            for i in taken:
                clients[i].set(key, FOREIGN, px=10_000)
            lease = redlock.acquire(key, blocking=False)
            free = n - size
            if free >= need:
                assert lease is not None, f"free={free} of {n} must win"
                assert lease.validity > 9
                lease.release()
            else:
                assert lease is None, f"free={free} of {n} must lose"
            # Nothing of ours is left behind, and the foreign keys are untouched.
            for i, client in enumerate(clients):
                assert client.get(key) == (FOREIGN if i in taken else None), (taken, i)


def test_contended_reply_names_the_holder_and_when_it_frees(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=10)
    lease = redlock.acquire("named", holder="task-1@worker-a:42")
    assert lease is not None
    with pytest.raises(LockContended) as caught:
        redlock.try_acquire("named", blocking=False)
    assert caught.value.holder == "task-1@worker-a:42"
    assert caught.value.ttl is not None and 9 < caught.value.ttl <= 10
    info = redlock.holder("named")
    assert info.holder == "task-1@worker-a:42"
    assert all(n.token == lease.token for n in info.nodes)
    assert info.ttl is not None and 9 < info.ttl <= 10
    lease.release()
    assert redlock.holder("named").holder is None


# -- our token only ---------------------------------------------------------------------


def test_expired_holder_cannot_release_or_extend_the_next_holders_lock(
    redis_nodes: RedisCluster,
) -> None:
    first = Redlock(redis_nodes.urls, ttl=0.2, node_timeout=0.05)
    second = Redlock(redis_nodes.urls, ttl=10)
    old = first.acquire("mine")
    assert old is not None
    time.sleep(0.3)
    new = second.acquire("mine", blocking=False)
    assert new is not None
    assert old.extend(5) is False
    assert old.lost
    old.release()
    for client in _clients(redis_nodes):
        assert client.get("mine") == new.value.encode()
        assert client.pttl("mine") > 9000  # not shortened to the old holder's 5 s
    new.release()
    assert _keys_everywhere(redis_nodes, "mine") == [None] * 5


def test_release_is_idempotent_and_leaves_other_keys_alone(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls)
    a = redlock.acquire("a")
    b = redlock.acquire("b")
    assert a is not None and b is not None
    a.release()
    a.release()
    assert a.released and not a.held
    assert _keys_everywhere(redis_nodes, "a") == [None] * 5
    assert all(v == b.value.encode() for v in _keys_everywhere(redis_nodes, "b"))


# -- time -------------------------------------------------------------------------------


def test_validity_is_ttl_minus_elapsed_minus_drift_from_before_the_round(
    redis_nodes: RedisCluster,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=10, drift_factor=0.01)
    before = time.monotonic()
    lease = redlock.acquire("v")
    after = time.monotonic()
    assert lease is not None
    margin = 10 * 0.01 + 0.002
    assert before + 10 - margin <= lease.deadline <= after + 10 - margin
    assert 0 < lease.validity <= 10 - margin


def test_key_expires_at_ttl_and_can_be_taken_again(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=0.25)
    lease = redlock.acquire("exp")
    assert lease is not None
    assert redlock.acquire("exp", blocking=False) is None
    time.sleep(0.3)
    assert not lease.held
    with pytest.raises(LockLost):
        lease.ensure_held()
    assert _keys_everywhere(redis_nodes, "exp") == [None] * 5
    again = redlock.acquire("exp", blocking=False)
    assert again is not None


def test_extension_pushes_expiry_and_is_bounded_by_max_hold(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=0.3, max_hold=0.7)
    lease = redlock.acquire("bounded")
    assert lease is not None
    extended = 0
    while lease.extend():
        extended += 1
        assert lease.deadline <= lease.acquired_at + 0.7
        time.sleep(0.1)
    assert extended >= 3
    assert lease.deadline <= lease.acquired_at + 0.7
    time.sleep(max(0.0, lease.deadline - time.monotonic()) + 0.05)
    assert lease.lost
    assert redlock.acquire("bounded", blocking=False) is not None


def test_single_node_lock_works(redis_server: RedisServer) -> None:
    redlock = Redlock([redis_server.url], ttl=5)
    lease = redlock.acquire("one")
    assert lease is not None and lease.validity > 4.9
    assert redlock.acquire("one", blocking=False) is None
    assert lease.extend()
    lease.release()
    assert redlock.acquire("one", blocking=False) is not None


def test_blocking_acquire_waits_for_the_holder_and_is_bounded_by_timeout(
    redis_nodes: RedisCluster,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=0.4, retry_delay=0.5)
    held = redlock.acquire("wait")
    assert held is not None
    start = time.monotonic()
    # retry_delay is 0.5 s but the holder frees within 0.4 s: the wait follows its TTL.
    lease = redlock.acquire("wait", timeout=2)
    took = time.monotonic() - start
    assert lease is not None
    assert took < 0.6
    long_holder = Redlock(redis_nodes.urls, ttl=30).acquire("long")
    assert long_holder is not None
    start = time.monotonic()
    assert redlock.acquire("long", timeout=0.3) is None
    assert 0.25 <= time.monotonic() - start < 1.0
    with pytest.raises(LockContended), redlock.lock("long", timeout=0.1):
        pass


def test_lock_context_manager_releases_on_error(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5)
    with pytest.raises(ZeroDivisionError), redlock.lock("ctx") as lease:
        assert lease.held
        1 / 0  # noqa: B018
    assert lease.released
    assert _keys_everywhere(redis_nodes, "ctx") == [None] * 5


def test_auto_extend_keeps_a_short_lease_for_long_work(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=0.3)
    other = Redlock(redis_nodes.urls, ttl=0.3)
    with redlock.lock("long-work", auto_extend=True) as lease:
        for _ in range(10):  # 1 s: over 3x the TTL
            time.sleep(0.1)
            assert other.acquire("long-work", blocking=False) is None
        assert lease.held and lease.extensions >= 2
    assert other.acquire("long-work", blocking=False) is not None


def test_watchdog_marks_lease_lost_when_a_quorum_stops_answering(
    redis_nodes: RedisCluster,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=0.6, node_timeout=0.05)
    lost: list[str] = []
    with redlock.lock("fragile", auto_extend=True) as lease:
        lease.on_lost(lambda gone: lost.append(gone.key))
        for server in list(redis_nodes)[:3]:
            server.pause()
        try:
            time.sleep(0.9)
            assert lost == ["fragile"]  # once, at the first failed renewal
            assert not lease.held
            assert lease.lost_reason and "needed 3" in lease.lost_reason
            with pytest.raises(LockLost):
                lease.ensure_held()
        finally:
            for server in list(redis_nodes)[:3]:
                server.resume()


# -- faults -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
@pytest.mark.parametrize("down", [1, 2])
def test_minority_down_still_grants_within_node_timeout(
    redis_nodes: RedisCluster, fault: str, down: int
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=0.05)
    warm = redlock.acquire("warm")
    assert warm is not None
    warm.release()
    victims = list(redis_nodes)[:down]
    for server in victims:
        server.kill() if fault == "kill" else server.pause()
    try:
        for i in range(20):
            start = time.monotonic()
            lease = redlock.acquire(f"minority:{i}", blocking=False)
            took = time.monotonic() - start
            assert lease is not None
            assert took < 0.05 + 0.03
            lease.release()
    finally:
        for server in victims:
            server.resume() if fault == "pause" else None


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_majority_down_fails_within_node_timeout_and_leaves_no_keys(
    redis_nodes: RedisCluster, fault: str
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=0.05)
    servers = list(redis_nodes)
    victims = servers[:3]
    for server in victims:
        server.kill() if fault == "kill" else server.pause()
    try:
        for i in range(5):
            start = time.monotonic()
            with pytest.raises(QuorumUnavailable) as caught:
                redlock.acquire(f"majority:{i}", blocking=False)
            assert time.monotonic() - start < 0.05 + 0.05
            assert len(caught.value.errors) == 3
            for server in servers[3:]:
                assert server.client().get(f"majority:{i}") is None
    finally:
        if fault == "pause":
            for server in victims:
                server.resume()
    if fault == "pause":
        # The stalled nodes run our SET and then our clean-up, in order.
        time.sleep(0.1)
        for server in servers:
            assert server.client().keys("majority:*") == []


def test_fresh_connections_to_hung_nodes_cost_one_node_timeout_not_n(
    redis_nodes: RedisCluster,
) -> None:
    servers = list(redis_nodes)
    for server in servers[:3]:
        server.pause()
    try:
        redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=0.1)  # no connection yet
        start = time.monotonic()
        with pytest.raises(QuorumUnavailable):
            redlock.acquire("fresh", blocking=False)
        assert time.monotonic() - start < 0.1 + 0.05
    finally:
        for server in servers[:3]:
            server.resume()


def test_late_reply_is_never_read_as_the_answer_to_a_later_command(
    redis_nodes: RedisCluster,
) -> None:
    servers = list(redis_nodes)
    redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=0.05)
    servers[0].pause()
    try:
        first = redlock.acquire("late-a", blocking=False)
        assert first is not None  # 4 of 5 answered; node 0 owes a reply
    finally:
        servers[0].resume()
    second = redlock.acquire("late-b", blocking=False)
    assert second is not None
    info = redlock.holder("late-b")
    assert [n.token for n in info.nodes] == [second.token] * 5
    assert redlock.holder("late-a").nodes[0].token == first.token
    first.release()
    second.release()


def test_forked_child_gets_fresh_connections(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5)
    lease = redlock.acquire("parent")
    assert lease is not None
    ctx = multiprocessing.get_context("fork")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_child_acquires, args=(redlock, queue))
    child.start()
    child.join(10)
    assert queue.get(timeout=1) == ("child-ok", None)
    assert redlock.acquire("parent", blocking=False) is None  # parent's view intact
    lease.release()


def _child_acquires(redlock: Redlock, queue: Any) -> None:
    contended = redlock.acquire("parent", blocking=False)
    own = redlock.acquire("child", blocking=False)
    queue.put(("child-ok" if own is not None else "child-failed", contended))


def test_script_flush_falls_back_to_eval(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5)
    warm = redlock.acquire("flush")
    assert warm is not None
    warm.release()
    for client in _clients(redis_nodes):
        client.script_flush()
    lease = redlock.acquire("flush", blocking=False)
    assert lease is not None
    assert lease.extend()
    lease.release()
    assert _keys_everywhere(redis_nodes, "flush") == [None] * 5


def test_one_command_per_node_per_acquire_and_per_release(redis_nodes: RedisCluster) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5)
    warm = redlock.acquire("count")
    assert warm is not None
    warm.release()
    time.sleep(0.01)
    clients = _clients(redis_nodes)
    for client in clients:
        client.config_resetstat()
    for _ in range(50):
        lease = redlock.acquire("count", blocking=False)
        assert lease is not None
        lease.release()
    time.sleep(0.05)  # releases return at quorum: let the last ones land
    for client in clients:
        stats = client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 100
        assert "cmdstat_eval" not in stats


# -- fencing ----------------------------------------------------------------------------


def test_fences_strictly_increase_from_holder_to_holder(redis_nodes: RedisCluster) -> None:
    a = Redlock(redis_nodes.urls, ttl=5, fencing=True)
    b = Redlock(redis_nodes.urls, ttl=5, fencing=True)
    fences = []
    for i in range(20):
        lease = (a if i % 2 else b).acquire("fenced")
        assert lease is not None and lease.fence is not None
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences))
    assert Redlock(redis_nodes.urls).acquire("plain") is not None
    assert Redlock(redis_nodes.urls).acquire("plain2").fence is None  # type: ignore[union-attr]


# -- mutual exclusion under contention -----------------------------------------------


def _contend(
    urls: Sequence[str], observer_url: str, key: str, rounds: int, seed: int, out: Any
) -> None:
    redlock = Redlock(urls, ttl=2, node_timeout=0.05, retry_delay=0.002, retry_count=10_000)
    observer = redis.Redis.from_url(observer_url)
    lock_clients = [redis.Redis.from_url(u) for u in urls]
    overlaps = no_ttl = done = 0
    intervals = []
    while done < rounds:
        lease = redlock.acquire(key, blocking=True, holder=f"p{seed}")
        if lease is None:
            continue
        start = time.monotonic_ns()
        if observer.incr("occupancy") != 1:
            overlaps += 1
        pttls = [c.pttl(key) for c in lock_clients[:1]]
        no_ttl += sum(1 for t in pttls if t == -1)
        if observer.decr("occupancy") != 0:
            overlaps += 1
        end = time.monotonic_ns()
        lease.release()
        intervals.append((start, end))
        done += 1
    out.put((overlaps, no_ttl, intervals))


@pytest.mark.slow
def test_mutual_exclusion_under_contention_checked_by_an_independent_counter(
    redis_nodes: RedisCluster, redis_server_factory: Callable[..., RedisServer]
) -> None:
    observer = redis_server_factory()
    processes, rounds = 8, 260
    ctx = multiprocessing.get_context("spawn")
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(target=_contend, args=(redis_nodes.urls, observer.url, "hot", rounds, i, out))
        for i in range(processes)
    ]
    stop_scan = threading.Event()
    keys_without_ttl: list[bytes] = []
    scanner = threading.Thread(
        target=_scan_for_keys_without_ttl, args=(redis_nodes, stop_scan, keys_without_ttl)
    )
    scanner.start()
    for proc in procs:
        proc.start()
    results = [out.get(timeout=240) for _ in procs]
    stop_scan.set()
    scanner.join()
    for proc in procs:
        proc.join(10)
    overlaps = sum(r[0] for r in results)
    no_ttl = sum(r[1] for r in results)
    intervals = sorted(iv for r in results for iv in r[2])
    assert len(intervals) == processes * rounds >= 2000
    assert overlaps == 0
    assert no_ttl == 0 and keys_without_ttl == []
    # The oracle log: holding intervals (one monotonic clock for all processes) never overlap.
    for (_, end), (start, _) in zip(intervals, intervals[1:]):
        assert end < start


def _scan_for_keys_without_ttl(
    cluster: RedisCluster, stop: threading.Event, found: list[bytes]
) -> None:
    clients = _clients(cluster)
    while not stop.is_set():
        for client in clients:
            for key in client.scan_iter("*"):
                if client.pttl(key) == -1:
                    found.append(key)
        time.sleep(0.01)


# -- bad input ---------------------------------------------------------------------------

BAD_CONSTRUCTION: list[tuple[str, dict[str, Any], str]] = [
    ("no nodes", {"nodes": []}, "at least one"),
    ("a str instead of a list", {"nodes": "redis://127.0.0.1:1/0"}, "list of Redis URLs"),
    ("malformed URL", {"nodes": ["http://127.0.0.1:1"]}, "nodes[0]"),
    ("port out of range", {"nodes": ["redis://127.0.0.1:99999/0"]}, "nodes[0]"),
    ("not a URL or client", {"nodes": [6379]}, "got int"),
    (
        "same node twice",
        {"nodes": ["redis://127.0.0.1:7001/0", "redis://localhost:7001/1"]},
        "listed twice",
    ),
    ("ttl zero", {"ttl": 0}, "ttl must be > 0"),
    ("ttl negative", {"ttl": -1}, "ttl must be > 0"),
    ("ttl not a number", {"ttl": "10"}, "ttl must be a number"),
    ("ttl bool", {"ttl": True}, "ttl must be a number"),
    ("ttl nan", {"ttl": float("nan")}, "finite"),
    ("node_timeout >= ttl", {"ttl": 1, "node_timeout": 1}, "smaller than ttl"),
    ("node_timeout zero", {"node_timeout": 0}, "node_timeout must be > 0"),
    ("drift_factor out of range", {"drift_factor": 1.5}, "drift_factor"),
    ("retry_count negative", {"retry_count": -1}, "retry_count"),
    ("retry_delay negative", {"retry_delay": -0.1}, "retry_delay"),
    ("max_hold zero", {"max_hold": 0}, "max_hold"),
]


@pytest.mark.parametrize(
    ("kwargs", "expected"), [c[1:] for c in BAD_CONSTRUCTION], ids=[c[0] for c in BAD_CONSTRUCTION]
)
def test_bad_construction_argument_gets_a_clear_error(
    kwargs: dict[str, Any], expected: str
) -> None:
    kwargs = {"nodes": ["redis://127.0.0.1:7001/0"], **kwargs}
    with pytest.raises(ConfigurationError, match=re.escape(expected)) as caught:
        Redlock(**kwargs)
    assert isinstance(caught.value, RedlockError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda r: r.acquire(42), "key must be a non-empty str"),
        (lambda r: r.acquire(""), "key must be a non-empty str"),
        (lambda r: r.acquire(b"bytes"), "key must be a non-empty str"),
        (lambda r: r.acquire("k", ttl=-5), "ttl must be > 0"),
        (lambda r: r.acquire("k", ttl=0.01), "larger than node_timeout"),
        (lambda r: r.acquire("k", timeout=-1), "timeout must be >= 0"),
        (lambda r: r.acquire("k", holder="two\nlines"), "holder must be a one-line str"),
        (lambda r: r.holder(None), "key must be a non-empty str"),
    ],
    ids=[
        "int key",
        "empty key",
        "bytes key",
        "ttl",
        "ttl<timeout",
        "timeout",
        "holder",
        "holder()",
    ],
)
def test_bad_call_argument_gets_a_clear_error(
    redis_server: RedisServer, call: Callable[[Redlock], object], expected: str
) -> None:
    redlock = Redlock([redis_server.url])
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        call(redlock)


def test_unreachable_nodes_raise_quorum_unavailable_naming_each_node() -> None:
    redlock = Redlock(["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"])
    with pytest.raises(QuorumUnavailable) as caught:
        redlock.acquire("x", blocking=False)
    assert set(caught.value.errors) == {
        "127.0.0.1:1/0",
        "127.0.0.1:2/0",
        "127.0.0.1:3/0",
    }
    assert "127.0.0.1:1/0" in str(caught.value)


def test_redis_clients_are_accepted_as_nodes(redis_nodes: RedisCluster) -> None:
    redlock = Redlock([server.client() for server in redis_nodes], ttl=5)
    lease = redlock.acquire("clients")
    assert lease is not None
    assert os.getpid() and lease.holder.endswith(f":{os.getpid()}")
    lease.release()


def test_a_release_that_overtakes_a_late_set_leaves_no_key_behind(
    redis_nodes: RedisCluster, fault_proxy_factory: Callable[..., Any]
) -> None:
    # The acquire returns once 3 fast nodes said yes; its SETs to 2 slow nodes are
    # still travelling when a release, on other connections, reaches those nodes.
    servers = list(redis_nodes)
    slow = [fault_proxy_factory(server) for server in servers[3:]]
    for proxy in slow:
        proxy.delay(0.1, direction="to_server")
    holder = Redlock([s.url for s in servers[:3]] + [p.url for p in slow], ttl=10)
    other_connections = Redlock(redis_nodes.urls, ttl=10)
    lease = holder.acquire("overtaken", blocking=False)
    assert lease is not None
    other_connections.release_value("overtaken", lease.value)
    time.sleep(0.3)  # the late SETs have landed by now
    assert _keys_everywhere(redis_nodes, "overtaken") == [None] * 5
    assert other_connections.acquire("overtaken", blocking=False) is not None


@pytest.mark.parametrize("n", [1, 3])
def test_first_acquire_after_the_nodes_restart_succeeds_on_fresh_connections(
    redis_cluster_factory: Callable[..., RedisCluster], n: int
) -> None:
    cluster = redis_cluster_factory(n)
    redlock = Redlock(cluster.urls, ttl=5, node_timeout=0.2)
    warm = redlock.acquire("restart")  # every node now has a pooled connection
    assert warm is not None
    warm.release()
    for server in cluster:
        server.restart(keep_data=False)  # the pooled connections are dead now
    lease = redlock.acquire("restart", blocking=False)
    assert lease is not None  # not a QuorumUnavailable for a stale socket
    lease.release()


def test_a_lagging_node_keeps_its_connection_and_gets_every_release(
    redis_nodes: RedisCluster, fault_proxy_factory: Callable[..., Any]
) -> None:
    # Rounds stop reading at quorum, so the slowest node's replies are always owed.
    # They must be drained, not let pile up until the connection is dropped: a
    # dropped connection (RST) makes the node discard commands it has not read yet,
    # our releases among them, and the keys would linger until their TTL.
    servers = list(redis_nodes)
    lagging = fault_proxy_factory(servers[4])
    lagging.delay(0.003)
    redlock = Redlock([s.url for s in servers[:4]] + [lagging.url], ttl=30)
    probe = servers[4].client()
    connections_before = probe.info("stats")["total_connections_received"]
    for i in range(200):
        lease = redlock.acquire(f"lag:{i}", blocking=False)
        assert lease is not None
        lease.release()
    time.sleep(0.3)
    left = [
        [k for k in server.client().scan_iter("lag:*") if b"\x00" not in k] for server in servers
    ]
    assert left == [[]] * 5
    made = probe.info("stats")["total_connections_received"] - connections_before
    assert made <= 2  # the lagging node keeps its connection(s); no churn


def test_a_release_after_script_flush_reaches_the_node_the_round_did_not_wait_for(
    redis_nodes: RedisCluster, fault_proxy_factory: Callable[..., Any]
) -> None:
    # The release returns once a quorum answered; the slow node's reply is NOSCRIPT
    # (its scripts were flushed) and arrives after: it must still be resent as EVAL.
    servers = list(redis_nodes)
    slow = fault_proxy_factory(servers[4])
    redlock = Redlock([s.url for s in servers[:4]] + [slow.url], ttl=30)
    lease = redlock.acquire("flushed", blocking=False)
    assert lease is not None
    time.sleep(0.05)  # every node holds the key
    for server in servers:
        server.client().script_flush()
    slow.delay(0.05)
    lease.release()
    time.sleep(0.3)
    redlock.acquire("other", blocking=False)  # a later round drains the slow node
    time.sleep(0.3)
    assert _keys_everywhere(redis_nodes, "flushed") == [None] * 5
