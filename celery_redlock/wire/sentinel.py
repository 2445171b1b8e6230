"""Sentinel-managed lock nodes: the ``sentinel://`` URL and finding the master.

A node URL may name Redis Sentinels and a master name instead of the master itself,
in the form kombu's Sentinel transport uses for ``broker_url`` (``;`` between the
Sentinels, the master's credentials and db on the first one)::

    sentinel://[[user]:password@]host1[:26379][/db];sentinel://host2:26380?master_name=mymaster

Query options (on any part): ``master_name`` (required), ``sentinel_username`` and
``sentinel_password`` (the Sentinels' own AUTH, kombu's ``sentinel_kwargs``); the
user and password in the URL are the master's, as in kombu.

The lock rounds find the master with ``discover``: ``SENTINEL get-master-addr-by-name``
sent to every Sentinel at once, over the interpreter's own sockets (also under
gevent/eventlet, see unpatched.py), and the first Sentinel that knows the master
wins, all under the round's deadline: a hung Sentinel costs at most what is left of
it, never a socket timeout per Sentinel (which is why redis-py's
``Sentinel.discover_master`` is not used there). node.py asks again after the master
refused a connection or answered READONLY (a demoted master). Inspection (doctor,
CLI) uses redis-py's ``Sentinel.master_for``, which follows a failover by itself.

``default_url`` builds the single default node from a ``sentinel://`` broker and
kombu's ``broker_transport_options`` (``master_name``, ``sentinel_kwargs``).

Imports resp.py, unpatched.py and errors.py; must not import node.py, node_set.py,
redlock.py or Celery.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Optional
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
from redis import exceptions as rexc
from redis.sentinel import Sentinel

from ..errors import ConfigurationError
from . import unpatched
from .resp import INCOMPLETE, pack, parse

__all__ = [
    "DEFAULT_PORT",
    "SCHEME",
    "SentinelSpec",
    "default_url",
    "discover",
    "is_sentinel_url",
    "master_client",
    "parse_sentinel_url",
]

SCHEME: Final = "sentinel://"
#: Sentinel's own port, when a URL gives none (as kombu and redis-sentinel use).
DEFAULT_PORT: Final = 26379
#: The query options a ``sentinel://`` node URL accepts.
QUERY_OPTIONS: Final = ("master_name", "sentinel_username", "sentinel_password")
#: Socket timeouts of the inspection client (doctor, CLI), in seconds.
INSPECTION_TIMEOUT: Final = 5.0

ACCEPTED: Final = (
    "accepted: sentinel://[[user]:password@]host[:port][/db][;sentinel://host[:port]...]"
    "?master_name=NAME[&sentinel_password=...&sentinel_username=...]"
)

_POLLIN: Final = unpatched.POLL_READ
_POLLOUT: Final = unpatched.POLL_WRITE


def is_sentinel_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.strip().lower().startswith(SCHEME)


@dataclass(frozen=True)
class SentinelSpec:
    """Where the Sentinels are, which master they watch, and how to greet both."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: Optional[str] = None  # the master's
    password: Optional[str] = None
    sentinel_username: Optional[str] = None
    sentinel_password: Optional[str] = None

    @property
    def address(self) -> str:
        """How errors and logs name the node: master name, Sentinels and db."""
        where = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"sentinel:{self.master_name}@{where}/{self.db}"

    @property
    def identity(self) -> tuple[str, ...]:
        """What makes two entries the same master (the duplicate check)."""
        where = sorted(f"{host.lower()}:{port}" for host, port in self.sentinels)
        return ("sentinel", self.master_name, *where)


