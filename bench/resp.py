"""A bare RESP2 connection over a blocking socket: no client library in the way.

Two uses: the physical floor (hand-packed ``SET k v NX PX`` then ``DEL k``, the least
any lock can do on one node) and the bench's own control connection (CONFIG
RESETSTAT, INFO, MONITOR), whose commands must be told apart from the contenders'.
Commands are packed and replies parsed by celery-redlock's own codec
(``celery_redlock.wire.resp``): only the sockets and the floor's loops are the bench's.
"""

from __future__ import annotations

import secrets
import select
import socket
from typing import Union

from celery_redlock.lock.commands import acquire_command, release_command
from celery_redlock.wire.resp import INCOMPLETE, pack, parse

__all__ = ["FloorCycle", "FloorQuorum", "LeanQuorum", "RespConnection", "pack"]


class RespConnection:
    """One TCP connection (TCP_NODELAY) to a Redis node, read with a plain buffer."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()

    @property
    def local_address(self) -> str:
        """``ip:port`` of our end, as Redis prints it in MONITOR and CLIENT LIST."""
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RespConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def call(self, *args: Union[bytes, str, int]) -> object:
        """Send one command and return its reply; an error reply raises (redis-py's
        error class for it)."""
        self.sock.sendall(pack(*args))
        reply = self.read_reply()
        if isinstance(reply, Exception):
            raise reply
        return reply

    def read_line(self) -> bytes:
        """One CRLF-terminated line, without the CRLF."""
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[: end + 2]
                return line
            self._fill()

    def read_reply(self) -> object:
        """The next reply (an error reply is returned as an exception instance)."""
        while True:
            reply, end = parse(self._buf, 0)
            if reply is not INCOMPLETE:
                del self._buf[:end]
                return reply
            self._fill()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self._buf += chunk


class FloorCycle:
    """Two bare round trips on one node: ``SET key value NX PX ttl`` then ``DEL key``.

    Blocking socket, commands packed once, replies checked by their first byte: what
    is left is the kernel, the loopback and Redis itself.
    """

    def __init__(self, host: str, port: int, key: str, value: bytes, ttl_ms: int) -> None:
        self._conn = RespConnection(host, port)
        self._sock = self._conn.sock
        self._sock.settimeout(None)  # truly blocking: no poll() before each recv
        self._set = pack(b"SET", key, value, b"NX", b"PX", ttl_ms)
        self._del = pack(b"DEL", key)

    def close(self) -> None:
        self._conn.close()

    def __call__(self) -> None:
        sock = self._sock
        sock.sendall(self._set)
        reply = sock.recv(64)
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(64)
        if reply != b"+OK\r\n":
            raise RuntimeError(f"floor: SET NX was refused: {reply!r}")
        sock.sendall(self._del)
        reply = sock.recv(64)
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(64)
        if reply != b":1\r\n":
            raise RuntimeError(f"floor: DEL deleted nothing: {reply!r}")


class FloorQuorum:
    """The multiplexed floor on N nodes: ``SET NX PX`` to every node at once, wait for
    a quorum of replies, then ``DEL`` the same way -- what a Redlock round costs with
    no client code at all. Replies left unread when a quorum answered are counted off
    by the next round (every reply here is one line).
    """

    @staticmethod
    def name(nodes: int) -> str:
        """What the tables call it on ``nodes`` nodes."""
        return f"floor: bare sockets, {nodes} nodes, quorum of {nodes // 2 + 1}"

    def __init__(
        self, addresses: list[tuple[str, int]], key: str, value: bytes, ttl_ms: int
    ) -> None:
        self._conns = [RespConnection(host, port) for host, port in addresses]
        self._socks = [conn.sock for conn in self._conns]
        self._need = len(addresses) // 2 + 1
        self._sent = [0] * len(addresses)
        self._got = [0] * len(addresses)
        self._poller = select.poll()
        self._index: dict[int, int] = {}
        for i, sock in enumerate(self._socks):
            sock.setblocking(False)
            self._poller.register(sock.fileno(), select.POLLIN)
            self._index[sock.fileno()] = i
        self._set = pack(b"SET", key, value, b"NX", b"PX", ttl_ms)
        self._del = pack(b"DEL", key)

    def close(self) -> None:
        for conn in self._conns:
            conn.close()

    def _round(self, payload: bytes) -> None:
        sent, got, socks = self._sent, self._got, self._socks
        for i, sock in enumerate(socks):
            sock.send(payload)  # a few dozen bytes: always fits the socket buffer
            sent[i] += 1
        while sum(1 for i in range(len(socks)) if got[i] >= sent[i]) < self._need:
            for fd, _ in self._poller.poll(1000):
                i = self._index[fd]
                got[i] += socks[i].recv(4096).count(b"\r\n")

    def __call__(self) -> None:
        self._round(self._set)
        self._round(self._del)


class LeanQuorum(FloorQuorum):
    """The least Python a Redlock operation needs on N nodes: the lock's own acquire
    and release scripts (``EVALSHA``, packed by celery-redlock's commands, a fresh
    token per acquire), sent to every node at once, a quorum of replies -- without
    any of the lock's rules, pools, deadlines, records or error handling.

    Between the floor (``SET``/``DEL`` packed once) and the lock: the lock's distance
    to it is client code, which a leaner path could save. Each reply must be ``:1``
    (granted, released): a refusal (a reply of several lines) or an error stops it.
    """

    def __init__(self, addresses: list[tuple[str, int]], key: str, ttl: float) -> None:
        self._key, self._ttl = key, ttl
        super().__init__(addresses, key, b"", int(ttl * 1000))
        scripts = (acquire_command((key,), "x|y", ttl, False), release_command((key,), "x|y", ttl))
        for conn in self._conns:
            conn.sock.setblocking(True)
            for command in scripts:
                conn.call(b"SCRIPT", b"LOAD", command.script.source)
            conn.sock.setblocking(False)

    def _quorum(self, payload: bytes) -> None:
        """``_round``, checking that each node's reply to ``payload`` is ``:1``."""
        sent, got, socks = self._sent, self._got, self._socks
        for i, sock in enumerate(socks):
            sock.send(payload)
            sent[i] += 1
        answered = 0
        while answered < self._need:
            for fd, _ in self._poller.poll(1000):
                i = self._index[fd]
                data = socks[i].recv(4096)
                before = got[i]
                got[i] += data.count(b"\r\n")
                if before < sent[i] <= got[i]:  # this round's reply is the last line
                    if not data.endswith(b":1\r\n") or got[i] > sent[i]:
                        raise RuntimeError(f"lean: a reply was not :1 ({data[-40:]!r})")
                    answered += 1

    def __call__(self) -> None:
        value = f"{secrets.token_urlsafe(20)}|bench:1"
        self._quorum(acquire_command((self._key,), value, self._ttl, False).payload)
        self._quorum(release_command((self._key,), value, self._ttl).payload)
