"""A Redis Cluster as one lock node (``redis+cluster://``, see cluster.py).

``ClusterNode`` is a ``Node`` whose connections go to the master serving a
command's slot: it keeps the slot map and, per master, a plain ``Node`` with its
idle connections (so the pool, the owed-reply bookkeeping and the finisher work per
server as for any node). The map is asked of the servers when a round first needs
it (``needs_discovery``: node_set.py gives it a share of the round's deadline, as a
Sentinel-managed node's discovery), updated by a ``MOVED`` reply (``moved``) and
dropped when a server cannot be reached or does not answer in time
(``forget_address``): the next round asks again.

Imports cluster.py, node.py and connection.py; must not import node_set.py, the
lock or Celery.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional, cast

import redis
from redis import exceptions as rexc

from .cluster import (
    ASKING,
    ClusterSpec,
    SlotMap,
    ask_slot_map,
    is_cluster_url,
    parse_cluster_url,
    slot_of,
)
from .cluster import renamed as cluster_renamed
from .cluster import tagged as cluster_tagged
from .cluster_view import ClusterView
from .connection import MIN_OWED_AGE, Connection
from .node import DISCOVERY_BUDGET, Node, redact
from .resp import Command

__all__ = ["ClusterNode", "make_node"]


def make_node(spec: object, index: int = 0) -> Node:
    """The node ``spec`` names: a ``ClusterNode`` for a ``redis+cluster://`` URL."""
    if is_cluster_url(spec):
        assert isinstance(spec, str)
        return ClusterNode(parse_cluster_url(spec, index, redact(spec)), index)
    return Node(spec, index)


