"""Limits (``acquire(key, limit=N)``) and rates (``admit(key, rate)``) against real
lock nodes.

Safety is judged by an independent observer: each holder INCRs an occupancy counter
on a separate Redis while inside (and records the highest value), each start under a
rate is logged with the observer's own clock; never by the lock's word. What is on
the nodes is read with plain clients.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from celery_redlock import ConfigurationError, LockContended, Redlock
from celery_redlock.asyncio import AsyncRedlock
from celery_redlock.cli.release import delete_permits_on_each_node
from celery_redlock.lock.permits import Terms, acquire_permit_command
from celery_redlock.lock.stored import LIMIT, permit_slot, permit_slot_prefix
from celery_redlock.lock.validate import MAX_PERMITS
from celery_redlock.testing import RedisNodes, RedisServer

NODE_TIMEOUT = 0.5
TTL = 10.0


def _lock(nodes: RedisNodes, **kwargs: Any) -> Redlock:
    kwargs.setdefault("ttl", TTL)
    kwargs.setdefault("node_timeout", NODE_TIMEOUT)
    return Redlock(nodes.urls, **kwargs)


def _slots_held(nodes: RedisNodes, key: str, count: int) -> list[list[bool]]:
    """Per node, which of ``key``'s limit slots hold a value."""
    return [
        [bool(node.client().exists(permit_slot(key, LIMIT, i))) for i in range(count)]
        for node in nodes
    ]


def test_n_leases_on_n_permits_and_the_next_is_refused_naming_the_limit(
    redis_nodes: RedisNodes,
) -> None:
    lock = _lock(redis_nodes)
    leases = [lock.try_acquire("api", limit=3, blocking=False) for _ in range(3)]
    assert sorted(lease.keys[0] for lease in leases) == [
        permit_slot("api", LIMIT, i) for i in range(3)
    ]
    assert all(lease.key == "api" for lease in leases)
    assert _slots_held(redis_nodes, "api", 3) == [[True] * 3] * 5
    assert lock.acquire("api", limit=3, blocking=False) is None
    with pytest.raises(LockContended) as refused:
        lock.try_acquire("api", limit=3, blocking=False)
    assert refused.value.limit == "limit 3/3"
    assert not refused.value.split
    assert refused.value.holder == leases[0].holder
    assert refused.value.ttl is not None and 0 < refused.value.ttl <= TTL
    assert "limit 3/3 reached" in str(refused.value)
    # The exception survives a result backend's cls(*args).
    rebuilt = LockContended(*refused.value.args)
    assert (rebuilt.limit, rebuilt.ttl, rebuilt.split) == ("limit 3/3", refused.value.ttl, False)
    # A plain lock key of the same name is not one of its permits.
    assert redis_nodes[0].client().exists("api") == 0
    assert leases[1].extend()
    assert leases[1].release()
    again = lock.try_acquire("api", limit=3, blocking=False)
    assert again.keys == leases[1].keys  # the only free slot
    for lease in (*leases[::2], again):
        assert lease.release()
    assert _slots_held(redis_nodes, "api", 3) == [[False] * 3] * 5


def test_a_blocked_acquire_wakes_when_any_permit_frees(redis_nodes: RedisNodes) -> None:
    lock = _lock(redis_nodes)
    held = [lock.try_acquire("w", limit=2, blocking=False) for _ in range(2)]
    freed = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        freed.set()
        held[1].release()

    threading.Thread(target=release_later).start()
    lease = lock.try_acquire("w", limit=2, timeout=TTL / 2)
    assert freed.is_set()
    assert lease.keys == held[1].keys
    # Woken by the release, not by the holders' expiry (TTL s away).
    assert held[0].validity > TTL / 2
    for each in (held[0], lease):
        each.release()


def test_a_crashed_holders_permit_frees_within_its_ttl(redis_nodes: RedisNodes) -> None:
    lock = _lock(redis_nodes, ttl=1.0)
    crashed = lock.try_acquire("c", limit=1 + 1, blocking=False)
    other = lock.try_acquire("c", limit=2, blocking=False, ttl=TTL)
    lease = lock.try_acquire("c", limit=2, timeout=5.0)  # nothing releases `crashed`
    assert lease.keys == crashed.keys
    assert crashed.validity <= 0
    other.release()
    lease.release()


