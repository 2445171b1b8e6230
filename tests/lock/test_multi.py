"""Multi-resource locks (``acquire(["a", "b"])``) against real lock nodes.

Every claim is checked on the nodes directly, with plain clients: which value each
node holds under each key, its TTL, tombstones and fence counters. Another
``Redlock`` over the same nodes is a second client, the independent judge of what
is held.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
import redis

from celery_redlock import (
    AlreadyHeld,
    ConfigurationError,
    LockContended,
    QuorumUnavailable,
    Redlock,
)
from celery_redlock.lock.commands import MAX_KEYS
from celery_redlock.lock.stored import fence_counter, tombstone
from celery_redlock.testing import RedisNodes
from tests.support.observe import settles, until

NODE_TIMEOUT = 0.5
KEY_TTL = 30.0
LIST_RULE = r"key must be a non-empty str or a list of 1\.\.64 distinct non-empty str keys"
FOREIGN = b"someone-elses-token-0123|elsewhere:1"


def _lock(cluster: RedisNodes, **kwargs: Any) -> Redlock:
    return Redlock(cluster.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT, **kwargs)


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _values(cluster: RedisNodes, key: str) -> list[Any]:
    return [c.get(key) for c in _clients(cluster)]


def _settle(cluster: RedisNodes, keys: list[str], expected: list[Any]) -> None:
    """Wait until every node holds ``expected`` under each of ``keys``: a round
    returns at quorum, the other nodes' copies follow."""
    for key in keys:
        settles(lambda: _values(cluster, key), expected, f"{key!r} on every node")  # noqa: B023


