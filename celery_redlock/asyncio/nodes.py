"""Talking to N Redis nodes at once from an event loop: the asyncio round.

The same round as nodes.py's, fed to the same sans-IO ``Round`` (round.py): the
command is written to every node's connection at once, each reply is handed to the
round as it arrives (``replied``; a NOSCRIPT is sent again as EVAL on the same
connection), a connection that fails is a ``failed``, and the deadline is
``deadline_passed``. The round returns as soon as its outcome is decided, so a hung
node costs at most the round's deadline and usually nothing.

Cheap per round, since a lock operation is one or two of them: one write per node
(when other tasks' rounds are in flight, everything sent to a node in one loop turn
goes out in one write, and its replies come back together), no task per node, one
future per round, one entry per round in each node's queue of owed replies (the
round's ``_RoundWaiter`` itself, told each reply straight from ``data_received``),
and one timer for every round in flight (re-armed for the earliest deadline)
instead of one per round. Once decided, the round drops the replies still to come
(one flag, not a walk over its nodes).

A round abandoned half-way -- its task cancelled -- stops waiting at once; its
``Ask.undo`` (an acquire's release) goes to every node without waiting, behind the
command it undoes on the same connection, so a cancelled acquire keeps nothing.

Node specs are read by node.py's ``Node`` through the synchronous ``NodeSet`` (the
same URL checks, TLS contexts, handshakes and duplicate check); only their
connections differ. Sentinel-managed masters (``sentinel://``) are refused: their
address is asked of the Sentinels with blocking I/O. A Redis Cluster node
(``redis+cluster://``) is routed by cluster.py: its slot map asked on the loop, its
commands renamed and sent to their slot's master, its redirects followed once per
round. Must not import redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, Optional, Sequence

from redis import exceptions as rexc

from ..errors import ConfigurationError
from ..lock.steps import Ask
from ..wire.cluster import redirect_target
from ..wire.cluster_node import ClusterNode
from ..wire.connection import owed_age
from ..wire.node import Node
from ..wire.node_set import NodeSet
from ..wire.resp import Command
from ..wire.round import Round
from .cluster import ClusterConnections
from .connection import NodeConnection, Unwaited, Waiter

__all__ = ["AsyncNodeSet"]


class _RoundWaiter:
    """One round in flight: the tally, fed by the connections' replies. One object
    for every node of the round: it sits in each node's queue of owed replies."""

    __slots__ = (
        "active", "command", "count", "deadline", "follow", "heard", "redirected", "routed",
        "sent", "silent", "tally", "wake",
    )  # fmt: skip

    handshake = False

    def __init__(self, tally: Round, command: Command, count: int, sent: float) -> None:
        self.tally = tally
        self.command = command
        self.count = count
        self.sent = sent
        self.wake: Optional[asyncio.Future[None]] = None
        self.deadline = 0.0  # on the event loop's clock
        self.heard = 0  # of the nodes waited for (not ``silent``)
        #: Nodes silent for a round's deadline before this one: not waited for on
        #: their own (see ``AsyncNodeSet.round``); None when there are none.
        self.silent: Optional[set[int]] = None
        self.active = True  # False once the round stopped waiting: replies dropped
        #: Cluster nodes' own commands (renamed) and redirects (cluster.py): None
        #: when no node is a cluster.
        self.routed: Optional[dict[int, Command]] = None
        self.follow: Optional[Callable[[int, object, _RoundWaiter], bool]] = None
        self.redirected: Optional[set[int]] = None  # made at the first redirect

    def _command(self, node: int) -> Command:
        routed = self.routed
        return self.command if routed is None else routed.get(node, self.command)

    def replied(self, conn: NodeConnection, reply: object) -> None:
        if not self.active:  # read and dropped; a NOSCRIPT still has to happen
            if isinstance(reply, rexc.NoScriptError):
                command = self._command(conn.index)
                conn.send(command.fallback(), Unwaited(command, self.sent))
            return
        if self.follow is not None and self.follow(conn.index, reply, self):
            return  # redirected: the reply comes from the server named
        tally = self.tally
        if tally.replied(conn.index, reply):  # NOSCRIPT: again as EVAL, still awaited
            if not conn.closed:
                conn.send(self._command(conn.index).fallback(), self)
                return
            tally.failed(conn.index, rexc.ConnectionError("NOSCRIPT and the connection is gone"))
        self._heard(conn.index)

    def failed(self, node: int, error: BaseException) -> None:
        if self.active and self.tally.awaiting(node):
            self.tally.failed(node, error)
            self._heard(node)

    def _heard(self, node: int) -> None:
        if self.silent is None or node not in self.silent:
            self.heard += 1
        if self.tally.decided or self.heard >= self.count:
            self._done()

    def hush(self, nodes: list[int]) -> None:
        """``nodes`` have been silent for a round's deadline: when a minority, stop
        waiting for them once every other node is heard (their replies still count
        until then). A silent majority is waited for (wire/node_set.py)."""
        nodes = [i for i in nodes if self.tally.awaiting(i)]
        if nodes and 2 * len(nodes) < len(self.tally.results):
            self.silent = set(nodes)
            self.count -= len(nodes)
            if self.heard >= self.count:
                self._done()

    def _done(self) -> None:
        """Decided, or every node heard: the replies still to come are read and
        dropped, as the synchronous round stops reading (NOT_AWAITED in its results)."""
        self.active = False
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)


