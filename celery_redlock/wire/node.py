"""One Redis master: where it is, how to greet it, and its idle connections.

``Node`` turns a URL (``redis://``, ``rediss://``, ``unix://``, or ``sentinel://``
naming Sentinels and a master name, see sentinel.py) or a ``redis.Redis`` client into
what a connection needs: the address (resolved once, again after a refusal; for a
Sentinel-managed master, asked of the Sentinels at connect and again after a refusal
or a READONLY reply, the connections to the old address dropped), the TLS context
built exactly as redis-py's ``SSLConnection`` would, and the handshake bytes. It
keeps the idle connections between rounds (``checkout`` / ``checkin``; a connection
found out of step is closed, never reused; ``finish`` lets the finisher thread read
one that still owes replies, taking it out of the pool meanwhile so that one thread
at a time reads it) and a plain redis-py client for inspection (holder, doctor, CLI),
which lock operations never use.

Fork safety is the caller's: ``reset`` drops the connections (node_set.py calls it in a
forked child). Imports connection.py, sentinel.py, unpatched.py and errors.py; must
not import node_set.py, redlock.py or Celery.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections import deque
from typing import Any, Final, Optional
from urllib.parse import urlsplit

import redis
from redis import exceptions as rexc
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from ..errors import ConfigurationError
from . import unpatched
from .cluster import ClusterSpec
from .connection import MIN_OWED_AGE, READY, Connection, handshake
from .resp import Command
from .sentinel import SentinelSpec, discover, is_sentinel_url, master_client, parse_sentinel_url

__all__ = ["DISCOVERY_BUDGET", "Node", "redact"]

#: Seconds a connect made outside a round may spend asking the Sentinels (a round
#: gives them its own deadline instead).
DISCOVERY_BUDGET: Final = 1.0


_ACCEPTED_URLS: Final = (
    "accepted: redis://[[user]:password@]host[:port][/db], rediss://... "
    "(TLS), unix:///path/to/socket[?db=N] or "
    "sentinel://[[user]:password@]host[:port][/db][;sentinel://...]?master_name=NAME "
    "or redis+cluster://[[user]:password@]host:port[;redis+cluster://...] (a Redis Cluster)"
)


def redact(url: str) -> str:
    """``url`` with its passwords replaced by ``***`` (for errors and logs)."""
    url = re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)
    return re.sub(r"([?&]sentinel_password=)[^&;]*", r"\1***", url)


def _node_kwargs(spec: object, index: int) -> dict[str, Any]:
    if is_sentinel_url(spec):
        assert isinstance(spec, str)
        sentinel = parse_sentinel_url(spec, index, redact(spec))
        return {
            "sentinel": sentinel,
            "db": sentinel.db,
            "username": sentinel.username,
            "password": sentinel.password,
        }
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
        #: The Sentinels that know where this master is (None: a fixed address).
        self.sentinel: Optional[SentinelSpec] = kwargs.pop("sentinel", None)
        #: The Redis Cluster this node is (cluster_node.py), or None: one master.
        self.cluster: Optional[ClusterSpec] = None
        self._kwargs = kwargs
        self.path: Optional[str] = kwargs.get("path")
        self.host: str = kwargs.get("host") or "localhost"
        self.port: int = int(kwargs.get("port") or 6379)
        self.db: int = int(kwargs.get("db") or 0)
        cls = kwargs.get("connection_class")
        self.tls = isinstance(cls, type) and issubclass(cls, SSLConnection)
        if cls is not None and issubclass(cls, UnixDomainSocketConnection):
            self.path = self.path or kwargs.get("path")
        if self.sentinel is not None:
            self.address = self.sentinel.address
        elif self.path:
            self.address = f"unix:{self.path}/{self.db}"
        else:
            self.address = f"{self.host}:{self.port}/{self.db}"
        self.name = name or self.address
        self.ssl_context: Optional[ssl.SSLContext] = None
        self.server_hostname: Optional[str] = None
        if self.tls:
            self.ssl_context, self.server_hostname = _ssl_settings(kwargs, index)
        #: Sent ahead of a new connection's first command (see connection.handshake).
        self.handshake = handshake(kwargs.get("username"), kwargs.get("password"), self.db)
        self._sockaddr: Optional[tuple[int, Any]] = None
        # Sentinel-managed: the master discovered, and the one just left (forget_address).
        self._master: Optional[tuple[str, int]] = None
        self._left: Optional[tuple[str, int]] = None
        self._idle: deque[Connection] = deque()
        self._client: Optional[redis.Redis] = None
        self._given_client = spec if isinstance(spec, redis.Redis) else None

    @property
    def identity(self) -> tuple[str, ...]:
        """What makes two entries the same server (for the duplicate check)."""
        if self.sentinel is not None:
            return self.sentinel.identity
        if self.path:
            return ("unix", os.path.realpath(self.path))
        host = self.host.lower()
        if host in ("localhost", "::1", "0.0.0.0"):
            host = "127.0.0.1"
        return ("tcp", host, str(self.port))

    def __repr__(self) -> str:
        return f"<Node {self.address}>"

    def client(self) -> redis.Redis:
        """A plain redis-py client for this node, for inspection (holder, doctor, CLI).

        Lock operations never use it: they go through rounds.
        """
        if self._client is None:
            if self._given_client is not None:
                self._client = self._given_client
            elif self.sentinel is not None:
                self._client = master_client(self.sentinel)
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

    def renamed_name(self, name: str) -> str:
        """``name`` as this node stores it (a Redis Cluster tags it: cluster.py)."""
        return name

    def route(self, command: Command) -> tuple[Command, Optional[int]]:
        """``command`` as this node is sent it, and the hash slot it goes to (None:
        one master serves every key)."""
        return command, None

    def _resolve(self, budget: float) -> tuple[int, Any]:
        if self.path:
            return socket.AF_UNIX, self.path
        found = self._sockaddr
        if found is None:
            host, port = self.host, self.port
            if self.sentinel is not None:
                # Raises redis.ConnectionError saying what each Sentinel answered.
                host, port = self._master = discover(self.sentinel, budget, self._left)
                self._left = None
            # Resolved once and cached: getaddrinfo blocks, and for an IP literal
            # or /etc/hosts name it is instant anyway.
            infos = unpatched.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            found = self._sockaddr = (family, sockaddr)
        return found

    @property
    def needs_discovery(self) -> bool:
        """A Sentinel-managed node whose master's address is not known yet."""
        return self.sentinel is not None and self._sockaddr is None

    def forget_address(self) -> None:
        """Resolve the host again on the next connect (it may have moved): after a
        refusal, or a READONLY reply (a master demoted to replica by a failover)."""
        if not self.path:
            self._sockaddr = None
            self._left = self._master  # a Sentinel naming it again is taken last

    def _moved(self, conn: Connection) -> bool:
        """A Sentinel-managed master's connection to where the master no longer is."""
        if self.sentinel is None:
            return False
        current = self._sockaddr
        return current is None or conn.sockaddr != current[1]

    def connect(
        self, now: float, budget: float = DISCOVERY_BUDGET, slot: Optional[int] = None
    ) -> Connection:
        """A new connection being set up. Raises ``redis.ConnectionError``.

        ``budget``: seconds the Sentinels may take to name the master, when that
        must be asked first (a round passes what is left of its deadline). ``slot``:
        the hash slot of the command it is for (``route``; only a cluster uses it).
        """
        try:
            family, sockaddr = self._resolve(budget)
        except OSError as exc:
            raise rexc.ConnectionError(f"{self.address}: cannot resolve host: {exc}") from None
        return Connection(self, family, sockaddr, now)

    def checkout(
        self,
        connect: bool,
        now: float,
        owed_age: float = MIN_OWED_AGE,
        budget: float = DISCOVERY_BUDGET,
        slot: Optional[int] = None,
    ) -> Optional[Connection]:
        """An idle connection, or a new one being set up (``None`` when ``connect`` is
        false and there is no idle one). Raises ``redis.ConnectionError``.

        ``budget``, ``slot``: see ``connect``."""
        idle = self._idle
        while True:
            try:
                conn = idle.pop()  # deque.pop / append are atomic: no lock needed
            except IndexError:
                break
            if self.sentinel is not None and self._moved(conn):
                conn.close()
            elif not conn.expect and conn.state == READY:
                return conn  # in step, nothing owed: the usual case
            elif conn.usable(now, owed_age):
                return conn
            else:
                conn.close()
        return self.connect(now, budget) if connect else None

    def take_in_step(
        self, now: float, owed_age: float, silent_after: float
    ) -> Optional[Connection]:
        """The last idle connection, when a straight round (straight.py) can use it
        as it is: set up, nothing half-written, no reply owed for longer than
        ``silent_after`` seconds (replies owed for less are read and dropped first,
        as ``checkout`` does, and one it finds unusable is closed, as there).
        Otherwise None, and a usable connection stays in the pool for ``checkout``.
        """
        idle = self._idle
        try:
            conn = idle.pop()
        except IndexError:
            return None
        if conn.state == READY:
            if conn.expect and not conn.usable(now, owed_age):
                conn.close()  # hung up, a reply not coming, a handshake refused
                return None
            if not conn.out and (not conn.expect or conn.owed_for(now) <= silent_after):
                return conn
        idle.append(conn)
        return None

    def put_back(self, conn: Connection) -> None:
        """Return a connection ``take_in_step`` gave, unused."""
        self._idle.append(conn)

    def checkin(self, conn: Connection, now: float) -> bool:
        """Take back a connection after a round: in step, or closed. True when it
        still owes replies (see ``finish_owed``)."""
        if conn.park(now) and (self.sentinel is None or not self._moved(conn)):
            self._idle.append(conn)
            return conn.owes
        conn.close()
        return False

    def idle_owing(self) -> list[Connection]:
        """The idle connections that owe replies or are being set up (a snapshot:
        rounds pop and append meanwhile)."""
        return [conn for conn in list(self._idle) if conn.owes]

    def finish(self, conn: Connection, now: float, owed_age: float) -> bool:
        """Read what idle ``conn`` owes (see ``Connection.finish``) and put it back,
        or close it; True while it still owes.

        Runs beside rounds on other threads: ``conn`` is taken out of the idle pool
        before it is read, so only one thread reads it at a time.
        """
        idle = self._idle
        try:
            idle.remove(conn)
        except ValueError:
            return False  # a round took it: that round reads it, and notes it again
        if not conn.finish(now, owed_age):
            conn.close()
            return False
        if self._idle is not idle or self._moved(conn):
            conn.close()  # reset meanwhile (close, fork), or the master moved
            return False
        idle.append(conn)
        return conn.owes

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
    context = unpatched.ssl_context()  # its sockets are never cooperative
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
