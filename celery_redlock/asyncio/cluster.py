"""Redis Cluster lock nodes (``redis+cluster://``) from an event loop.

What the synchronous driver does for a cluster node (wire/cluster.py,
wire/cluster_node.py), on asyncio connections: the slot map is asked of every known
server and seed at once (``CLUSTER SLOTS`` on ``NodeConnection``s, TLS and AUTH
included) and the first full answer wins, all within what is left of the round's
deadline, without blocking the loop; a command goes, renamed, to the connection of
its slot's master (one connection per server, shared by every round of the loop);
``MOVED`` (the map updated) and ``ASK`` (``ASKING`` first) are followed once per
node and round; a server that fails or leaves a round unanswered drops the map, and
the next round asks again. The map itself is kept on the ``ClusterNode``.

Must not import redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

from redis import exceptions as rexc

from ..wire.cluster import ASKING, CLUSTER_SLOTS, SlotMap
from ..wire.cluster_node import ClusterNode
from ..wire.resp import Command
from .connection import NodeConnection, Unwaited, Waiter

__all__ = ["ClusterConnections"]

Where = tuple[str, int]


class _MapAnswer:
    """One server asked for the slot map: the first full map settles ``found``; once
    every server failed, ``found`` fails saying what each said."""

    __slots__ = ("address", "asked", "found", "sent", "total", "where")

    handshake = False

    def __init__(
        self,
        found: asyncio.Future[SlotMap],
        asked: list[str],
        total: int,
        where: Where,
        sent: float,
        address: str,
    ) -> None:
        self.found = found
        self.asked = asked  # what each server said, shared by the servers asked
        self.total = total
        self.where = where
        self.sent = sent
        self.address = address

    def replied(self, conn: NodeConnection, reply: object) -> None:
        slots = SlotMap.from_reply(reply, self.where)
        if slots is not None:
            if not self.found.done():
                self.found.set_result(slots)
            return
        shown = str(reply) if isinstance(reply, Exception) else "a slot map not covering every slot"
        self.failed(conn.index, rexc.ResponseError(shown))

    def failed(self, node: int, error: BaseException) -> None:
        self.asked.append(f"{self.where[0]}:{self.where[1]}: {error}")
        if len(self.asked) >= self.total and not self.found.done():
            self.found.set_exception(_no_map(self.address, self.asked))


def _no_map(address: str, told: list[str]) -> rexc.ConnectionError:
    return rexc.ConnectionError(
        f"{address}: no server gave the cluster's slot map ({'; '.join(told)})"
    )


class ClusterConnections:
    """The connections to one cluster node's servers, and its slot map's discovery."""

    def __init__(self, node: ClusterNode, index: int, clock: Callable[[], float]) -> None:
        self.node = node
        self.index = index
        self._clock = clock
        self._conns: dict[Where, NodeConnection] = {}

    def close(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()

    def _conn(self, where: Where, now: float, owed_age: float) -> NodeConnection:
        loop = asyncio.get_running_loop()
        conn = self._conns.get(where)
        if conn is None or not conn.usable(now, owed_age, loop):
            if conn is not None:
                conn.close()
            conn = self._conns[where] = NodeConnection(
                self.node.server(where), self.index, now, self._clock
            )
        return conn

    async def find_map(self, budget: float, owed_age: float) -> None:
        """Ask every known server and seed for the slot map at once; the first full
        one is kept on the node. Raises ``redis.ConnectionError`` saying what each
        said when none gave one within ``budget`` seconds."""
        assert self.node.cluster is not None
        loop = asyncio.get_running_loop()
        found: asyncio.Future[SlotMap] = loop.create_future()
        asked: list[str] = []
        now = self._clock()
        servers = list(dict.fromkeys([*self._conns, *self.node.cluster.seeds]))
        for where in servers:
            answer = _MapAnswer(found, asked, len(servers), where, now, self.node.address)
            self._conn(where, now, owed_age).send(CLUSTER_SLOTS.payload, answer)
        try:
            slots = await asyncio.wait_for(found, budget)
        except asyncio.TimeoutError:
            told = [*asked, f"the others: no answer within {budget * 1000:.0f} ms"]
            raise _no_map(self.node.address, told) from None
        self.node.learn(slots)

    def send(self, command: Command, slot: Optional[int], entry: Waiter, owed_age: float) -> None:
        """Write ``command`` (renamed already) to its slot's master, ``entry`` told
        the reply. Raises ``redis.ConnectionError`` when the map is not known."""
        where = self.node.owner_of(slot)
        if where is None:
            raise rexc.ConnectionError(f"{self.node.address}: the slot map is not known")
        now = self._clock()
        self._conn(where, now, owed_age).send(command.payload, entry)

    def follow(
        self, target: tuple[bool, int, str, int], command: Command, entry: Waiter, owed_age: float
    ) -> None:
        """A ``MOVED`` / ``ASK`` reply: ``command`` sent where it says (``ASKING``
        first for an ASK; a MOVED updates the map)."""
        asking, slot, host, port = target
        if not asking:
            self.node.moved(slot, (host, port))
        now = self._clock()
        conn = self._conn((host, port), now, owed_age)
        if asking:
            conn.send(ASKING.payload, Unwaited(ASKING, now))
        conn.send(command.payload, entry)