def parse_sentinel_url(url: str, index: int = 0, shown: Optional[str] = None) -> SentinelSpec:
    """The ``SentinelSpec`` of ``nodes[index]``; ConfigurationError naming what is wrong.

    ``shown``: the URL as errors show it (passwords redacted; node.redact).
    """
    shown = url if shown is None else shown
    parts = [part.strip() for part in url.split(";") if part.strip()]
    sentinels: list[tuple[str, int]] = []
    query: dict[str, str] = {}
    first = None
    for part in parts:
        if not part.lower().startswith(SCHEME):
            raise ConfigurationError(
                f"nodes[{index}]: {shown!r}: every part between ';' must be a "
                f"sentinel:// URL; {ACCEPTED}"
            )
        try:
            split = urlsplit(part)
            port = split.port or DEFAULT_PORT
        except ValueError as exc:
            raise ConfigurationError(f"nodes[{index}]: {shown!r}: {exc}; {ACCEPTED}") from None
        if not split.hostname:
            raise ConfigurationError(f"nodes[{index}]: {shown!r} has no host; {ACCEPTED}")
        sentinels.append((split.hostname, port))
        first = first or split
        for name, values in parse_qs(split.query, keep_blank_values=True).items():
            if name not in QUERY_OPTIONS:
                raise ConfigurationError(
                    f"nodes[{index}]: {shown!r}: unknown option {name!r}; a sentinel:// "
                    f"URL accepts {', '.join(QUERY_OPTIONS)}"
                )
            query[name] = values[-1]
    assert first is not None  # a sentinel:// URL has at least one part
    master_name = query.get("master_name", "")
    if not master_name:
        raise ConfigurationError(
            f"nodes[{index}]: {shown!r} names no master: add ?master_name=NAME (the name "
            "the Sentinels monitor); for the broker's default node set "
            'broker_transport_options = {"master_name": NAME}'
        )
    # kombu reads the db from the first URL; one given on a later part counts too.
    db = next((p for p in (urlsplit(part).path.strip("/") for part in parts) if p), "")
    if db and not db.isdigit():
        raise ConfigurationError(f"nodes[{index}]: {shown!r}: the db must be a number, got {db!r}")
    return SentinelSpec(
        sentinels=tuple(sentinels),
        master_name=master_name,
        db=int(db or 0),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password is not None else None,
        sentinel_username=query.get("sentinel_username") or None,
        sentinel_password=query.get("sentinel_password") or None,
    )


def default_url(broker: str, transport_options: Mapping[str, Any]) -> str:
    """The lock node of a ``sentinel://`` broker: its Sentinels, the master named by
    ``broker_transport_options["master_name"]``, and the Sentinels' password from
    ``broker_transport_options["sentinel_kwargs"]`` (kombu's options)."""
    master_name = transport_options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ConfigurationError(
            "redlock_nodes is not set and the broker is a Sentinel URL, but "
            'broker_transport_options["master_name"] is not set: set it to the master '
            "name the Sentinels monitor (kombu needs it too), or set redlock_nodes"
        )
    query = {"master_name": master_name}
    sentinel_kwargs = transport_options.get("sentinel_kwargs") or {}
    if not isinstance(sentinel_kwargs, Mapping):
        raise ConfigurationError(
            'broker_transport_options["sentinel_kwargs"] must be a dict such as '
            f'{{"password": "..."}}, got {type(sentinel_kwargs).__name__}'
        )
    for option in ("username", "password"):
        if sentinel_kwargs.get(option):
            query[f"sentinel_{option}"] = str(sentinel_kwargs[option])
    encoded = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    parts = [part.strip() for part in broker.split(";") if part.strip()]
    return ";".join(parts) + "?" + encoded


# -- discovery in a lock round ---------------------------------------------------------


class _Asking:
    """One Sentinel being asked: a non-blocking socket and the replies it owes."""

    def __init__(self, host: str, port: int, request: bytes, replies: int) -> None:
        self.where = f"{host}:{port}"
        self.inbuf = bytearray()
        self.out = bytearray(request)
        self.owed = replies
        self.sock: Optional[socket.socket] = None
        family, _, _, _, sockaddr = unpatched.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = unpatched.socket_class()(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EALREADY):
            sock.close()
            raise OSError(err, os.strerror(err))
        self.sock = sock

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def step(self, event: int) -> Optional[object]:
        """Write what is queued, read what came; the answer once it is complete."""
        assert self.sock is not None
        try:
            if event & select.POLLOUT and self.out:
                err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                del self.out[: self.sock.send(self.out)]
            if event & _POLLIN:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("connection closed by the Sentinel")
                self.inbuf += chunk
        except BlockingIOError:
            return None  # woken early: poll again
        pos = 0
        while self.owed:
            reply, pos = parse(self.inbuf, pos)
            if reply is INCOMPLETE:
                break
            self.owed -= 1
            if isinstance(reply, rexc.RedisError):
                raise reply  # AUTH refused, or not a Sentinel
            if not self.owed:
                return reply
        del self.inbuf[:pos]
        return None


