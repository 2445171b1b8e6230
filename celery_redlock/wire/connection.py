"""One connection to one Redis node: a non-blocking socket and the replies it owes.

Why not redis-py's ``Connection``: its ``connect()`` runs an on-connect handshake
(CLIENT SETINFO, AUTH, SELECT) with blocking socket timeouts, node after node, so one
hung node would eat its own timeouts before the next node is even contacted, and a
half-read reply leaves the connection out of step. Here the handshake (AUTH, SELECT,
CLIENT SETNAME, SCRIPT LOAD of every script) is pipelined in front of the first
command, on a non-blocking socket (TLS included), so it counts against the round's
deadline; and every connection knows, in order, what each reply it still owes
means: the round's answer, a *stale* answer nobody waits for any more (read and
dropped; a stale NOSCRIPT is sent again as EVAL, since the command must still
happen), or a handshake reply. A reply we stopped waiting for is read by the next
round on the connection or by the finisher (``finish``), whichever comes first, so a
late SET is always followed by our late DEL; a connection that cannot be brought back
in step is closed (``park`` says so). Each owed reply keeps the time its command was
sent: only a reply owed for long (a hung node) closes the connection, never a node
that stays a round or two behind. Requests lost on the way (a partition that drops
bytes) leave a stream whose replies keep coming, each one read as the answer to an
older command: such a connection stays behind for good, and the rounds that wait on
it time out; ``behind_for`` tells the driver how long it has been behind.

A connection knows its node only as an ``Endpoint`` (address, handshake, TLS
context): node.py's ``Node`` is one. This module does no waiting of its own (the
driver polls) and must not import node.py, node_set.py, redlock.py or Celery.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
from collections import deque
from typing import Any, Final, Optional, Protocol, cast

from redis import exceptions as rexc

from . import unpatched
from .resp import INCOMPLETE, Command, pack, parse
from .script import PRELOADED

__all__ = [
    "MAX_CONNECTING",
    "MAX_OWED_REPLIES",
    "MIN_OWED_AGE",
    "OWED_AGE_ROUNDS",
    "READY",
    "Connection",
    "Endpoint",
    "handshake",
    "owed_age",
]

#: Replies a connection may still owe before it is closed instead of reused: a node
#: that stopped answering (hung) should not collect an unbounded backlog. A slow but
#: live node never gets near it: owed replies are drained whenever the connection is
#: taken. Closing drops what the node has not read yet, so this is for hung nodes only.
MAX_OWED_REPLIES: Final = 256
#: A connection still connecting after this long is dropped and started afresh.
MAX_CONNECTING: Final = 5.0
#: A connection whose oldest owed reply was sent more than this many round deadlines
#: ago (and at least MIN_OWED_AGE seconds) is closed, not reused: a reply that never
#: comes (a node hung for good) would otherwise keep every later round on it one reply
#: behind. So is one behind for that long on which a round timed out (see node_set.py).
OWED_AGE_ROUNDS: Final = 10
MIN_OWED_AGE: Final = 0.5
CLIENT_NAME: Final = b"celery-redlock"


def owed_age(timeout: float) -> float:
    """How long a reply may stay owed on a connection used with round ``timeout``."""
    return max(MIN_OWED_AGE, OWED_AGE_ROUNDS * timeout)


_READ_SIZE: Final = 65536

# What the reply we are waiting for means (one tag per command sent, in order).
_RESULT: Final = 0  # the round's answer
_STALE: Final = 1  # an answer nobody waits for any more: read and drop
_SETUP: Final = 2  # handshake (AUTH, SELECT): an error makes the connection unusable
_OPTIONAL: Final = 3  # handshake nicety (CLIENT SETNAME, SCRIPT LOAD): errors ignored

_CONNECTING: Final = 0
_TLS_HANDSHAKE: Final = 1
READY: Final = 2


class Endpoint(Protocol):
    """What a connection needs to know about its node (node.Node is one)."""

    @property
    def address(self) -> str: ...  # for errors: host:port/db or unix:path/db
    @property
    def tls(self) -> bool: ...
    @property
    def ssl_context(self) -> Optional[ssl.SSLContext]: ...
    @property
    def server_hostname(self) -> Optional[str]: ...
    @property
    def handshake(self) -> tuple[bytes, tuple[int, ...]]: ...  # see ``handshake()``

    def forget_address(self) -> None:
        """The address was refused, or answered READONLY: resolve it again next time."""


def handshake(
    username: Optional[str], password: Optional[str], db: int
) -> tuple[bytes, tuple[int, ...]]:
    """The commands sent ahead of a new connection's first command, and their tags."""
    parts: list[bytes] = []
    tags: list[int] = []
    if password is not None:
        parts.append(pack(b"AUTH", username, password) if username else pack(b"AUTH", password))
        tags.append(_SETUP)
    if db:
        parts.append(pack(b"SELECT", db))
        tags.append(_SETUP)
    parts.append(pack(b"CLIENT", b"SETNAME", CLIENT_NAME))
    tags.append(_OPTIONAL)
    for script in PRELOADED:
        parts.append(pack(b"SCRIPT", b"LOAD", script.source))
        tags.append(_OPTIONAL)
    return b"".join(parts), tuple(tags)


