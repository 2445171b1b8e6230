"""Talking to N Redis nodes at once from an event loop: the asyncio round.

The same round as nodes.py's, fed to the same sans-IO ``Round`` (round.py): the
command is written to every node's connection at once, each reply is handed to the
round as it arrives (``replied``; a NOSCRIPT is sent again as EVAL on the same
connection), a connection that fails is a ``failed``, and one timer is the round's
deadline (``deadline_passed``). The round returns as soon as its outcome is
decided, so a hung node costs at most the round's deadline and usually nothing.

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

from ..connection import owed_age
from ..errors import ConfigurationError
from ..node import Node
from ..nodes import NodeSet
from ..quorum import Ask
from ..resp import Command
from ..round import Round
from .connection import NodeConnection, Owed

__all__ = ["AsyncNodeSet"]


class _RoundWaiter:
    """One round in flight: the tally, fed by the connections' replies."""

    __slots__ = ("command", "conns", "entries", "heard", "sent", "tally", "wake")

    def __init__(self, tally: Round, command: Command, count: int, sent: float) -> None:
        self.tally = tally
        self.command = command
        self.sent = sent
        self.wake: Optional[asyncio.Future[None]] = None
        self.conns: list[Optional[NodeConnection]] = [None] * count
        self.entries: list[Optional[Owed]] = [None] * count
        self.heard = 0

    def replied(self, node: int, reply: object) -> None:
        tally = self.tally
        if tally.replied(node, reply):  # NOSCRIPT: again as EVAL, still awaited
            conn = self.conns[node]
            if conn is not None and not conn.closed:
                command = self.command
                self.entries[node] = conn.send(command, command.fallback(), self, node, self.sent)
                return
            tally.failed(node, rexc.ConnectionError("NOSCRIPT and the connection is gone"))
        self._heard()

    def failed(self, node: int, error: BaseException) -> None:
        if self.tally.awaiting(node):
            self.tally.failed(node, error)
            self._heard()

    def _heard(self) -> None:
        self.heard += 1
        wake = self.wake
        if (self.tally.decided or self.heard >= len(self.conns)) and wake and not wake.done():
            wake.set_result(None)


class AsyncNodeSet:
    """N nodes, one asyncio connection each, and the round over them."""

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
        self._conns: list[Optional[NodeConnection]] = [None] * len(self.nodes)
        self._clock = clock
        self._owed_age = owed_age(0.0)

    def __len__(self) -> int:
        return len(self.nodes)

    def close(self) -> None:
        for i, conn in enumerate(self._conns):
            if conn is not None:
                conn.close()
            self._conns[i] = None

    def _checkout(self, i: int, now: float) -> NodeConnection:
        conn = self._conns[i]
        if conn is None or not conn.usable(now, self._owed_age):
            if conn is not None:
                conn.close()
            conn = self._conns[i] = NodeConnection(self.nodes[i], now)
        return conn

    def send_only(self, command: Command) -> None:
        """Write ``command`` to every live connection and wait for nobody (a failed
        or cancelled acquire's release: behind the SET it undoes, in order)."""
        now = self._clock()
        for i, conn in enumerate(self._conns):
            if conn is not None and conn.usable(now, self._owed_age):
                conn.send(command, command.payload, None, i, now)

    async def round(self, ask: Ask) -> list[object]:
        """One round (see ``nodes.NodeSet.round`` for what ``ask`` means)."""
        tally = Round(len(self.nodes), ask.is_yes, ask.enough_yes, ask.enough_no)
        if not ask.wait:
            self.send_only(ask.command)
            return tally.finish()
        now = self._clock()
        self._owed_age = max(self._owed_age, owed_age(ask.timeout))
        command = ask.command
        waiter = _RoundWaiter(tally, command, len(self.nodes), now)
        for i in range(len(self.nodes)):
            try:
                conn = self._checkout(i, now)
            except (OSError, rexc.RedisError) as exc:
                waiter.failed(i, rexc.ConnectionError(f"{self.nodes[i].address}: {exc}"))
                continue
            waiter.conns[i] = conn
            waiter.entries[i] = conn.send(command, command.payload, waiter, i, now)
        if not tally.decided and waiter.heard < len(self.nodes):
            loop = asyncio.get_running_loop()
            wake = waiter.wake = loop.create_future()
            timer = loop.call_later(ask.timeout, _set, wake)
            try:
                await wake
            except BaseException:  # cancelled: keep nothing an acquire got
                self._stop_waiting(waiter, ask.deliver)
                if ask.undo is not None:
                    self.send_only(ask.undo)
                raise
            finally:
                timer.cancel()
        self._stop_waiting(waiter, ask.deliver)
        if not tally.decided:
            tally.deadline_passed([node.address for node in self.nodes], ask.timeout)
        return tally.finish()

    def _stop_waiting(self, waiter: _RoundWaiter, deliver: bool) -> None:
        for conn, owed in zip(waiter.conns, waiter.entries):
            if conn is not None and owed is not None and owed.waiter is waiter:
                conn.abandon(owed, deliver)


def _set(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)
