"""Hand-off to waiting duplicates, the lock nodes' side (celery_redlock.lock.waiters), on
real redis-server processes: the waiter queue's order and expiry, and the claim that
lets exactly one of a waiter's two copies go on."""

from __future__ import annotations

import threading
import time

import pytest

from celery_redlock import Redlock
from celery_redlock.lock.waiters import (
    CLAIM_LOST,
    CLAIM_SPLIT,
    CLAIM_UNDECIDED,
    CLAIM_WON,
    claim,
    claim_key,
    claim_verdict,
    claimed_by_another,
    pop_next,
    read_claim,
    register,
)
from celery_redlock.testing import RedisNodes, RedisNodesFactory

TIMEOUT = 0.5


@pytest.fixture
def three(redis_nodes_factory: RedisNodesFactory) -> RedisNodes:
    return redis_nodes_factory(3)


def test_waiters_are_popped_in_arrival_order_once_each(three: RedisNodes) -> None:
    nodes = Redlock(three.urls).node_set
    for name, score in (("w-late", 300), ("w-first", 100), ("w-mid", 200)):
        assert register(nodes, "k", name, score, f"message {name}", 30.0, TIMEOUT).queued == 3
    popped = [pop_next(nodes, "k", TIMEOUT) for _ in range(4)]
    assert [p.waiter if p else None for p in popped] == ["w-first", "w-mid", "w-late", None]
    assert popped[0] is not None and popped[0].message == "message w-first"
    # Nothing is left behind, and nothing was kept without a TTL.
    assert all(not node.client().keys("*") for node in three)


def test_an_expired_waiter_is_skipped(three: RedisNodes) -> None:
    nodes = Redlock(three.urls).node_set
    register(nodes, "k", "w-dead", 1, "dead", 0.05, TIMEOUT)
    register(nodes, "k", "w-live", 2, "live", 30.0, TIMEOUT)
    time.sleep(0.1)  # w-dead's message key's TTL has passed (Redis expires it on access)
    popped = pop_next(nodes, "k", TIMEOUT)
    assert popped is not None and popped.waiter == "w-live"


def test_a_waiter_registered_on_a_minority_is_still_woken_later(three: RedisNodes) -> None:
    nodes = Redlock(three.urls).node_set
    register(nodes, "k", "w-2", 2, "two", 30.0, TIMEOUT)
    three[0].kill()
    register(nodes, "k", "w-1", 1, "one", 30.0, TIMEOUT)  # only on nodes 2 and 3
    assert pop_next(nodes, "k", TIMEOUT).waiter == "w-1"  # type: ignore[union-attr]
    assert pop_next(nodes, "k", TIMEOUT).waiter == "w-2"  # type: ignore[union-attr]


def test_of_two_copies_racing_for_one_waiter_exactly_one_wins(three: RedisNodes) -> None:
    def run(copy: str, waiter: str, start: threading.Barrier, verdicts: dict[str, str]) -> None:
        nodes = Redlock(three.urls).node_set
        start.wait()
        verdicts[copy] = claim(nodes, 2, "k", waiter, copy, 60.0, TIMEOUT).verdict

    for trial in range(30):
        verdicts: dict[str, str] = {}
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=run, args=(c, f"w{trial}", start, verdicts))
            for c in ("wake", "fallback")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(verdicts.values()) == [CLAIM_LOST, CLAIM_WON], verdicts


def test_a_redelivered_copy_finds_its_own_claim(three: RedisNodes) -> None:
    nodes = Redlock(three.urls).node_set
    assert claim(nodes, 2, "k", "w", "copy-a", 60.0, TIMEOUT) == (CLAIM_WON, {}, "copy-a")
    assert claim(nodes, 2, "k", "w", "copy-a", 60.0, TIMEOUT).verdict == CLAIM_WON
    assert claim(nodes, 2, "k", "w", "copy-b", 60.0, TIMEOUT).verdict == CLAIM_LOST


