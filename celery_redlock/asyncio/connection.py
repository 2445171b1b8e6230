"""One asyncio connection to one Redis node, and the replies it owes, in order.

The asyncio twin of connection.py, on an ``asyncio.Protocol``: no reader task, no
StreamReader; the loop hands ``data_received`` the bytes as they come, and each
whole reply in them goes straight to whoever waits for it. A node's connection is
shared by every round of the event loop: commands are written as they are sent and
replies come back in the same order, so the connection keeps a queue of what it
owes, one entry per command, and each entry is told its reply (``replied``) or
that the connection failed (``failed``):

- a round (nodes.py's ``_RoundWaiter``, one object for all its nodes: no object
  per command). Once the round stopped waiting, its replies are read and dropped;
  a dropped NOSCRIPT is sent again as EVAL (``Unwaited``), since a release must
  still happen;
- the handshake (AUTH, SELECT, CLIENT SETNAME, SCRIPT LOAD: node.py's
  ``Node.handshake``, the same bytes as the synchronous driver's), written in front
  of the first command in one write, so it costs the round no extra round trip; an
  AUTH or SELECT error fails the connection.

A reply split over several reads waits in ``inbuf`` until whole; several replies in
one read are handed out in order. A connection that failed, or whose oldest owed
reply is older than the owed age while the node answers nothing (a hung node), is
not reused: nodes.py opens a fresh one on a later round. A busy connection to a node
that answers late is kept, however many replies it owes (up to ``MAX_OWED_BUSY``).
Must not import redlock.py or Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import time
from collections import deque
from typing import Any, Callable, Final, Optional, Protocol

from redis import exceptions as rexc

from ..wire.connection import _SETUP, MAX_CONNECTING, MAX_OWED_REPLIES
from ..wire.node import Node
from ..wire.resp import INCOMPLETE, Command, parse

__all__ = ["MAX_OWED_BUSY", "NodeConnection", "Unwaited", "Waiter"]

#: Replies one connection may owe, its node answering all the while, before it is
#: closed all the same: a node answering slower than it is asked, for long, must
#: not collect an unbounded backlog (a reference each: a few hundred KiB at most).
MAX_OWED_BUSY: Final = 64 * MAX_OWED_REPLIES

#: Whole reads that are one common reply, parsed once here (the hot path: a lock
#: round's reply is a small integer).
_SMALL_REPLIES: Final[dict[bytes, object]] = {
    b":1\r\n": 1,
    b":0\r\n": 0,
    b":-1\r\n": -1,
    b":-2\r\n": -2,
    b"+OK\r\n": b"OK",
}


class Waiter(Protocol):
    """An entry of a connection's queue: told the reply to its command, or that the
    connection failed first. ``sent``: when the command was written (the owed age)."""

    handshake: bool
    sent: float

    def replied(self, conn: NodeConnection, reply: object) -> None: ...
    def failed(self, node: int, error: BaseException) -> None: ...


class Unwaited:
    """A command nobody waits for (a stale NOSCRIPT's EVAL, an undo, a release that
    must land): its reply is read and dropped; a NOSCRIPT is sent again as EVAL."""

    __slots__ = ("command", "sent")

    handshake = False

    def __init__(self, command: Command, sent: float) -> None:
        self.command = command
        self.sent = sent

    def replied(self, conn: NodeConnection, reply: object) -> None:
        if isinstance(reply, rexc.NoScriptError):
            conn.send(self.command.fallback(), self)

    def failed(self, node: int, error: BaseException) -> None:
        pass


class _HandshakeReply:
    """One reply of the handshake; an error to AUTH or SELECT fails the connection."""

    __slots__ = ("sent", "tag")

    handshake = True

    def __init__(self, tag: int, sent: float) -> None:
        self.tag = tag
        self.sent = sent

    def replied(self, conn: NodeConnection, reply: object) -> None:
        if self.tag == _SETUP and isinstance(reply, rexc.RedisError):
            conn.fail(type(reply)(f"{conn.node.address}: {reply}"))

    def failed(self, node: int, error: BaseException) -> None:
        pass


class NodeConnection(asyncio.Protocol):
    """An asyncio connection to node ``index`` and the replies it still owes."""

    def __init__(
        self, node: Node, index: int, now: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.node = node
        self.index = index
        self.loop = asyncio.get_running_loop()
        self.born = now
        self.clock = clock
        #: When the node last answered anything (its handshake included).
        self.heard = now
        self.transport: Optional[asyncio.Transport] = None
        self.closed = False
        self.owed: deque[Waiter] = deque()
        self.inbuf = bytearray()
        self.outbuf: list[bytes] = []  # queued (``queue``), or written once connected
        greeting, tags = node.handshake
        self.outbuf.append(greeting)
        self.owed.extend(_HandshakeReply(tag, now) for tag in tags)
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
            self.fail(rexc.ConnectionError(f"{node.address}: {exc}"))
        except asyncio.CancelledError:
            self.fail(rexc.ConnectionError(f"{node.address}: connection closed"))
            raise
        finally:
            self._connecting = None

    # -- what the round asks ---------------------------------------------------------

    def usable(self, now: float, owed_age: float, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a round on ``loop`` may use this connection now (else: a fresh one).

        Given up only when the node looks hung: a reply owed for longer than
        ``owed_age``, or more than ``MAX_OWED_REPLIES`` owed, *and* nothing heard from
        it for ``owed_age`` either (nor waiting unread). One connection serves every
        task of the loop: a busy one to a node that answers, only late, owes many
        replies, the oldest of them old, and closing it would fail every other
        round in flight on it. Past ``MAX_OWED_BUSY`` (a node answering slower than
        it is asked, for long) it goes whatever it answers."""
        owed_queue = self.owed
        if owed_queue and self.transport is not None and not self.closed and self.loop is loop:
            oldest = owed_queue[0]  # the usual case, in short
            if not oldest.handshake and len(owed_queue) <= MAX_OWED_REPLIES:
                return now - oldest.sent <= owed_age or self._answering(now, owed_age)
        if self.closed or self.loop is not loop:
            return False
        if self.transport is None:
            return now - self.born < MAX_CONNECTING
        if not owed_queue:
            return True
        if len(owed_queue) > MAX_OWED_BUSY:
            return False
        if len(owed_queue) > MAX_OWED_REPLIES:
            return self._answering(now, owed_age)
        for owed in owed_queue:
            if not owed.handshake:  # that reply is not coming: start afresh
                return now - owed.sent <= owed_age or self._answering(now, owed_age)
        return True

    def silent_for(self, now: float, seconds: float) -> bool:
        """Whether the node has owed a reply for over ``seconds`` and said nothing for
        as long (nor waits unread): hung or stopped, not merely busy (see
        ``AsyncNodeSet.round``)."""
        owed = self.owed
        return bool(owed) and now - owed[0].sent > seconds and not self._answering(now, seconds)

    def _answering(self, now: float, owed_age: float) -> bool:
        """Whether the node answered within ``owed_age``, or its answer waits unread."""
        return now - self.heard <= owed_age or self._unread()

    def _unread(self) -> bool:
        """Whether bytes wait in the socket, not yet handed to ``data_received``: a
        node that answered while this process was stalled (a loaded machine), not a
        hung one. A round resumed by an earlier turn runs before this turn's reads."""
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
            return bool(readable)
        return False

    def send(self, payload: bytes, entry: Waiter) -> None:
        """Write one command now, behind any queued (queued until connected);
        ``entry`` is told its reply."""
        self.owed.append(entry)
        if self.transport is None:
            self.outbuf.append(payload)  # written once connected
        elif self.outbuf:
            self.outbuf.append(payload)
            self.flush()
        else:
            self.transport.write(payload)

    def queue(self, payload: bytes, entry: Waiter) -> None:
        """As ``send``, but written by the next ``flush``: the rounds of every task
        that sends in one turn of the event loop go out in one write per node."""
        self.owed.append(entry)
        self.outbuf.append(payload)

    def flush(self) -> None:
        """Write what ``queue`` left, in one write."""
        out = self.outbuf
        if out and self.transport is not None:
            self.outbuf = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        self.fail(rexc.ConnectionError(f"{self.node.address}: connection closed"))

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.closed:
            transport.abort()
            return
        self.transport = transport
        self.flush()  # the handshake, then what was sent while connecting

    def connection_lost(self, exc: Optional[Exception]) -> None:
        detail = exc or "connection closed by server"
        self.fail(rexc.ConnectionError(f"{self.node.address}: {detail}"))

    def data_received(self, data: bytes) -> None:
        self.heard = self.clock()
        owed_queue = self.owed
        buf = self.inbuf
        if not buf:
            small = _SMALL_REPLIES.get(data, INCOMPLETE)
            if small is not INCOMPLETE and owed_queue:
                owed_queue.popleft().replied(self, small)
                return
            buf = data  # type: ignore[assignment]  # read in place: no copy
        else:
            buf += data
        pos = 0
        end = len(buf)
        while pos < end and owed_queue:
            if buf.startswith(b":1\r\n", pos):  # a round's usual reply, in a batch
                reply: object = 1
                pos += 4
            else:
                reply, after = parse(buf, pos)
                if reply is INCOMPLETE:
                    break
                pos = after
            owed_queue.popleft().replied(self, reply)
            if self.closed:
                return
        if buf is self.inbuf:
            del buf[:pos]
        elif pos < end:
            self.inbuf = bytearray(data[pos:])

    def fail(self, error: BaseException) -> None:
        """The connection is unusable: every waiting round hears ``error`` for it."""
        if self.closed:
            return
        self.closed = True
        self.outbuf = []
        owed, self.owed = self.owed, deque()
        for entry in owed:
            entry.failed(self.index, error)
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
