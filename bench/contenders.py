"""One adapter per lock library, all driven the same way.

A contender makes a *handle* per key (the library's per-key lock object, made once,
outside the timed region, like our ``Redlock`` object) and an *op* per key that does
one non-blocking acquire and one release, raising OpFailed (counted, the run goes on)
if the lock was not won. Every
contender gets clients made with the library's defaults, as a user would write them.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import pottery
import redis
import redis_lock

from celery_redlock import QuorumUnavailable, Redlock

from .stats import Op, OpFailed

__all__ = [
    "Contender",
    "Handle",
    "LockNotWon",
    "OurRedlock",
    "Pottery",
    "PythonRedisLock",
    "RedisPyLock",
]


class LockNotWon(OpFailed):
    """A free key was not won: nobody else ever touches the bench's keys."""

    def __init__(self, detail: str) -> None:
        super().__init__("not won", detail)


def _unavailable(error: QuorumUnavailable) -> OpFailed:
    return OpFailed("QuorumUnavailable", str(error))


class Handle(Protocol):
    def acquire(self) -> None: ...
    def release(self) -> None: ...


class Contender(Protocol):
    #: Short identifier used in the JSON.
    slug: str
    #: What the table calls it.
    name: str
    #: How many Redis nodes one operation talks to.
    nodes: int

    def handle(self, key: str) -> Handle: ...
    def op(self, key: str) -> Op: ...
    def close(self) -> None: ...


def _op_from_handle(handle: Handle) -> Op:
    acquire, release = handle.acquire, handle.release

    def op() -> None:
        acquire()
        release()

    return op


class OurRedlock:
    """celery-redlock: ``Redlock(urls).acquire(key, blocking=False)`` + ``lease.release()``.

    One ``Redlock`` object per contender, shared by every thread (it is thread-safe).
    """

    def __init__(self, urls: list[str], ttl: float, node_timeout: float) -> None:
        self.nodes = len(urls)
        self.slug = f"celery_redlock_{self.nodes}"
        plural = "s" if self.nodes > 1 else ""
        self.name = f"celery-redlock ({self.nodes} node{plural})"
        self.redlock = Redlock(urls, ttl=ttl, node_timeout=node_timeout)

    def handle(self, key: str) -> Handle:
        return _OurHandle(self.redlock, key)

    def op(self, key: str) -> Op:
        acquire = self.redlock.acquire

        def op() -> None:
            try:
                lease = acquire(key, blocking=False)
                if lease is None:
                    raise LockNotWon(f"{self.name}: {key!r}")
                lease.release()
            except QuorumUnavailable as error:  # a loaded machine missed node_timeout
                raise _unavailable(error) from None

        return op

    def close(self) -> None:
        self.redlock.close()


class _OurHandle:
    def __init__(self, redlock: Redlock, key: str) -> None:
        self._redlock = redlock
        self._key = key
        self._lease: Any = None

    def acquire(self) -> None:
        try:
            self._lease = self._redlock.acquire(self._key, blocking=False)
        except QuorumUnavailable as error:
            raise _unavailable(error) from None
        if self._lease is None:
            raise LockNotWon(f"celery-redlock: {self._key!r}")

    def release(self) -> None:
        try:
            self._lease.release()
        except QuorumUnavailable as error:  # a loaded machine missed node_timeout
            raise _unavailable(error) from None


class _BoolHandle:
    """A library lock object whose ``acquire(blocking=False)`` returns a bool."""

    def __init__(self, name: str, lock: Any) -> None:
        self._name = name
        self._lock = lock

    def acquire(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise LockNotWon(self._name)

    def release(self) -> None:
        self._lock.release()


class _LibraryContender:
    slug = ""
    name = ""
    nodes = 1

    def __init__(self, make_lock: Callable[[str], Any], clients: list[redis.Redis]) -> None:
        self._make_lock = make_lock
        self._clients = clients

    def handle(self, key: str) -> Handle:
        return _BoolHandle(f"{self.name}: {key!r}", self._make_lock(key))

    def op(self, key: str) -> Op:
        return _op_from_handle(self.handle(key))

    def close(self) -> None:
        for client in self._clients:
            client.close()


class RedisPyLock(_LibraryContender):
    """redis-py's ``Redis(...).lock(key, timeout=ttl)``: one node."""

    slug = "redis_py"
    name = "redis-py Lock (1 node)"
    nodes = 1

    def __init__(self, host: str, port: int, ttl: float) -> None:
        client = redis.Redis(host=host, port=port)
        super().__init__(lambda key: client.lock(key, timeout=ttl), [client])


class Pottery(_LibraryContender):
    """pottery's ``Redlock(key=..., masters={Redis, ...}, auto_release_time=ttl)``."""

    slug = "pottery_5"
    name = "pottery Redlock (5 nodes)"

    def __init__(self, addresses: list[tuple[str, int]], ttl: float) -> None:
        clients = [redis.Redis(host=host, port=port) for host, port in addresses]
        masters = frozenset(clients)
        self.nodes = len(clients)
        #: redis-py's default (5 s in redis-py 8): how long a thread pottery left behind
        #: on a hung node waits before giving up.
        self.socket_timeout: object = clients[0].connection_pool.connection_kwargs.get(
            "socket_timeout"
        )
        self.slug = f"pottery_{self.nodes}"
        self.name = f"pottery Redlock ({self.nodes} nodes)"
        super().__init__(
            lambda key: pottery.Redlock(key=key, masters=masters, auto_release_time=ttl),
            clients,
        )


class PythonRedisLock(_LibraryContender):
    """python-redis-lock's ``redis_lock.Lock(conn, name, expire=ttl)``: one node."""

    slug = "python_redis_lock"
    name = "python-redis-lock (1 node)"
    nodes = 1

    def __init__(self, host: str, port: int, ttl: float) -> None:
        client = redis.Redis(host=host, port=port)
        expire = max(1, round(ttl))  # whole seconds: it sets the key with EX
        super().__init__(lambda key: redis_lock.Lock(client, key, expire=expire), [client])