class ClusterNode(Node):
    """One Redis Cluster, one Redlock vote: commands go to their slot's master."""

    def __init__(self, spec: ClusterSpec, index: int = 0) -> None:
        super().__init__(spec.server_url(*spec.seeds[0]), index)
        self.cluster: Optional[ClusterSpec] = spec
        self.address = self.name = spec.address
        self._index = index
        self._slots: Optional[SlotMap] = None
        self._servers: dict[tuple[str, int], Node] = {}

    @property
    def identity(self) -> tuple[str, ...]:
        assert self.cluster is not None
        return self.cluster.identity

    def __repr__(self) -> str:
        return f"<ClusterNode {self.address}>"

    # -- names and routing -------------------------------------------------------------

    def renamed_name(self, name: str) -> str:
        return cluster_tagged(name)

    def route(self, command: Command) -> tuple[Command, Optional[int]]:
        return cluster_renamed(command)

    @property
    def needs_discovery(self) -> bool:
        return self._slots is None

    def forget_address(self) -> None:
        """Ask the servers for the slot map again on the next round."""
        self._slots = None

    def learn(self, slots: SlotMap) -> None:
        """A slot map found by another driver (the asyncio one)."""
        self._slots = slots

    def owner_of(self, slot: Optional[int]) -> Optional[tuple[str, int]]:
        """Where ``slot`` is served (any master for None); None while no map is known."""
        slots = self._slots
        if slots is None:
            return None
        return slots.owner(slot) if slot is not None else slots.masters[0]

    def moved(self, slot: int, where: tuple[str, int]) -> None:
        """A ``MOVED`` reply: ``slot`` is served at ``where`` now."""
        if self._slots is not None:
            self._slots.owners[slot] = where

    def follow(
        self,
        target: tuple[bool, int, str, int],
        commands: Sequence[Command],
        now: float,
        owed_age: float,
        budget: float,
    ) -> Connection:
        """A redirect (cluster.redirect_target): ``commands`` sent to the server it
        names on an idle or new connection, an ``ASK`` prefixing each with ``ASKING``
        (the map left as it is), a ``MOVED`` updating the map first. Raises
        ``redis.ConnectionError``."""
        asking, slot, host, port = target
        if not asking:
            self.moved(slot, (host, port))
        conn = self.server((host, port)).checkout(True, now, owed_age, budget)
        assert conn is not None  # connect=True
        for command in commands:
            sent = self.route(command)[0]
            if asking:
                conn.send_optional(ASKING.payload)
            conn.send(sent.payload, sent, now)
        return conn

    def server(self, where: tuple[str, int]) -> Node:
        """The plain node for one of the cluster's servers (made once, then kept)."""
        found = self._servers.get(where)
        if found is None:
            assert self.cluster is not None
            # setdefault: two threads meeting a new server keep one node for it.
            made = Node(self.cluster.server_url(*where), self._index)
            found = self._servers.setdefault(where, made)
        return found

    def _owner(self, slot: Optional[int], now: float, budget: float) -> Node:
        slots = self._slots
        if slots is None:
            slots = self._slots = self._discover(now, budget)
        return self.server(slots.owner(slot) if slot is not None else slots.masters[0])

    def _discover(self, now: float, budget: float) -> SlotMap:
        assert self.cluster is not None
        asked: list[tuple[tuple[str, int], Connection]] = []
        refused: list[str] = []
        for where in dict.fromkeys([*self._servers, *self.cluster.seeds]):
            try:
                conn = self.server(where).checkout(True, now, budget=budget)
            except rexc.ConnectionError as exc:
                refused.append(str(exc))
            else:
                assert conn is not None  # connect=True
                asked.append((where, conn))
        try:
            slots, done = ask_slot_map(asked, budget, self.address)
        except rexc.ConnectionError as exc:
            if refused:
                raise rexc.ConnectionError(f"{exc}; {'; '.join(refused)}") from None
            raise
        for where, conn in done:
            self.server(where).checkin(conn, now)
        return slots

    def masters(self, budget: float = DISCOVERY_BUDGET) -> list[Node]:
        """The cluster's masters as plain nodes (for inspection: doctor, CLI), the
        slot map asked first when it is not known. Raises ``redis.ConnectionError``."""
        slots = self._slots
        if slots is None:
            slots = self._slots = self._discover(time.monotonic(), budget)
        return [self.server(where) for where in slots.masters]

    def master_of_name(self, name: str, budget: float = DISCOVERY_BUDGET) -> Node:
        """The master serving ``name`` (as a cluster node stores it: ``tagged``)."""
        self.masters(budget)
        assert self._slots is not None
        return self.server(self._slots.owner(slot_of(name)))

    # -- connections (Node's, per server) --------------------------------------------

    def checkout(
        self,
        connect: bool,
        now: float,
        owed_age: float = MIN_OWED_AGE,
        budget: float = DISCOVERY_BUDGET,
        slot: Optional[int] = None,
    ) -> Optional[Connection]:
        return self._owner(slot, now, budget).checkout(connect, now, owed_age, budget)

    def connect(
        self, now: float, budget: float = DISCOVERY_BUDGET, slot: Optional[int] = None
    ) -> Connection:
        return self._owner(slot, now, budget).connect(now, budget)

    def _server_of(self, conn: Connection) -> Optional[Node]:
        server = cast(Node, conn.node)
        return server if any(s is server for s in self._servers.values()) else None

    def checkin(self, conn: Connection, now: float) -> bool:
        server = self._server_of(conn)
        if server is None:
            conn.close()
            return False
        return server.checkin(conn, now)

    def idle_owing(self) -> list[Connection]:
        return [conn for server in list(self._servers.values()) for conn in server.idle_owing()]

    def finish(self, conn: Connection, now: float, owed_age: float) -> bool:
        server = self._server_of(conn)
        return server.finish(conn, now, owed_age) if server is not None else False

    def reset(self) -> None:
        for server in list(self._servers.values()):
            server.reset()
        self._client = None

    def client(self) -> redis.Redis:
        """The cluster seen as one plain Redis, for inspection (CLI, ``clear``):
        cluster_view.py. Rounds never use it."""
        if self._client is None:
            self._client = cast(redis.Redis, ClusterView(self))
        return self._client
