"""The watchdog renews the leases due together in one round per lock (renewals.py).

What each test observes comes from the nodes themselves (``INFO commandstats``,
GET and PTTL on every node), never from the lease's word: the leases' own events
only say when to look. Each test runs its own ``Watchdog`` (not the process's), so
no other test's leases share its batches.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from celery_redlock import Lease, Redlock
from celery_redlock.lock import renewals as renewals_module
from celery_redlock.lock.lease import Extension
from celery_redlock.lock.watchdog import Watchdog
from celery_redlock.testing import FaultProxyFactory, RedisNodes, RedisNodesFactory
from tests.support.observe import settles

TTL = 3.0
INTERVAL = TTL / 3
#: The node-reset test's lease: its batch is held, reset and retried before the
#: leases are checked, with room for a loaded machine's stalls between the steps.
RESET_TTL = 9.0


class Renewals:
    """Has ``watchdog`` renew ``leases`` every INTERVAL (all watched within a few ms:
    due within one window) and counts each lease's extensions and losses, from its
    callbacks (only to know when to look)."""

    def __init__(self, leases: Sequence[Lease], watchdog: Watchdog) -> None:
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self.extended: dict[int, int] = {}
        self.lost: list[Lease] = []
        self._changed = threading.Condition(self._lock)
        #: When the first and the last watch() returned (see the batching test).
        self.watched_between = (time.monotonic(), time.monotonic())
        for lease in leases:
            self.watch(lease)

    def watch(self, lease: Lease) -> None:
        called = time.monotonic()
        with self._changed:
            self.extended[id(lease)] = 0
        lease.on_extended(self._on_extended)
        lease.on_lost(self._on_lost)
        self._watchdog.watch(lease, INTERVAL)
        # From before the first watch() to after the last: each lease fell due
        # INTERVAL after a moment inside its own call.
        first = self.watched_between[0] if len(self.extended) > 1 else called
        self.watched_between = (first, time.monotonic())

    def _on_extended(self, lease: Lease) -> None:
        with self._changed:
            self.extended[id(lease)] += 1
            self._changed.notify_all()

    def _on_lost(self, lease: Lease) -> None:
        with self._changed:
            self.lost.append(lease)
            self._changed.notify_all()

    def wait(self, condition: str, timeout: float) -> None:
        checks = {
            "all extended": lambda: all(self.extended.values()),
            "one lost": lambda: bool(self.lost),
        }
        with self._changed:
            assert self._changed.wait_for(checks[condition], timeout), condition


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    dog = Watchdog()
    yield dog
    with dog._cond:  # stop renewing whatever the test left watched
        dog._watched.clear()


def _acquire(redlock: Redlock, count: int, prefix: str, ttl: float = TTL) -> list[Lease]:
    leases = []
    for i in range(count):
        # Tried until won: one round may stall past node_timeout on a busy machine;
        # the set-up must not fail for it.
        lease = redlock.acquire(f"{prefix}:{i}", ttl=ttl, timeout=ttl)
        assert lease is not None
        leases.append(lease)
    return leases


def _holders(client: redis.Redis, keys: Sequence[str]) -> list[tuple[object, int]]:
    """Each key's value and PTTL on one node, read in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute()
    return list(zip(replies[::2], replies[1::2]))


def _assert_held_everywhere(
    clients: Sequence[redis.Redis], leases: Sequence[Lease], expiring_after: float
) -> None:
    """Every lease's own value on every node, with a TTL that the acquire alone
    could not explain: ``expiring_after`` is past each acquire's ttl."""
    keys = [lease.key for lease in leases]
    for client in clients:
        for lease, (value, pttl) in zip(leases, _holders(client, keys)):
            assert value == lease.value.encode(), (lease.key, value)
            assert pttl > 0, (lease.key, pttl)
    assert time.monotonic() > expiring_after


def _calls(client: redis.Redis, command: str) -> int:
    return _count(client.info("commandstats"), command)