def test_the_watchdog_keeps_a_permit_past_many_ttls(redis_nodes: RedisNodes) -> None:
    # The watchdog's batched renewal extends the permit's slot, not the limit's name
    # (which no node keeps): renewed past several ttls, the slot is still held on every
    # node, so a limit of 2 admits one more holder, not two.
    lock = _lock(redis_nodes, ttl=0.6)
    with lock.lock("dog", limit=2, auto_extend=True) as lease:
        time.sleep(2.0)  # more than 3 ttls
        assert lease.held and lease.extensions >= 3
        slot = lease.keys[0]
        assert all(node.client().pttl(slot) > 0 for node in redis_nodes)  # on the nodes
        other = lock.try_acquire("dog", limit=2, blocking=False)
        assert other.keys != lease.keys
        assert lock.acquire("dog", limit=2, blocking=False) is None
        other.release()


@pytest.mark.parametrize("paused", [0, 2], ids=["all-up", "two-of-five-paused"])
def test_never_more_than_n_inside_by_an_independent_observer(
    redis_nodes: RedisNodes, redis_server: RedisServer, paused: int
) -> None:
    limit, workers, rounds = 3, 10, 4
    for node in redis_nodes[:paused]:
        node.pause()
    observer = redis_server.client()
    lock = _lock(redis_nodes, ttl=5.0, node_timeout=0.2)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for _ in range(rounds):
                with lock.lock("n", limit=limit, timeout=60):
                    inside = observer.incr("inside")
                    observer.rpush("seen", inside)
                    # Held long beside an acquire's round (up to node_timeout with two
                    # nodes paused), so that the limit is reached however slow the
                    # machine: the liveness check below needs N holders at once.
                    time.sleep(0.1)
                    observer.decr("inside")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for node in redis_nodes[:paused]:
        node.resume()
    assert errors == []
    seen = [int(v) for v in observer.lrange("seen", 0, -1)]
    assert len(seen) == workers * rounds
    assert max(seen) <= limit
    assert max(seen) == limit  # the limit was used, not only respected


def test_a_grant_of_another_slot_on_a_minority_is_dropped_by_the_release(
    redis_nodes: RedisNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nodes 0-2 have slot 0 taken by a leftover, nodes 3-4 do not: a caller whose
    # scan starts at slot 0 is given slot 1 by three nodes and slot 0 by two -- it
    # holds slot 1. Its slot 0 on nodes 3-4 goes at once when their replies were
    # read, else with its release (the round may be decided before they answer).
    monkeypatch.setattr(random, "randrange", lambda n: 0)
    leftover = b"leftover-token-0123456789|x"
    for node in redis_nodes[:3]:
        node.client().set(permit_slot("s", LIMIT, 0), leftover, px=60_000)
    lock = _lock(redis_nodes)
    lease = lock.try_acquire("s", limit=2, blocking=False)
    assert lease.keys == (permit_slot("s", LIMIT, 1),)
    assert lease.release()
    assert [n.client().get(permit_slot("s", LIMIT, 0)) for n in redis_nodes] == [
        leftover,
        leftover,
        leftover,
        None,
        None,
    ]
    assert _slots_held(redis_nodes, "s", 2)[3:] == [[False, False]] * 2
    # With leftovers on slot 0 of every node, a holder of slot 1 fills the key.
    for node in redis_nodes[3:]:
        node.client().set(permit_slot("s", LIMIT, 0), leftover, px=60_000)
    lease = lock.try_acquire("s", limit=2, blocking=False)
    with pytest.raises(LockContended) as refused:
        lock.try_acquire("s", limit=2, blocking=False)
    assert refused.value.limit == "limit 2/2"
    assert lease.release()


def test_a_late_acquire_after_its_release_sets_nothing(redis_nodes: RedisNodes) -> None:
    lock = _lock(redis_nodes)
    lease = lock.try_acquire("late", limit=2, blocking=False)
    # Node 0 as if the acquire had not reached it yet: the release finds nothing of
    # ours there and leaves a tombstone for our token, which covers every slot.
    redis_nodes[0].client().delete(*lease.keys)
    assert lease.release()
    command = acquire_permit_command("late", Terms.limit(2), lease.value, TTL, False)
    client = redis_nodes[0].client()
    reply = client.eval(*command.eval_args())
    assert reply == [None, -2]
    assert _slots_held(redis_nodes, "late", 2) == [[False, False]] * 5


def test_callers_that_disagree_on_the_limit_are_told(redis_nodes: RedisNodes) -> None:
    lock = _lock(redis_nodes)
    lease = lock.try_acquire("d", limit=3, blocking=False)
    with pytest.raises(ConfigurationError, match=r"limit 2 for key 'd' disagrees with the limit 3"):
        lock.acquire("d", limit=2, blocking=False)
    # Nothing of the refused caller stays behind.
    assert [sum(node) for node in _slots_held(redis_nodes, "d", 3)] == [1] * 5
    lease.release()
    other = _lock(redis_nodes)
    disagrees = r"limit 4 for key 'm' disagrees with the limit 1"
    # The key held as a mutex (limit 1) by another caller.
    with other.lock("m"), pytest.raises(ConfigurationError, match=disagrees):
        lock.acquire("m", limit=4, blocking=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0}, r"limit must be an int from 1 to 1000"),
        ({"limit": -2}, r"limit must be an int from 1 to 1000"),
        ({"limit": MAX_PERMITS + 1}, r"limit must be an int from 1 to 1000"),
        ({"limit": "3"}, r"limit must be an int from 1 to 1000 .*got '3'"),
        ({"limit": True}, r"limit must be an int"),
        ({"limit": 2.0}, r"limit must be an int"),
        ({"limit": 2, "reentrant": True}, r"limit=2 is not re-entered"),
    ],
)
def test_bad_limits_are_refused_naming_the_argument(
    redis_nodes: RedisNodes, kwargs: dict[str, Any], message: str
) -> None:
    lock = _lock(redis_nodes)
    with pytest.raises(ConfigurationError, match=message):
        lock.acquire("b", blocking=False, **kwargs)


