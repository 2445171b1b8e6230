"""One asyncio connection to one Redis node, and the replies it owes, in order.

The asyncio twin of connection.py, on an ``asyncio.Protocol`` (no reader task: the
loop hands us bytes as they come). A node's connection is shared by every round of
the event loop: commands are written as they are sent and replies come back in the
same order, so each reply owed is an ``Owed`` entry in a queue saying who waits for
it -- a round (``Owed.waiter``, told ``replied(i, reply)``), nobody any more (a
*stale* reply: read and dropped; a stale NOSCRIPT is sent again as EVAL, since a
release must still happen), or the handshake. The handshake (AUTH, SELECT, CLIENT
SETNAME, SCRIPT LOAD: node.py's ``Node.handshake``, the same bytes as the
synchronous driver's) is written in front of the first command in one write, so
it costs the round no extra round trip; an AUTH or SELECT error fails the
connection.

A connection that failed, or whose oldest owed reply is older than the owed age (a
hung node), is not reused: nodes.py opens a fresh one on a later round. Must not
import redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import Any, Final, Optional, Protocol

from redis import exceptions as rexc

from ..connection import _SETUP, MAX_CONNECTING, MAX_OWED_REPLIES
from ..node import Node
from ..resp import INCOMPLETE, Command, parse

__all__ = ["NodeConnection", "Owed", "Waiter"]

_RESULT: Final = -1  # a command's reply (the handshake's tags are connection.py's)


class Waiter(Protocol):
    """A round waiting for node ``i``'s reply (nodes.py's ``_RoundWaiter``)."""

    def replied(self, node: int, reply: object) -> None: ...
    def failed(self, node: int, error: BaseException) -> None: ...


class Owed:
    """One reply a connection owes: to whom, for which command, sent when."""

    __slots__ = ("command", "node", "payload", "sent", "tag", "waiter")

    def __init__(
        self,
        tag: int,
        command: Optional[Command],
        waiter: Optional[Waiter],
        node: int,
        sent: float,
        payload: Optional[bytes] = None,
    ) -> None:
        self.tag = tag
        self.command = command
        self.waiter = waiter  # None: stale, nobody waits for it any more
        self.node = node
        self.sent = sent
        self.payload = payload  # kept until written (while connecting)


class NodeConnection(asyncio.Protocol):
    """An asyncio connection to one node and the replies it still owes."""

    def __init__(self, node: Node, now: float) -> None:
        self.node = node
        self.loop = asyncio.get_running_loop()
        self.born = now
        self.transport: Optional[asyncio.Transport] = None
        self.closed = False
        self.owed: deque[Owed] = deque()
        self.inbuf = bytearray()
        self.outbuf: list[bytes] = []  # queued, not yet written (see ``queue``)
        greeting, tags = node.handshake
        self._greeting: Optional[bytes] = greeting
        for tag in tags:
            self.owed.append(Owed(tag, None, None, -1, now))
        self._connecting: Optional[asyncio.Task[None]] = self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        node = self.node
        try:
            if node.path:
                await self.loop.create_unix_connection(lambda: self, node.path)
            else:
                tls: Optional[ssl.SSLContext] = node.ssl_context if node.tls else None
                await self.loop.create_connection(
                    lambda: self,
                    node.host,
                    node.port,
                    ssl=tls,
                    server_hostname=(node.server_hostname or node.host) if tls else None,
                )
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            self._fail(rexc.ConnectionError(f"{node.address}: {exc}"))
        except asyncio.CancelledError:
            self._fail(rexc.ConnectionError(f"{node.address}: connection closed"))
            raise
        finally:
            self._connecting = None

    # -- what the round asks ---------------------------------------------------------

    def usable(self, now: float, owed_age: float, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a round on ``loop`` may use this connection now (else: a fresh one)."""
        if self.closed or self.loop is not loop:
            return False
        if self.transport is None:
            return now - self.born < MAX_CONNECTING
        owed_queue = self.owed
        if not owed_queue:
            return True
        if len(owed_queue) > MAX_OWED_REPLIES:
            return False
        for owed in owed_queue:
            if owed.tag == _RESULT:
                return now - owed.sent <= owed_age  # that reply is not coming: start afresh
        return True

    def send(
        self, command: Command, payload: bytes, waiter: Optional[Waiter], node: int, now: float
    ) -> Owed:
        """Write one command now, behind any queued (queued until connected);
        ``waiter`` is told its reply."""
        owed = Owed(_RESULT, command, waiter, node, now)
        self.owed.append(owed)
        transport = self.transport
        if transport is None:
            owed.payload = payload
        elif self.outbuf:
            self.outbuf.append(payload)
            self.flush()
        else:
            transport.write(payload)
        return owed

    def queue(
        self, command: Command, payload: bytes, waiter: Optional[Waiter], node: int, now: float
    ) -> Owed:
        """As ``send``, but written by the next ``flush``: the rounds of every task
        that sends in one turn of the event loop go out in one write per node."""
        owed = Owed(_RESULT, command, waiter, node, now)
        self.owed.append(owed)
        if self.transport is not None:
            self.outbuf.append(payload)
        else:
            owed.payload = payload
        return owed

    def flush(self) -> None:
        """Write what ``queue`` left, in one write."""
        out = self.outbuf
        if out and self.transport is not None:
            self.outbuf = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def abandon(self, owed: Owed, deliver: bool) -> None:
        """The round stopped waiting for ``owed``. Still unwritten (connecting) and
        not ``deliver``: it is never sent (an acquire's SET must not land later);
        otherwise its reply is read and dropped when it comes."""
        owed.waiter = None
        if owed.payload is not None and not deliver:
            with contextlib.suppress(ValueError):
                self.owed.remove(owed)

    def close(self) -> None:
        self._fail(rexc.ConnectionError(f"{self.node.address}: connection closed"))

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.closed:
            transport.abort()
            return
        self.transport = transport
        parts = [self._greeting or b""]
        self._greeting = None
        for owed in self.owed:
            if owed.payload is not None:
                parts.append(owed.payload)
                owed.payload = None
        transport.write(b"".join(parts))

    def connection_lost(self, exc: Optional[Exception]) -> None:
        detail = exc or "connection closed by server"
        self._fail(rexc.ConnectionError(f"{self.node.address}: {detail}"))

    def data_received(self, data: bytes) -> None:
        buf = self.inbuf
        buf += data
        pos = 0
        owed_queue = self.owed
        while pos < len(buf) and owed_queue:
            reply, pos = parse(buf, pos)
            if reply is INCOMPLETE:
                break
            owed = owed_queue.popleft()
            if owed.tag == _RESULT:
                if owed.waiter is not None:
                    owed.waiter.replied(owed.node, reply)
                elif isinstance(reply, rexc.NoScriptError) and owed.command is not None:
                    # Nobody waits for it, but it must still happen: again as EVAL.
                    self.send(owed.command, owed.command.fallback(), None, owed.node, owed.sent)
            elif owed.tag == _SETUP and isinstance(reply, rexc.RedisError):
                del buf[:pos]
                self._fail(type(reply)(f"{self.node.address}: {reply}"))
                return
        del buf[:pos]

    def _fail(self, error: BaseException) -> None:
        """The connection is unusable: every waiting round hears ``error`` for it."""
        if self.closed:
            return
        self.closed = True
        self.outbuf = []
        owed, self.owed = self.owed, deque()
        for entry in owed:
            if entry.waiter is not None:
                entry.waiter.failed(entry.node, error)
        with contextlib.suppress(RuntimeError):  # its event loop closed meanwhile
            if self.transport is not None:
                self.transport.abort()
            if self._connecting is not None and self._connecting is not _current_task():
                self._connecting.cancel()


def _current_task() -> Optional[asyncio.Task[Any]]:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