def test_a_claimed_waiter_is_not_queued_again(three: RedisNodes) -> None:
    """A copy of the waiter claimed it (the claim takes it out of the queue): a later
    copy registering it again, as a contended fallback would, is refused on every node
    that holds the claim, and no release wakes it."""
    nodes = Redlock(three.urls).node_set
    assert register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT).queued == 3
    assert claim(nodes, 2, "k", "w", "copy-a", 60.0, TIMEOUT).verdict == CLAIM_WON
    assert register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT).queued == 0
    assert pop_next(nodes, "k", TIMEOUT) is None
    three[0].client().delete(claim_key("k", "w"))  # a node that lost the claim (restarted)
    assert register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT).queued == 1


@pytest.mark.parametrize("limit", [1, 3])
def test_a_registration_tells_whether_the_lock_is_still_taken(
    three: RedisNodes, limit: int
) -> None:
    """Read in the registration's own script, per node: the lock key (a mutex) or the
    note that every permit is taken, which a refused attempt leaves and any release
    clears."""
    redlock = Redlock(three.urls)
    nodes = redlock.node_set
    leases = [redlock.acquire("k", ttl=30, holder=f"h{i}", limit=limit) for i in range(limit)]
    assert all(leases)
    if limit > 1:
        assert redlock.acquire("k", ttl=30, holder="refused", limit=limit, blocking=False) is None
    taken = register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT, limit)
    assert taken == (3, 0)
    leases[0].release()  # type: ignore[union-attr]
    freed = register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT, limit)
    assert freed == (3, 3)
    assert register(nodes, "k", "w", 1, "message", 30.0, TIMEOUT, None) == (3, 0)


def test_a_claim_read_names_the_copy_it_settled_on_only_when_settled(three: RedisNodes) -> None:
    nodes = Redlock(three.urls).node_set
    assert claim(nodes, 2, "k", "w", "copy-a", 60.0, TIMEOUT).verdict == CLAIM_WON
    values = read_claim(nodes, "k", "w", TIMEOUT)
    assert claimed_by_another(values, "copy-b", 2) == "copy-a"
    assert claimed_by_another(values, "copy-a", 2) is None
    assert claimed_by_another(read_claim(nodes, "k", "unclaimed", TIMEOUT), "copy-b", 2) is None
    # On one node of three: any copy may still win it on the other two.
    three[0].client().set(claim_key("k", "w2"), "copy-a", px=60_000)
    assert claimed_by_another(read_claim(nodes, "k", "w2", TIMEOUT), "copy-b", 2) is None
    three[1].client().set(claim_key("k", "w2"), "copy-a", px=60_000)
    three[2].kill()  # on a quorum, the third node silent: settled
    assert claimed_by_another(read_claim(nodes, "k", "w2", TIMEOUT), "copy-b", 2) == "copy-a"


def test_a_claim_that_too_few_nodes_answer_is_undecided(three: RedisNodes) -> None:
    three[0].kill()
    three[1].kill()
    nodes = Redlock(three.urls).node_set
    verdict, errors, winner = claim(nodes, 2, "k", "w", "copy-a", 60.0, TIMEOUT)
    assert winner is None
    assert verdict == CLAIM_UNDECIDED
    assert sorted(errors) == sorted(node.address for node in nodes.nodes[:2])  # named


def test_claim_verdict_rules() -> None:
    error = ConnectionError("down")
    assert claim_verdict([b"a", b"a", error], "a", 2) == CLAIM_WON
    assert claim_verdict([b"a", b"a", error], "b", 2) == CLAIM_LOST
    # Two nodes answered (a quorum of three), their ids differ: a split, no outage.
    assert claim_verdict([b"a", b"b", error], "a", 2) == CLAIM_SPLIT
    assert claim_verdict([b"a", error, error], "a", 2) == CLAIM_UNDECIDED
    # Four nodes split 2-2, all answered: the values are final, the smallest id wins.
    assert claim_verdict([b"a", b"b", b"b", b"a"], "a", 3) == CLAIM_WON
    assert claim_verdict([b"a", b"b", b"b", b"a"], "b", 3) == CLAIM_LOST
