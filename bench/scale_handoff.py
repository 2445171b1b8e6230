"""Library hand-off latency, for ``python -m bench scale``: how long after a holder in
one process starts its ``release()`` does a waiter blocked in ``acquire(key,
blocking=True, timeout=...)`` in another process get the lock.

Public API only (``Redlock.acquire`` and ``Lease.release``), so the same code measures
whatever ``acquire`` does while it waits: polling today, a wake-up on release once one
exists. One call, :func:`measure`, is what ``bench/scale.py`` runs.

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
from typing import Any

from celery_redlock import Redlock

from .stats import percentile

__all__ = ["measure"]

TTL = 10.0
#: How long the waiter may block; far above any hand-off, far below the TTL.
WAIT_TIMEOUT = 5.0


def _holder(urls: list[str], key: str, conn: Connection) -> None:
    """The other process: acquire, wait for the waiter, release, report the stamp."""
    redlock = Redlock(urls, ttl=TTL)
    rng = random.Random()
    try:
        while conn.recv() == "go":
            lease = redlock.acquire(key, blocking=True, timeout=WAIT_TIMEOUT)
            if lease is None:
                conn.send(None)
                continue
            conn.send("held")
            conn.recv()  # the waiter is about to block
            time.sleep(rng.uniform(0.02, 0.06))
            stamp = time.monotonic_ns()
            lease.release()
            conn.send(stamp)
    finally:
        redlock.close()


def measure(urls: list[str], samples: int, key: str) -> dict[str, Any]:
    """``samples`` hand-offs of ``key`` on ``urls``; latencies in ms."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    holder = context.Process(target=_holder, args=(urls, key, theirs), daemon=True)
    holder.start()
    redlock = Redlock(urls, ttl=TTL)
    latencies_ns: list[int] = []
    missed = 0
    try:
        for _ in range(samples):
            ours.send("go")
            if ours.recv() != "held":
                missed += 1
                continue
            ours.send("waiting")
            lease = redlock.acquire(key, blocking=True, timeout=WAIT_TIMEOUT)
            got = time.monotonic_ns()
            released = ours.recv()
            if lease is None:
                missed += 1
                continue
            latencies_ns.append(got - released)
            lease.release()
        ours.send("stop")
    finally:
        redlock.close()
        holder.join(10)
        if holder.is_alive():
            holder.kill()
    values = sorted(latencies_ns)
    if not values:
        return {"nodes": len(urls), "samples": 0, "missed": missed}
    return {
        "nodes": len(urls),
        "samples": len(values),
        "missed": missed,
        "p50_ms": round(percentile(values, 0.5) / 1e6, 3),
        "p95_ms": round(percentile(values, 0.95) / 1e6, 3),
        "max_ms": round(values[-1] / 1e6, 3),
        "mean_ms": round(statistics.fmean(values) / 1e6, 3),
        "wait_timeout_s": WAIT_TIMEOUT,
    }
