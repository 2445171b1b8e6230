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
address is asked of the Sentinels with blocking I/O. Must not import redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Sequence

from redis import exceptions as rexc

from ..errors import ConfigurationError
from ..lock.steps import Ask
from ..wire.connection import owed_age
from ..wire.node import Node
from ..wire.node_set import NodeSet
from ..wire.resp import Command
from ..wire.round import Round
from .connection import NodeConnection, Unwaited, Waiter

__all__ = ["AsyncNodeSet"]


class _RoundWaiter:
    """One round in flight: the tally, fed by the connections' replies. One object
    for every node of the round: it sits in each node's queue of owed replies."""

    __slots__ = ("active", "command", "count", "deadline", "heard", "sent", "tally", "wake")

    handshake = False

    def __init__(self, tally: Round, command: Command, count: int, sent: float) -> None:
        self.tally = tally
        self.command = command
        self.count = count
        self.sent = sent
        self.wake: Optional[asyncio.Future[None]] = None
        self.deadline = 0.0  # on the event loop's clock
        self.heard = 0
        self.active = True  # False once the round stopped waiting: replies dropped

    def replied(self, conn: NodeConnection, reply: object) -> None:
        if not self.active:  # read and dropped; a NOSCRIPT still has to happen
            if isinstance(reply, rexc.NoScriptError):
                conn.send(self.command.fallback(), Unwaited(self.command, self.sent))
            return
        tally = self.tally
        if tally.replied(conn.index, reply):  # NOSCRIPT: again as EVAL, still awaited
            if not conn.closed:
                conn.send(self.command.fallback(), self)
                return
            tally.failed(conn.index, rexc.ConnectionError("NOSCRIPT and the connection is gone"))
        self.heard += 1
        if tally.decided or self.heard >= self.count:
            self._done()

    def failed(self, node: int, error: BaseException) -> None:
        if self.active and self.tally.awaiting(node):
            self.tally.failed(node, error)
            self.heard += 1
            if self.tally.decided or self.heard >= self.count:
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
            if node.cluster is not None:
                raise ConfigurationError(
                    f"nodes[{index}]: {node.address!r} is a Redis Cluster; AsyncRedlock "
                    "takes fixed addresses only (redis://, rediss://, unix://): use "
                    "Redlock for redis+cluster:// nodes"
                )
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
        for i in range(len(conns)):
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

    async def round(self, ask: Ask) -> list[object]:
        """One round (see ``nodes.NodeSet.round`` for what ``ask`` means)."""
        count = len(self.nodes)
        tally = Round(count, ask.is_yes, ask.enough_yes, ask.enough_no, ask.settled)
        if not ask.wait:
            self.send_only(ask.command)
            return tally.finish()
        now = self._clock()
        if ask.timeout > self._timeout_seen:
            self._timeout_seen = ask.timeout
            self._owed_age = max(self._owed_age, owed_age(ask.timeout))
        waiter = _RoundWaiter(tally, ask.command, count, now)
        loop = asyncio.get_running_loop()
        self._write_all(ask.command.payload, waiter, now, True, loop)
        if not tally.decided and waiter.heard < count:
            wake = waiter.wake = loop.create_future()
            waiter.deadline = loop.time() + ask.timeout
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
            tally.deadline_passed([node.address for node in self.nodes], ask.timeout)
        return tally.finish()

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
