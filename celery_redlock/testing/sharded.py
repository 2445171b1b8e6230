"""A real Redis Cluster (``cluster-enabled yes``): one keyspace whose 16384 hash slots
are shared out over several shards, each a master and its replicas.

Not :class:`~celery_redlock.testing.RedisNodes`: those are N independent masters,
the shape Redlock runs on; a :class:`ShardedCluster` is one store spread over
shards, which a client must route by slot (``MOVED``, ``ASK``). Each server is a
:class:`RedisServer` on a free loopback port whose cluster bus port (the port +
10000) is free as well. Slots are given with ``CLUSTER ADDSLOTS`` (Redis 6.2 has no
``ADDSLOTSRANGE``), the servers introduced with ``CLUSTER MEET`` and each replica
attached with ``CLUSTER REPLICATE``; the cluster is ready when every server sees
every slot served and every replica is in sync. :meth:`ShardedCluster.failover`
promotes a shard's replica (``CLUSTER FAILOVER``, ``FORCE`` when its master is
down). Imports redis-py (through :mod:`.server`) and the standard library only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union, overload

import redis
from redis.cluster import ClusterNode, RedisCluster

from .ports import LOOPBACK, claim_free_port, claim_port, release_port
from .sentinel import FAILOVER_TIMEOUT, _wait_until
from .server import START_TIMEOUT, RedisServer

__all__ = ["CLUSTER_SLOTS", "ShardedCluster", "ShardedClusterFactory", "claim_cluster_port"]

#: Hash slots of every Redis Cluster.
CLUSTER_SLOTS = 16384
#: A node's cluster bus listens on its port plus this.
BUS_PORT_OFFSET = 10000
_HIGHEST_PORT = 65535


def claim_cluster_port() -> int:
    """A free loopback port for a cluster node, its bus port (+10000) claimed with it."""
    passed: list[int] = []
    try:
        for _ in range(200):
            port = claim_free_port()
            if port + BUS_PORT_OFFSET <= _HIGHEST_PORT and claim_port(port + BUS_PORT_OFFSET):
                return port
            passed.append(port)
    finally:
        for port in passed:
            release_port(port)
    raise RuntimeError("no free loopback port whose cluster bus port (+10000) is free too")


def slot_ranges(masters: int) -> list[range]:
    """The 16384 slots in ``masters`` contiguous ranges, as even as they divide."""
    bounds = [CLUSTER_SLOTS * i // masters for i in range(masters + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(masters)]


class ShardedCluster(Sequence[RedisServer]):
    """A Redis Cluster of ``masters`` shards (default 3), each a master and
    ``replicas`` replicas, on free loopback ports, the slots shared out evenly.
    Index and iterate it like a list of the shards' current masters::

        with ShardedCluster(3, replicas=1) as cluster:
            client = cluster.client()        # a redis.cluster.RedisCluster
            client.set("k", "v")             # routed to the master owning k's slot
            cluster.failover(0)              # shard 0's replica takes over

    ``node_timeout_ms``: ``cluster-node-timeout``, how long a master may be silent
    before the others count it failed (short here, so a killed master's replica is
    promoted within seconds). ``server_kwargs`` go to every :class:`RedisServer`
    (all but ``port``).
    """

    def __init__(
        self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 1000,
        **server_kwargs: Any,
    ) -> None:  # fmt: skip
        counts = (("masters", masters, 1), ("replicas", replicas, 0))
        for name, value, least in (*counts, ("node_timeout_ms", node_timeout_ms, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"ShardedCluster {name} must be an int >= {least}, got {value!r}")
        if "port" in server_kwargs:
            raise ValueError("ShardedCluster gives every server its own free port; drop 'port'")
        extra = [*server_kwargs.pop("extra_args", ())]
        cluster_args = [
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
        ]  # fmt: skip
        self._bus_ports: list[int] = []
        self._migrating: dict[int, tuple[RedisServer, RedisServer]] = {}
        #: Each shard's servers; the first one starts as its master.
        self.shards: list[list[RedisServer]] = []
        for _ in range(masters):
            shard = []
            for _ in range(1 + replicas):
                port = claim_cluster_port()
                self._bus_ports.append(port + BUS_PORT_OFFSET)
                shard.append(
                    RedisServer(port=port, extra_args=[*cluster_args, *extra], **server_kwargs)
                )
            self.shards.append(shard)

    @overload
    def __getitem__(self, index: int) -> RedisServer: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RedisServer]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[RedisServer, Sequence[RedisServer]]:
        if isinstance(index, slice):
            return [self.master_of(shard) for shard in range(len(self))[index]]
        return self.master_of(range(len(self))[index])

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Iterator[RedisServer]:
        return (self.master_of(shard) for shard in range(len(self)))

    def __repr__(self) -> str:
        return f"<ShardedCluster of {len(self)} shards: {self.shards!r}>"

    @property
    def servers(self) -> list[RedisServer]:
        """Every server, shard by shard."""
        return [server for shard in self.shards for server in shard]

    @property
    def urls(self) -> list[str]:
        """Every server's ``redis://`` URL (each one a seed for a cluster client)."""
        return [server.url for server in self.servers]

    @property
    def lock_url(self) -> str:
        """The cluster as one lock node: ``redis+cluster://`` naming every server as a
        seed (the password, if any, on the first)."""
        password = self.servers[0].password
        auth = f":{password}@" if password else ""
        seeds = [f"redis+cluster://{LOOPBACK}:{server.port}" for server in self.servers]
        seeds[0] = seeds[0].replace("://", f"://{auth}", 1)
        return ";".join(seeds)

    def shard_of_slot(self, slot: int) -> int:
        """The shard whose master serves ``slot`` now (as that master says)."""
        for shard in range(len(self)):
            master = self.master_of(shard)
            for start, end, owner, *_ in _command(master, "CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end) and int(owner[1]) == master.port:
                    return shard
        raise RuntimeError(f"no shard of {self!r} serves slot {slot}")

    def begin_migration(self, slot: int, to_shard: int) -> None:
        """Start moving ``slot`` to ``to_shard`` (``CLUSTER SETSLOT ... IMPORTING`` /
        ``MIGRATING``): its keys stay where they are until ``end_migration``; a key
        the old master does not have is answered with ``ASK``."""
        source = self.master_of(self.shard_of_slot(slot))
        target = self.master_of(to_shard)
        if source is target:
            raise ValueError(f"slot {slot} is served by shard {to_shard} already")
        _command(
            target, "CLUSTER", "SETSLOT", slot, "IMPORTING", _command(source, "CLUSTER", "MYID")
        )
        _command(
            source, "CLUSTER", "SETSLOT", slot, "MIGRATING", _command(target, "CLUSTER", "MYID")
        )
        self._migrating[slot] = (source, target)

    def end_migration(self, slot: int) -> None:
        """Move ``slot``'s keys still on the old master (``MIGRATE``) and give the slot
        to the new one on every master (``CLUSTER SETSLOT ... NODE``)."""
        source, target = self._migrating.pop(slot)
        while True:
            keys = _command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            args = ["MIGRATE", LOOPBACK, target.port, "", 0, 5000]
            if target.password:
                args += ["AUTH", target.password]
            _command(source, *args, "KEYS", *keys)
        target_id = _command(target, "CLUSTER", "MYID")
        for server in (target, source, *[m for m in self if m not in (source, target)]):
            _command(server, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        _wait_until(self._ready, START_TIMEOUT, f"{self!r} ready after moving slot {slot}")

    def migrate_slot(self, slot: int, to_shard: int) -> None:
        """Move ``slot`` and its keys to ``to_shard`` (a resharding of one slot)."""
        self.begin_migration(slot, to_shard)
        self.end_migration(slot)

    def master_of(self, shard: int) -> RedisServer:
        """The running server of ``shard`` that says it is a master."""
        for server in self.shards[shard]:
            if server.running and server.info("replication").get("role") == "master":
                return server
        raise RuntimeError(f"shard {shard} of {self!r} has no running master")

    def client(self, **kwargs: Any) -> RedisCluster:
        """A redis-py cluster client seeded with every server; the caller closes it."""
        seeds = [
            ClusterNode(LOOPBACK, server.port)  # type: ignore[no-untyped-call]
            for server in self.servers
        ]
        password = self.servers[0].password
        return RedisCluster(startup_nodes=seeds, password=password, **kwargs)

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start every server, give each master its slots, introduce them all, attach
        the replicas and return once the cluster is ready (up to START_TIMEOUT). On
        failure every server is closed and the error raised."""
        try:
            for server in self.servers:
                server.start()
            for shard, slots in zip(self.shards, slot_ranges(len(self))):
                _command(shard[0], "CLUSTER", "ADDSLOTS", *slots)
            for server in self.servers[1:]:
                _command(self.servers[0], "CLUSTER", "MEET", LOOPBACK, server.port)
            for shard in self.shards:
                master_id = _command(shard[0], "CLUSTER", "MYID")
                for replica in shard[1:]:
                    # A replica attaches once it has heard of its master (gossip).
                    _wait_until(
                        functools.partial(_replicate, replica, master_id),
                        START_TIMEOUT,
                        f"{replica!r} replicating {shard[0]!r}",
                    )
            _wait_until(self._ready, START_TIMEOUT, f"{self!r} ready")
        except BaseException:
            self.close()
            raise

    def _ready(self) -> bool:
        """Every running server sees every slot served and every server; every
        running replica's link to its master is up."""
        running = [server for server in self.servers if server.running]
        for server in running:
            fields = _cluster_info(server)
            if fields.get("cluster_state") != "ok":
                return False
            if int(fields.get("cluster_known_nodes", 0)) != len(self.servers):
                return False
            if int(fields.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS:
                return False
            replication = server.info("replication")
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def failover(self, shard: int, timeout: float = FAILOVER_TIMEOUT) -> RedisServer:
        """Promote a running replica of ``shard`` and return it once it is the master,
        the old master (if it runs) its replica, and the cluster ready again:
        ``CLUSTER FAILOVER`` (the replica catches up with its master first: nothing
        acknowledged is lost), or ``CLUSTER FAILOVER FORCE`` when the master is down
        (what it had not replicated is lost)."""
        old = next((s for s in self.shards[shard] if s.running and _is_master(s)), None)
        replica = next(
            (s for s in self.shards[shard] if s.running and s is not old and not _is_master(s)),
            None,
        )
        if replica is None:
            raise RuntimeError(f"shard {shard} of {self!r} has no running replica to promote")
        _command(replica, "CLUSTER", "FAILOVER", *([] if old is not None else ["FORCE"]))
        _wait_until(lambda: _is_master(replica), timeout, f"{replica!r} promoted")
        if old is not None:
            _wait_until(lambda: not _is_master(old), timeout, f"{old!r} turned into a replica")
        _wait_until(self._ready, timeout, f"{self!r} ready after the failover")
        return replica

    def close(self) -> None:
        """Close every server, even if closing one fails, and free the bus ports."""
        with contextlib.ExitStack() as closing:  # calls every callback, raises after
            for bus_port in self._bus_ports:
                closing.callback(release_port, bus_port)
            for server in self.servers:
                closing.callback(server.close)

    def __enter__(self) -> ShardedCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()


#: ``make(masters=3, **ShardedCluster kwargs) -> ShardedCluster``, started (the fixture's type).
ShardedClusterFactory = Callable[..., ShardedCluster]


def _command(server: RedisServer, *args: Any) -> Any:
    reply = server._control_client().execute_command(*args)  # type: ignore[no-untyped-call]
    return reply.decode() if isinstance(reply, bytes) else reply


def _cluster_info(server: RedisServer) -> dict[str, str]:
    text = str(_command(server, "CLUSTER", "INFO"))
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _is_master(server: RedisServer) -> bool:
    return bool(server.info("replication").get("role") == "master")


def _replicate(replica: RedisServer, master_id: str) -> bool:
    try:
        _command(replica, "CLUSTER", "REPLICATE", master_id)
    except redis.ResponseError as error:
        if "Unknown node" in str(error):
            return False  # not heard of it yet
        raise
    return True
