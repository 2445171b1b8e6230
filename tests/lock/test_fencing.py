"""Fencing against real servers: fences rise per holder, and a paused holder's stale
write is refused by the storage (Redis and SQLite), with real SIGSTOP pauses."""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import multiprocessing
import os
import signal
import sqlite3
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import pytest

from celery_redlock import ConfigurationError, Redlock
from celery_redlock.fencing import fence_key, fenced_set, sql_fenced_update
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.observe import settles

#: The paused holder's lease: long enough that its fenced acquire (two rounds) fits
#: with room to spare on a loaded machine, short enough for 20 pauses past it.
TTL = 1.0
#: For rounds that must succeed: a deadline no loaded machine misses.
NODE_TIMEOUT = 0.5
#: How long the parent waits for a message from the holder (it fails, not hangs).
CHILD_REPLY_WITHIN = 30.0


def _db(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=5)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS reports (id INTEGER PRIMARY KEY, body TEXT, last_fence INTEGER)"
    )
    connection.execute("INSERT OR IGNORE INTO reports VALUES (1, '', -1)")
    connection.commit()
    return connection


def _write(store_url: str, db_path: Path, body: str, fence: int) -> tuple[bool, bool]:
    import redis

    store = redis.Redis.from_url(store_url)
    in_redis = fenced_set(store, "report", body, fence)
    connection = _db(db_path)
    in_sql = sql_fenced_update(connection, "reports", {"body": body}, {"id": 1}, fence)
    connection.close()
    return in_redis, in_sql


def _paused_holder(urls: list[str], store_url: str, db_path: Path, conn: Any) -> None:
    # SIGUSR1 writes every thread's stack next to the database: what a holder that
    # never answers was doing (see _stacks).
    faulthandler.register(signal.SIGUSR1, file=open(_stack_file(db_path), "w"))  # noqa: SIM115
    try:
        redlock = Redlock(urls, ttl=TTL, node_timeout=NODE_TIMEOUT, fencing=True)
        lease = redlock.acquire("fenced-report")
        assert lease is not None and lease.fence is not None
        conn.send(("acquired", lease.fence, _write(store_url, db_path, "A-first", lease.fence)))
        assert conn.recv() == "write"  # the parent SIGSTOPs us before it sends this
        conn.send(("stale", _write(store_url, db_path, "A-stale", lease.fence), lease.held))
    except BaseException:
        # The parent fails with what went wrong here, not with "never answered".
        conn.send(("failed", traceback.format_exc()))
        raise


def _reply(conn: Any, holder: Any, db_path: Path, awaited: str) -> tuple[Any, ...]:
    """The holder's next message; fails with its traceback if it failed instead, with
    its exit code if it died without a word, or with its stacks if it hangs."""
    assert conn.poll(CHILD_REPLY_WITHIN), (
        f"the holder never {awaited}; its stacks:\n{_stacks(db_path, holder.pid)}"
    )
    try:
        message: tuple[Any, ...] = conn.recv()
    except EOFError:  # the parent holds no copy of the child's end: EOF means it exited
        holder.join(5)
        pytest.fail(f"the holder exited (code {holder.exitcode}) before it {awaited}")
    if message[0] == "failed":
        pytest.fail(f"the holder failed before it {awaited}:\n{message[1]}")
    return message


def _stack_file(db_path: Path) -> Path:
    return db_path.with_suffix(".holder-stacks")


def _stacks(db_path: Path, pid: Optional[int]) -> str:
    """The stacks of a holder that did not answer in time (it dumps them on SIGUSR1)."""
    if pid is None:
        return "(no holder process)"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    with contextlib.suppress(OSError):
        return _stack_file(db_path).read_text()
    return "(no stacks written)"


