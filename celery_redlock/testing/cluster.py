"""A real Redis Cluster (``cluster-enabled yes``): one keyspace whose 16384 hash slots
are shared out over several masters.

Not :class:`~celery_redlock.testing.RedisNodes`: those are N independent masters,
the shape Redlock runs on; a :class:`ShardedCluster` is one store spread over
shards, which a client must route by slot (``MOVED``, ``ASK``). Each master is a
:class:`RedisServer` on a free loopback port whose cluster bus port (the port +
10000) is free as well. Slots are given with ``CLUSTER ADDSLOTS`` (Redis 6.2 has no
``ADDSLOTSRANGE``) and the masters introduced with ``CLUSTER MEET``; the cluster is
ready when every master sees every slot served. Imports redis-py (through
:mod:`.server`) and the standard library only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Optional, Union, overload

from redis.cluster import ClusterNode, RedisCluster

from .ports import LOOPBACK, claim_free_port, claim_port, release_port
from .server import START_TIMEOUT, RedisServer

__all__ = ["CLUSTER_SLOTS", "ShardedCluster", "claim_cluster_port"]

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
    """A Redis Cluster of ``masters`` masters (default 3) on free loopback ports,
    the slots shared out evenly. Index and iterate it like a list of its masters::

        with ShardedCluster(3) as cluster:
            client = cluster.client()        # a redis.cluster.RedisCluster
            client.set("k", "v")             # routed to the master owning k's slot

    ``server_kwargs`` go to every :class:`RedisServer` (all but ``port``).
    """

    def __init__(self, masters: int = 3, **server_kwargs: Any) -> None:
        if isinstance(masters, bool) or not isinstance(masters, int) or masters < 1:
            raise ValueError(f"ShardedCluster masters must be an int >= 1, got {masters!r}")
        if "port" in server_kwargs:
            raise ValueError("ShardedCluster gives every master its own free port; drop 'port'")
        extra = [*server_kwargs.pop("extra_args", ())]
        self._bus_ports: list[int] = []
        self._servers: list[RedisServer] = []
        for _ in range(masters):
            port = claim_cluster_port()
            self._bus_ports.append(port + BUS_PORT_OFFSET)
            cluster_args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            self._servers.append(
                RedisServer(port=port, extra_args=[*cluster_args, *extra], **server_kwargs)
            )

    @overload
    def __getitem__(self, index: int) -> RedisServer: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RedisServer]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[RedisServer, Sequence[RedisServer]]:
        return self._servers[index]

    def __len__(self) -> int:
        return len(self._servers)

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self._servers)

    def __repr__(self) -> str:
        return f"<ShardedCluster of {len(self)} masters: {self._servers!r}>"

    @property
    def urls(self) -> list[str]:
        """Every master's ``redis://`` URL (each one a seed for a cluster client)."""
        return [server.url for server in self._servers]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A redis-py cluster client seeded with every master; the caller closes it."""
        seeds = [
            ClusterNode(LOOPBACK, server.port)  # type: ignore[no-untyped-call]
            for server in self._servers
        ]
        password = self._servers[0].password
        return RedisCluster(startup_nodes=seeds, password=password, **kwargs)

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start every master, give each its slots, introduce them to each other and
        return once every master sees all 16384 slots served (up to START_TIMEOUT).
        On failure every master is closed and the error raised."""
        try:
            for server in self._servers:
                server.start()
            for server, slots in zip(self._servers, slot_ranges(len(self))):
                server._control_client().execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER", "ADDSLOTS", *slots
                )
            first = self._servers[0]._control_client()
            for server in self._servers[1:]:
                first.execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER", "MEET", LOOPBACK, server.port
                )
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    def _ready(self) -> bool:
        for server in self._servers:
            info = server._control_client().execute_command(  # type: ignore[no-untyped-call]
                "CLUSTER", "INFO"
            )
            text = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
            if fields.get("cluster_state") != "ok":
                return False
            if int(fields.get("cluster_known_nodes", 0)) != len(self):
                return False
            if int(fields.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS:
                return False
        return True

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pause = 0.01
        while not self._ready():
            if time.monotonic() > deadline:
                states = [server.info("cluster") for server in self._servers]
                raise RuntimeError(
                    f"{self!r}: cluster not ready within {START_TIMEOUT:g} s ({states})"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def close(self) -> None:
        """Close every master, even if closing one fails, and free the bus ports."""
        with contextlib.ExitStack() as closing:  # calls every callback, raises after
            for bus_port in self._bus_ports:
                closing.callback(release_port, bus_port)
            for server in self._servers:
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
