"""A loopback TCP proxy in front of one node, for injecting network faults.

:class:`FaultProxy` adds latency, swallows traffic, holds replies back or resets
connections, on live connections, from any thread. It speaks raw TCP (standard
library); :mod:`.server` is imported only to accept a RedisServer as its target.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import struct
import threading
import time
from collections import deque
from types import TracebackType
from typing import Callable, Literal, Optional, Union

from .ports import LOOPBACK, redis_url
from .server import STOP_TIMEOUT, RedisServer

__all__ = ["Direction", "FaultProxy", "FaultProxyFactory"]

#: Which way a :meth:`FaultProxy.delay` applies.
Direction = Literal["both", "to_server", "to_client"]

# Stop reading from a side while this much is queued toward the other (backpressure).
_QUEUE_LIMIT = 4 * 1024 * 1024
_CHUNK = 64 * 1024


class _Link:
    """One proxied connection: the client's socket, ours to the server, and the bytes
    in flight each way as (due time, chunk)."""

    def __init__(self, client: socket.socket, server: socket.socket, connected: bool) -> None:
        self.client = client
        self.server = server
        self.connected = connected  # our connect() to the server has completed
        self.to_server: deque[tuple[float, bytes]] = deque()
        self.to_client: deque[tuple[float, bytes]] = deque()
        self.eof: dict[socket.socket, bool] = {client: False, server: False}
        self.blocked: dict[socket.socket, bool] = {client: False, server: False}
        self.interest: dict[socket.socket, int] = {client: 0, server: 0}

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.server if sock is self.client else self.client

    def queue_to(self, sock: socket.socket) -> deque[tuple[float, bytes]]:
        return self.to_server if sock is self.server else self.to_client


class FaultProxy:
    """A loopback TCP proxy in front of one node, for injecting network faults.

    ``FaultProxy(server)`` or ``FaultProxy(("127.0.0.1", 6379))`` listens on a free
    loopback port (:attr:`url`) and passes bytes both ways. Every control below is
    thread-safe, has taken effect when it returns, and applies to live connections:

    - :meth:`delay`: latency added to every chunk forwarded (one way or both);
    - :meth:`blackhole`: read everything, forward nothing — a hung node; a client
      waits for its socket timeout;
    - :meth:`hold_replies` / :meth:`release_replies`: server-to-client bytes are kept
      back until released (a reply that arrives late, after the client gave up);
    - :meth:`reset`: every current connection is closed with a TCP RST;
    - :meth:`heal`: pass-through again (held replies are released).

    One background thread runs a selector loop; it sleeps in ``select`` until a
    socket is ready, a delayed chunk falls due, or a control wakes it.
    """

    def __init__(self, target: Union[RedisServer, tuple[str, int]]) -> None:
        if isinstance(target, RedisServer):
            self.target: tuple[str, int] = (target.host, target.port)
            self.password = target.password
        else:
            self.target = (target[0], int(target[1]))
            self.password = None
        self._listener = socket.create_server((LOOPBACK, 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._requests: deque[Callable[[], None]] = deque()
        self._requests_lock = threading.Lock()
        self._closed = False
        self._failure: Optional[BaseException] = None
        # Fault state: touched only by the loop thread.
        self._delays = {"to_server": 0.0, "to_client": 0.0}
        self._blackholed = False
        self._holding = False
        self._stopping = False
        self._links: list[_Link] = []
        self._thread = threading.Thread(
            target=self._run, name=f"FaultProxy-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of the proxy (with the target's password)."""
        return redis_url(self.port, self.password)

    def __repr__(self) -> str:
        return f"<FaultProxy {LOOPBACK}:{self.port} -> {self.target[0]}:{self.target[1]}>"

    # --- controls -------------------------------------------------------------------

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        """Hold every chunk read from then on ``seconds`` before forwarding it.

        ``direction``: ``"to_server"``, ``"to_client"`` or ``"both"`` (a request
        round trip then takes at least twice ``seconds``). ``delay(0)`` removes it.
        """
        if seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {seconds!r}")
        if direction not in ("both", "to_server", "to_client"):
            raise ValueError(
                f"direction must be 'both', 'to_server' or 'to_client', got {direction!r}"
            )

        def apply() -> None:
            for way in ("to_server", "to_client"):
                if direction in ("both", way):
                    self._delays[way] = float(seconds)

        self._in_loop(apply)

    def blackhole(self) -> None:
        """Forward nothing either way from now on (bytes in flight are dropped)."""

        def apply() -> None:
            self._blackholed = True
            for link in self._links:
                link.to_server.clear()
                link.to_client.clear()

        self._in_loop(apply)

    def hold_replies(self) -> None:
        """Keep server-to-client bytes back until :meth:`release_replies`."""

        def apply() -> None:
            self._holding = True

        self._in_loop(apply)

    def release_replies(self) -> None:
        """Forward the held replies and stop holding."""

        def apply() -> None:
            self._holding = False

        self._in_loop(apply)

    def reset(self) -> None:
        """Close every current connection with a TCP RST, both toward the client and
        toward the server. New connections are accepted as before."""

        def apply() -> None:
            for link in list(self._links):
                self._drop(link, abort=True)

        self._in_loop(apply)

    def heal(self) -> None:
        """Back to pass-through: no delay, no blackhole, held replies released."""

        def apply() -> None:
            self._delays = {"to_server": 0.0, "to_client": 0.0}
            self._blackholed = False
            self._holding = False

        self._in_loop(apply)

    def close(self) -> None:
        """Stop the loop and close every socket. Idempotent."""
        if self._closed:
            return

        def apply() -> None:
            self._stopping = True

        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._in_loop(apply)
            self._thread.join(STOP_TIMEOUT)
        with self._requests_lock:
            self._closed = True
        self._teardown()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # --- the loop -------------------------------------------------------------------

    def _in_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the loop thread and wait for it: the loop owns the sockets."""
        done = threading.Event()
        raised: list[BaseException] = []

        def request() -> None:
            try:
                action()
            except BaseException as error:
                raised.append(error)
            finally:
                done.set()

        with self._requests_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            self._requests.append(request)
        with contextlib.suppress(BlockingIOError):  # full: the loop is being woken already
            self._wake_writer.send(b"\0")
        while not done.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"{self!r}: its loop has died") from self._failure
        if raised:
            raise raised[0]

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        try:
            while not self._stopping:
                for key, mask in self._selector.select(self._next_timeout()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_reader:
                        self._run_requests()
                    else:
                        assert isinstance(key.fileobj, socket.socket)
                        self._service(key.data, key.fileobj, mask)
                self._flush_all()
                self._update_interest()
        except BaseException as error:
            self._failure = error
            raise
        finally:
            for link in list(self._links):
                self._drop(link, abort=True)

    def _run_requests(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._requests_lock:
                if not self._requests:
                    return
                request = self._requests.popleft()
            request()

    def _next_timeout(self) -> Optional[float]:
        # Only a delayed chunk that can go out when due sets a timeout; anything
        # else waits for a socket event or a control's wake-up (no busy loop).
        earliest: Optional[float] = None
        for link in self._links:
            candidates = []
            if link.connected and not link.blocked[link.server] and link.to_server:
                candidates.append(link.to_server[0][0])
            if not self._holding and not link.blocked[link.client] and link.to_client:
                candidates.append(link.to_client[0][0])
            for due in candidates:
                earliest = due if earliest is None else min(earliest, due)
        if earliest is None:
            return None
        return max(0.0, earliest - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the client sees a closed socket
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setblocking(False)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            status = server.connect_ex(self.target)
            if status not in (0, errno.EINPROGRESS):
                client.close()
                server.close()
                continue
            self._links.append(_Link(client, server, connected=status == 0))

    def _service(self, link: _Link, sock: socket.socket, mask: int) -> None:
        if link not in self._links:
            return  # dropped earlier in this round
        if sock is link.server and not link.connected:
            if mask & selectors.EVENT_WRITE:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self._drop(link, abort=False)  # the node is down: so is the connection
                    return
                link.connected = True
            return
        if mask & selectors.EVENT_WRITE:
            link.blocked[sock] = False
        if mask & selectors.EVENT_READ:
            try:
                chunk = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(link, abort=True)  # pass a reset on as a reset
                return
            if not chunk:
                link.eof[sock] = True
            elif not self._blackholed:
                way = "to_server" if sock is link.client else "to_client"
                link.queue_to(link.peer(sock)).append((time.monotonic() + self._delays[way], chunk))

    def _flush_all(self) -> None:
        now = time.monotonic()
        for link in list(self._links):
            if link.connected:
                self._flush(link, link.server, now)
            if not self._holding:
                self._flush(link, link.client, now)
            if link in self._links and self._finished(link):
                self._drop(link, abort=False)

    def _flush(self, link: _Link, dest: socket.socket, now: float) -> None:
        queue = link.queue_to(dest)
        while queue and queue[0][0] <= now and link in self._links:
            due, chunk = queue[0]
            try:
                sent = dest.send(chunk)
            except (BlockingIOError, InterruptedError):
                link.blocked[dest] = True
                return
            except OSError:
                self._drop(link, abort=True)
                return
            if sent < len(chunk):
                queue[0] = (due, chunk[sent:])
                link.blocked[dest] = True
                return
            queue.popleft()

    def _finished(self, link: _Link) -> bool:
        # A side that hung up is followed once what it sent has been delivered; a
        # server hanging up behind a blackhole stays unseen, as a hung node would.
        client_gone = link.eof[link.client] and not link.to_server
        server_gone = link.eof[link.server] and not link.to_client and not self._blackholed
        return client_gone or server_gone

    def _update_interest(self) -> None:
        for link in self._links:
            for sock in (link.client, link.server):
                wanted = 0
                toward_peer = link.queue_to(link.peer(sock))
                queued = sum(len(chunk) for _, chunk in toward_peer)
                connecting = sock is link.server and not link.connected
                if connecting:
                    wanted = selectors.EVENT_WRITE
                else:
                    if not link.eof[sock] and queued < _QUEUE_LIMIT:
                        wanted |= selectors.EVENT_READ
                    if link.blocked[sock]:
                        wanted |= selectors.EVENT_WRITE
                if wanted == link.interest[sock]:
                    continue
                if link.interest[sock] == 0:
                    self._selector.register(sock, wanted, link)
                elif wanted == 0:
                    self._selector.unregister(sock)
                else:
                    self._selector.modify(sock, wanted, link)
                link.interest[sock] = wanted

    def _drop(self, link: _Link, abort: bool) -> None:
        if link in self._links:
            self._links.remove(link)
        for sock in (link.client, link.server):
            if link.interest[sock]:
                self._selector.unregister(sock)
                link.interest[sock] = 0
            if abort:
                # SO_LINGER on with a zero timeout: close() sends RST, not FIN.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def _teardown(self) -> None:
        for link in list(self._links):
            self._drop(link, abort=True)
        self._selector.close()
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()


#: ``make(server or (host, port)) -> FaultProxy`` (the fixture's type).
FaultProxyFactory = Callable[[Union[RedisServer, tuple[str, int]]], FaultProxy]