def test_keys_are_taken_in_canonical_order_and_named_together(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    lease = redlock.acquire(["b", "a"])
    assert lease is not None
    assert lease.keys == ("a", "b")
    assert lease.key == "a+b"
    value = lease.value.encode()
    _settle(redis_nodes, ["a", "b"], [value] * 5)
    assert lease.release() is True
    _settle(redis_nodes, ["a", "b"], [None] * 5)
    single = redlock.acquire(["solo"])  # one key in a list: a plain lease
    assert single is not None and single.keys == ("solo",) and single.key == "solo"
    assert single.release() is True


def test_overlapping_sets_contend_and_the_loser_sets_no_key(redis_nodes: RedisNodes) -> None:
    first = _lock(redis_nodes).acquire(["a", "b"])
    assert first is not None
    _settle(redis_nodes, ["a", "b"], [first.value.encode()] * 5)  # held on every node
    other = _lock(redis_nodes)
    assert other.acquire(["b", "c"], blocking=False) is None
    # All or none: "c" was free everywhere, yet no node set it.
    assert _values(redis_nodes, "c") == [None] * 5
    assert _values(redis_nodes, "b") == [first.value.encode()] * 5
    with pytest.raises(LockContended) as caught:
        other.try_acquire(["c", "b"], blocking=False)
    assert caught.value.key == "b+c"
    assert caught.value.holder == first.holder
    assert caught.value.ttl is not None and 0 < caught.value.ttl <= KEY_TTL
    disjoint = other.acquire(["c", "d"], blocking=False)  # no overlap: no contention
    assert disjoint is not None and disjoint.release() is True
    assert first.release() is True
    _settle(redis_nodes, ["a", "b", "c", "d"], [None] * 5)
    second = other.acquire(["b", "c"], blocking=False)
    assert second is not None
    _settle(redis_nodes, ["b", "c"], [second.value.encode()] * 5)
    assert _values(redis_nodes, "a") == [None] * 5
    assert second.release() is True


def test_a_node_where_one_key_is_held_by_someone_else_grants_neither(
    redis_nodes: RedisNodes,
) -> None:
    clients = _clients(redis_nodes)
    for client in clients[:2]:
        client.set("b", FOREIGN, px=60_000)
    lease = _lock(redis_nodes).acquire(["a", "b"], blocking=False)
    assert lease is not None  # three free nodes make the quorum
    value = lease.value.encode()
    _settle(redis_nodes, ["a"], [None, None, value, value, value])
    _settle(redis_nodes, ["b"], [FOREIGN, FOREIGN, value, value, value])
    assert lease.release() is True
    _settle(redis_nodes, ["a"], [None] * 5)
    _settle(redis_nodes, ["b"], [FOREIGN, FOREIGN, None, None, None])

    clients[2].set("b", FOREIGN, px=60_000)  # now a majority holds "b": no quorum
    assert _lock(redis_nodes).acquire(["a", "b"], blocking=False) is None
    _settle(redis_nodes, ["a"], [None] * 5)  # undone everywhere
    _settle(redis_nodes, ["b"], [FOREIGN] * 3 + [None] * 2)


def test_quorum_with_two_of_five_nodes_down(redis_nodes: RedisNodes) -> None:
    redis_nodes[3].kill()
    redis_nodes[4].kill()
    redlock = _lock(redis_nodes)
    lease = redlock.acquire(["x", "y"], blocking=False)
    assert lease is not None
    live = _clients(redis_nodes)[:3]
    assert [(c.get("x"), c.get("y")) for c in live] == [(lease.value.encode(),) * 2] * 3
    assert lease.extend() is True
    assert lease.owned() is True
    assert lease.release() is True
    assert [(c.get("x"), c.get("y")) for c in live] == [(None, None)] * 3
    redis_nodes[2].kill()
    with pytest.raises(QuorumUnavailable):
        redlock.acquire(["x", "y"], blocking=False)


def test_extend_and_release_cover_the_whole_set(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    lease = redlock.acquire(["p", "q", "r"], ttl=KEY_TTL)
    assert lease is not None
    assert lease.extend(ttl=3 * KEY_TTL) is True
    clients = _clients(redis_nodes)
    until(  # only the extension reaches past KEY_TTL
        lambda: all(c.pttl(key) > KEY_TTL * 1000 for c in clients for key in lease.keys),
        "the extension on every node",
    )
    for client in clients[:3]:  # someone else took "q" on a majority
        client.set("q", FOREIGN, px=60_000)
    assert lease.extend() is False  # a node extends all keys or none: a majority refused
    assert lease.lost
    for client in clients[:3]:
        assert client.pttl("p") > KEY_TTL * 1000  # untouched by the refused extension
    assert lease.release() is False  # not wholly ours any more
    _settle(redis_nodes, ["q"], [FOREIGN] * 3 + [None] * 2)  # the foreign copies untouched
    _settle(redis_nodes, ["p", "r"], [None] * 5)


def test_release_leaves_a_tombstone_for_each_absent_key(redis_nodes: RedisNodes) -> None:
    lease = _lock(redis_nodes).acquire(["t1", "t2"])
    assert lease is not None
    _settle(redis_nodes, ["t1", "t2"], [lease.value.encode()] * 5)
    for client in _clients(redis_nodes):
        client.delete("t1", "t2")  # expired, or a late SET still on its way
    assert lease.release() is False
    tombstones = (tombstone("t1", lease.value), tombstone("t2", lease.value))
    settles(
        lambda: [c.exists(*tombstones) for c in _clients(redis_nodes)],
        [2] * 5,
        "both tombstones on every node",
    )


def test_the_watchdog_extends_the_whole_set_through_a_lock_block(
    redis_nodes: RedisNodes,
) -> None:
    redlock = Redlock(redis_nodes.urls, ttl=1.0, node_timeout=0.2)
    extended = threading.Event()
    with redlock.lock(["w1", "w2"], auto_extend=True) as lease:

        def count(lease: Any) -> None:
            if lease.extensions >= 3:  # three renewals: past the first TTL by construction
                extended.set()

        lease.on_extended(count)
        assert extended.wait(60), "the watchdog never renewed the set"
        assert lease.held
        _settle(redis_nodes, ["w1", "w2"], [lease.value.encode()] * 5)
    _settle(redis_nodes, ["w1", "w2"], [None] * 5)


def test_each_key_of_a_set_reads_as_held_by_its_holder(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    lease = redlock.acquire(["h1", "h2"], holder="reporter")
    assert lease is not None
    _settle(redis_nodes, ["h1", "h2"], [lease.value.encode()] * 5)  # no SET still on its way
    other = _lock(redis_nodes)
    for key in lease.keys:
        assert other.locked(key) is True
        assert other.holder(key).holder == "reporter"
    assert other.locked("h3") is False
    assert lease.owned() is True
    _clients(redis_nodes)[0].delete("h2")
    _clients(redis_nodes)[1].delete("h2")
    _clients(redis_nodes)[2].delete("h2")
    assert lease.owned() is False  # a majority no longer holds the whole set
    assert lease.release() is False


def test_release_value_and_extend_value_take_the_list(redis_nodes: RedisNodes) -> None:
    lease = _lock(redis_nodes).acquire(["v1", "v2"])
    assert lease is not None
    _settle(redis_nodes, ["v1", "v2"], [lease.value.encode()] * 5)
    elsewhere = _lock(redis_nodes)  # another process, handed the value
    assert elsewhere.extend_value(["v2", "v1"], lease.value, ttl=3 * KEY_TTL) is True
    clients = _clients(redis_nodes)
    until(
        lambda: all(min(c.pttl("v1"), c.pttl("v2")) > KEY_TTL * 1000 for c in clients),
        "the extension on every node",
    )
    assert elsewhere.release_value(["v1", "v2"], lease.value) is True
    _settle(redis_nodes, ["v1", "v2"], [None] * 5)
    assert elsewhere.release_value(["v1", "v2"], lease.value) is False
    assert elsewhere.extend_value(["v1", "v2"], lease.value) is False


def test_a_fenced_set_orders_the_holders_of_each_key(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes, fencing=True)
    lease = redlock.acquire(["f1", "f2"])
    assert lease is not None and lease.fence is not None
    for key in lease.keys:
        settles(
            lambda: [int(c.get(fence_counter(key)) or 0) for c in _clients(redis_nodes)],  # noqa: B023
            [lease.fence] * 5,
            f"the fence counter of {key!r} on every node",
        )
    assert lease.release() is True
    later = [redlock.acquire(key) for key in ("f2", "f1")]
    fences = [lease.fence]
    for single in later:
        assert single is not None and single.fence is not None
        fences.append(single.fence)
        assert single.release() is True
    assert fences == sorted(set(fences))  # strictly increasing, whichever key
    again = redlock.acquire(["f1", "f2"])
    assert again is not None and again.fence is not None and again.fence > fences[-1]
    assert again.release() is True


def test_a_key_of_a_held_set_is_already_held_by_this_execution(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes)
    lease = redlock.acquire(["s1", "s2"])
    assert lease is not None
    calls: list[Callable[[], object]] = [
        lambda: redlock.acquire("s1"),
        lambda: redlock.acquire("s2", reentrant=True),
        lambda: redlock.acquire(["s2", "s3"]),
        lambda: redlock.try_acquire(["s1", "s2"]),
    ]
    for call in calls:
        with pytest.raises(AlreadyHeld):
            call()
    assert lease.release() is True
    _settle(redis_nodes, ["s1", "s2"], [None] * 5)
    again = redlock.acquire(["s2", "s3"], blocking=False)
    assert again is not None and again.release() is True


def test_reentrant_takes_one_key(redis_nodes: RedisNodes) -> None:
    with pytest.raises(ConfigurationError, match=r"reentrant=True takes one key"):
        _lock(redis_nodes).acquire(["a", "b"], reentrant=True)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            [],
            LIST_RULE + ", got 0 keys",
        ),
        (("a", "b", "a"), r"key must list each key once, got 'a' more than once"),
        (["a", 3], r"key\[1\] must be a non-empty str, got int: 3"),
        (["a", ""], r"key\[1\] must be a non-empty str"),
        (["a", "b\x00c"], r"key\[1\] must not contain NUL"),
        (
            [f"k{i}" for i in range(MAX_KEYS + 1)],
            r"list of 1\.\.64 distinct non-empty str keys, got 65",
        ),
        (
            {"a", "b"},
            LIST_RULE + ", got set",
        ),
    ],
)
def test_bad_key_lists_are_refused_naming_the_argument(
    redis_nodes: RedisNodes, key: Any, message: str
) -> None:
    redlock = _lock(redis_nodes)
    calls: list[Callable[[], object]] = [
        lambda: redlock.acquire(key),
        lambda: redlock.try_acquire(key),
        lambda: redlock.lock(key).__enter__(),
        lambda: redlock.release_value(key, "token-0123456789abcdef|me"),
        lambda: redlock.extend_value(key, "token-0123456789abcdef|me"),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError, match=message):
            call()
    for client in _clients(redis_nodes):
        assert client.dbsize() == 0  # refused before any round