def test_a_limit_takes_one_key(redis_nodes: RedisNodes) -> None:
    with pytest.raises(ConfigurationError, match=r"limit=2 takes one key"):
        _lock(redis_nodes).acquire(["a", "b"], limit=2, blocking=False)


@pytest.mark.parametrize(
    "rate",
    ["10/fortnight", "10", "/s", "0/s", "-1/s", "1001/s", "ten/s", (0, 1), (-1, 1),
     (3, 0), (3, -1), (3, float("inf")), (2.5, 1), (True, 1), None, 5, (1, 2, 3)],
)  # fmt: skip
def test_bad_rates_are_refused_naming_the_argument(redis_nodes: RedisNodes, rate: Any) -> None:
    with pytest.raises(ConfigurationError, match=r'rate must be "R/s", "R/m", "R/h" or "R/d"'):
        _lock(redis_nodes).admit("r", rate)


@pytest.mark.parametrize(
    ("rate", "terms"),
    [("10/s", (10, 1.0)), ("100/m", (100, 60.0)), ("1000/h", (1000, 3600.0)),
     (" 7 / d ", (7, 86400.0)), ("5/10s", (5, 10.0)), ("3/0.5s", (3, 0.5)), ((20, 2), (20, 2.0))],
)  # fmt: skip
def test_rates_read_as_starts_per_period(rate: Any, terms: tuple[int, float]) -> None:
    read = Terms.rate(rate)
    assert (read.count, read.period) == terms


def test_a_rate_admits_r_starts_then_says_when_the_next_may_start(
    redis_nodes: RedisNodes,
) -> None:
    lock = _lock(redis_nodes)
    assert [lock.admit("r5", "5/2s") for _ in range(5)] == [0.0] * 5
    wait = lock.admit("r5", "5/2s")
    assert 1.0 < wait <= 2.1
    # Nothing was counted by the refusal: the same wait, give or take the time passed
    # and which nodes answered first (the first quorum of "full" replies decides the
    # round, and each node's first start was set up to a round apart: seen, 2.038 s
    # after 2.036 s on Redis 6.2).
    assert lock.admit("r5", "5/2s") <= wait + NODE_TIMEOUT
    with pytest.raises(
        ConfigurationError, match=r"rate 6/2s for key 'r5' disagrees with the rate 5/2s"
    ):
        lock.admit("r5", "6/2s")
    waited = time.monotonic()
    assert lock.admit("r5", "5/2s", timeout=None) == 0.0
    assert time.monotonic() - waited >= wait - 0.2
    # timeout shorter than the wait: no start, the wait is returned at once.
    assert lock.admit("r1", "1/5s") == 0.0
    assert lock.admit("r1", "1/5s", timeout=0.01) > 4.0