class AsyncNodeSet:
    """N nodes, one asyncio connection each, and the round over them.

    Per event loop turn, what every round queued for a node goes out in one write
    (``_flush``, scheduled once per turn); one timer serves every round in flight
    (``_expire``, re-armed for the earliest deadline), not one per round.
    """

    def __init__(self, specs: Sequence[object], clock: Callable[[], float] = time.monotonic):
        self.nodes: list[Node] = NodeSet(specs, clock=clock).nodes
        for index, node in enumerate(self.nodes):
            if node.sentinel is not None:
                raise ConfigurationError(
                    f"nodes[{index}]: {node.address!r} is a Sentinel-managed master; "
                    "AsyncRedlock takes fixed addresses only (redis://, rediss://, "
                    "unix://): use Redlock for sentinel:// nodes, or give the masters' "
                    "addresses"
                )
        #: The cluster nodes' connections, per server (cluster.py); the others' below.
        self._clusters = {
            i: ClusterConnections(node, i, clock)
            for i, node in enumerate(self.nodes)
            if isinstance(node, ClusterNode)
        }
        self._plain = [i for i in range(len(self.nodes)) if i not in self._clusters]
        self._conns: list[Optional[NodeConnection]] = [None] * len(self.nodes)
        self._clock = clock
        self._owed_age = owed_age(0.0)
        self._dirty: list[NodeConnection] = []  # queued to, to flush this turn
        self._flush_loop: Optional[asyncio.AbstractEventLoop] = None
        self._flush_due = False
        self._waiting: set[_RoundWaiter] = set()  # rounds awaiting replies
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_loop: Optional[asyncio.AbstractEventLoop] = None

    def __len__(self) -> int:
        return len(self.nodes)

    def close(self) -> None:
        for i, conn in enumerate(self._conns):
            if conn is not None:
                conn.close()
            self._conns[i] = None
        for cluster in self._clusters.values():
            cluster.close()

    def _checkout(self, i: int, now: float, loop: asyncio.AbstractEventLoop) -> NodeConnection:
        conn = self._conns[i]
        if conn is None or not conn.usable(now, self._owed_age, loop):
            if conn is not None:
                conn.close()
            conn = self._conns[i] = NodeConnection(self.nodes[i], i, now, self._clock)
        return conn

    def _write_all(
        self,
        payload: bytes,
        entry: Waiter,
        now: float,
        wait: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Send ``payload`` to every node, each told to ``entry``: now when no other
        round is in flight (one task: nothing to coalesce with); otherwise at the end
        of this loop turn, with what the other tasks' rounds send meanwhile.
        ``wait``: a node that cannot be reached fails ``entry`` for it (else it is
        skipped: nobody waits for its reply). A node whose connection is still being
        set up gets the command once it is, also after the round (as a slow node
        does: see wire/connection.py's ``Connection.park``)."""
        coalesce = bool(self._waiting)
        if coalesce:
            if self._flush_loop is not loop:  # a new event loop: the old one's turn is over
                self._dirty, self._flush_loop, self._flush_due = [], loop, False
            if not self._flush_due:
                loop.call_soon(self._flush)
                self._flush_due = True
        conns = self._conns
        for i in self._plain:
            conn = conns[i]
            if conn is None or not conn.usable(now, self._owed_age, loop):
                if not wait:
                    continue
                try:
                    conn = self._checkout(i, now, loop)
                except (OSError, rexc.RedisError) as exc:
                    entry.failed(i, rexc.ConnectionError(f"{self.nodes[i].address}: {exc}"))
                    continue
            if conn.transport is None:
                conn.queue(payload, entry)  # written once connected
            elif not coalesce:
                conn.send(payload, entry)
            else:  # ``conn.queue``, inline: the hot path of many tasks
                if not conn.outbuf:
                    self._dirty.append(conn)
                conn.owed.append(entry)
                conn.outbuf.append(payload)

    def _flush(self) -> None:
        self._flush_due = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def send_only(self, command: Command) -> None:
        """Send ``command`` to every live connection and wait for nobody (a failed
        or cancelled acquire's release: behind the SET it undoes, in order)."""
        now = self._clock()
        loop = asyncio.get_running_loop()
        self._write_all(command.payload, Unwaited(command, now), now, False, loop)
        for cluster in self._clusters.values():
            routed, slot = cluster.node.route(command)
            with contextlib.suppress(rexc.RedisError):  # no map: nothing there to undo
                cluster.send(routed, slot, Unwaited(routed, now), self._owed_age)

    async def round(self, ask: Ask) -> list[object]:
        """One round (see ``nodes.NodeSet.round`` for what ``ask`` means)."""
        count = len(self.nodes)
        tally = Round(count, ask.is_yes, ask.enough_yes, ask.enough_no, ask.settled)
        routes = self._routes(ask.command) if self._clusters else {}  # may refuse
        if not ask.wait:
            self.send_only(ask.command)
            return tally.finish()
        loop = asyncio.get_running_loop()
        started = loop.time()
        if ask.timeout > self._timeout_seen:
            self._timeout_seen = ask.timeout
            self._owed_age = max(self._owed_age, owed_age(ask.timeout))
        # A cluster node's slot map, asked first where unknown (half the deadline).
        no_map = await self._find_maps(ask.timeout / 2) if self._clusters else {}
        now = self._clock()
        waiter = _RoundWaiter(tally, ask.command, count, now)
        self._write_all(ask.command.payload, waiter, now, True, loop)
        if self._clusters:
            self._send_routed(routes, waiter, no_map)
        # Nodes that have not answered for a whole deadline (hung, stopped) would
        # almost never answer within this one: waited for, they would cost every
        # undecided round (a split vote) its full deadline (wire/node_set.py).
        conns = self._conns
        waiter.hush([
            i for i in self._plain
            if (conn := conns[i]) is not None and conn.silent_for(now, ask.timeout)
        ])  # fmt: skip
        if not tally.decided and waiter.heard < waiter.count:
            wake = waiter.wake = loop.create_future()
            waiter.deadline = started + ask.timeout
            self._wait(waiter, loop)
            try:
                await wake
            except BaseException:  # cancelled: keep nothing an acquire got
                waiter.active = False  # its replies are dropped from now on
                if ask.undo is not None:
                    self.send_only(ask.undo())
                raise
            finally:
                self._waiting.discard(waiter)
        waiter.active = False
        if not tally.decided:
            tally.deadline_passed(
                [node.address for node in self.nodes], ask.timeout, waiter.silent or ()
            )
        results = tally.finish()
        for i, cluster in self._clusters.items():
            if isinstance(results[i], (rexc.ConnectionError, rexc.TimeoutError)):
                cluster.node.forget_address()  # a server gone or hung: ask again
        return results

    # -- cluster nodes (cluster.py) ----------------------------------------------------

    def _routes(self, command: Command) -> dict[int, tuple[Command, Optional[int]]]:
        """Each cluster node's command (renamed) and slot; ConfigurationError before
        anything is sent when one cannot take it (keys in several slots)."""
        return {i: cluster.node.route(command) for i, cluster in self._clusters.items()}

    async def _find_maps(self, budget: float) -> dict[int, BaseException]:
        """The slot maps not known yet, asked of every cluster at once; the error of
        each cluster that gave none."""
        missing = [c for c in self._clusters.values() if c.node.needs_discovery]
        if not missing:
            return {}
        found = await asyncio.gather(
            *(c.find_map(budget, self._owed_age) for c in missing), return_exceptions=True
        )
        return {c.index: e for c, e in zip(missing, found) if isinstance(e, BaseException)}

    def _send_routed(
        self,
        routes: dict[int, tuple[Command, Optional[int]]],
        waiter: _RoundWaiter,
        no_map: dict[int, BaseException],
    ) -> None:
        waiter.routed = {i: command for i, (command, _) in routes.items()}
        waiter.follow = self._follow
        for i, cluster in self._clusters.items():
            error = no_map.get(i)
            if error is None:
                command, slot = routes[i]
                try:
                    cluster.send(command, slot, waiter, self._owed_age)
                except rexc.RedisError as exc:
                    error = exc
            if error is not None:
                cluster.node.forget_address()
                waiter.failed(i, error)

    def _follow(self, node: int, reply: object, waiter: _RoundWaiter) -> bool:
        """A cluster node's MOVED / ASK: followed once per round (True), the command
        sent where it says; any other reply is the round's (False)."""
        cluster = self._clusters.get(node)
        target = redirect_target(reply) if cluster is not None else None
        if cluster is None or target is None:
            return False
        if waiter.redirected is None:
            waiter.redirected = set()
        elif node in waiter.redirected:
            return False  # a second redirect in one round: the node's no
        waiter.redirected.add(node)
        cluster.follow(target, waiter._command(node), waiter, self._owed_age)
        return True

    _timeout_seen = -1.0

    def _wait(self, waiter: _RoundWaiter, loop: asyncio.AbstractEventLoop) -> None:
        """Have the timer wake ``waiter`` at its deadline."""
        self._waiting.add(waiter)
        timer = self._timer
        if timer is not None and self._timer_loop is loop and timer.when() <= waiter.deadline:
            return  # it fires sooner, and re-arms for this one then
        if timer is not None:
            timer.cancel()
        self._timer = loop.call_at(waiter.deadline, self._expire)
        self._timer_loop = loop

    def _expire(self) -> None:
        """The timer: wake every round whose deadline passed, re-arm for the next."""
        self._timer = None
        loop = self._timer_loop
        assert loop is not None
        now = loop.time()
        later: Optional[_RoundWaiter] = None
        for waiter in list(self._waiting):
            wake = waiter.wake
            if wake is None or wake.get_loop() is not loop:
                self._waiting.discard(waiter)  # an earlier event loop's
            elif waiter.deadline <= now:
                self._waiting.discard(waiter)
                if not wake.done():
                    wake.set_result(None)
            elif later is None or waiter.deadline < later.deadline:
                later = waiter
        if later is not None:
            self._waiting.discard(later)
            self._wait(later, loop)
