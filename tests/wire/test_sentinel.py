"""Sentinel-managed lock nodes: ``sentinel://...?master_name=`` against real Sentinels.

One group (a master with a password, one replica, three Sentinels with their own
password) serves the module; the failover test moves its master, so every test asks
the group where the master is now. Where a lock key lives is checked on the data
servers themselves (their own clients), never by the lock's word.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from celery.contrib.testing.worker import start_worker
from celery.exceptions import ImproperlyConfigured
from click.testing import CliRunner

from celery_redlock import QuorumUnavailable, Redlock, RedlockTask
from celery_redlock.cli import judge_node, redlock
from celery_redlock.cli.checks import WARNING, check_sentinel
from celery_redlock.cli.facts import NodeFacts
from celery_redlock.errors import ConfigurationError
from celery_redlock.lock.stored import LIMIT, RATE, permit_slot
from celery_redlock.tasks.config import app_config
from celery_redlock.testing import RedisSentinelGroup, RedisServer
from celery_redlock.wire.node import Node, redact
from tests.support.appfixture import recording

MASTER_PASSWORD = "master-secret"
SENTINEL_PASSWORD = "sentinel-secret"


@pytest.fixture(scope="module")
def group() -> Iterator[RedisSentinelGroup]:
    with RedisSentinelGroup(
        replicas=1, sentinels=3, password=MASTER_PASSWORD, sentinel_password=SENTINEL_PASSWORD
    ) as started:
        yield started


def holds(server: RedisServer, key: str) -> bool:
    """Whether ``server`` itself has ``key`` (an observer apart from the lock)."""
    return bool(server.client().exists(key))


def conf_app(**settings: Any) -> Celery:
    app = Celery("sentinel_tests", broker="memory://", set_as_current=False)
    app.conf.update(settings)
    return app


# -- the URL and the settings, no servers --------------------------------------------------


def test_a_sentinel_url_without_master_name_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"nodes\[0\].*names no master.*master_name="):
        Redlock(["sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380"])


def test_a_sentinel_url_with_an_unknown_option_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option 'service'.*master_name"):
        Redlock(["sentinel://127.0.0.1:26379?service=x"])
    with pytest.raises(ConfigurationError, match=r"every part between ';'"):
        Redlock(["sentinel://127.0.0.1:26379;redis://127.0.0.1:6379?master_name=m"])
    with pytest.raises(ConfigurationError, match=r"the db must be a number"):
        Redlock(["sentinel://127.0.0.1:26379/zero?master_name=m"])


def test_the_url_reads_as_kombu_does_master_credentials_first_sentinel_password_in_query() -> None:
    node = Node("sentinel://u:p%40ss@h1;sentinel://h2:26380/3?master_name=m&sentinel_password=s")
    assert node.sentinel is not None
    assert node.sentinel.sentinels == (("h1", 26379), ("h2", 26380))
    assert (node.sentinel.username, node.sentinel.password, node.sentinel.db) == ("u", "p@ss", 3)
    assert node.sentinel.sentinel_password == "s"
    assert node.address == "sentinel:m@h1:26379,h2:26380/3"
    shown = redact("sentinel://u:pw@h1?master_name=m&sentinel_password=s")
    assert "pw" not in shown and "=s" not in shown


def test_the_same_sentinel_master_listed_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock(
            [
                "sentinel://h1;sentinel://h2?master_name=m",
                "sentinel://h2;sentinel://h1?master_name=m",
            ]
        )


def test_a_sentinel_broker_without_master_name_is_refused_naming_the_setting() -> None:
    app = conf_app(broker_url="sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380")
    with pytest.raises(ConfigurationError, match=r'broker_transport_options\["master_name"\]'):
        app_config(app)


def test_a_sentinel_broker_gives_the_default_node_with_kombus_options() -> None:
    app = conf_app(
        broker_url="sentinel://:pw@127.0.0.1:26379/0;sentinel://127.0.0.1:26380/0",
        broker_transport_options={
            "master_name": "mymaster",
            "sentinel_kwargs": {"password": "s&t"},
        },
    )
    (url,) = app_config(app).nodes
    assert url == (
        "sentinel://:pw@127.0.0.1:26379/0;sentinel://127.0.0.1:26380/0"
        "?master_name=mymaster&sentinel_password=s%26t"
    )
    node = Node(url)
    assert node.sentinel is not None and node.sentinel.sentinel_password == "s&t"
    assert node.sentinel.password == "pw"


def test_doctor_warns_that_a_failover_can_lose_a_held_lock() -> None:
    config = app_config(conf_app(redlock_nodes=["redis://127.0.0.1:1/0"]))
    facts = NodeFacts("sentinel:m@h:26379/0", reachable=True, role="master")
    assert "sentinel" not in [c.name for c in judge_node(facts, config)]
    facts.sentinel_master, facts.master_address = "m", "10.0.0.5:6379"
    check = check_sentinel(facts, config)
    assert check.status == WARNING
    assert "master 'm', now at 10.0.0.5:6379" in check.message
    assert "can lose a held lock" in check.message
    assert check.advice is not None and "independent masters" in check.advice
    assert "redlock_ttl is 30 s" in check.advice
    assert [c.name for c in judge_node(facts, config)][-1] == "sentinel"


# -- real Sentinels ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_lock_through_sentinels_lives_on_the_master_and_is_released(
    group: RedisSentinelGroup,
) -> None:
    lock = Redlock([group.url], node_timeout=0.5)
    lease = lock.acquire("sentinel:plain", ttl=10, blocking=False)
    assert lease is not None
    assert holds(group.master, "sentinel:plain")
    other = Redlock([group.url], node_timeout=0.5)  # another holder
    assert other.acquire("sentinel:plain", ttl=10, blocking=False) is None
    lease.release()
    assert not holds(group.master, "sentinel:plain")


@pytest.mark.slow
def test_permits_and_a_rate_through_sentinels_live_on_the_master(
    group: RedisSentinelGroup,
) -> None:
    lock = Redlock([group.url], node_timeout=0.5)
    first = lock.acquire("sentinel:limit", ttl=10, limit=2, blocking=False)
    second = lock.acquire("sentinel:limit", ttl=10, limit=2, blocking=False)
    assert first is not None and second is not None
    assert lock.acquire("sentinel:limit", ttl=10, limit=2, blocking=False) is None
    slots = [permit_slot("sentinel:limit", LIMIT, i) for i in range(2)]
    assert [holds(group.master, slot) for slot in slots] == [True, True]
    first.release()
    assert sum(holds(group.master, slot) for slot in slots) == 1
    third = lock.acquire("sentinel:limit", ttl=10, limit=2, blocking=False)
    assert third is not None
    for lease in (second, third):
        lease.release()
    assert not any(holds(group.master, slot) for slot in slots)
    assert [lock.admit("sentinel:rate", "2/10s") for _ in range(2)] == [0.0, 0.0]
    assert lock.admit("sentinel:rate", "2/10s") > 0  # the window is full: the wait
    rate_slots = [permit_slot("sentinel:rate", RATE, i) for i in range(2)]
    assert [holds(group.master, slot) for slot in rate_slots] == [True, True]


@pytest.mark.slow
def test_hung_sentinels_cost_their_own_node_not_the_others(group: RedisSentinelGroup) -> None:
    # A Sentinel-managed node whose Sentinels all hang, beside two plain masters: the
    # plain ones are written first and the lookup gets only what is left, so the
    # quorum of 2 of 3 is still won (checked on the plain masters themselves).
    with RedisServer() as b, RedisServer() as c:
        for sentinel in group.sentinels:
            sentinel.pause()
        try:
            redlock = Redlock([group.url, b.url, c.url], node_timeout=0.3)
            for attempt in range(3):  # every round, not only the first
                lease = redlock.acquire(f"sentinel:mixed:{attempt}", ttl=10, blocking=False)
                assert lease is not None
                assert holds(b, lease.key) and holds(c, lease.key)
                assert lease.release() is True
        finally:
            for sentinel in group.sentinels:
                if sentinel.paused:
                    sentinel.resume()


@pytest.mark.slow
def test_an_unknown_master_name_fails_the_node_saying_so(group: RedisSentinelGroup) -> None:
    url = group.url.replace("master_name=mymaster", "master_name=nosuch")
    lock = Redlock([url], node_timeout=0.5)
    with pytest.raises(QuorumUnavailable, match="knows no master named 'nosuch'"):
        lock.acquire("sentinel:unknown", ttl=10, blocking=False)


@pytest.mark.slow
def test_a_wrong_sentinel_password_fails_the_node_saying_so(group: RedisSentinelGroup) -> None:
    url = group.url.replace(SENTINEL_PASSWORD, "wrong")
    with pytest.raises(QuorumUnavailable, match="no Sentinel gave the master's address"):
        Redlock([url], node_timeout=0.5).acquire("sentinel:auth", ttl=10, blocking=False)


@pytest.mark.slow
def test_hung_sentinels_cost_the_round_its_deadline_not_a_hang(group: RedisSentinelGroup) -> None:
    group.sentinels[0].pause()
    try:
        # One Sentinel hung: the others answer, the lock is won.
        lease = Redlock([group.url], node_timeout=0.5).acquire(
            "sentinel:hung", ttl=10, blocking=False
        )
        assert lease is not None and holds(group.master, "sentinel:hung")
        lease.release()
        for sentinel in group.sentinels[1:]:
            sentinel.pause()
        # All hung: the round ends at its deadline with what each Sentinel did.
        with pytest.raises(QuorumUnavailable, match="no answer within"):
            Redlock([group.url], node_timeout=0.2).acquire("sentinel:hung", ttl=10, blocking=False)
    finally:
        for sentinel in group.sentinels:
            if sentinel.paused:
                sentinel.resume()


@pytest.mark.slow
def test_doctor_ls_and_show_take_a_sentinel_url(group: RedisSentinelGroup) -> None:
    # Its round includes asking a Sentinel for the master: a deadline no loaded
    # machine misses, not the default 50 ms.
    lease = Redlock([group.url], node_timeout=0.5).acquire(
        "redlock:sentinel:cli", ttl=30, blocking=False
    )
    assert lease is not None
    try:
        app = conf_app(redlock_nodes=[group.url])
        obj = CLIContext(app=app, no_color=True, workdir=None)
        runner = CliRunner()
        result = runner.invoke(redlock, ["doctor", "--json"], obj=obj, catch_exceptions=False)
        report = json.loads(result.stdout)
        (node,) = report["nodes"]
        checks = {c["check"]: c for c in node["checks"]}
        assert checks["reachable"]["status"] == "OK"
        assert checks["permissions"]["status"] == "OK"
        assert checks["sentinel"]["status"] == "WARNING"
        assert f"now at 127.0.0.1:{group.master.port}" in checks["sentinel"]["message"]
        assert node["sentinel_master"] == "mymaster"
        assert SENTINEL_PASSWORD not in result.stdout and MASTER_PASSWORD not in result.stdout
        listed = runner.invoke(redlock, ["ls"], obj=obj, catch_exceptions=False)
        assert "sentinel:cli" in listed.output
        shown = runner.invoke(redlock, ["show", "sentinel:cli"], obj=obj, catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
    finally:
        lease.release()


@pytest.mark.slow
def test_after_a_failover_the_next_acquire_goes_to_the_new_master(
    group: RedisSentinelGroup,
) -> None:
    lock = Redlock([group.url], node_timeout=0.5, retry_delay=0.05)
    before = lock.acquire("sentinel:before", ttl=30, blocking=False)
    assert before is not None
    old = group.master
    assert holds(old, "sentinel:before")
    new = group.failover()
    assert new is not old
    assert old.info("replication")["role"] == "slave"
    # The pooled connection still goes to the old master, now a replica: it answers
    # READONLY, the node asks the Sentinels again, and the retry lands on the new one.
    lease = lock.acquire("sentinel:after", ttl=30)
    assert lease is not None
    assert holds(new, "sentinel:after")
    lease.release()
    assert not holds(new, "sentinel:after")
    # Later rounds go straight to the new master.
    again = lock.acquire("sentinel:again", ttl=30, blocking=False)
    assert again is not None and holds(new, "sentinel:again")
    again.release()
    before.release()


@pytest.mark.slow
def test_a_worker_on_a_sentinel_broker_locks_on_its_master_by_default(
    group: RedisSentinelGroup,
) -> None:
    app = Celery("sentinel_worker", set_as_current=False)
    app.conf.update(
        broker_url=group.broker_url,
        broker_transport_options=group.transport_options,
        broker_connection_retry_on_startup=True,
        task_create_missing_queues=True,
        # The task's acquire is one round (its Sentinel is asked for the master
        # first): a deadline no loaded machine misses, not the default 50 ms.
        redlock_node_timeout=0.5,
    )
    assert app_config(app).nodes == (group.url,)
    running = threading.Event()
    finish = threading.Event()
    seen: dict[str, Any] = {}

    @app.task(  # type: ignore[untyped-decorator]
        base=RedlockTask, bind=True, shared=False, redlock_key="sentinel-worker", redlock_ttl=30
    )
    def guarded(self: Any) -> None:
        seen["key"] = self.redlock.key
        seen["held"] = holds(group.master, self.redlock.key)
        running.set()
        assert finish.wait(30)

    try:
        with (
            recording() as rec,
            start_worker(app, pool="threads", concurrency=1, perform_ping_check=False),
        ):
            result = guarded.delay()
            assert running.wait(30), "the task never ran"
            finish.set()
            rec.wait_for("lock_released", result.id, timeout=30)
    except ImproperlyConfigured:  # pragma: no cover - kombu without Sentinel support
        pytest.fail("kombu could not use the Sentinel broker")
    assert seen["held"] is True
    assert not holds(group.master, seen["key"])


@pytest.mark.slow
def test_a_hung_master_is_left_for_the_one_the_sentinels_promote() -> None:
    """SIGSTOP, not a refused connection: the old master's port still accepts, and
    nothing answers. A round that its node does not answer asks the Sentinels
    again, so once they have promoted the replica, the lock follows (until then
    every attempt is QuorumUnavailable: the only node is hung)."""
    with RedisSentinelGroup(
        replicas=1, sentinels=1, down_after_ms=500, failover_timeout_ms=1000
    ) as hung_group:
        lock = Redlock([hung_group.url], ttl=5, node_timeout=0.2)
        first = lock.acquire("hung:before", blocking=False)
        assert first is not None
        first.release()
        old = hung_group.master
        old.pause()
        try:
            deadline = time.monotonic() + 60
            moved = None
            while moved is None or moved[1] == old.port:  # the Sentinel's own word
                assert time.monotonic() < deadline, "the Sentinel never failed over"
                moved = hung_group.sentinels[0].master_address()
                time.sleep(0.05)
            won = None
            for attempt in range(100):  # each attempt asks the Sentinels once more
                with contextlib.suppress(QuorumUnavailable):
                    won = lock.acquire(f"hung:after:{attempt}", blocking=False)
                if won is not None:
                    break
            assert won is not None, "100 attempts after the failover, still the old master"
            assert holds(hung_group.master, won.key) and hung_group.master is not old
            won.release()
        finally:
            old.resume()


@pytest.mark.slow
def test_a_sentinel_naming_the_master_just_left_is_heard_last() -> None:
    """A lagging or partitioned Sentinel may still name the demoted master. After a
    READONLY (or a silent round) the node asks again avoiding that address: the
    answer of a Sentinel naming another master wins, whoever answers first; the
    avoided address is taken only when every Sentinel names it. Two groups under one
    master name play a current and a stale Sentinel."""
    from celery_redlock.wire.sentinel import discover, parse_sentinel_url

    with (
        RedisSentinelGroup(replicas=1, sentinels=1) as one,
        RedisSentinelGroup(replicas=1, sentinels=1) as other,
    ):
        a, b = ("127.0.0.1", one.master.port), ("127.0.0.1", other.master.port)
        both = parse_sentinel_url(f"{one.broker_url};{other.broker_url}?master_name=mymaster")
        for _ in range(5):  # whichever Sentinel answers first
            assert discover(both, 2.0, avoid=a) == b
            assert discover(both, 2.0, avoid=b) == a
        alone = parse_sentinel_url(one.url)
        assert discover(alone, 2.0, avoid=a) == a  # every Sentinel names it: taken
