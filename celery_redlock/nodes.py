"""Connecting to N Redis nodes and talking to all of them at once.

A lock operation is one *round*: the same command goes to every node, then the
replies are read as they arrive -- one ``poll`` over all the sockets, from one thread,
under one deadline shared by the whole round. The round stops as soon as its outcome
is decided (a quorum said yes, or too many said no), so a hung node costs at most the
round's deadline, never a deadline per node, and usually nothing at all.

Why not redis-py's ``Connection`` for the round: its ``connect()`` runs an on-connect
handshake (CLIENT SETINFO, AUTH, SELECT) with blocking socket timeouts, node after
node, so one hung node would eat its own timeouts before the next node is even
contacted, and a half-read reply leaves the connection out of step. Here the
handshake is pipelined in front of the first command on a non-blocking socket and
counts against the round's deadline, and every connection knows how many replies it
still owes: a reply we stopped waiting for is read and dropped by the next round on
that connection (in order, so a late SET is always followed by our late DEL), and a
connection that cannot be brought back in step is closed. redis-py still parses the
URLs, holds the TLS settings and provides the error classes.

Scripts are loaded once per connection, pipelined into the handshake (SCRIPT LOAD),
so EVALSHA never misses after a node restart; NOSCRIPT (an operator's SCRIPT FLUSH)
falls back to EVAL within the same round.

Fork safety: a process that finds itself forked drops the parent's connections.

This module must not import Celery, redlock.py or task code.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import select
import socket
import ssl
import time
from collections import deque
from typing import Any, Callable, Final, Optional, Sequence, Union
from urllib.parse import urlsplit

import redis
from redis import exceptions as rexc
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from .errors import ConfigurationError
from .scripts import ALL_SCRIPTS, Script

__all__ = ["NOT_AWAITED", "Command", "Node", "NodeSet", "pack"]


#: Replies a connection may still owe before it is closed instead of reused: a node
#: that stopped answering (hung) should not collect an unbounded backlog. A slow but
#: live node never gets near it: owed replies are drained whenever the connection is
#: taken. Closing drops what the node has not read yet, so this is for hung nodes only.
MAX_OWED_REPLIES: Final = 256
#: A connection still connecting after this long is dropped and started afresh.
MAX_CONNECTING: Final = 5.0
#: A connection whose oldest owed reply is older than this many round deadlines (and
#: at least MIN_OWED_AGE seconds) is closed, not reused: a reply that never comes
#: (bytes dropped by a proxy, a node hung for good) would otherwise keep every later
#: round on it one reply behind.
OWED_AGE_ROUNDS: Final = 10
MIN_OWED_AGE: Final = 0.5
CLIENT_NAME: Final = b"celery-redlock"

_READ_SIZE: Final = 65536
_POLLIN: Final = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLLOUT: Final = select.POLLOUT | select.POLLERR | select.POLLHUP

# What the reply we are waiting for means (one tag per command sent, in order).
_RESULT: Final = 0  # the round's answer
_STALE: Final = 1  # an answer nobody waits for any more: read and drop
_SETUP: Final = 2  # handshake (AUTH, SELECT): an error makes the connection unusable
_OPTIONAL: Final = 3  # handshake nicety (CLIENT SETNAME, SCRIPT LOAD): errors ignored

_CONNECTING: Final = 0
_TLS_HANDSHAKE: Final = 1
_READY: Final = 2


def pack(*args: Union[bytes, str, int]) -> bytes:
    """RESP-encode one command."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


_EVALSHA_PREFIXES: dict[tuple[str, int, int], bytes] = {}


def _evalsha_prefix(script: Script, numkeys: int, argc: int) -> bytes:
    """``*N EVALSHA <sha> <numkeys>`` packed once per script and shape (hot path)."""
    shape = (script.sha, numkeys, argc)
    prefix = _EVALSHA_PREFIXES.get(shape)
    if prefix is None:
        prefix = pack(b"EVALSHA", script.sha, numkeys)
        prefix = b"*%d" % (3 + numkeys + argc) + prefix[prefix.index(b"\r\n") :]
        _EVALSHA_PREFIXES[shape] = prefix
    return prefix