class Connection:
    """A non-blocking socket to one node and the replies it still owes, in order."""

    __slots__ = (
        "behind_since",
        "born",
        "commands",
        "expect",
        "inbuf",
        "node",
        "out",
        "pending",
        "sock",
        "sockaddr",
        "state",
        "tls_wants_write",
    )

    def __init__(self, node: Endpoint, family: int, sockaddr: Any, now: float) -> None:
        self.node = node
        self.born = now
        self.inbuf = bytearray()
        greeting, tags = node.handshake
        self.out = bytearray(greeting)
        self.expect: deque[int] = deque(tags)
        # The command behind each _RESULT / _STALE tag and when it was sent, in the
        # same order: a reply found to be NOSCRIPT after the round stopped waiting is
        # resent as EVAL; the oldest send time tells a stuck node from a slow one.
        self.commands: deque[tuple[Command, float]] = deque()
        self.pending: list[bytes] = []  # commands queued before the connection is ready
        self.behind_since: Optional[float] = None  # owing stale replies, without a break
        self.tls_wants_write = False  # what a TLS handshake in progress waits for
        self.sockaddr = sockaddr  # where it goes (a Sentinel-managed master may move)
        sock = unpatched.socket_class()(family, socket.SOCK_STREAM)  # never cooperative
        self.sock: Optional[socket.socket] = sock
        sock.setblocking(False)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EALREADY):
            sock.close()
            self.sock = None
            node.forget_address()
            raise rexc.ConnectionError(f"{node.address}: {os.strerror(err)}")
        self.state = _CONNECTING
        if err == 0:
            self._connected()

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    @property
    def owes(self) -> bool:
        """True while replies are owed or the connection is still being set up."""
        return bool(self.expect) or self.state != READY

    def owed_for(self, now: float) -> float:
        """Seconds since the oldest owed reply's command was sent (or since the
        connection began, for its handshake); 0 when nothing is owed."""
        try:
            # One read: the finisher asks about connections a round may be using.
            return now - self.commands[0][1]
        except IndexError:
            return now - self.born if self.owes else 0.0

    def behind_for(self, now: float) -> float:
        """Seconds this connection has owed stale replies without a break (0: in step)."""
        return 0.0 if self.behind_since is None else now - self.behind_since

    def usable(self, now: float, owed_age: float) -> bool:
        """Whether an idle connection may serve a round now (else: close it)."""
        if self.state != READY:
            return now - self.born < MAX_CONNECTING
        if self.expect:
            # Replies owed from rounds that stopped at quorum: drop the ones that
            # have arrived now, so a merely slow node never piles up a backlog.
            try:
                self.read()
            except rexc.RedisError:
                return False  # the node hung up meanwhile (restart, timeout)
            if self.owed_for(now) > owed_age:
                return False  # that reply is not coming: start afresh
        return True

    def finish(self, now: float, owed_age: float) -> bool:
        """Read what an idle connection owes, without waiting: move set-up along,
        resend NOSCRIPT as EVAL, write what is queued. False: close it (the node
        hung up, or a reply has been owed longer than ``owed_age``)."""
        if self.sock is None:
            return False
        if self.state != READY and now - self.born >= MAX_CONNECTING:
            return False
        try:
            self.read()
        except (rexc.RedisError, OSError):
            return False
        if self.state != READY and not self.commands:
            return True  # set-up only: MAX_CONNECTING bounds it
        return self.owed_for(now) <= owed_age and len(self.expect) <= MAX_OWED_REPLIES

    def park(self, now: float) -> bool:
        """Get back in step after a round; False: out of step, close it.

        A command still queued behind the connection's set-up goes out once it is
        done, as one sent to a slow node lands late: a round decided without this
        node still gives it the key, and a late command is one the scripts expect
        (a release's tombstones refuse an acquire or hold that comes after it; a
        lost round's undo follows it on the same connection, or leaves a tombstone).
        """
        if self.sock is None or len(self.expect) > MAX_OWED_REPLIES:
            return False
        if self.state != READY:
            self._stop_awaiting()
        elif self.out:
            return False  # a half-written command: the stream is out of step
        elif self.expect:
            # Replies we stopped waiting for are still owed: read and drop them first.
            self._stop_awaiting()
            if self.behind_since is None:
                self.behind_since = now
        return True

    def _stop_awaiting(self) -> None:
        """Mark the replies the round waited for stale (read and dropped when they come)."""
        expect = self.expect
        try:
            # A scan in C, then Python only from the first awaited reply on: earlier
            # parks left none, so that is this round's, near the end. Rebuilding the
            # whole deque cost each round on a hung node time in proportion to its
            # backlog (up to MAX_OWED_REPLIES).
            first = expect.index(_RESULT)
        except ValueError:
            return
        for i in range(first, len(expect)):
            if expect[i] == _RESULT:
                expect[i] = _STALE

    def send(self, payload: bytes, command: Command, now: float) -> None:
        """Queue one command whose reply the round waits for; write it if we can.

        ``now``: when it is sent, on the round's clock.
        """
        self.expect.append(_RESULT)
        self.commands.append((command, now))
        if self.state != READY:
            self.pending.append(payload)
            return
        if not self.out:
            try:
                sent = self.sock.send(payload)  # type: ignore[union-attr]
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except OSError as exc:
                raise rexc.ConnectionError(f"{self.node.address}: {exc}") from None
            if sent == len(payload):
                return
            payload = payload[sent:]
        self.out += payload
        self.flush()

    def send_optional(self, payload: bytes) -> None:
        """Queue a command whose reply nobody reads (``ASKING`` ahead of a command
        redirected by a cluster); an error in it is ignored, as a handshake nicety's."""
        self.expect.append(_OPTIONAL)
        if self.state != READY:
            self.pending.append(payload)
        else:
            self.out += payload
            self.flush()

    @property
    def wants_write(self) -> bool:
        if self.state == _CONNECTING:
            return True
        if self.state == _TLS_HANDSHAKE:
            # Polling a handshaking socket for POLLOUT when it waits to read would
            # return at once, every time: a busy loop on a stalled node.
            return self.tls_wants_write
        return bool(self.out)

    def _connected(self) -> None:
        if self.node.tls:
            assert self.node.ssl_context is not None and self.sock is not None
            self.sock = self.node.ssl_context.wrap_socket(
                self.sock,
                server_hostname=self.node.server_hostname,
                do_handshake_on_connect=False,
            )
            self.state = _TLS_HANDSHAKE
            self._tls_step()
        else:
            self._ready()

    def _ready(self) -> None:
        self.state = READY
        if self.pending:
            self.out += b"".join(self.pending)
            self.pending.clear()
        self.flush()

    def _tls_step(self) -> None:
        # An original SSLSocket: under gevent not an instance of the patched ssl.SSLSocket.
        sock = cast(ssl.SSLSocket, self.sock)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.tls_wants_write = False
            return
        except ssl.SSLWantWriteError:
            self.tls_wants_write = True
            return
        except ssl.SSLError as exc:
            raise rexc.ConnectionError(
                f"{self.node.address}: TLS handshake failed: {exc}"
            ) from None
        self._ready()

    def advance(self) -> None:
        """Move connection set-up along, or write what is queued."""
        assert self.sock is not None
        if self.state == _CONNECTING:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.node.forget_address()
                raise rexc.ConnectionError(f"{self.node.address}: {os.strerror(err)}")
            try:
                self.sock.getpeername()
            except OSError:
                return  # not connected yet (asked before poll said writable)
            self._connected()
        elif self.state == _TLS_HANDSHAKE:
            self._tls_step()
        else:
            self.flush()

    def flush(self) -> None:
        assert self.sock is not None
        try:
            while self.out:
                sent = self.sock.send(self.out)
                del self.out[:sent]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError as exc:
            raise rexc.ConnectionError(f"{self.node.address}: {exc}") from None

    def read(self) -> list[object]:
        """Read what has arrived; return the replies the round waits for (usually one).

        Raises ``redis.ConnectionError`` when the node hung up or the handshake failed.
        """
        sock = self.sock
        assert sock is not None
        if self.state != READY:
            self.advance()
            if self.state != READY:
                return []
        while True:
            try:
                chunk = sock.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError as exc:
                raise rexc.ConnectionError(f"{self.node.address}: {exc}") from None
            if not chunk:
                raise rexc.ConnectionError(f"{self.node.address}: connection closed by server")
            if (
                not self.inbuf
                and len(self.expect) == 1
                and self.expect[0] == _RESULT
                and chunk[0] == 0x3A  # ':' an integer reply, the usual answer
                and chunk.find(b"\r\n") == len(chunk) - 2
                and not self.node.tls
            ):
                self.expect.popleft()
                self.commands.popleft()
                return [int(chunk[1:-2])]
            self.inbuf += chunk
            if len(chunk) < _READ_SIZE and not self.node.tls:
                break  # a short read drained the kernel buffer (TLS may buffer more)
        return self._take_replies()

    def _take_replies(self) -> list[object]:
        """Parse what is buffered: drop stale replies, check the handshake's."""
        results: list[object] = []
        buf = self.inbuf
        pos = 0
        while pos < len(buf) and self.expect:
            reply, pos = parse(buf, pos)
            if reply is INCOMPLETE:
                break
            tag = self.expect.popleft()
            if isinstance(reply, rexc.ReadOnlyError):
                # A replica now (a failover demoted it): find the master again.
                self.node.forget_address()
            if tag == _RESULT:
                self.commands.popleft()
                results.append(reply)
            elif tag == _STALE:
                sent = self.commands.popleft()
                if isinstance(reply, rexc.NoScriptError):
                    # Nobody waits for it, but it must still happen (a release after
                    # an operator's SCRIPT FLUSH): send it again as EVAL, in order.
                    self.out += sent[0].fallback()
                    self.expect.append(_STALE)
                    self.commands.append(sent)
            elif tag == _SETUP and isinstance(reply, rexc.RedisError):
                raise type(reply)(f"{self.node.address}: {reply}")
        del buf[:pos]
        if self.behind_since is not None and _STALE not in self.expect:
            self.behind_since = None  # caught up
        if self.out:
            self.flush()
        return results