@pytest.mark.slow
def test_paused_holders_stale_writes_are_refused_by_redis_and_sql(
    redis_nodes: RedisNodes, redis_server_factory: Any, tmp_path: Path
) -> None:
    store: RedisServer = redis_server_factory()
    db_path = tmp_path / "reports.db"
    _db(db_path).close()
    ctx = multiprocessing.get_context("fork")
    trials, stale_accepted = 20, 0
    for _ in range(trials):
        parent_end, child_end = ctx.Pipe()
        holder = ctx.Process(
            target=_paused_holder, args=(redis_nodes.urls, store.url, db_path, child_end)
        )
        holder.start()
        child_end.close()  # the child's copy only: a holder that dies reads as EOF here
        try:
            tag, f1, first = _reply(parent_end, holder, db_path, "acquired")
            assert tag == "acquired" and first == (True, True)
            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGSTOP)
            # Its validity counts from before it acquired: it has run out after TTL.
            time.sleep(TTL)
            # Its keys expire on the nodes soon after: a blocking acquire follows them.
            rival = Redlock(redis_nodes.urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
            lease = rival.acquire("fenced-report", timeout=10 * TTL)
            assert lease is not None and lease.fence is not None
            f2 = lease.fence
            assert f2 > f1
            assert _write(store.url, db_path, "B", f2) == (True, True)
            os.kill(holder.pid, signal.SIGCONT)
            parent_end.send("write")
            tag, stale, still_held = _reply(parent_end, holder, db_path, "wrote once resumed")
            assert still_held is False  # the resumed holder sees its lease lost
            stale_accepted += sum(stale)
            lease.release()
        finally:
            if holder.is_alive() and holder.pid:
                os.kill(holder.pid, signal.SIGCONT)  # never leave a stopped child behind
            holder.join(5)
        assert store.client().get("report") == b"B"
        row = _db(db_path).execute("SELECT body, last_fence FROM reports").fetchone()
        assert row == ("B", f2)
    assert stale_accepted == 0


def test_the_same_holder_may_write_again_and_a_lower_fence_may_not(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server.client()
    assert fenced_set(client, "doc", "v1", 5)
    assert fenced_set(client, "doc", "v2", 5)  # same holder, second write
    assert not fenced_set(client, "doc", "old", 4)
    assert fenced_set(client, "doc", "v3", 6)
    assert client.get("doc") == b"v3" and client.get(fence_key("doc")) == b"6"
    connection = _db(tmp_path / "x.db")
    assert sql_fenced_update(connection, "reports", {"body": "a"}, {"id": 1}, 5)
    assert sql_fenced_update(connection, "reports", {"body": "b"}, {"id": 1}, 5)
    assert not sql_fenced_update(connection, "reports", {"body": "old"}, {"id": 1}, 4)


@pytest.mark.parametrize("fence", [None, "7", 1.5, True])
def test_fenced_writes_reject_a_fence_that_is_not_an_int(
    redis_server: RedisServer, fence: Any
) -> None:
    with pytest.raises(ConfigurationError, match="fence must be an int"):
        fenced_set(redis_server.client(), "doc", "v", fence)


def test_sql_helper_rejects_names_that_are_not_identifiers(tmp_path: Path) -> None:
    connection = _db(tmp_path / "y.db")
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        sql_fenced_update(connection, "reports; DROP TABLE x", {"body": "a"}, {"id": 1}, 1)


def test_fences_rise_across_processes_and_survive_a_minority_restart_with_data(
    redis_nodes_factory: Any,
) -> None:
    cluster: RedisNodes = redis_nodes_factory(5, appendonly=True)
    redlock = Redlock(cluster.urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
    fences = []
    for i in range(30):
        if i == 10:
            cluster[0].restart(keep_data=True)
        if i == 20:
            cluster[1].kill()
            cluster[1].restart(keep_data=True)  # appendfsync always: counters kept
        lease = redlock.acquire("stream")
        assert lease is not None and lease.fence is not None
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences))


@pytest.mark.parametrize("clock_term", [True, False], ids=["with-clock-term", "control"])
def test_fences_rise_across_a_delayed_restart_without_persistence(
    redis_nodes_factory: Any, fault_proxy_factory: Any, clock_term: bool
) -> None:
    # The model checker's trace, on real servers: A's fence is recorded on exactly a
    # quorum {0, 1}; node 0 then restarts empty after a delayed restart (longer than
    # the TTL); B's quorum {0, 2} meets A's only at node 0, whose counter is gone.
    # The control runs the counter-only scheme (clock term off) and must go wrong.
    cluster: RedisNodes = redis_nodes_factory(3)
    hidden = fault_proxy_factory(cluster[2])
    hidden.blackhole()  # node 2 never sees A's acquire or fence
    a = Redlock(
        [cluster[0].url, cluster[1].url, hidden.url],
        ttl=TTL,
        node_timeout=NODE_TIMEOUT,
        fencing=True,
    )
    b = Redlock(cluster.urls, ttl=5, fencing=True, node_timeout=NODE_TIMEOUT)
    if not clock_term:
        a._rules.wall_us = b._rules.wall_us = lambda: 0
    lease_a = a.acquire("restarted", blocking=False)
    assert lease_a is not None and lease_a.fence is not None
    assert cluster[0].client().get("restarted\x00fence") is not None
    assert cluster[2].client().get("restarted\x00fence") is None
    cluster[0].kill()
    time.sleep(TTL + 0.1)  # a delayed restart: down longer than the largest TTL
    cluster[0].restart(keep_data=False)
    cluster[1].pause()  # B's quorum is {0, 2}
    try:
        lease_b = b.acquire("restarted", blocking=False)
    finally:
        cluster[1].resume()
    assert lease_b is not None and lease_b.fence is not None
    if clock_term:
        assert lease_b.fence > lease_a.fence
    else:
        assert lease_b.fence <= lease_a.fence  # counters alone lose the order here


@pytest.mark.parametrize("keys", [["counted"], ["counted:a", "counted:b"]], ids=["one", "set"])
def test_fence_counters_expire_a_week_after_their_last_fence_and_fences_still_rise(
    redis_nodes_factory: Any, keys: list[str]
) -> None:
    """One counter per distinct key ever fenced must not fill a ``noeviction`` node:
    each expires FENCE_COUNTER_TTL after the last fence recorded on it, refreshed by
    every later one. With the counters gone (expired, as after a week of silence),
    the clock term still puts the next fence above the last."""
    from celery_redlock.lock.stored import FENCE_COUNTER_TTL, fence_counter

    cluster: RedisNodes = redis_nodes_factory(3)
    redlock = Redlock(cluster.urls, ttl=5, node_timeout=NODE_TIMEOUT, fencing=True)
    clients = [server.client() for server in cluster]
    target = keys if len(keys) > 1 else keys[0]
    fences = []
    for _ in range(2):
        lease = redlock.acquire(target, blocking=False)
        assert lease is not None and lease.fence is not None
        fences.append(lease.fence)
        for client in clients:  # on every node (all three granted), for every key
            for key in keys:
                # The acquire returned at quorum: the third node's fence may follow.
                counter = functools.partial(_counter, client, fence_counter(key))
                settles(counter, lease.fence, f"{key}'s fence counter on {client}")
                pttl = client.pttl(fence_counter(key))
                assert 0 < pttl <= FENCE_COUNTER_TTL * 1000, (key, pttl)
        assert lease.release() is True
        # Released everywhere before the next acquire, which every node must grant.
        settles(lambda: sum(client.exists(*keys) for client in clients), 0, f"{keys} released")
        for client in clients:  # the counters expired
            client.delete(*[fence_counter(key) for key in keys])
    assert fences[1] > fences[0]


def _counter(client: Any, counter: str) -> int:
    return int(client.get(counter) or 0)