def _count(stats: dict[str, Any], command: str) -> int:
    """How many times ``command`` ran, from one ``INFO commandstats`` reading."""
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_many_due_leases_are_renewed_by_one_call_per_node(
    redis_nodes: RedisNodes, watchdog: Watchdog, monkeypatch: pytest.MonkeyPatch
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=TTL)
    leases = _acquire(redlock, 50, "batch")
    clients = [server.client() for server in redis_nodes]
    # Each renewal round's size, as the watchdog hands it to the lock.
    rounds: list[int] = []
    batch_round = redlock._extend_leases

    def counted(group: Sequence[Lease]) -> list[Extension]:
        rounds.append(len(group))
        return batch_round(group)

    monkeypatch.setattr(redlock, "_extend_leases", counted)
    # Every acquire's script has run on every node before the counts start.
    keys = [lease.key for lease in leases]
    for client in clients:
        settles(functools.partial(client.exists, *keys), 50, f"the leases on {client}")
        client.config_resetstat()
    renewals = Renewals(leases, watchdog)
    renewals.wait("all extended", timeout=TTL)
    for lease in leases:
        watchdog.unwatch(lease)
    first, last = renewals.watched_between
    if last - first <= INTERVAL / 2:
        # The first falls due with every other due within half an interval: by the
        # watchdog's rule they are all taken together.
        assert rounds[0] == 50, (rounds, last - first)
    assert rounds and max(rounds) > 1, rounds
    smallest, largest = min(rounds), max(rounds)
    total = 0
    for client in clients:
        # One INFO reading: the counts of one instant, between two scripts.
        stats = client.info("commandstats")
        scripts, pexpires = _count(stats, "evalsha"), _count(stats, "pexpire")
        # Each call the node ran extended a whole round's keys: one call per round
        # (a round's call may not have reached a slow node yet, or been dropped).
        assert scripts <= len(rounds), (scripts, rounds)
        assert smallest * scripts <= pexpires <= largest * scripts, (scripts, pexpires, rounds)
        assert _count(stats, "eval") == 0
        total += pexpires
    # Each lease was extended by a quorum (3 of 5) of yes replies, each a PEXPIRE run.
    assert total >= 3 * len(leases), (total, rounds)
    assert not renewals.lost
    for lease in leases:
        lease.release()


def test_one_stolen_lease_among_many_is_reported_lost_alone(
    redis_nodes: RedisNodes, watchdog: Watchdog
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=TTL)
    leases = _acquire(redlock, 20, "steal")
    clients = [server.client() for server in redis_nodes]
    renewals = Renewals(leases, watchdog)
    stolen = leases[7]
    for client in clients:  # another holder's value, on every node
        client.set(stolen.key, "thief|elsewhere", px=60_000)
    renewals.wait("one lost", timeout=TTL)
    # Past every acquire's ttl: a key still there was renewed.
    time.sleep(max(0.0, max(lease.acquired_at for lease in leases) + TTL + 0.2 - time.monotonic()))
    others = [lease for lease in leases if lease is not stolen]
    _assert_held_everywhere(clients, others, leases[-1].acquired_at + TTL)
    for client in clients:
        assert client.get(stolen.key) == b"thief|elsewhere"  # never touched
    assert renewals.lost == [stolen]
    assert stolen.lost_reason is not None and "reached 0 of 5" in stolen.lost_reason
    assert all(lease.held for lease in others)
    for lease in others:
        lease.release()