class Command:
    """One script call, packed once and sent to every node of a round."""

    __slots__ = ("_args", "_keys", "payload", "script")

    def __init__(
        self, script: Script, keys: Sequence[str], args: Sequence[Union[bytes, str, int]]
    ) -> None:
        self.script = script
        self._keys = tuple(keys)
        self._args = tuple(args)
        body = pack(*self._keys, *self._args)
        self.payload = (
            _evalsha_prefix(script, len(self._keys), len(self._args))
            + body[body.index(b"\r\n") + 2 :]
        )

    def fallback(self) -> bytes:
        """The same call as EVAL, for a node that answered NOSCRIPT."""
        return pack(b"EVAL", self.script.source, len(self._keys), *self._keys, *self._args)


# -- replies ------------------------------------------------------------------------

_INCOMPLETE: Final = object()


class _NotAwaited:
    """A node whose reply the round stopped waiting for: the outcome was decided."""

    def __repr__(self) -> str:
        return "NOT_AWAITED"


#: In a round's results: the outcome was decided before this node answered.
NOT_AWAITED: Final = _NotAwaited()

_ERROR_CLASSES: Final[dict[str, type[rexc.RedisError]]] = {
    "NOSCRIPT": rexc.NoScriptError,
    "NOAUTH": rexc.AuthenticationError,
    "WRONGPASS": rexc.AuthenticationError,
    "NOPERM": rexc.NoPermissionError,
    "READONLY": rexc.ReadOnlyError,
    "LOADING": rexc.BusyLoadingError,
    "OOM": rexc.OutOfMemoryError,
}


def _error(line: bytes) -> rexc.RedisError:
    text = line.decode("utf-8", "replace")
    cls = _ERROR_CLASSES.get(text.split(" ", 1)[0], rexc.ResponseError)
    return cls(text)


def _parse(buf: bytearray, pos: int) -> tuple[object, int]:
    """Parse one RESP2 reply at ``pos``; ``(_INCOMPLETE, pos)`` when more bytes are needed.

    Errors come back as exception *instances* (they are data here, not control flow).
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    nxt = end + 2
    if kind == 0x3A:  # ':' integer
        return int(line), nxt
    if kind == 0x24:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, nxt
        if len(buf) < nxt + size + 2:
            return _INCOMPLETE, pos
        return bytes(buf[nxt : nxt + size]), nxt + size + 2
    if kind == 0x2A:  # '*' array
        count = int(line)
        if count < 0:
            return None, nxt
        items: list[object] = []
        for _ in range(count):
            item, nxt = _parse(buf, nxt)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, nxt
    if kind == 0x2B:  # '+' simple string
        return line, nxt
    if kind == 0x2D:  # '-' error
        return _error(line), nxt
    raise rexc.InvalidResponse(f"unexpected reply type {chr(kind)!r}")


# -- nodes --------------------------------------------------------------------------


_ACCEPTED_URLS: Final = (
    "accepted: redis://[[user]:password@]host[:port][/db], rediss://... "
    "(TLS) or unix:///path/to/socket[?db=N]"
)


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for errors and logs)."""
    return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)


def _node_kwargs(spec: object, index: int) -> dict[str, Any]:
    if isinstance(spec, str):
        shown = redact(spec)
        try:
            kwargs = parse_url(spec)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            detail = str(exc).replace(spec, shown)
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r} is not a Redis URL ({detail}); {_ACCEPTED_URLS}"
            ) from None
        if "path" not in kwargs and not kwargs.get("host"):
            raise ConfigurationError(f"nodes[{index}]: {shown!r} has no host; {_ACCEPTED_URLS}")
        db = urlsplit(spec).path.strip("/")
        if not spec.startswith("unix:") and db and not db.isdigit():
            # redis-py drops a path it cannot read as a db and would lock in db 0.
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: the db must be a number, got {db!r}"
            )
        return dict(kwargs)
    if isinstance(spec, redis.Redis):
        pool = spec.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["connection_class"] = pool.connection_class
        return kwargs
    raise ConfigurationError(
        f"nodes[{index}]: expected a Redis URL (str) or a redis.Redis client, "
        f"got {type(spec).__name__}"
    )


