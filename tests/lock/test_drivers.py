"""The core lock tests, run on both drivers: ``Redlock`` and ``AsyncRedlock``.

Each test gets ``make`` (a lock on given nodes, sync or asyncio) and calls it the
same way whichever driver it is: ``Driven`` awaits the asyncio lock's coroutines on
one event loop per test, all in one asyncio Task (``OneTask``), so that a test is
one execution on either driver, as the sync driver's one thread is; ``elsewhere``
calls from another execution (a thread; another Task). Real redis-server
processes; what the nodes hold is read by plain clients (the observer), never taken
from the lock's word.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import re
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, Callable

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
from celery_redlock.asyncio import AsyncRedlock
from celery_redlock.lock.lease import LeaseState
from celery_redlock.lock.stored import reentry_holds
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.bad_construction import BAD_CONSTRUCTION
from tests.support.observe import settles, until

FOREIGN = b"someone-else-entirely|other-host:1"
NODE_TIMEOUT = 1.0
KEY_TTL = 30.0
TOKEN = "caller-chosen-token-0123456789"


class OneTask:
    """Runs every awaitable it is given in one asyncio Task, one after the other."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._inbox: asyncio.Future[tuple[Awaitable[Any], asyncio.Future[Any]]]
        self._inbox = loop.create_future()
        self._task = loop.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            awaitable, reply = await self._inbox
            self._inbox = self.loop.create_future()
            try:
                reply.set_result(await awaitable)
            except BaseException as exc:  # handed to the caller
                reply.set_exception(exc)

    def run(self, awaitable: Awaitable[Any]) -> Any:
        reply: asyncio.Future[Any] = self.loop.create_future()
        self._inbox.set_result((awaitable, reply))
        return self.loop.run_until_complete(reply)

    def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self._task)


