"""The lock's own API beyond acquire: release outcomes, server-side queries, tokens
handed across processes and operators' deletions -- against real redis-server
processes."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import redis

from celery_redlock import ConfigurationError, Lease, LockLost, QuorumUnavailable, Redlock
from celery_redlock.lock.stored import fence_counter, tombstone
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.observe import settles, until

NODE_TIMEOUT = 1.0
KEY_TTL = 30.0
FOREIGN = b"someone-else-entirely|other-host:1"
TOKEN = "caller-chosen-token-0123456789"


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _lock(cluster: RedisNodes, **kwargs: Any) -> Redlock:
    return Redlock(cluster.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT, **kwargs)


def _values(cluster: RedisNodes, key: str) -> list[Any]:
    return [c.get(key) for c in _clients(cluster)]


def _settled(cluster: RedisNodes, key: str, expected: list[Any]) -> None:
    """Wait until every node holds ``expected`` under ``key``: a round returns at
    quorum, the other nodes' copies follow."""
    settles(lambda: _values(cluster, key), expected, f"{key!r} on every node")


def _overwrite(cluster: RedisNodes, key: str) -> None:
    """Another holder took ``key`` on every node (as after our lease ran out)."""
    for client in _clients(cluster):
        client.set(key, FOREIGN, px=int(KEY_TTL * 1000))


def _held_then_cut(cluster: RedisNodes, key: str) -> tuple[Redlock, Lease]:
    """A lease on ``key``, then a majority of the nodes killed."""
    redlock = Redlock(cluster.urls, ttl=KEY_TTL, node_timeout=0.2)
    lease = redlock.acquire(key)
    assert lease is not None
    for server in list(cluster)[:3]:
        server.kill()
    return redlock, lease


# -- release reports its outcome -------------------------------------------------------


def test_release_is_true_when_a_quorum_deleted_and_false_once_released(
    redis_nodes: RedisNodes,
) -> None:
    lease = _lock(redis_nodes).acquire("rel")
    assert lease is not None
    assert lease.release() is True
    assert lease.release() is False  # idempotent: nothing sent, nothing released
    _settled(redis_nodes, "rel", [None] * 5)


def test_release_of_a_lease_another_holder_took_is_false_and_leaves_it(
    redis_nodes: RedisNodes,
) -> None:
    lease = _lock(redis_nodes).acquire("taken")
    assert lease is not None
    _overwrite(redis_nodes, "taken")
    assert lease.release() is False
    assert [c.get("taken") for c in _clients(redis_nodes)] == [FOREIGN] * 5


def test_release_value_of_an_absent_key_is_false_and_still_leaves_tombstones(
    redis_nodes: RedisNodes,
) -> None:
    value = f"{TOKEN}|elsewhere:1"
    assert _lock(redis_nodes).release_value("never", value) is False
    # A late SET of that value must still be refused: the tombstones are there.
    settles(
        lambda: [c.exists(tombstone("never", value)) for c in _clients(redis_nodes)],
        [1] * 5,
        "a tombstone on every node",
    )


def test_release_without_a_quorum_raises_quorum_unavailable(redis_nodes: RedisNodes) -> None:
    _, lease = _held_then_cut(redis_nodes, "cut")
    with pytest.raises(QuorumUnavailable) as caught:
        lease.release()
    assert len(caught.value.errors) == 3
    assert lease.release() is False


def test_leaving_the_block_raises_lock_lost_when_the_lease_was_lost(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes)
    with pytest.raises(LockLost, match="no longer held"), redlock.lock("gone"):
        _overwrite(redis_nodes, "gone")
    # The block's own error wins over the loss.
    with pytest.raises(ZeroDivisionError), redlock.lock("gone2"):
        _overwrite(redis_nodes, "gone2")
        1 / 0  # noqa: B018
    with redlock.lock("kept") as lease:
        assert lease.held
    assert lease.released
    with redlock.lock("early") as lease:
        assert lease.release() is True  # released in the block: leaving says nothing


# -- server-side queries ---------------------------------------------------------------