class Node:
    """One Redis master: where it is, how to greet it, and its idle connections."""

    def __init__(self, spec: object, index: int = 0, name: Optional[str] = None) -> None:
        kwargs = _node_kwargs(spec, index)
        self._kwargs = kwargs
        self.path: Optional[str] = kwargs.get("path")
        self.host: str = kwargs.get("host") or "localhost"
        self.port: int = int(kwargs.get("port") or 6379)
        self.db: int = int(kwargs.get("db") or 0)
        cls = kwargs.get("connection_class")
        self.tls = isinstance(cls, type) and issubclass(cls, SSLConnection)
        if cls is not None and issubclass(cls, UnixDomainSocketConnection):
            self.path = self.path or kwargs.get("path")
        if self.path:
            self.address = f"unix:{self.path}/{self.db}"
        else:
            self.address = f"{self.host}:{self.port}/{self.db}"
        self.name = name or self.address
        self._ssl_context: Optional[ssl.SSLContext] = None
        self._server_hostname: Optional[str] = None
        if self.tls:
            self._ssl_context, self._server_hostname = _ssl_settings(kwargs, index)
        self._handshake, self._handshake_tags = self._make_handshake(kwargs)
        self._sockaddr: Optional[tuple[int, Any]] = None
        self._idle: deque[_Connection] = deque()
        self._client: Optional[redis.Redis] = None
        self._given_client = spec if isinstance(spec, redis.Redis) else None

    @property
    def identity(self) -> tuple[str, ...]:
        """What makes two entries the same server (for the duplicate check)."""
        if self.path:
            return ("unix", os.path.realpath(self.path))
        host = self.host.lower()
        if host in ("localhost", "::1", "0.0.0.0"):
            host = "127.0.0.1"
        return ("tcp", host, str(self.port))

    def __repr__(self) -> str:
        return f"<Node {self.address}>"

    @staticmethod
    def _make_handshake(kwargs: dict[str, Any]) -> tuple[bytes, tuple[int, ...]]:
        parts: list[bytes] = []
        tags: list[int] = []
        password = kwargs.get("password")
        username = kwargs.get("username")
        if password is not None:
            parts.append(pack(b"AUTH", username, password) if username else pack(b"AUTH", password))
            tags.append(_SETUP)
        db = int(kwargs.get("db") or 0)
        if db:
            parts.append(pack(b"SELECT", db))
            tags.append(_SETUP)
        parts.append(pack(b"CLIENT", b"SETNAME", CLIENT_NAME))
        tags.append(_OPTIONAL)
        for script in ALL_SCRIPTS:
            parts.append(pack(b"SCRIPT", b"LOAD", script.source))
            tags.append(_OPTIONAL)
        return b"".join(parts), tuple(tags)

    def client(self) -> redis.Redis:
        """A plain redis-py client for this node, for inspection (holder, doctor, CLI).

        Lock operations never use it: they go through rounds.
        """
        if self._client is None:
            if self._given_client is not None:
                self._client = self._given_client
            else:
                kwargs = {k: v for k, v in self._kwargs.items() if k != "connection_class"}
                pool = redis.ConnectionPool(
                    connection_class=self._kwargs.get("connection_class", redis.Connection),
                    socket_timeout=5.0,
                    socket_connect_timeout=5.0,
                    **kwargs,
                )
                self._client = redis.Redis(connection_pool=pool)
        return self._client

    def _resolve(self) -> tuple[int, Any]:
        if self.path:
            return socket.AF_UNIX, self.path
        if self._sockaddr is None:
            # Resolved once and cached: getaddrinfo blocks, and for an IP literal
            # or /etc/hosts name it is instant anyway.
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            self._sockaddr = (family, sockaddr)
        return self._sockaddr

    def forget_address(self) -> None:
        """Resolve the host again on the next connect (it may have moved)."""
        if not self.path:
            self._sockaddr = None

    def connect(self, now: float) -> _Connection:
        """A new connection being set up. Raises ``redis.ConnectionError``."""
        try:
            family, sockaddr = self._resolve()
        except OSError as exc:
            raise rexc.ConnectionError(f"{self.address}: cannot resolve host: {exc}") from None
        return _Connection(self, family, sockaddr, now)

    def checkout(
        self, connect: bool, now: float, owed_age: float = MIN_OWED_AGE
    ) -> Optional[_Connection]:
        """An idle connection, or a new one being set up (``None`` when ``connect`` is
        false and there is no idle one). Raises ``redis.ConnectionError``."""
        idle = self._idle
        while True:
            try:
                conn = idle.pop()  # deque.pop / append are atomic: no lock needed
            except IndexError:
                break
            if conn.state != _READY:
                if now - conn.born < MAX_CONNECTING:
                    return conn
                conn.close()
                continue
            if conn.expect:
                # Replies owed from rounds that stopped at quorum: drop the ones that
                # have arrived now, so a merely slow node never piles up a backlog.
                try:
                    conn.read()
                except rexc.RedisError:
                    conn.close()  # the node hung up meanwhile (restart, timeout)
                    continue
                if conn.owed_since is not None and now - conn.owed_since > owed_age:
                    conn.close()  # those replies are not coming: start afresh
                    continue
            return conn
        return self.connect(now) if connect else None

    def checkin(self, conn: _Connection, now: float) -> None:
        """Take back a connection after a round: in step, or closed."""
        if conn.sock is None or len(conn.expect) > MAX_OWED_REPLIES:
            conn.close()
            return
        if conn.state != _READY:
            # Still connecting: nothing of the round's command went out, so drop it
            # and keep the handshake going; the next round picks it up.
            conn.pending = None
            while conn.expect and conn.expect[-1] == _RESULT:
                conn.expect.pop()
                conn.commands.pop()
        elif conn.out:
            conn.close()  # a half-written command: the stream is out of step
            return
        elif conn.expect:
            # Replies we stopped waiting for are still owed: read and drop them first.
            conn.expect = deque(_STALE if t == _RESULT else t for t in conn.expect)
            if conn.owed_since is None:
                conn.owed_since = now
        self._idle.append(conn)

    def reset(self) -> None:
        """Forget every idle connection (after a fork they belong to the parent)."""
        idle, self._idle = self._idle, deque()
        for conn in idle:
            conn.close()
        self._client = self._given_client


