"""Library hand-off latency, for ``python -m bench scale``: how long after a holder in
one process starts its ``release()`` does a waiter blocked in ``acquire(key,
blocking=True, timeout=...)`` in another process get the lock.

Public API only (``Redlock.acquire`` and ``Lease.release``), so the same code measures
whatever ``acquire`` does while it waits: polling today, a wake-up on release once one
exists. One call, :func:`measure`, is what ``bench/scale.py`` runs; beside ours it
measures python-redis-lock (one node, BLPOP on release) the same way, for scale.

Per sample: the holder (a spawned process) acquires the key and says so; the waiter
(this process) tells it that it is about to block and calls ``acquire``; the holder
waits a random 20-60 ms (so the waiter is well into its wait, at a random phase of any
poll), takes ``time.monotonic_ns()`` and releases, and sends that stamp. The latency
is the waiter's ``monotonic_ns()`` right after ``acquire`` returned minus the stamp
(CLOCK_MONOTONIC: one clock for both processes).
"""

from __future__ import annotations

import multiprocessing
import random
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional, Protocol

import redis

from celery_redlock import Redlock

from .stats import percentile

__all__ = ["LOCKS", "measure"]

TTL = 10.0
#: How long the waiter may block; far above any hand-off, far below the TTL.
WAIT_TIMEOUT = 5.0


class _Lock(Protocol):
    def acquire(self) -> Optional[Callable[[], object]]: ...  # the release, or None
    def close(self) -> None: ...


class _Ours:
    """celery-redlock: ``Redlock(urls).acquire(key, blocking=True, timeout=...)``."""

    def __init__(self, urls: list[str], key: str) -> None:
        self._redlock = Redlock(urls, ttl=TTL)
        self._key = key

    def acquire(self) -> Optional[Callable[[], object]]:
        lease = self._redlock.acquire(self._key, blocking=True, timeout=WAIT_TIMEOUT)
        return None if lease is None else lease.release

    def close(self) -> None:
        self._redlock.close()


class _PythonRedisLock:
    """python-redis-lock on the first node: a waiter blocks in BLPOP on a signal list
    that the release pushes to."""

    def __init__(self, urls: list[str], key: str) -> None:
        import redis_lock  # the bench extra

        self._make = redis_lock.Lock
        self._client = redis.Redis.from_url(urls[0])
        self._key = key

    def acquire(self) -> Optional[Callable[[], object]]:
        lock = self._make(self._client, self._key, expire=int(TTL))
        return lock.release if lock.acquire(blocking=True, timeout=WAIT_TIMEOUT) else None

    def close(self) -> None:
        self._client.close()


#: Lock library -> how to make its lock on (urls, key), and how many nodes it uses.
LOCKS: dict[str, tuple[Callable[[list[str], str], _Lock], Optional[int]]] = {
    "celery-redlock": (_Ours, None),
    "python-redis-lock": (_PythonRedisLock, 1),
}


def _holder(lock_name: str, urls: list[str], key: str, conn: Connection) -> None:
    """The other process: acquire, wait for the waiter, release, report the stamp."""
    lock = LOCKS[lock_name][0](urls, key)
    rng = random.Random()
    try:
        while conn.recv() == "go":
            release = lock.acquire()
            if release is None:
                conn.send(None)
                continue
            conn.send("held")
            conn.recv()  # the waiter is about to block
            time.sleep(rng.uniform(0.02, 0.06))
            stamp = time.monotonic_ns()
            release()
            conn.send(stamp)
    finally:
        lock.close()


def measure(
    urls: list[str], samples: int, key: str, lock_name: str = "celery-redlock"
) -> dict[str, Any]:
    """``samples`` hand-offs of ``key`` on ``urls`` (``lock_name``: a key of ``LOCKS``;
    a one-node library uses the first URL); latencies in ms."""
    make, nodes = LOCKS[lock_name]
    urls = urls[:nodes] if nodes else urls
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    holder = context.Process(target=_holder, args=(lock_name, urls, key, theirs), daemon=True)
    holder.start()
    lock = make(urls, key)
    latencies_ns: list[int] = []
    missed = 0
    try:
        for _ in range(samples):
            ours.send("go")
            if ours.recv() != "held":
                missed += 1
                continue
            ours.send("waiting")
            release = lock.acquire()
            got = time.monotonic_ns()
            released = ours.recv()
            if release is None:
                missed += 1
                continue
            latencies_ns.append(got - released)
            release()
        ours.send("stop")
    finally:
        lock.close()
        holder.join(10)
        if holder.is_alive():
            holder.kill()
    values = sorted(latencies_ns)
    if not values:
        return {"lock": lock_name, "nodes": len(urls), "samples": 0, "missed": missed}
    return {
        "lock": lock_name,
        "nodes": len(urls),
        "samples": len(values),
        "missed": missed,
        "p50_ms": round(percentile(values, 0.5) / 1e6, 3),
        "p95_ms": round(percentile(values, 0.95) / 1e6, 3),
        "max_ms": round(values[-1] / 1e6, 3),
        "mean_ms": round(statistics.fmean(values) / 1e6, 3),
        "wait_timeout_s": WAIT_TIMEOUT,
    }