def test_a_node_reset_in_the_middle_of_a_batch_loses_no_lease(
    redis_nodes: RedisNodes,
    fault_proxy_factory: FaultProxyFactory,
    watchdog: Watchdog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Several calls per node in each round (chunks of 5), and every node needed:
    # two of five are down, the third answers through a proxy.
    monkeypatch.setattr(renewals_module, "CHUNK", 5)
    proxy = fault_proxy_factory(redis_nodes[0])
    urls = [proxy.url, *redis_nodes.urls[1:]]
    redlock = Redlock(urls, ttl=RESET_TTL, node_timeout=0.3)
    leases = _acquire(redlock, 23, "reset", ttl=RESET_TTL)
    redis_nodes[3].kill()
    redis_nodes[4].kill()
    behind = redis_nodes[0].client()
    # The acquires returned at quorum: node 0 (behind its proxy) may still be running
    # the last ones, which must not count as the batch's calls below.
    keys = [lease.key for lease in leases]
    settles(lambda: behind.exists(*keys), len(leases), "the leases on node 0")
    before = _calls(behind, "evalsha")
    proxy.hold_replies()
    renewals = Renewals(leases, watchdog)
    # The node has run the batch's five calls; their replies are held in the proxy.
    deadline = time.monotonic() + RESET_TTL
    while _calls(behind, "evalsha") < before + 5:
        assert time.monotonic() < deadline, "the batch never reached node 0"
        time.sleep(0.005)
    proxy.reset()  # the connection dies mid-round, its replies unread
    proxy.heal()
    renewals.wait("all extended", timeout=RESET_TTL)
    time.sleep(max(0.0, leases[-1].acquired_at + RESET_TTL + 0.2 - time.monotonic()))
    live = [server.client() for server in redis_nodes[:3]]
    _assert_held_everywhere(live, leases, leases[-1].acquired_at + RESET_TTL)
    assert not renewals.lost
    for lease in leases:
        watchdog.unwatch(lease)


@pytest.mark.slow
def test_1000_leases_on_nodes_10ms_away_are_renewed_and_never_held_in_name_only(
    redis_nodes_factory: RedisNodesFactory,
    fault_proxy_factory: FaultProxyFactory,
    watchdog: Watchdog,
) -> None:
    """1,000 leases renewed through nodes 20 ms away (round trip): their renewals
    fit in the interval, so the leases outlive three times their ttl. On a loaded
    machine a lease may still be lost (the watchdog thread starved): then it says
    so before it expires. Checked on the nodes, never by the lock's own word: a
    lease that calls itself held after the nodes were read is on a majority of them.
    How many were lost is printed; keeping them all is bench/renewals.py's measure."""
    cluster = redis_nodes_factory(5)
    proxies = [fault_proxy_factory(server) for server in cluster]
    redlock = Redlock([proxy.url for proxy in proxies], ttl=TTL)
    renewals = Renewals([], watchdog)
    leases = []
    for i in range(1000):  # before the delay: fast; each one watched at once
        # Tried until won: a stall past the 50 ms round (a busy machine, the proxies'
        # threads) must not fail the set-up; the renewals are what is tested.
        lease = redlock.acquire(f"far:{i}", ttl=TTL, timeout=TTL)
        assert lease is not None
        renewals.watch(lease)
        leases.append(lease)
    for proxy in proxies:
        proxy.delay(0.01)  # each way: a round trip of 20 ms or more
    clients = [server.client() for server in cluster]
    keys = [lease.key for lease in leases]
    # Three times past the acquires' ttl: any lease the watchdog dropped is gone.
    for rounds in range(1, 4):
        time.sleep(max(0.0, leases[-1].acquired_at + rounds * TTL - time.monotonic()))
        on_nodes = [0] * len(leases)
        for client in clients:
            for i, (value, pttl) in enumerate(_holders(client, keys)):
                on_nodes[i] += value == leases[i].value.encode() and pttl > 0
        for lease, count in zip(leases, on_nodes):
            if lease.held:  # validity runs past the read: a majority had it then
                assert count >= 3, (lease.key, count)
    # Each lease no longer held is reported lost (on_lost), once the watchdog runs.
    lost = {id(lease) for lease in leases if not lease.held}
    with renewals._changed:
        reported = renewals._changed.wait_for(
            lambda: lost <= {id(lease) for lease in renewals.lost}, 3 * TTL
        )
    assert reported, f"{len(lost)} leases lost, {len(renewals.lost)} reported"
    print(f"1,000 leases 20 ms away, 3 ttls: {len(lost)} lost (each reported)")
    for lease in leases:
        watchdog.unwatch(lease)


class _GatedRedlock(Redlock):
    """A Redlock whose single-lease extension rounds wait for ``gate`` first: a round
    still in flight, for as long as the test wants (the nodes are real)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.in_round = threading.Event()

    def _extend_lease(self, lease: Lease, ttl: float) -> Extension:
        self.in_round.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super()._extend_lease(lease, ttl)


def test_a_release_waits_only_for_its_own_leases_renewal_not_the_whole_batch(
    redis_nodes: RedisNodes,
) -> None:
    # A batch renews a re-entered lease in a round of its own. A plain lease of the
    # same lock, renewed in the batch's shared round, must not be held meanwhile:
    # its release (a greenlet's, on the hub's OS thread) would wait for every round.
    redlock = _GatedRedlock(redis_nodes.urls, ttl=30.0, node_timeout=0.5)
    outer = redlock.acquire("gated:reentered")
    assert outer is not None
    inner = redlock.acquire("gated:reentered", reentrant=True)
    plain = redlock.acquire("gated:plain")
    assert inner is not None and plain is not None
    renewing = threading.Thread(target=renewals_module.renew, args=([outer, plain],))
    renewing.start()
    try:
        assert redlock.in_round.wait(30), "the re-entered lease's round never started"
        released: list[bool] = []
        releasing = threading.Thread(target=lambda: released.append(plain.release()))
        releasing.start()
        releasing.join(30)
        # Ordering, not timing: the release ended while the other lease's round was
        # still held at the gate.
        assert released == [True], "the release waited for another lease's round"
    finally:
        redlock.gate.set()
        renewing.join(30)
    assert not renewing.is_alive()
    assert redis_nodes[0].client().get("gated:plain") is None
    assert inner.release() and outer.release()
