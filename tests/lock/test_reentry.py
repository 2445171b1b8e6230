"""Reentrancy (``reentrant=True``) against real lock nodes and a real worker.

The holds are counted on the nodes: the tests read each node's holds set and lock
key by hand, and a second client (another thread, another process, another Redlock)
is the independent judge of whether the key is held.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any, Callable

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import (
    AlreadyHeld,
    ConfigurationError,
    QuorumUnavailable,
    Redlock,
    RedlockTask,
)
from celery_redlock.lock import scripts
from celery_redlock.lock.commands import reenter_command, release_command
from celery_redlock.lock.reentry import is_reentered
from celery_redlock.lock.stored import FIRST_HOLD, reentry_holds
from celery_redlock.tasks.config import app_config
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.observe import SETTLES_WITHIN, settles

NODE_TIMEOUT = 0.5
KEY_TTL = 30.0


def _lock(cluster: RedisNodes, **kwargs: Any) -> Redlock:
    return Redlock(cluster.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT, **kwargs)


def _clients(cluster: RedisNodes) -> list[redis.Redis]:
    return [server.client() for server in cluster]


def _holds(cluster: RedisNodes, key: str, value: str) -> list[int]:
    """How many holds each node counts for ``value`` (0: no set)."""
    return [int(c.scard(reentry_holds(key, value))) for c in _clients(cluster)]


def _values(cluster: RedisNodes, key: str) -> list[Any]:
    return [c.get(key) for c in _clients(cluster)]


def _settled_holds(cluster: RedisNodes, key: str, value: str, expected: list[int]) -> None:
    """Wait until the nodes count ``expected`` holds: a round returns at quorum."""
    settles(lambda: _holds(cluster, key, value), expected, f"the holds of {key!r} on every node")


def _settled_values(cluster: RedisNodes, key: str, expected: list[Any]) -> None:
    settles(lambda: _values(cluster, key), expected, f"{key!r} on every node")


def _in_thread(redlock: Redlock, key: str) -> Any:
    """An acquire from another thread (another execution) of the same Redlock."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(redlock.acquire(key, blocking=False)))
    thread.start()
    thread.join(30)
    return out[0]


