"""Holders in other processes and what the nodes say about wake-ups, for the wake-up
tests of both drivers (tests/lock/test_wake.py, tests/asyncio/test_asyncio_wake.py).

No timing claims: :func:`wait_for` waits for an event and fails only past a hang guard.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest
import redis

from celery_redlock import Redlock
from celery_redlock.lock.stored import LIMIT, permit_full, permit_slot
from celery_redlock.lock.wake import wake_channel

NODE_TIMEOUT = 0.5
#: An acquire's timeout that polling cannot meet (see tests/lock/test_wake.py).
HANG_GUARD = 30.0
#: retry_delay and holder TTL far past HANG_GUARD: polling never gets there in time.
NEVER = 3600.0


def wait_for(check: Callable[[], bool], guard: float = HANG_GUARD) -> None:
    """Wait for ``check`` (an event, not a timing claim); fail past ``guard``."""
    done = threading.Event()
    for _ in range(int(guard / 0.01)):
        if check():
            return
        done.wait(0.01)
    pytest.fail("the condition was never reached")


def steady(read: Callable[[], object], quiet: float = 0.3) -> Callable[[], bool]:
    """A check that holds once ``read()`` gave the same value for ``quiet`` seconds
    (e.g. a node's command count: the waiters made their attempts and now wait)."""
    seen: list[object] = [object()]
    since = [0.0]

    def check() -> bool:
        value, now = read(), time.monotonic()
        if value != seen[0]:
            seen[0], since[0] = value, now
        return now - since[0] >= quiet

    return check


def subscribed(urls: list[str], key: str, count: int = 1) -> Callable[[], bool]:
    clients = [redis.Redis.from_url(u) for u in urls]
    channel = wake_channel(key)

    def check() -> bool:
        return all(c.pubsub_numsub(channel)[0][1] >= count for c in clients)

    return check


def hold_until_waited(urls: list[str], key: str, ttl: float, ready: Any, out: Any) -> None:
    """Another process: take ``key``, say so, release once a waiter listens."""
    redlock = Redlock(urls, ttl=ttl, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire(key, blocking=False, holder="holder-process")
    assert lease is not None
    ready.set()
    wait_for(subscribed(urls, key))
    out.put(lease.release())


def stray(urls: list[str], key: str, nodes: range, limit: int) -> None:
    """On ``nodes``: take what the holder's round will find free (the key, or the
    permit slots nobody holds), as a racing caller's claim would; each one is
    undone later (:func:`undo_strays`)."""
    for url in [urls[i] for i in nodes]:
        client = redis.Redis.from_url(url)
        if limit == 1:
            client.set(key, "racer|x", px=60_000)
            continue
        for slot in range(limit):
            client.set(permit_slot(key, LIMIT, slot), f"racer{slot}|x", px=60_000, nx=True)


def undo_strays(urls: list[str], key: str, limit: int) -> None:
    for url in urls:
        client = redis.Redis.from_url(url, decode_responses=True)
        names = [key] if limit == 1 else [permit_slot(key, LIMIT, i) for i in range(limit)]
        for name in names:
            value = client.get(name)
            if value is not None and str(value).startswith("racer"):
                client.delete(name, permit_full(key, LIMIT))