def discover(
    spec: SentinelSpec, budget: float, avoid: Optional[tuple[str, int]] = None
) -> tuple[str, int]:
    """The master's (host, port), as the first Sentinel to answer knows it.

    Every Sentinel is asked at once; gives up after ``budget`` seconds. ``avoid``: the
    address just left (it answered READONLY, or nothing): a lagging or partitioned
    Sentinel may still name it, so it is taken only when every Sentinel that answers
    in time does. Raises ``redis.ConnectionError`` saying what each Sentinel answered.
    """
    deadline = time.monotonic() + budget
    auth: list[bytes] = []
    if spec.sentinel_password is not None:
        auth.append(
            pack(b"AUTH", spec.sentinel_username, spec.sentinel_password)
            if spec.sentinel_username
            else pack(b"AUTH", spec.sentinel_password)
        )
    request = b"".join(auth) + pack(b"SENTINEL", b"get-master-addr-by-name", spec.master_name)
    errors: dict[str, str] = {}
    asking: dict[int, _Asking] = {}
    stale: Optional[tuple[str, int]] = None  # ``avoid``, named by some Sentinel
    poller = unpatched.poll()
    try:
        for host, port in spec.sentinels:
            try:
                one = _Asking(host, port, request, len(auth) + 1)
            except OSError as exc:
                errors[f"{host}:{port}"] = exc.strerror or str(exc)
                continue
            asking[one.sock.fileno()] = one  # type: ignore[union-attr]
            poller.register(one.sock, _POLLIN | _POLLOUT)
        while asking:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, event in poller.poll(math.ceil(remaining * 1000)):
                one = asking[fd]
                try:
                    answer = one.step(event)
                except (OSError, rexc.RedisError) as exc:
                    errors[one.where] = str(exc)
                    poller.unregister(fd)
                    del asking[fd]
                    one.close()
                    continue
                if answer is not None or not one.owed:
                    address = _master_address(answer)
                    if address is not None and address != avoid:
                        return address
                    if address is not None:
                        stale = address
                    else:
                        errors[one.where] = f"knows no master named {spec.master_name!r}"
                    poller.unregister(fd)
                    del asking[fd]
                    one.close()
                elif not one.out:
                    poller.modify(fd, _POLLIN)
        for one in asking.values():
            errors[one.where] = f"no answer within {budget * 1000:.0f} ms"
    finally:
        for one in asking.values():
            one.close()
    if stale is not None:
        return stale
    told = "; ".join(f"{where}: {why}" for where, why in errors.items())
    raise rexc.ConnectionError(f"{spec.address}: no Sentinel gave the master's address ({told})")


def _master_address(answer: object) -> Optional[tuple[str, int]]:
    if isinstance(answer, list) and len(answer) == 2 and all(isinstance(a, bytes) for a in answer):
        host, port = answer
        return host.decode(), int(port)
    return None  # nil: this Sentinel does not monitor a master of that name


# -- inspection (doctor, CLI) ------------------------------------------------------------


def master_client(spec: SentinelSpec, timeout: float = INSPECTION_TIMEOUT) -> redis.Redis:
    """A redis-py client for the master, through redis-py's Sentinel support (it asks
    the Sentinels again after a failover). For inspection only, never for rounds."""
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if spec.sentinel_password is not None:
        sentinel_kwargs["password"] = spec.sentinel_password
        sentinel_kwargs["username"] = spec.sentinel_username
    sentinel = Sentinel(list(spec.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        spec.master_name,
        db=spec.db,
        username=spec.username,
        password=spec.password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    return client
