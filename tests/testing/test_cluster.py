"""The test kit's Redis Cluster (``ShardedCluster``): real cluster-enabled masters
on free loopback ports, every slot served."""

from __future__ import annotations

import socket

import pytest
from redis.crc import key_slot

from celery_redlock.testing import ShardedCluster, ShardedClusterFactory
from celery_redlock.testing.ports import LOOPBACK, claim_free_port, claim_port, release_port
from celery_redlock.testing.sharded import (
    BUS_PORT_OFFSET,
    CLUSTER_SLOTS,
    claim_cluster_port,
    slot_ranges,
)


def _key_in_every_slot() -> dict[int, str]:
    """One key name per hash slot: ``{n}`` hash-tags the key to n's slot."""
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < CLUSTER_SLOTS:
        name = f"{{{n}}}k"
        keys.setdefault(key_slot(name.encode()), name)
        n += 1
    return keys


def test_a_three_master_cluster_serves_a_key_in_every_slot() -> None:
    with ShardedCluster(3) as cluster:
        assert len(cluster) == 3
        client = cluster.client()
        try:
            keys = _key_in_every_slot()
            pipe = client.pipeline()  # type: ignore[no-untyped-call]
            for slot, name in keys.items():
                pipe.set(name, slot)
            assert all(pipe.execute())
            # Each master holds exactly the keys of its own slots.
            for server, slots in zip(cluster, slot_ranges(3)):
                assert server.client().dbsize() == len(slots)
                assert server.client().get(keys[slots[0]]) == str(slots[0]).encode()
        finally:
            client.close()


def test_each_master_owns_one_third_of_the_slots_and_knows_the_others() -> None:
    with ShardedCluster(3) as cluster:
        for server in cluster:
            info = server.info("cluster")
            assert info["cluster_enabled"] == 1
        control = cluster[0].client()
        shards = control.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        owned = sorted((int(start), int(end), int(node[1])) for start, end, node, *_ in shards)
        assert owned == [
            (slots[0], slots[-1], server.port) for server, slots in zip(cluster, slot_ranges(3))
        ]
        assert all(server.port + BUS_PORT_OFFSET <= 65535 for server in cluster)


def test_slot_ranges_cover_every_slot_once() -> None:
    for masters in (1, 3, 6, 7):
        ranges = slot_ranges(masters)
        assert [slot for r in ranges for slot in r] == list(range(CLUSTER_SLOTS))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


@pytest.mark.parametrize("masters", [0, -1, 2.5, True, "3"])
def test_a_cluster_needs_a_whole_number_of_masters(masters: object) -> None:
    with pytest.raises(ValueError, match=r"ShardedCluster masters must be an int >= 1, got "):
        ShardedCluster(masters)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "value", "accepted"),
    [("replicas", -1, ">= 0"), ("replicas", 1.0, ">= 0"), ("node_timeout_ms", 0, ">= 1")],
)
def test_a_cluster_refuses_bad_replica_counts_and_node_timeouts(
    setting: str, value: object, accepted: str
) -> None:
    with pytest.raises(ValueError, match=rf"ShardedCluster {setting} must be an int {accepted}, "):
        ShardedCluster(3, **{setting: value})  # type: ignore[arg-type]


def test_each_shard_has_its_replica_in_sync_and_a_failover_loses_no_key() -> None:
    with ShardedCluster(3, replicas=1) as cluster:
        assert [len(shard) for shard in cluster.shards] == [2, 2, 2]
        first_master, replica = cluster.shards[0]
        assert cluster[0] is first_master
        assert replica.info("replication")["master_port"] == first_master.port
        client = cluster.client()
        try:
            keys = [f"{{{n}}}k" for n in range(300)]
            for name in keys:
                client.set(name, name)
            # CLUSTER FAILOVER: the replica catches up first, then takes over.
            assert cluster.failover(0) is replica
            assert cluster[0] is replica
            assert first_master.info("replication")["role"] == "slave"
            assert [client.get(name) for name in keys] == [name.encode() for name in keys]
        finally:
            client.close()


def test_a_killed_master_is_replaced_by_its_replica(
    sharded_cluster_factory: ShardedClusterFactory,
) -> None:
    cluster = sharded_cluster_factory(3, replicas=1)
    master, replica = cluster.shards[1]
    master.kill()
    # FORCE: the master cannot take part.
    assert cluster.failover(1) is replica
    assert cluster[1] is replica
    with pytest.raises(RuntimeError, match=r"shard 1 .* has no running replica to promote"):
        cluster.failover(1)


def test_a_cluster_chooses_its_servers_ports() -> None:
    with pytest.raises(ValueError, match="drop 'port'"):
        ShardedCluster(3, port=7000)


def test_a_port_is_claimed_once_and_not_while_something_listens_on_it() -> None:
    port = claim_free_port()
    try:
        assert not claim_port(port)  # ours already
    finally:
        release_port(port)
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen()
        assert not claim_port(listener.getsockname()[1])
    bus_port = claim_cluster_port() + BUS_PORT_OFFSET
    assert not claim_port(bus_port)  # claimed with its node's port