def _ssl_settings(kwargs: dict[str, Any], index: int) -> tuple[ssl.SSLContext, Optional[str]]:
    """Build the TLS context exactly as redis-py's SSLConnection would."""
    conn_kwargs = {k: v for k, v in kwargs.items() if k != "connection_class"}
    try:
        model = SSLConnection(**conn_kwargs)
    except (TypeError, ValueError, rexc.RedisError) as exc:
        raise ConfigurationError(
            f"nodes[{index}]: invalid TLS settings ({exc}); ssl_cert_reqs accepts "
            "none, optional or required"
        ) from None
    context = ssl.create_default_context()
    context.check_hostname = bool(model.check_hostname)
    context.verify_mode = model.cert_reqs
    try:
        if model.certfile or model.keyfile:
            context.load_cert_chain(
                certfile=model.certfile, keyfile=model.keyfile, password=model.certificate_password
            )
        if model.ca_certs is not None or model.ca_path is not None or model.ca_data is not None:
            context.load_verify_locations(
                cafile=model.ca_certs, capath=model.ca_path, cadata=model.ca_data
            )
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(
            f"{name}={value}"
            for name, value in (
                ("ssl_ca_certs", model.ca_certs),
                ("ssl_ca_path", model.ca_path),
                ("ssl_certfile", model.certfile),
                ("ssl_keyfile", model.keyfile),
            )
            if value
        )
        raise ConfigurationError(
            f"nodes[{index}]: cannot load the TLS files ({files}): {exc}"
        ) from None
    if model.ssl_min_version is not None:
        context.minimum_version = model.ssl_min_version
    if model.ssl_ciphers:
        context.set_ciphers(model.ssl_ciphers)
    return context, model.host