def test_reentrant_acquires_count_holds_on_the_nodes_and_the_last_release_frees(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("report")
    assert outer is not None
    inner = redlock.acquire("report", reentrant=True)
    innermost = redlock.acquire("report", reentrant=True)
    assert inner is not None and innermost is not None
    assert inner.value == innermost.value == outer.value
    _settled_holds(redis_nodes, "report", outer.value, [3] * 5)
    assert innermost.release() is True
    _settled_holds(redis_nodes, "report", outer.value, [2] * 5)
    assert _values(redis_nodes, "report") == [outer.value.encode()] * 5
    assert _in_thread(redlock, "report") is None  # still held: another thread contends
    assert inner.release() is True
    _settled_holds(redis_nodes, "report", outer.value, [1] * 5)
    assert _in_thread(redlock, "report") is None
    assert outer.release() is True
    _settled_values(redis_nodes, "report", [None] * 5)
    _settled_holds(redis_nodes, "report", outer.value, [0] * 5)
    assert _in_thread(redlock, "report") is not None


def test_holds_may_be_released_in_any_order(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("order")
    assert outer is not None
    inner = redlock.acquire("order", reentrant=True)
    assert inner is not None
    _settled_holds(redis_nodes, "order", outer.value, [2] * 5)
    assert outer.release() is True  # the first hold goes first: the key stays
    _settled_holds(redis_nodes, "order", outer.value, [1] * 5)
    assert _values(redis_nodes, "order") == [outer.value.encode()] * 5
    assert _lock(redis_nodes).acquire("order", blocking=False) is None  # another client
    assert inner.release() is True
    _settled_values(redis_nodes, "order", [None] * 5)


def test_without_reentrant_a_held_key_raises_already_held_at_once(
    redis_nodes: RedisNodes,
) -> None:
    def no_waiting(seconds: float) -> None:
        raise AssertionError(f"waited {seconds}s for its own lock")

    redlock = Redlock(redis_nodes.urls, ttl=KEY_TTL, node_timeout=NODE_TIMEOUT, sleep=no_waiting)
    lease = redlock.acquire("mine")
    assert lease is not None
    calls: list[Callable[[], object]] = [
        lambda: redlock.acquire("mine", timeout=60),
        lambda: redlock.try_acquire("mine"),
        lambda: redlock.lock("mine").__enter__(),
    ]
    for call in calls:
        with pytest.raises(AlreadyHeld, match="already held by this execution") as caught:
            call()
        assert caught.value.key == "mine"
    assert lease.release() is True
    again = redlock.acquire("mine", blocking=False)  # released: not held any more
    assert again is not None and again.release()


def test_reentrant_must_be_a_flag(redis_nodes: RedisNodes) -> None:
    with pytest.raises(ConfigurationError, match="reentrant must be True or False"):
        _lock(redis_nodes).acquire("flag", reentrant="yes")  # type: ignore[arg-type]


def test_reentrant_first_acquire_is_a_plain_one(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    with redlock.lock("first", reentrant=True) as lease:
        assert _holds(redis_nodes, "first", lease.value) == [0] * 5  # no set until re-entered
        with redlock.lock("first", reentrant=True) as inner:
            assert inner.value == lease.value
            _settled_holds(redis_nodes, "first", lease.value, [2] * 5)
        _settled_holds(redis_nodes, "first", lease.value, [1] * 5)  # the first hold
        assert _values(redis_nodes, "first") == [lease.value.encode()] * 5
    _settled_values(redis_nodes, "first", [None] * 5)


def test_a_hold_never_shortens_the_key_and_extend_keeps_the_count(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("long", ttl=KEY_TTL)
    assert outer is not None
    inner = redlock.acquire("long", ttl=2, reentrant=True)
    assert inner is not None
    _settled_holds(redis_nodes, "long", outer.value, [2] * 5)  # every node took both
    assert inner.deadline <= outer.deadline
    assert inner.extend(ttl=2)
    # The outer hold's 30 s still stand on every node (pttl in ms).
    assert all(c.pttl("long") > 2000 for c in _clients(redis_nodes))
    assert outer.extend()
    assert _holds(redis_nodes, "long", outer.value) == [2] * 5
    assert all(c.pttl("long") > 2000 for c in _clients(redis_nodes))
    assert inner.release() and outer.release()


def test_extend_value_of_a_re_entered_key_never_shortens_it_and_renews_its_holds(
    redis_nodes: RedisNodes,
) -> None:
    # A process handed the value knows nothing of its holds: its extension must still
    # keep the holds set with the key (or the count expires first) and never cut the
    # expiry another hold counts on.
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("handed", ttl=KEY_TTL)
    assert outer is not None
    inner = redlock.acquire("handed", ttl=KEY_TTL, reentrant=True)
    assert inner is not None
    _settled_holds(redis_nodes, "handed", outer.value, [2] * 5)
    elsewhere = _lock(redis_nodes)
    assert elsewhere.extend_value("handed", outer.value, ttl=2) is True
    assert all(c.pttl("handed") > 2000 for c in _clients(redis_nodes))  # not shortened
    assert elsewhere.extend_value("handed", outer.value, ttl=3 * KEY_TTL) is True
    holds = reentry_holds("handed", outer.value)
    longer = int(2 * KEY_TTL * 1000)
    settles(
        lambda: [
            c.pttl("handed") > longer and c.pttl(holds) > longer for c in _clients(redis_nodes)
        ],
        [True] * 5,
        "the key and its holds renewed together on every node",
    )
    assert inner.release() is True and outer.release() is True
    _settled_values(redis_nodes, "handed", [None] * 5)


def test_another_process_is_excluded_until_the_count_reaches_zero(
    redis_nodes: RedisNodes,
) -> None:
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("proc")
    inner = redlock.acquire("proc", reentrant=True)
    assert outer is not None and inner is not None
    ctx = multiprocessing.get_context("fork")

    def child_tries() -> bool:
        queue: Any = ctx.Queue()
        child = ctx.Process(target=_child_acquires, args=(redlock, "proc", queue))
        child.start()
        won: bool = queue.get(timeout=30)
        child.join(10)
        return won

    assert child_tries() is False  # the forked child is not this execution
    assert outer.release() is True
    assert child_tries() is False  # one hold left
    assert inner.release() is True
    assert child_tries() is True


def _child_acquires(redlock: Redlock, key: str, queue: Any) -> None:
    lease = redlock.acquire(key, blocking=False)
    queue.put(lease is not None)
    if lease is not None:
        lease.release()


def test_reentrant_acquire_needs_a_quorum(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("quorum")
    assert outer is not None
    _settled_values(redis_nodes, "quorum", [outer.value.encode()] * 5)  # before any stops
    redis_nodes[0].stop()
    redis_nodes[1].stop()
    inner = redlock.acquire("quorum", reentrant=True)  # 3 of 5 answer: a quorum
    assert inner is not None
    assert _holds(redis_nodes[2:], "quorum", outer.value) == [2] * 3  # type: ignore[arg-type]
    redis_nodes[2].stop()
    with pytest.raises(QuorumUnavailable):
        redlock.acquire("quorum", reentrant=True)
    assert _values(redis_nodes[3:], "quorum") == [outer.value.encode()] * 2  # type: ignore[arg-type]


def test_a_fenced_hold_shares_the_first_hold_fence(redis_nodes: RedisNodes) -> None:
    redlock = _lock(redis_nodes, fencing=True)
    outer = redlock.acquire("fenced")
    assert outer is not None and outer.fence is not None
    inner = redlock.acquire("fenced", reentrant=True)
    assert inner is not None and inner.fence == outer.fence
    assert inner.release() and outer.release()
    later = _lock(redis_nodes, fencing=True).acquire("fenced")
    assert later is not None and later.fence is not None and later.fence > outer.fence


# -- in a Celery task: the execution is the task run ------------------------------------


@pytest.fixture
def app(redis_server_factory: Any, redis_nodes: RedisNodes) -> Celery:
    broker: RedisServer = redis_server_factory()
    app = Celery("reentry", broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.redlock_nodes = redis_nodes.urls
    return app


def test_a_task_body_re_acquires_its_own_key(app: Celery, redis_nodes: RedisNodes) -> None:
    def body(self: RedlockTask, n: int) -> list[Any]:
        options = self.redlock_options()
        redlock = app_config(self.app).redlock(options.node_timeout, options.fencing)
        lease = self.redlock
        assert lease is not None
        seen: list[Any] = []
        try:
            redlock.acquire(lease.key)
        except AlreadyHeld as exc:
            seen.append(type(exc).__name__)
        with redlock.lock(lease.key, reentrant=True) as inner:
            seen.append(inner.value == lease.value)
            _settled_holds(redis_nodes, lease.key, lease.value, [2] * 5)
            seen.append("two holds everywhere")
        # Our inner hold is gone; the task's own lease still holds the key.
        _settled_holds(redis_nodes, lease.key, lease.value, [1] * 5)  # the first hold
        _settled_values(redis_nodes, lease.key, [lease.value.encode()] * 5)
        seen.append("the task's key everywhere")
        return seen

    job: Any = app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="job:{n}", name="r.job"
    )(body)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        result = job.delay(1).get(timeout=30)
    assert result == ["AlreadyHeld", True, "two holds everywhere", "the task's key everywhere"]
    _settled_values(redis_nodes, job.lock_key((1,), {}), [None] * 5)  # the run released it


def test_the_watchdog_renews_a_reentered_lease_with_its_holds(redis_nodes: RedisNodes) -> None:
    # The watchdog renews plain leases in batches (EXTEND_MANY, key only); a
    # re-entered lease must have its holds set renewed with its key, or the count
    # would expire first. Observed on the nodes, past several TTLs.
    redlock = Redlock(redis_nodes.urls, ttl=1.0, node_timeout=NODE_TIMEOUT)
    with redlock.lock("renewed", auto_extend=True) as outer:
        inner = redlock.acquire("renewed", reentrant=True)
        assert inner is not None
        extended = threading.Event()
        outer.on_extended(lambda _: extended.set() if outer.extensions >= 6 else None)
        assert extended.wait(30), "the watchdog never renewed the lease six times"
        # Six TTLs on, the lease is held: a majority renewed key and holds together (a
        # straggler node may have missed a renewal on a loaded machine, and let both go).
        holds = reentry_holds("renewed", outer.value)
        kept = [
            (c.get("renewed"), c.scard(holds), c.pttl(holds) > 0) for c in _clients(redis_nodes)
        ]
        renewed = kept.count((outer.value.encode(), 2, True))
        assert renewed >= 3, kept
        assert inner.release() is True
    _settled_values(redis_nodes, "renewed", [None] * 5)


def test_the_undo_of_a_hold_a_node_never_counted_leaves_the_outer_key(
    redis_nodes: RedisNodes,
) -> None:
    # A re-acquire that failed or was cancelled sends RELEASE_HOLD for its nonce to
    # every node, also where its REENTER never landed (no holds set there): that
    # must not delete the outer hold's key. The first hold's release still does.
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("undo")
    assert outer is not None
    _settled_values(redis_nodes, "undo", [outer.value.encode()] * 5)
    server = redis_nodes[0].client()
    args = ["undo", reentry_holds("undo", outer.value), "undo\x00tomb", "undo\x00hold-tomb"]
    release_hold = scripts.RELEASE_HOLD.source
    assert server.eval(release_hold, 4, *args, outer.value, "never-counted", 1000) == 1
    assert _values(redis_nodes, "undo") == [outer.value.encode()] * 5
    assert server.eval(release_hold, 4, *args, outer.value, FIRST_HOLD, 1000) == 1
    assert server.get("undo") is None  # the only hold on that node: the key goes
    assert outer.release() is True
    _settled_values(redis_nodes, "undo", [None] * 5)


def test_a_late_reenter_after_its_own_release_is_refused(redis_nodes: RedisNodes) -> None:
    # A re-acquire's round stops at a quorum: its REENTER to a slow node may still be
    # on the way when the hold is released (or the failed round undone) on another
    # connection. Played on one node in that order, the late REENTER must add no hold
    # -- nobody would release it, and the key would outlive the last release.
    redlock = _lock(redis_nodes)
    outer = redlock.acquire("late")
    assert outer is not None
    _settled_values(redis_nodes, "late", [outer.value.encode()] * 5)
    server = redis_nodes[0].client()
    hold = "late-hold"
    release = release_command("late", outer.value, KEY_TTL, hold)
    assert server.eval(*release.eval_args()) == 1
    reply = server.eval(*reenter_command("late", outer.value, hold, KEY_TTL).eval_args())
    assert not is_reentered(reply), reply
    assert server.scard(reentry_holds("late", outer.value)) == 0
    assert outer.release() is True
    _settled_values(redis_nodes, "late", [None] * 5)  # node 0 too, long before its TTL


def test_an_eager_task_applied_inside_a_body_gives_the_run_back_its_execution(
    app: Celery, redis_nodes: RedisNodes
) -> None:
    def echo(n: int) -> int:
        return n

    inner: Any = app.task(shared=False, base=RedlockTask, redlock_key="inner:{n}", name="r.inner")(
        echo
    )

    def body(self: RedlockTask, n: int) -> bool:
        options = self.redlock_options()
        redlock = app_config(self.app).redlock(options.node_timeout, options.fencing)
        lease = self.redlock
        assert lease is not None
        assert inner.apply((n,)).get() == n  # its own run, then ours again
        # A blocking re-entry: a node slow to answer within node_timeout is retried.
        again = redlock.acquire(lease.key, reentrant=True, timeout=SETTLES_WITHIN)
        return again is not None and again.release() is True

    outer: Any = app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="outer:{n}", name="r.outer"
    )(body)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert outer.delay(1).get(timeout=30) is True


def test_a_later_thread_never_inherits_an_ended_threads_leases(
    redis_nodes: RedisNodes,
) -> None:
    """Thread idents are reused as soon as a thread ends. A thread that took a lease
    and ended (handing the lease to another thread, or leaving it to expire) must not
    make the next thread its owner: that one contends (None), neither ``AlreadyHeld``
    nor -- with ``reentrant=True`` -- a second hold beside the lease's holder."""
    redlock = _lock(redis_nodes)
    handed: list[Any] = []
    idents: set[int] = set()

    def take() -> None:
        idents.add(threading.get_ident())
        handed.append(redlock.acquire("handed", blocking=False))

    first = threading.Thread(target=take)
    first.start()
    first.join(30)
    (lease,) = handed
    assert lease is not None  # now held by this (another) thread of ours
    reused = 0
    for _ in range(20):  # later threads: most get the ended thread's ident back
        out: list[Any] = []

        def again(out: list[Any] = out) -> None:
            out.append(threading.get_ident() in idents)
            out.append(redlock.acquire("handed", blocking=False, reentrant=True))

        thread = threading.Thread(target=again)
        thread.start()
        thread.join(30)
        same_ident, got = out
        reused += same_ident
        assert got is None  # contended: the lease is not theirs
    assert set(_holds(redis_nodes, "handed", lease.value)) == {0}  # no hold was counted
    assert lease.release() is True
    print(f"{reused} of 20 later threads had the first thread's ident")