class Driven:
    """A lock, lease or context manager of either driver, called synchronously."""

    def __init__(self, target: Any, runner: OneTask) -> None:
        self._target = target
        self._runner = runner

    def _settle(self, result: Any) -> Any:
        if inspect.isawaitable(result):
            result = self._runner.run(result)
        if isinstance(result, LeaseState):  # a Lease or an AsyncLease
            return Driven(result, self._runner)
        return result

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name == "lock":
            return lambda *a, **kw: self._lock(attr(*a, **kw))
        if not callable(attr):
            return attr
        return lambda *a, **kw: self._settle(attr(*map(_unwrapped, a), **kw))

    def elsewhere(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call method ``name`` from another execution: a thread (sync), another
        asyncio Task of the same loop (asyncio)."""
        call = getattr(self._target, name)
        out: list[Any] = []
        if isinstance(self._target, AsyncRedlock):
            out.append(self._runner.loop.run_until_complete(call(*args, **kwargs)))
        else:
            thread = threading.Thread(target=lambda: out.append(call(*args, **kwargs)))
            thread.start()
            thread.join(30)
        result = out[0]
        return Driven(result, self._runner) if isinstance(result, LeaseState) else result

    @contextlib.contextmanager
    def _lock(self, manager: Any) -> Iterator[Any]:
        if not hasattr(manager, "__aenter__"):
            with manager as lease:
                yield Driven(lease, self._runner)
            return
        lease = self._runner.run(manager.__aenter__())
        try:
            yield Driven(lease, self._runner)
        except BaseException as exc:
            if not self._runner.run(manager.__aexit__(type(exc), exc, None)):
                raise
        else:
            self._runner.run(manager.__aexit__(None, None, None))


def _unwrapped(arg: Any) -> Any:
    return arg._target if isinstance(arg, Driven) else arg


Make = Callable[..., Any]


@pytest.fixture(params=["sync", "asyncio"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    """``make(urls, **kwargs)``: a ``Redlock`` or an ``AsyncRedlock``, driven alike."""
    loop = asyncio.new_event_loop()
    runner = OneTask(loop)
    made: list[Any] = []

    def build(urls: list[str], **kwargs: Any) -> Any:
        cls = Redlock if request.param == "sync" else AsyncRedlock
        lock = cls(urls, **kwargs)
        made.append(lock)
        return Driven(lock, runner)

    yield build
    for lock in made:
        lock.close()
    runner.close()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _lock(make: Make, cluster: RedisNodes, **kwargs: Any) -> Any:
    return make(cluster.urls, ttl=kwargs.pop("ttl", KEY_TTL), node_timeout=NODE_TIMEOUT, **kwargs)


def _values(cluster: RedisNodes, key: str) -> list[Any]:
    return [c.get(key) for c in _clients(cluster)]


def _settled(cluster: RedisNodes, key: str, expected: list[Any]) -> None:
    """Wait until every node holds ``expected`` under ``key``: a round returns at
    quorum, the other nodes' copies follow."""
    settles(lambda: _values(cluster, key), expected, f"{key!r} on every node")


def _overwrite(cluster: RedisNodes, key: str, nodes: int = 5) -> None:
    for client in _clients(cluster)[:nodes]:
        client.set(key, FOREIGN, px=int(KEY_TTL * 1000))


def test_acquire_succeeds_iff_a_quorum_of_nodes_is_free(
    make: Make, redis_nodes: RedisNodes
) -> None:
    clients = _clients(redis_nodes)
    redlock = _lock(make, redis_nodes)
    for size in range(6):
        for taken in itertools.islice(itertools.combinations(range(5), size), 3):
            key = f"q:{'-'.join(map(str, taken)) or 'none'}"
            for i in taken:
                clients[i].set(key, FOREIGN, px=int(KEY_TTL * 1000))
            lease = redlock.acquire(key, blocking=False)
            if 5 - size >= 3:
                assert lease is not None
                assert lease.release() is True
            else:
                assert lease is None
            for i in taken:
                assert clients[i].get(key) == FOREIGN  # never touched


def test_contention_names_the_holder_and_the_loser_gets_nothing(
    make: Make, redis_nodes: RedisNodes
) -> None:
    first, second = _lock(make, redis_nodes), _lock(make, redis_nodes)
    lease = first.acquire("named", holder="task-1@worker-a:42")
    assert lease is not None
    with pytest.raises(LockContended) as caught:
        second.try_acquire("named", blocking=False)
    assert caught.value.holder == "task-1@worker-a:42"
    assert caught.value.ttl is not None and 0 < caught.value.ttl <= KEY_TTL
    assert second.acquire("named", blocking=False) is None
    assert second.holder("named").holder == "task-1@worker-a:42"
    _settled(redis_nodes, "named", [lease.value.encode()] * 5)
    assert lease.release() is True
    assert second.holder("named").holder is None


def test_release_outcomes_true_false_and_quorum_unavailable(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes)
    lease = redlock.acquire("rel")
    assert lease.release() is True
    assert lease.release() is False
    taken = redlock.acquire("taken")
    _overwrite(redis_nodes, "taken")
    assert taken.release() is False
    assert [c.get("taken") for c in _clients(redis_nodes)] == [FOREIGN] * 5
    cut = make(redis_nodes.urls, ttl=KEY_TTL, node_timeout=0.2)
    held = cut.acquire("cut")
    for server in list(redis_nodes)[:3]:
        server.kill()
    with pytest.raises(QuorumUnavailable) as caught:
        held.release()
    assert len(caught.value.errors) == 3


def test_extend_pushes_expiry_and_an_expired_holder_cannot_touch_the_next(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = make(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("ext")
    assert lease.extend(KEY_TTL) is True
    clients = _clients(redis_nodes)
    until(lambda: all(c.pttl("ext") > 10_000 for c in clients), "the extension on every node")
    _overwrite(redis_nodes, "ext")  # as if it had expired and another took it
    assert lease.extend() is False
    assert lease.lost and not lease.held
    assert lease.release() is False
    assert [c.get("ext") for c in _clients(redis_nodes)] == [FOREIGN] * 5


def test_extension_is_bounded_by_max_hold(make: Make, redis_nodes: RedisNodes) -> None:
    redlock = make(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT, max_hold=6)
    lease = redlock.acquire("bounded")
    assert lease.extend(KEY_TTL) is True  # only up to the bound: 6 s from the acquire
    assert all(c.pttl("bounded") <= 6000 for c in _clients(redis_nodes))


def test_queries_tokens_and_operators_deletions(make: Make, redis_nodes: RedisNodes) -> None:
    redlock, other = _lock(make, redis_nodes), _lock(make, redis_nodes)
    assert redlock.locked("q") is False
    lease = redlock.acquire("q", token=TOKEN, holder="first:1")
    assert lease.token == TOKEN and lease.value == f"{TOKEN}|first:1"
    assert other.locked("q") is True and lease.owned() is True
    assert other.extend_value("q", lease.value, ttl=KEY_TTL) is True
    assert other.extend_value("q", f"{TOKEN}|someone:2") is False
    assert other.release_value("q", lease.value) is True
    assert lease.owned() is False
    for key in ("a:1", "a:2"):
        _settled(redis_nodes, key, [other.acquire(key).value.encode()] * 5)
    assert redlock.force_release("a:1") == 5  # every node had it
    assert redlock.clear("a:*") == 1
    clients = _clients(redis_nodes)
    until(lambda: all(c.keys("a:*") == [] for c in clients), "a:* cleared on every node")


@pytest.mark.parametrize("down", [1, 2])
def test_a_minority_down_still_grants(make: Make, redis_nodes: RedisNodes, down: int) -> None:
    for server in list(redis_nodes)[:down]:
        server.kill()
    lease = make(redis_nodes.urls, ttl=KEY_TTL, node_timeout=0.5).acquire("minority")
    assert lease is not None
    live = [s.client() for s in list(redis_nodes)[down:]]
    settles(
        lambda: [c.get("minority") for c in live],
        [lease.value.encode()] * (5 - down),
        "the key on every live node",
    )
    assert lease.release() is True


def test_a_majority_down_raises_quorum_unavailable_naming_the_nodes(
    make: Make, redis_nodes: RedisNodes
) -> None:
    for server in list(redis_nodes)[:3]:
        server.kill()
    redlock = make(redis_nodes.urls, ttl=KEY_TTL, node_timeout=0.5)
    with pytest.raises(QuorumUnavailable) as caught:
        redlock.acquire("majority", blocking=False)
    assert set(caught.value.errors) == {s.url.split("//")[1] for s in list(redis_nodes)[:3]}


def test_leaving_the_block_raises_lock_lost_when_the_lease_was_lost(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes)
    with pytest.raises(LockLost, match="no longer held"), redlock.lock("gone"):
        _overwrite(redis_nodes, "gone")
    with pytest.raises(ZeroDivisionError), redlock.lock("gone2"):
        _overwrite(redis_nodes, "gone2")
        1 / 0  # noqa: B018
    with redlock.lock("kept") as lease:
        assert lease.held
    assert lease.released
    _settled(redis_nodes, "kept", [None] * 5)
    holder = _lock(make, redis_nodes).acquire("busy")
    with pytest.raises(LockContended), redlock.lock("busy", blocking=False):
        pass
    holder.release()


def test_fences_strictly_increase_from_holder_to_holder(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes, fencing=True)
    fences = []
    for _ in range(3):
        lease = redlock.acquire("fenced")
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences)) and all(isinstance(f, int) for f in fences)


@pytest.mark.parametrize(
    ("kwargs", "expected"), [c[1:] for c in BAD_CONSTRUCTION], ids=[c[0] for c in BAD_CONSTRUCTION]
)
def test_bad_construction_argument_gets_the_same_clear_error(
    make: Make, kwargs: dict[str, Any], expected: str
) -> None:
    kwargs = {"nodes": ["redis://127.0.0.1:7001/0"], **kwargs}
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        make(kwargs.pop("nodes"), **kwargs)


BAD_CALLS: list[tuple[str, Callable[[Any], object], str]] = [
    ("int key", lambda r: r.acquire(42), "key must be a non-empty str"),
    ("empty key", lambda r: r.acquire(""), "key must be a non-empty str"),
    ("ttl", lambda r: r.acquire("k", ttl=-5), "ttl must be > 0"),
    ("ttl<timeout", lambda r: r.acquire("k", ttl=0.01), "must be smaller than ttl (0.01s)"),
    ("timeout", lambda r: r.acquire("k", timeout=-1), "timeout must be >= 0"),
    ("no blocking", lambda r: r.acquire("k", blocking=False, timeout=1), "needs blocking=True"),
    ("holder", lambda r: r.acquire("k", holder="two\nlines"), "holder must be a one-line str"),
    ("token", lambda r: r.acquire("k", token="short"), "token must be 16..256 characters"),
    ("holder()", lambda r: r.holder(None), "key must be a non-empty str"),
    ("extend value", lambda r: r.extend_value("k", "x"), "value must be a lease's stored"),
    ("release value", lambda r: r.release_value("k", 5), "value must be a lease's stored"),
    ("locked", lambda r: r.locked(3), "key must be a non-empty str"),
    ("force", lambda r: r.force_release(None), "key must be a non-empty str"),
    ("clear", lambda r: r.clear(""), "match must be a non-empty glob str"),
    ("reentrant", lambda r: r.acquire("k", reentrant="yes"), "reentrant must be True or False"),
]


@pytest.mark.parametrize(
    ("call", "expected"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_call_argument_gets_the_same_clear_error(
    make: Make, redis_server: RedisServer, call: Callable[[Any], object], expected: str
) -> None:
    redlock = make([redis_server.url])
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        call(redlock)
    assert redis_server.client().keys("*") == []


# -- reentrancy: the execution is the thread (sync) or the asyncio Task ----------------------


def _holds(cluster: RedisNodes, key: str, value: str) -> list[int]:
    """How many holds each node counts for ``value`` (0: no set)."""
    return [int(c.scard(reentry_holds(key, value))) for c in _clients(cluster)]


def _settled_holds(cluster: RedisNodes, key: str, value: str, expected: list[int]) -> None:
    settles(lambda: _holds(cluster, key, value), expected, f"the holds of {key!r} on every node")


def test_a_held_key_raises_already_held_at_once_without_reentrant(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes)
    lease = redlock.acquire("mine")
    calls: list[Callable[[], object]] = [
        lambda: redlock.acquire("mine", timeout=60),  # would wait a minute for itself
        lambda: redlock.try_acquire("mine", blocking=False),
        lambda: redlock.lock("mine").__enter__(),
    ]
    for call in calls:
        with pytest.raises(AlreadyHeld, match="already held by this execution") as caught:
            call()
        assert caught.value.key == "mine"
    # Another execution of the same lock contends as usual, reentrant or not.
    assert redlock.elsewhere("acquire", "mine", blocking=False, reentrant=True) is None
    assert lease.release() is True
    again = redlock.acquire("mine", blocking=False)
    assert again is not None and again.release() is True


def test_reentrant_holds_are_counted_on_the_nodes_and_the_last_release_frees(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes, fencing=True)
    with redlock.lock("report", reentrant=True) as outer:
        assert _holds(redis_nodes, "report", outer.value) == [0] * 5  # a plain lease
        inner = redlock.acquire("report", reentrant=True)
        innermost = redlock.try_acquire("report", reentrant=True)
        assert inner.value == innermost.value == outer.value
        assert inner.fence == outer.fence
        assert inner.deadline <= outer.deadline
        _settled_holds(redis_nodes, "report", outer.value, [3] * 5)
        assert inner.release() is True  # any order
        _settled_holds(redis_nodes, "report", outer.value, [2] * 5)
        assert _values(redis_nodes, "report") == [outer.value.encode()] * 5
        assert redlock.elsewhere("acquire", "report", blocking=False) is None
        assert innermost.extend() is True
        assert _holds(redis_nodes, "report", outer.value) == [2] * 5
        assert innermost.release() is True
        _settled_holds(redis_nodes, "report", outer.value, [1] * 5)
    _settled(redis_nodes, "report", [None] * 5)
    other = redlock.elsewhere("acquire", "report", blocking=False)
    assert other is not None and other.release() is True


def test_a_hold_never_shortens_the_key_and_extends_keep_it(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes)
    outer = redlock.acquire("long", ttl=KEY_TTL)
    inner = redlock.acquire("long", ttl=2, reentrant=True)
    _settled_holds(redis_nodes, "long", outer.value, [2] * 5)  # every node took both
    assert inner.extend(ttl=2) is True
    # The outer hold's 30 s still stand on every node (pttl in ms), holds set too.
    assert all(c.pttl("long") > 2000 for c in _clients(redis_nodes))
    holds = reentry_holds("long", outer.value)
    assert all(c.pttl(holds) > 2000 for c in _clients(redis_nodes))
    assert inner.release() is True and outer.release() is True


def test_operators_deletions_and_hand_over_end_the_record(
    make: Make, redis_nodes: RedisNodes
) -> None:
    redlock = _lock(make, redis_nodes)
    for key in ("op:1", "op:2"):
        _settled(redis_nodes, key, [redlock.acquire(key).value.encode()] * 5)
    given = redlock.acquire("given")
    assert redlock.force_release("op:1") == 5  # every node had it
    assert redlock.clear("op:*") == 1
    redlock.hand_over(given)  # its value went to another execution
    assert redlock.release_value("given", given.value) is True
    for key in ("op:1", "op:2", "given"):
        lease = redlock.acquire(key, blocking=False)  # no AlreadyHeld: not held any more
        assert lease is not None and lease.release() is True


# -- several keys taken together (commands.py), on both drivers ---------------------------


def test_a_set_of_keys_is_taken_whole_or_not_at_all(make: Make, redis_nodes: RedisNodes) -> None:
    clients = _clients(redis_nodes)
    redlock, other = _lock(make, redis_nodes), _lock(make, redis_nodes)
    lease = redlock.acquire(["set:b", "set:a"])
    assert lease.keys == ("set:a", "set:b") and lease.key == "set:a+set:b"
    for key in lease.keys:
        _settled(redis_nodes, key, [lease.value.encode()] * 5)
    assert other.acquire(["set:a", "set:c"], blocking=False) is None  # overlaps: none
    assert all(c.get("set:c") is None for c in clients)
    with pytest.raises(LockContended, match="set:a\\+set:c"):
        other.try_acquire(["set:c", "set:a"], blocking=False)
    with pytest.raises(AlreadyHeld):
        redlock.acquire("set:b", blocking=False)
    with pytest.raises(ConfigurationError, match="reentrant=True takes one key"):
        redlock.acquire(["set:a", "set:b"], reentrant=True)
    assert lease.extend() is True and lease.owned() is True
    assert lease.release() is True
    for key in lease.keys:
        _settled(redis_nodes, key, [None] * 5)
    both = other.acquire(["set:a", "set:c"], blocking=False)
    assert both is not None and other.release_value(["set:c", "set:a"], both.value) is True
