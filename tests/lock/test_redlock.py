"""The Redlock algorithm against real redis-server processes (no mocks)."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from celery_redlock import (
    AlreadyHeld,
    ConfigurationError,
    Lease,
    LockContended,
    LockLost,
    QuorumUnavailable,
    Redlock,
    RedlockError,
)
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.bad_construction import BAD_CONSTRUCTION

FOREIGN = b"someone-else|other-host:1"
#: For rounds that must succeed: a deadline no loaded machine misses. Tests about the
#: deadline itself set their own, and bound times by it.
NODE_TIMEOUT = 1.0
#: Keys whose release is checked live this long, and are checked gone within
#: RELEASED_WITHIN: gone that early proves the release reached the node (not the TTL).
KEY_TTL = 30.0
RELEASED_WITHIN = KEY_TTL / 3


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _keys_everywhere(cluster: RedisNodes, key: str) -> list[object]:
    return [c.get(key) for c in _clients(cluster)]


def _eventually(check: Callable[[], bool], within: float, what: str) -> None:
    """Poll ``check`` until true; fail after ``within`` seconds (a bound, not a guess:
    each caller derives it from a TTL much longer)."""
    give_up = time.monotonic() + within
    while not check():
        assert time.monotonic() < give_up, f"{what}: still not so after {within} s"
        time.sleep(0.01)


def _gone_everywhere(cluster: RedisNodes, key: str) -> None:
    _eventually(
        lambda: _keys_everywhere(cluster, key) == [None] * len(cluster),
        RELEASED_WITHIN,
        f"{key} released on every node",
    )


# -- quorum -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 5])
def test_acquire_succeeds_iff_a_quorum_of_nodes_is_free(
    redis_nodes_factory: Callable[..., RedisNodes], n: int
) -> None:
    cluster = redis_nodes_factory(n)
    clients = _clients(cluster)
    redlock = Redlock(cluster.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    need = n // 2 + 1
    for size in range(n + 1):
        for taken in itertools.combinations(range(n), size):
            key = f"q:{n}:{'-'.join(map(str, taken)) or 'none'}"
            for i in taken:
                clients[i].set(key, FOREIGN, px=int(KEY_TTL * 2000))
            before = time.monotonic()
            lease = redlock.acquire(key, blocking=False)
            free = n - size
            if free >= need:
                assert lease is not None, f"free={free} of {n} must win"
                assert lease.deadline >= before + KEY_TTL - redlock._rules.settings.margin(KEY_TTL)
                lease.release()
            else:
                assert lease is None, f"free={free} of {n} must lose"
            # Nothing of ours is left behind (the release and the failed acquire's
            # clean-up reach the nodes the round did not wait for), and the foreign
            # keys are untouched.
            expected = [FOREIGN if i in taken else None for i in range(n)]
            _eventually(
                lambda: [c.get(key) for c in clients] == expected,  # noqa: B023
                RELEASED_WITHIN,
                f"{key}: ours gone, foreign kept",
            )


def test_contended_reply_names_the_holder_and_when_it_frees(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=10, node_timeout=NODE_TIMEOUT)
    before = time.monotonic()
    lease = redlock.acquire("named", holder="task-1@worker-a:42")
    assert lease is not None
    other = Redlock(redis_nodes.urls, ttl=10, node_timeout=NODE_TIMEOUT)  # another client
    with pytest.raises(LockContended) as caught:
        other.try_acquire("named", blocking=False)
    # The reported TTL ran down at most by the time since before the SET (Redis
    # counts in ms: 10 ms of rounding slack).
    assert caught.value.holder == "task-1@worker-a:42"
    ran_down = time.monotonic() - before
    assert caught.value.ttl is not None and 10 - ran_down - 0.01 <= caught.value.ttl <= 10
    _eventually(  # the acquire returned at quorum: the other SETs follow
        lambda: _keys_everywhere(redis_nodes, "named") == [lease.value.encode()] * 5,
        RELEASED_WITHIN,
        "the key on every node",
    )
    info = redlock.holder("named")
    assert info.holder == "task-1@worker-a:42"
    assert all(n.token == lease.token for n in info.nodes)
    ran_down = time.monotonic() - before
    assert info.ttl is not None and 10 - ran_down - 0.01 <= info.ttl <= 10
    lease.release()
    assert redlock.holder("named").holder is None


# -- our token only ---------------------------------------------------------------------


def test_expired_holder_cannot_release_or_extend_the_next_holders_lock(
    redis_nodes: RedisNodes,
) -> None:
    first = Redlock(redis_nodes.urls, ttl=1, node_timeout=0.5)
    second = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    old = first.acquire("mine")
    assert old is not None
    # Expired on every node: set after the round started, so past old's deadline too.
    _eventually(lambda: _keys_everywhere(redis_nodes, "mine") == [None] * 5, 10, "expired")
    new = second.acquire("mine", blocking=False)
    assert new is not None
    assert old.extend(5) is False
    assert old.lost
    old.release()
    _eventually(
        lambda: _keys_everywhere(redis_nodes, "mine") == [new.value.encode()] * 5,
        RELEASED_WITHIN,
        "the new holder's SET on every node",
    )
    for client in _clients(redis_nodes):
        assert client.pttl("mine") > 5000 + 1000  # not shortened to the old holder's 5 s
    new.release()
    _gone_everywhere(redis_nodes, "mine")


def test_release_is_idempotent_and_leaves_other_keys_alone(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    a = redlock.acquire("a")
    b = redlock.acquire("b")
    assert a is not None and b is not None
    a.release()
    a.release()
    assert a.released and not a.held
    _gone_everywhere(redis_nodes, "a")
    _eventually(
        lambda: _keys_everywhere(redis_nodes, "b") == [b.value.encode()] * 5,
        RELEASED_WITHIN,
        "b on every node",
    )


# -- time -------------------------------------------------------------------------------


def test_validity_is_ttl_minus_elapsed_minus_drift_from_before_the_round(
    redis_nodes: RedisNodes,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=10, node_timeout=NODE_TIMEOUT, drift_factor=0.01)
    before = time.monotonic()
    lease = redlock.acquire("v")
    after = time.monotonic()
    assert lease is not None
    margin = 10 * 0.01 + 0.002
    assert before + 10 - margin <= lease.deadline <= after + 10 - margin
    assert 0 < lease.validity <= 10 - margin


def test_key_expires_at_ttl_and_can_be_taken_again(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=1, node_timeout=0.5)
    lease = redlock.acquire("exp")
    assert lease is not None
    assert Redlock(redis_nodes.urls, ttl=1, node_timeout=0.5).acquire("exp", blocking=False) is None
    # Nobody releases it: it expires on the nodes. Each key was set after the round
    # started, so once they are all gone the lease's deadline has passed too.
    _eventually(lambda: _keys_everywhere(redis_nodes, "exp") == [None] * 5, 10, "expired")
    assert not lease.held
    with pytest.raises(LockLost):
        lease.ensure_held()
    again = redlock.acquire("exp", blocking=False)
    assert again is not None


def test_extension_pushes_expiry_and_is_bounded_by_max_hold(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=1, node_timeout=0.5, max_hold=3)
    lease = redlock.acquire("bounded")
    assert lease is not None
    extended = 0
    while lease.extend():
        extended += 1
        assert lease.deadline <= lease.acquired_at + 3
        time.sleep(0.2)
    assert extended >= 3
    assert lease.deadline <= lease.acquired_at + 3
    time.sleep(max(0.0, lease.deadline - time.monotonic()) + 0.05)
    assert lease.lost
    # The nodes' keys run out just after the deadline: a blocking acquire follows them.
    assert redlock.acquire("bounded", timeout=5) is not None


def test_single_node_lock_works(redis_server: RedisServer) -> None:
    redlock = Redlock([redis_server.url], ttl=5, node_timeout=NODE_TIMEOUT)
    before = time.monotonic()
    lease = redlock.acquire("one")
    assert lease is not None and lease.deadline >= before + 5 - redlock._rules.settings.margin(5)
    other = Redlock([redis_server.url], ttl=5, node_timeout=NODE_TIMEOUT)  # another client
    assert other.acquire("one", blocking=False) is None
    assert lease.extend()
    lease.release()
    assert redlock.acquire("one", blocking=False) is not None


def test_blocking_acquire_waits_for_the_holder_and_is_bounded_by_timeout(
    redis_nodes: RedisNodes,
) -> None:
    asked: list[float] = []  # every wait the acquire asks for

    def sleep(seconds: float) -> None:
        asked.append(seconds)
        time.sleep(seconds)

    redlock = Redlock(
        redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT, retry_delay=10, sleep=sleep
    )
    held = Redlock(redis_nodes.urls, ttl=1.5, node_timeout=0.5).acquire("wait")
    assert held is not None
    # retry_delay asks for 5..15 s, but the holder frees within 1.5 s: the waits
    # follow its TTL (the time a quorum of its keys still has, plus a few ms).
    lease = redlock.acquire("wait", timeout=30)
    assert lease is not None
    assert asked and all(0 < wait <= 1.5 + 0.005 for wait in asked), asked
    long_holder = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    assert long_holder.acquire("long") is not None
    asked.clear()
    start = time.monotonic()
    assert redlock.acquire("long", timeout=0.3) is None
    # It waited out its timeout, and never asked to wait past it.
    assert time.monotonic() - start >= 0.3
    assert asked and sum(asked) <= 0.3, asked
    with pytest.raises(LockContended), redlock.lock("long", timeout=0.1):
        pass


def test_lock_context_manager_releases_on_error(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    with pytest.raises(ZeroDivisionError), redlock.lock("ctx") as lease:
        assert lease.held
        1 / 0  # noqa: B018
    assert lease.released
    _gone_everywhere(redis_nodes, "ctx")


def _count_extensions(lease: Lease, enough: int) -> threading.Event:
    """An event set once the watchdog has extended ``lease`` ``enough`` times."""
    done = threading.Event()
    lease.on_extended(lambda extended: done.set() if extended.extensions >= enough else None)
    return done


def test_auto_extend_keeps_a_short_lease_for_long_work(redis_nodes: RedisNodes) -> None:
    ttl = 3.0
    redlock = Redlock(redis_nodes.urls, ttl=ttl, node_timeout=0.5)
    other = Redlock(redis_nodes.urls, ttl=ttl, node_timeout=0.5)
    with redlock.lock("long-work", auto_extend=True) as lease:
        extended = _count_extensions(lease, 4)
        # Renewals come every ttl/3, so the 4th is past the lease's first TTL.
        assert extended.wait(timeout=10 * ttl), f"{lease.extensions} extensions"
        assert time.monotonic() > lease.acquired_at + ttl
        assert lease.held and not lease.lost
        assert other.acquire("long-work", blocking=False) is None
    assert other.acquire("long-work", blocking=False) is not None


def test_watchdog_marks_lease_lost_when_a_quorum_stops_answering(
    redis_nodes: RedisNodes,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=3, node_timeout=0.05)
    lost: list[tuple[str, float, float]] = []  # key, when, the deadline it had then
    gone = threading.Event()

    def on_lost(lease: Lease) -> None:
        lost.append((lease.key, time.monotonic(), lease.deadline))
        gone.set()

    # Leaving the block raises LockLost: the lease was lost while it ran.
    with pytest.raises(LockLost), redlock.lock("fragile", auto_extend=True) as lease:
        lease.on_lost(on_lost)
        assert _count_extensions(lease, 1).wait(timeout=30)
        for server in list(redis_nodes)[:3]:
            server.pause()
        try:
            # Renewals retry while validity leaves room, then give up before the
            # deadline: reported before it, at most one TTL after the pause.
            assert gone.wait(timeout=30)
            ((key, when, deadline),) = lost  # once
            assert key == "fragile" and when < deadline
            assert not lease.held
            assert lease.lost_reason and "needed 3" in lease.lost_reason
            with pytest.raises(LockLost):
                lease.ensure_held()
        finally:
            for server in list(redis_nodes)[:3]:
                server.resume()
    assert len(lost) == 1


def test_a_renewal_round_that_times_out_does_not_lose_the_lease(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., Any]
) -> None:
    # The replies of 3 of 5 nodes are held back: an extension round cannot reach a
    # quorum in time, as when the renewing thread is descheduled under CPU load.
    servers = list(redis_nodes)
    proxies = [fault_proxy_factory(server) for server in servers[:3]]
    redlock = Redlock(
        [p.url for p in proxies] + [s.url for s in servers[3:]], ttl=10, node_timeout=1.0
    )
    lease = redlock.acquire("slow-renewal")
    assert lease is not None
    for proxy in proxies:
        proxy.hold_replies()
    assert lease.extend() is False
    assert lease.retry_by is not None and lease.retry_by < lease.deadline
    assert lease.held and not lease.lost and lease.lost_reason is None
    for proxy in proxies:
        proxy.release_replies()
    assert lease.extend()
    assert lease.retry_by is None and lease.held


def test_an_extension_a_majority_refuses_loses_the_lease_at_once(
    redis_nodes: RedisNodes,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("refused")
    assert lease is not None
    _eventually(
        lambda: _keys_everywhere(redis_nodes, "refused") == [lease.value.encode()] * 5,
        RELEASED_WITHIN,
        "set on every node",
    )
    for client in _clients(redis_nodes)[:3]:
        client.delete("refused")  # expired or taken over there: no longer ours
    assert lease.extend() is False
    assert lease.retry_by is None and lease.lost
    assert lease.lost_reason and "needed 3" in lease.lost_reason


# -- faults -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
@pytest.mark.parametrize("down", [1, 2])
def test_minority_down_still_grants_within_node_timeout(
    redis_nodes: RedisNodes, fault: str, down: int
) -> None:
    # A deadline no healthy reply misses, even on a loaded machine: a round that
    # ends before it stopped at quorum, without waiting on the dead or hung nodes.
    node_timeout = 2.0
    redlock = Redlock(redis_nodes.urls, ttl=10, node_timeout=node_timeout)
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
            assert took < node_timeout
            start = time.monotonic()
            lease.release()
            assert time.monotonic() - start < node_timeout
    finally:
        for server in victims:
            server.resume() if fault == "pause" else None


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_majority_down_fails_within_node_timeout_and_leaves_no_keys(
    redis_nodes: RedisNodes, fault: str
) -> None:
    # One node_timeout per attempt, not one per hung node: under 2 x node_timeout
    # whatever the load (three in a row would be 3 x).
    node_timeout = 1.0
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=node_timeout)
    servers = list(redis_nodes)
    victims = servers[:3]
    for server in victims:
        server.kill() if fault == "kill" else server.pause()
    try:
        for i in range(2):
            start = time.monotonic()
            with pytest.raises(QuorumUnavailable) as caught:
                redlock.acquire(f"majority:{i}", blocking=False)
            assert time.monotonic() - start < 2 * node_timeout
            assert len(caught.value.errors) == 3
            _eventually(
                lambda: all(
                    s.client().get(f"majority:{i}") is None  # noqa: B023
                    for s in servers[3:]
                ),
                RELEASED_WITHIN,
                "the failed acquire cleaned up the live nodes",
            )
    finally:
        if fault == "pause":
            for server in victims:
                server.resume()
    if fault == "pause":
        # The stalled nodes run our SET and then our clean-up, in order.
        _eventually(
            lambda: all(server.client().keys("majority:*") == [] for server in servers),
            RELEASED_WITHIN,
            "no key left on the nodes that stalled",
        )


def test_nodes_silent_for_a_whole_deadline_are_not_waited_for_by_the_next_round(
    redis_nodes: RedisNodes,
) -> None:
    # Two of five stopped and the key held by someone else on one live node: 2 yes,
    # 1 no, and only the stopped nodes could decide. The first round waits its whole
    # deadline for them; the next ones do not (they had not answered for a deadline),
    # and say why. With waiters racing for permits, every split vote used to hold
    # its slots for a whole deadline this way.
    node_timeout = 2.0
    servers = list(redis_nodes)
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=node_timeout)
    servers[2].client().set("silent", FOREIGN)
    for server in servers[:2]:
        server.pause()
    try:
        took = []
        for _ in range(3):
            began = time.monotonic()
            assert redlock.acquire("silent", blocking=False) is None
            took.append(time.monotonic() - began)
            time.sleep(0.05)
        info = redlock.holder("silent")
    finally:
        for server in servers[:2]:
            server.resume()
        redlock.close()
    assert took[0] >= node_timeout
    assert max(took[1:]) < node_timeout / 2, took
    for node in info.nodes[:2]:
        assert isinstance(node.error, redis.TimeoutError)
        assert "silent for a round's deadline" in str(node.error)


def test_a_silent_majority_is_still_waited_for(redis_nodes: RedisNodes) -> None:
    # Three of five silent is more likely a slow client than three hung nodes: every
    # round gives them its whole deadline, as before.
    node_timeout = 0.5
    servers = list(redis_nodes)
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=node_timeout)
    for server in servers[:3]:
        server.pause()
    try:
        for _ in range(2):
            began = time.monotonic()
            with pytest.raises(QuorumUnavailable) as caught:
                redlock.acquire("majority-silent", blocking=False)
            assert time.monotonic() - began >= node_timeout
            assert not any("silent" in str(e) for e in caught.value.errors.values())
    finally:
        for server in servers[:3]:
            server.resume()
        redlock.close()


def test_fresh_connections_to_hung_nodes_cost_one_node_timeout_not_n(
    redis_nodes: RedisNodes,
) -> None:
    servers = list(redis_nodes)
    for server in servers[:3]:
        server.pause()
    try:
        node_timeout = 1.0  # 3 hung set-ups in a row would take 3x: under 2x whatever the load
        redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=node_timeout)  # no connection yet
        start = time.monotonic()
        with pytest.raises(QuorumUnavailable):
            redlock.acquire("fresh", blocking=False)
        assert time.monotonic() - start < 2 * node_timeout
    finally:
        for server in servers[:3]:
            server.resume()


def test_late_reply_is_never_read_as_the_answer_to_a_later_command(
    redis_nodes: RedisNodes,
) -> None:
    servers = list(redis_nodes)
    redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT)
    servers[0].pause()
    try:
        first = redlock.acquire("late-a", blocking=False)
        assert first is not None  # 4 of 5 answered; node 0 owes a reply
    finally:
        servers[0].resume()
    second = redlock.acquire("late-b", blocking=False)
    assert second is not None
    # Both acquires returned at quorum: read through the lock's own connections once
    # every node (seen by plain clients) holds both keys.
    _eventually(
        lambda: (
            _keys_everywhere(redis_nodes, "late-b") == [second.value.encode()] * 5
            and servers[0].client().get("late-a") == first.value.encode()
        ),
        RELEASED_WITHIN,
        "late-b on every node, late-a on node 0",
    )
    info = redlock.holder("late-b")
    assert [n.token for n in info.nodes] == [second.token] * 5
    assert redlock.holder("late-a").nodes[0].token == first.token
    first.release()
    second.release()


def test_forked_child_gets_fresh_connections(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("parent")
    assert lease is not None
    ctx = multiprocessing.get_context("fork")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_child_acquires, args=(redlock, queue))
    child.start()
    child.join(10)
    assert queue.get(timeout=1) == ("child-ok", None)
    with pytest.raises(AlreadyHeld):  # parent's view intact: it holds it
        redlock.acquire("parent", blocking=False)
    lease.release()


def _child_acquires(redlock: Redlock, queue: Any) -> None:
    contended = redlock.acquire("parent", blocking=False)
    own = redlock.acquire("child", blocking=False)
    queue.put(("child-ok" if own is not None else "child-failed", contended))


def test_script_flush_falls_back_to_eval(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    warm = redlock.acquire("flush")
    assert warm is not None
    warm.release()
    _gone_everywhere(redis_nodes, "flush")
    for client in _clients(redis_nodes):
        client.script_flush()
    lease = redlock.acquire("flush", blocking=False)
    assert lease is not None
    assert lease.extend()
    lease.release()
    # Also on the nodes whose NOSCRIPT came after the rounds returned: resent as EVAL.
    _gone_everywhere(redis_nodes, "flush")


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_one_command_per_node_per_acquire_and_per_release(redis_nodes: RedisNodes) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    warm = redlock.acquire("count")
    assert warm is not None
    warm.release()
    _gone_everywhere(redis_nodes, "count")  # the warm-up's commands have all run
    clients = _clients(redis_nodes)
    for client in clients:
        client.config_resetstat()
    for _ in range(50):
        lease = redlock.acquire("count", blocking=False)
        assert lease is not None
        lease.release()
    # Releases return at quorum: wait for the last ones to land, then count.
    _eventually(
        lambda: [_evalsha_calls(c) for c in clients] == [100] * 5,
        RELEASED_WITHIN,
        "100 EVALSHA per node",
    )
    for client in clients:
        assert "cmdstat_eval" not in client.info("commandstats")


# -- fencing ----------------------------------------------------------------------------


def test_fences_strictly_increase_from_holder_to_holder(redis_nodes: RedisNodes) -> None:
    a = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
    b = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
    fences = []
    for i in range(20):
        lease = (a if i % 2 else b).acquire("fenced")
        assert lease is not None and lease.fence is not None
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences))
    plain = Redlock(redis_nodes.urls, node_timeout=NODE_TIMEOUT)
    assert plain.acquire("plain") is not None
    assert plain.acquire("plain2").fence is None  # type: ignore[union-attr]


# -- mutual exclusion under contention -----------------------------------------------


def _contend(
    urls: Sequence[str], observer_url: str, key: str, rounds: int, seed: int, out: Any
) -> None:
    """``rounds`` holds of ``key``; per hold, the observer's occupancy count and the
    holding interval. A hold whose lease ran out before the body ended (a process
    stalled past the 2 s ttl on a loaded machine) protected nothing: it is sent
    marked, and nothing is concluded from it."""
    redlock = Redlock(urls, ttl=2, node_timeout=0.5, retry_delay=0.002, retry_count=10_000)
    observer = redis.Redis.from_url(observer_url)
    lock_clients = [redis.Redis.from_url(u) for u in urls]
    overlaps = no_ttl = done = 0
    intervals = []
    while done < rounds:
        try:
            lease = redlock.acquire(key, blocking=True, holder=f"p{seed}")
        except QuorumUnavailable:  # nodes too slow to answer in time: try again
            continue
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
        protected = lease.held  # the lease's validity outlasted the body
        with contextlib.suppress(QuorumUnavailable):  # else it frees at its ttl
            lease.release()
        intervals.append((start, end, protected))
        done += 1
    out.put((overlaps, no_ttl, intervals))


@pytest.mark.slow
def test_mutual_exclusion_under_contention_checked_by_an_independent_counter(
    redis_nodes: RedisNodes, redis_server_factory: Callable[..., RedisServer]
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
    results = [out.get(timeout=600) for _ in procs]
    stop_scan.set()
    scanner.join()
    for proc in procs:
        proc.join(10)
    intervals = sorted(iv for r in results for iv in r[2])
    assert len(intervals) == processes * rounds >= 2000
    assert sum(r[1] for r in results) == 0 and keys_without_ttl == []
    unprotected = sum(1 for _, _, protected in intervals if not protected)
    if unprotected == 0:  # the usual case: the observer's count is the whole check
        assert sum(r[0] for r in results) == 0
    # The oracle log: the holding intervals (one monotonic clock for all processes)
    # whose lease outlived the body never overlap.
    held = [(start, end) for start, end, protected in intervals if protected]
    for (_, end), (start, _) in zip(held, held[1:]):
        assert end < start
    print(f"{len(intervals)} holds, {unprotected} outlived by a stalled body")


def _scan_for_keys_without_ttl(
    cluster: RedisNodes, stop: threading.Event, found: list[bytes]
) -> None:
    clients = _clients(cluster)
    while not stop.is_set():
        for client in clients:
            for key in client.scan_iter("*"):
                if client.pttl(key) == -1:
                    found.append(key)
        time.sleep(0.01)


# -- bad input ---------------------------------------------------------------------------


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
        (lambda r: r.acquire("k", ttl=0.01), "must be smaller than ttl (0.01s)"),
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


def test_redis_clients_are_accepted_as_nodes(redis_nodes: RedisNodes) -> None:
    redlock = Redlock([server.client() for server in redis_nodes], ttl=5, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("clients")
    assert lease is not None
    assert os.getpid() and lease.holder.endswith(f":{os.getpid()}")
    lease.release()


def test_a_release_that_overtakes_a_late_set_leaves_no_key_behind(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., Any]
) -> None:
    # The acquire returns once 3 fast nodes said yes; its SETs to 2 slow nodes are
    # still travelling when a release, on other connections, reaches those nodes.
    servers = list(redis_nodes)
    slow = [fault_proxy_factory(server) for server in servers[3:]]
    for proxy in slow:
        proxy.delay(0.5, direction="to_server")
    urls = [s.url for s in servers[:3]] + [p.url for p in slow]
    holder = Redlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    other_connections = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    warm = other_connections.acquire("warm")  # its connections are set up
    assert warm is not None
    warm.release()
    _gone_everywhere(redis_nodes, "warm")
    slow_clients = [server.client() for server in servers[3:]]
    for client in slow_clients:
        client.config_resetstat()
    lease = holder.acquire("overtaken", blocking=False)
    assert lease is not None
    other_connections.release_value("overtaken", lease.value)
    # The slow nodes ran both the release and the late SET (in whichever order).
    _eventually(
        lambda: [_evalsha_calls(c) for c in slow_clients] == [2, 2],
        RELEASED_WITHIN,
        "the late SETs ran",
    )
    # The release returned at quorum; a key left behind would stay for KEY_TTL.
    _gone_everywhere(redis_nodes, "overtaken")
    assert other_connections.acquire("overtaken", blocking=False) is not None


@pytest.mark.parametrize("n", [1, 3])
def test_first_acquire_after_the_nodes_restart_succeeds_on_fresh_connections(
    redis_nodes_factory: Callable[..., RedisNodes], n: int
) -> None:
    cluster = redis_nodes_factory(n)
    redlock = Redlock(cluster.urls, ttl=5, node_timeout=NODE_TIMEOUT)
    warm = redlock.acquire("restart")  # every node now has a pooled connection
    assert warm is not None
    warm.release()
    for server in cluster:
        server.restart(keep_data=False)  # the pooled connections are dead now
    lease = redlock.acquire("restart", blocking=False)
    assert lease is not None  # not a QuorumUnavailable for a stale socket
    lease.release()


def test_a_pooled_connection_that_fails_at_the_write_is_replaced_within_the_round(
    redis_nodes: RedisNodes,
) -> None:
    # A restart shows at the read (test above); a socket the kernel will not write
    # to any more fails at the write itself, before the round has read anything.
    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    warm = redlock.acquire("write-fails")
    assert warm is not None
    warm.release()
    pooled = [conn for node in redlock.node_set.nodes for conn in node._idle]
    assert pooled
    for conn in pooled:
        assert conn.sock is not None
        conn.sock.shutdown(socket.SHUT_WR)  # the next send raises EPIPE
    lease = redlock.acquire("write-fails", blocking=False)
    assert lease is not None  # every node answered on a fresh connection
    assert all(conn.sock is None for conn in pooled)  # the broken ones closed
    lease.release()
    _gone_everywhere(redis_nodes, "write-fails")


def test_a_lagging_node_keeps_its_connection_and_gets_every_release(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., Any]
) -> None:
    # Rounds stop reading at quorum, so the slowest node's replies are always owed.
    # They must be drained, not let pile up until the connection is dropped: a
    # dropped connection (RST) makes the node discard commands it has not read yet,
    # our releases among them, and the keys would linger until their TTL.
    servers = list(redis_nodes)
    lagging = fault_proxy_factory(servers[4])
    lagging.delay(0.003)
    urls = [s.url for s in servers[:4]] + [lagging.url]
    redlock = Redlock(urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT)
    # The observer's own clients connect before the count starts: only ours count.
    observers = [server.client() for server in servers]
    probe = observers[4]
    connections_before = probe.info("stats")["total_connections_received"]
    for i in range(200):
        lease = redlock.acquire(f"lag:{i}", blocking=False)
        assert lease is not None
        lease.release()

    def left() -> list[list[bytes]]:
        return [[k for k in c.scan_iter("lag:*") if b"\x00" not in k] for c in observers]

    _eventually(lambda: left() == [[]] * 5, RELEASED_WITHIN, "every release reached every node")
    made = probe.info("stats")["total_connections_received"] - connections_before
    assert made <= 2  # the lagging node keeps its connection(s); no churn


def test_a_release_after_script_flush_reaches_the_node_the_round_did_not_wait_for(
    redis_nodes: RedisNodes, fault_proxy_factory: Callable[..., Any]
) -> None:
    # The release returns once a quorum answered; the held-back node's reply is
    # NOSCRIPT (its scripts were flushed) and arrives after: it must still be resent
    # as EVAL, though this lock makes no further round.
    servers = list(redis_nodes)
    held_back = fault_proxy_factory(servers[4])
    redlock = Redlock(
        [s.url for s in servers[:4]] + [held_back.url], ttl=KEY_TTL, node_timeout=NODE_TIMEOUT
    )
    lease = redlock.acquire("flushed", blocking=False)
    assert lease is not None
    value = lease.value.encode()
    _eventually(
        lambda: _keys_everywhere(redis_nodes, "flushed") == [value] * 5,
        RELEASED_WITHIN,
        "every node holds the key",
    )
    for server in servers:
        server.client().script_flush()
    held_back.hold_replies()
    lease.release()
    # The round cannot have heard node 4, whose EVALSHA met NOSCRIPT: still there.
    assert servers[4].client().get("flushed") == value
    held_back.release_replies()
    _gone_everywhere(redis_nodes, "flushed")