def test_locked_and_owned_ask_the_nodes(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    other = _lock(redis_nodes)
    assert redlock.locked("q") is False
    lease = redlock.acquire("q")
    assert lease is not None
    assert other.locked("q") is True
    assert lease.owned() is True
    _overwrite(redis_nodes, "q")
    assert lease.owned() is False
    assert other.locked("q") is True
    for client in _clients(redis_nodes)[:3]:
        client.delete("q")
    assert other.locked("q") is False  # only a minority holds it


def test_queries_without_a_quorum_raise_quorum_unavailable(redis_nodes: RedisNodes) -> None:
    redlock, lease = _held_then_cut(redis_nodes, "dark")
    with pytest.raises(QuorumUnavailable):
        redlock.locked("dark")
    with pytest.raises(QuorumUnavailable):
        lease.owned()


# -- tokens across processes -----------------------------------------------------------


def test_a_caller_chosen_token_lets_another_lock_extend_and_release(
    redis_nodes: RedisNodes,
) -> None:
    lease = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT).acquire(
        "handed", token=TOKEN, holder="first:1"
    )
    assert lease is not None and lease.token == TOKEN
    assert lease.value == f"{TOKEN}|first:1"
    _settled(redis_nodes, "handed", [lease.value.encode()] * 5)  # no 5 s SET on its way
    elsewhere = _lock(redis_nodes)
    assert elsewhere.extend_value("handed", lease.value, ttl=KEY_TTL) is True
    clients = _clients(redis_nodes)
    until(lambda: all(c.pttl("handed") > 10_000 for c in clients), "the extension everywhere")
    assert elsewhere.extend_value("handed", f"{TOKEN}|someone:2") is False
    assert elsewhere.release_value("handed", lease.value) is True
    assert elsewhere.extend_value("handed", lease.value) is False
    _settled(redis_nodes, "handed", [None] * 5)


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (12345678901234567, "token must be a str of 16..256 characters without '|', got int"),
        ("short", "token must be 16..256 characters long"),
        ("x" * 257, "token must be 16..256 characters long"),
        ("has|a-separator-in-it", "token must not contain '|'"),
        ("bad-\ud800-surrogate-text", "token must be text that UTF-8 can encode"),
    ],
    ids=["int", "short", "long", "separator", "not utf-8"],
)
def test_a_bad_token_is_refused_before_anything_is_taken(
    redis_server: RedisServer, token: Any, says: str
) -> None:
    redlock = Redlock([redis_server.url])
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        redlock.acquire("tok", token=token)
    assert redis_server.client().keys("*") == []


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda r: r.extend_value("k", "no-separator"), "value must be a lease's stored value"),
        (lambda r: r.extend_value("k", 5), "value must be a lease's stored value"),
        (lambda r: r.extend_value("k", "t|h", ttl=-1), "ttl must be > 0"),
        (lambda r: r.extend_value("", "t|h"), "key must be a non-empty str"),
        (lambda r: r.locked(3), "key must be a non-empty str"),
        (lambda r: r.force_release(None), "key must be a non-empty str"),
        (lambda r: r.clear(""), "match must be a non-empty glob str"),
        (lambda r: r.clear(7), "match must be a non-empty glob str"),
        (lambda r: r.clear("a\x00*"), "match must be a non-empty glob str without NUL"),
        (lambda r: r.clear("bad-\ud800"), "match must be text that UTF-8 can encode"),
    ],
    ids=[
        "extend value",
        "extend value int",
        "extend ttl",
        "extend key",
        "locked key",
        "force key",
        "clear empty",
        "clear int",
        "clear NUL",
        "clear utf-8",
    ],
)
def test_a_bad_argument_of_the_new_calls_gets_a_clear_error(
    redis_server: RedisServer, call: Callable[[Redlock], object], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        call(Redlock([redis_server.url]))


# -- administrative release ------------------------------------------------------------


def test_force_release_deletes_whoever_holds_it_and_keeps_the_fence(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes, fencing=True)
    first = redlock.acquire("stuck")
    assert first is not None and first.fence is not None
    _settled(redis_nodes, "stuck", [first.value.encode()] * 5)
    assert redlock.force_release("stuck") == 5  # it waits for every node
    assert redlock.force_release("stuck") == 0
    assert all(c.exists(fence_counter("stuck")) for c in _clients(redis_nodes))
    second = redlock.acquire("stuck", blocking=False)
    assert second is not None and second.fence is not None
    assert second.fence > first.fence  # fences stay monotonic
    assert first.release() is False


def test_clear_deletes_matching_lock_keys_only(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes, fencing=True)
    for name in ("job:1", "job:2", "job:3", "other"):
        lease = redlock.acquire(name)
        assert lease is not None
        _settled(redis_nodes, name, [lease.value.encode()] * 5)  # no SET left on its way
    assert redlock.clear("job:*") == 3
    for client in _clients(redis_nodes):
        assert client.exists("job:1", "job:2", "job:3") == 0
        assert client.exists("other") == 1
        assert client.exists(fence_counter("job:1")) == 1
    assert redlock.clear() == 1


def test_clear_without_a_quorum_raises_quorum_unavailable(redis_nodes: RedisNodes) -> None:
    redlock, _ = _held_then_cut(redis_nodes, "c:1")
    with pytest.raises(QuorumUnavailable):
        redlock.clear("c:*")


# -- refused combinations --------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.acquire("nb", blocking=False, timeout=5),
        lambda r: r.try_acquire("nb", blocking=False, timeout=0),
        lambda r: r.lock("nb", blocking=False, timeout=1).__enter__(),
    ],
    ids=["acquire", "try_acquire", "lock"],
)
def test_a_timeout_without_blocking_is_refused(
    redis_server: RedisServer, call: Callable[[Redlock], object]
) -> None:
    with pytest.raises(ConfigurationError, match=r"timeout=\d+ needs blocking=True"):
        call(Redlock([redis_server.url]))
    assert redis_server.client().exists("nb") == 0