class _Connection:
    """A non-blocking socket to one node and the replies it still owes, in order."""

    __slots__ = (
        "born",
        "commands",
        "expect",
        "inbuf",
        "node",
        "out",
        "owed_since",
        "pending",
        "sock",
        "state",
        "tls_wants_write",
    )

    def __init__(self, node: Node, family: int, sockaddr: Any, now: float) -> None:
        self.node = node
        self.born = now
        self.inbuf = bytearray()
        self.out = bytearray(node._handshake)
        self.expect: deque[int] = deque(node._handshake_tags)
        # The command behind each _RESULT / _STALE tag, in the same order: a reply
        # found to be NOSCRIPT after the round stopped waiting is resent as EVAL.
        self.commands: deque[Command] = deque()
        self.owed_since: Optional[float] = None  # when replies nobody waits for began
        self.pending: Optional[bytes] = None  # the round's command, sent once ready
        self.tls_wants_write = False  # what a TLS handshake in progress waits for
        sock = socket.socket(family, socket.SOCK_STREAM)
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

    def send(self, payload: bytes, command: Command) -> None:
        """Queue one command whose reply the round waits for; write it if we can."""
        self.expect.append(_RESULT)
        self.commands.append(command)
        if self.state != _READY:
            self.pending = payload
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
            assert self.node._ssl_context is not None and self.sock is not None
            self.sock = self.node._ssl_context.wrap_socket(
                self.sock,
                server_hostname=self.node._server_hostname,
                do_handshake_on_connect=False,
            )
            self.state = _TLS_HANDSHAKE
            self._tls_step()
        else:
            self._ready()

    def _ready(self) -> None:
        self.state = _READY
        if self.pending is not None:
            self.out += self.pending
            self.pending = None
        self.flush()

    def _tls_step(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self.sock.do_handshake()
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
        if self.state != _READY:
            self.advance()
            if self.state != _READY:
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
        results: list[object] = []
        buf = self.inbuf
        pos = 0
        while pos < len(buf) and self.expect:
            reply, pos = _parse(buf, pos)
            if reply is _INCOMPLETE:
                break
            tag = self.expect.popleft()
            if tag == _RESULT:
                self.commands.popleft()
                results.append(reply)
            elif tag == _STALE:
                command = self.commands.popleft()
                if isinstance(reply, rexc.NoScriptError):
                    # Nobody waits for it, but it must still happen (a release after
                    # an operator's SCRIPT FLUSH): send it again as EVAL, in order.
                    self.out += command.fallback()
                    self.expect.append(_STALE)
                    self.commands.append(command)
            elif tag == _SETUP and isinstance(reply, rexc.RedisError):
                raise type(reply)(f"{self.node.address}: {reply}")
        del buf[:pos]
        if self.owed_since is not None and _STALE not in self.expect:
            self.owed_since = None  # caught up
        if self.out:
            self.flush()
        return results


# -- rounds -------------------------------------------------------------------------

# This process's pid, refreshed after a fork (a getpid per round is measurable).
_PID = os.getpid()


def _after_fork() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class NodeSet:
    """N nodes and the round: one command to all of them, replies as they arrive."""

    def __init__(self, specs: Sequence[object], clock: Callable[[], float] = time.monotonic):
        self.nodes = [Node(spec, i) for i, spec in enumerate(specs)]
        seen: dict[tuple[str, ...], int] = {}
        for i, node in enumerate(self.nodes):
            if node.identity in seen:
                raise ConfigurationError(
                    f"nodes: {node.address} is listed twice (nodes[{seen[node.identity]}] "
                    f"and nodes[{i}]); Redlock needs N independent Redis masters"
                )
            seen[node.identity] = i
        self._clock = clock
        self._pid = _PID

    def __len__(self) -> int:
        return len(self.nodes)

    def _check_fork(self) -> None:
        if self._pid != _PID:
            for node in self.nodes:
                node.reset()
            self._pid = _PID

    def close(self) -> None:
        for node in self.nodes:
            node.reset()

    def round(
        self,
        command: Command,
        timeout: float,
        is_yes: Callable[[object], bool] = bool,
        enough_yes: Optional[int] = None,
        enough_no: Optional[int] = None,
        wait: bool = True,
    ) -> list[object]:
        """Send ``command`` to every node and collect one reply per node.

        Stops when ``enough_yes`` replies satisfy ``is_yes`` or ``enough_no`` do not
        (errors count as no), when every node has answered, or at ``timeout``
        seconds. The result has one entry per node: the reply, ``NOT_AWAITED`` when
        the outcome was decided before that node answered, or an exception instance
        (``redis.ConnectionError``, ``redis.TimeoutError`` for a node that did not
        answer in time, ``redis.ResponseError`` for a script error).

        ``wait=False`` only writes to nodes with an idle, ready connection and returns
        at once (a failed acquire's clean-up must not wait on hung nodes); their
        replies are read and dropped by the next round on the same connection, which
        also keeps the clean-up in order behind the command it undoes.
        """
        self._check_fork()
        count = len(self.nodes)
        enough_yes = count + 1 if enough_yes is None else enough_yes
        enough_no = count + 1 if enough_no is None else enough_no
        now = self._clock()
        deadline = now + timeout
        results: list[object] = [_INCOMPLETE] * count
        conns: list[Optional[_Connection]] = [None] * count
        no = 0
        for i, node in enumerate(self.nodes):
            try:
                conn = node.checkout(wait, now, max(MIN_OWED_AGE, OWED_AGE_ROUNDS * timeout))
                if conn is None:
                    continue
                conns[i] = conn
                try:
                    conn.send(command.payload, command)
                except rexc.ConnectionError:
                    if conn.born == now or not wait:
                        raise
                    # A pooled connection the node dropped (restart, idle timeout):
                    # once more on a fresh one, within the same round.
                    conn.close()
                    conns[i] = conn = node.connect(now)
                    conn.send(command.payload, command)
            except (rexc.RedisError, OSError) as exc:
                results[i] = (
                    exc
                    if isinstance(exc, rexc.RedisError)
                    else rexc.ConnectionError(f"{node.address}: {exc}")
                )
                if conns[i] is not None:
                    conns[i].close()  # type: ignore[union-attr]
                    conns[i] = None
                no += 1
        timed_out = wait and self._collect(
            command, conns, results, deadline, is_yes, enough_yes, enough_no, no
        )
        for i, conn in enumerate(conns):
            if conn is not None:
                conn.node.checkin(conn, now)
            if results[i] is _INCOMPLETE:
                results[i] = (
                    rexc.TimeoutError(
                        f"{self.nodes[i].address}: no reply within {timeout * 1000:.0f} ms"
                    )
                    if timed_out
                    else NOT_AWAITED
                )
        return results

    def _collect(
        self,
        command: Command,
        conns: list[Optional[_Connection]],
        results: list[object],
        deadline: float,
        is_yes: Callable[[object], bool],
        enough_yes: int,
        enough_no: int,
        no: int,
    ) -> bool:
        """Read replies until decided (False) or the deadline passed (True)."""
        yes = 0
        started = self._clock()
        poller = select.poll()
        by_fd: dict[int, int] = {}
        for i, conn in enumerate(conns):
            if conn is not None:
                fd = conn.fileno()
                by_fd[fd] = i
                poller.register(fd, _POLLIN | (_POLLOUT if conn.wants_write else 0))
        final = False
        while by_fd and yes < enough_yes and no < enough_no and not final:
            remaining = deadline - self._clock()
            # Past the deadline, look once more without waiting: a thread that woke
            # late (GIL, busy CPU) must not ignore replies already in the sockets.
            final = remaining <= 0
            events = poller.poll(0 if final else math.ceil(remaining * 1000))
            for fd, event in events:
                i = by_fd.get(fd, -1)
                conn = conns[i] if i >= 0 else None
                if conn is None:
                    continue
                try:
                    if event & select.POLLOUT:
                        conn.advance()
                    replies = conn.read() if event & _POLLIN or conn.state != _READY else []
                except (rexc.RedisError, OSError) as exc:
                    poller.unregister(fd)
                    del by_fd[fd]
                    conn.close()
                    if isinstance(exc, (rexc.ConnectionError, OSError)) and conn.born < started:
                        # A pooled connection the node had dropped (restart, idle
                        # timeout): once more on a fresh one, within this round. The
                        # scripts are idempotent for our own value, so a resend is safe.
                        try:
                            fresh = conn.node.connect(started)
                            fresh.send(command.payload, command)
                        except rexc.RedisError as again:
                            exc = again
                        else:
                            conns[i] = fresh
                            by_fd[fresh.fileno()] = i
                            poller.register(fresh.fileno(), _POLLIN | _POLLOUT)
                            continue
                    results[i] = (
                        exc
                        if isinstance(exc, rexc.RedisError)
                        else (rexc.ConnectionError(f"{conn.node.address}: {exc}"))
                    )
                    no += 1
                    continue
                for reply in replies:
                    if isinstance(reply, rexc.NoScriptError):
                        conn.send(command.fallback(), command)  # the node forgot our scripts
                        continue
                    results[i] = reply
                    if is_yes(reply):
                        yes += 1
                    else:
                        no += 1
                if results[i] is not _INCOMPLETE:
                    poller.unregister(fd)
                    del by_fd[fd]
                elif conn.sock is not None:
                    poller.modify(fd, _POLLIN | (_POLLOUT if conn.wants_write else 0))
        return final and bool(by_fd)