def test_a_full_window_is_noted_so_a_refusal_reads_one_key_not_every_slot(
    redis_nodes: RedisNodes,
) -> None:
    # Each node counts the GETs its scripts run: the first refusal scans the 200
    # slots and notes the window full; the next one reads the note. A forced
    # deletion of the permits (the CLI's) takes the note with them.
    lock = _lock(redis_nodes)
    clients = [node.client() for node in redis_nodes]

    def gets() -> list[int]:
        time.sleep(0.2)  # the nodes the round did not wait for have run it too
        return [int(c.info("commandstats").get("cmdstat_get", {}).get("calls", 0)) for c in clients]

    assert [lock.admit("big", "200/h") for _ in range(200)] == [0.0] * 200
    before = gets()
    wait = lock.admit("big", "200/h")
    scanned = gets()
    assert wait > 3000
    assert abs(lock.admit("big", "200/h") - wait) <= 1.0  # the same answer
    noted = gets()
    assert all(b - a >= 200 for a, b in zip(before, scanned)), (before, scanned)
    assert all(c - b <= 5 for b, c in zip(scanned, noted)), (scanned, noted)
    deletions = delete_permits_on_each_node(lock.node_set.nodes, "big", 5.0)
    assert [d.result for d in deletions] == ["deleted"] * 5
    assert lock.admit("big", "200/h") == 0.0  # not refused by a note left behind
    lock.close()


def test_no_window_has_more_than_r_starts_by_an_independent_observer(
    redis_nodes: RedisNodes, redis_server: RedisServer
) -> None:
    rate, period, callers, each = 8, 1.0, 6, 6
    observer = redis_server.client()
    lock = _lock(redis_nodes, node_timeout=0.2)

    def start(n: int) -> None:
        for _ in range(each):
            assert lock.admit("window", (rate, period), timeout=None) == 0.0
            seconds, micros = observer.time()
            observer.rpush("starts", seconds * 1_000_000 + micros)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts = sorted(int(s) for s in observer.lrange("starts", 0, -1))
    assert len(starts) == callers * each
    # Any window of one period: at most `rate` starts (sliding, every start opens one).
    # The observer logs a start a moment after it, at most one round later.
    slack = 5_000  # µs: the observer's own round trip after admit returned
    for i, first in enumerate(starts):
        inside = [s for s in starts[i:] if s < first + int(period * 1e6) - slack]
        assert len(inside) <= rate, (i, inside)


async def _async_limits(urls: list[str]) -> tuple[list[Any], float]:
    lock = AsyncRedlock(urls, ttl=TTL, node_timeout=NODE_TIMEOUT)
    try:
        leases = [await lock.try_acquire("a", limit=2, blocking=False) for _ in range(2)]
        refused = await lock.acquire("a", limit=2, blocking=False)
        for lease in leases:
            assert await lease.release()
        admitted = [await lock.admit("ar", "2/s") for _ in range(3)]
        return [lease.keys for lease in leases] + [refused], admitted[-1]
    finally:
        lock.close()


def test_asyncio_has_limits_and_rates(redis_nodes: RedisNodes) -> None:
    keys, wait = asyncio.run(_async_limits(redis_nodes.urls))
    assert sorted(keys[:2]) == [(permit_slot("a", LIMIT, 0),), (permit_slot("a", LIMIT, 1),)]
    assert keys[2] is None
    assert 0 < wait <= 1.1


def test_permit_slots_share_the_keys_prefix() -> None:
    assert permit_slot("tenant:7", LIMIT, 3).startswith("tenant:7")
    assert permit_slot_prefix("k", LIMIT) + "0" == permit_slot("k", LIMIT, 0)


def test_callers_refused_by_a_full_window_are_handed_turns_a_spacing_apart(
    redis_nodes: RedisNodes,
) -> None:
    lock = _lock(redis_nodes)
    assert [lock.admit("turns", "2/s") for _ in range(2)] == [0.0, 0.0]
    # Without a reservation every refused caller is told when the window next frees.
    plain = [lock.admit("turns", "2/s") for _ in range(3)]
    assert all(0.0 < wait <= 1.1 for wait in plain)
    # With one, each is told its own turn: a slot's lifetime / R (0.516 s: the
    # period, its 1% drift and 22 ms margins, / 2) after the one before, less the
    # time between the calls (node time). Each turn is the quorum-th of the five
    # nodes', whose first turns came from their own expiries a few ms apart, so a
    # gap may show a few ms more.
    turns = [lock.admit("turns", "2/s", reserve=True) for _ in range(4)]
    gaps = [later - earlier for earlier, later in zip(turns, turns[1:])]
    assert all(0.25 < gap <= 0.522 for gap in gaps), turns
    assert turns[0] <= 1.1
    with pytest.raises(ConfigurationError, match="reserve must be True or False"):
        lock.admit("turns", "2/s", reserve="yes")  # type: ignore[arg-type]
