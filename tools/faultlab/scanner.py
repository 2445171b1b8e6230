"""What the lock leaves on its nodes: a thread that finds lock keys and tombstones
without a TTL while a scenario runs, and the keys still there after it.

Like :mod:`.oracle` and :mod:`.evidence`, it imports no celery_redlock code (plain
redis-py clients).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Union

import redis

__all__ = ["FENCE_SUFFIX", "TOMBSTONE_MARK", "TtlScanner", "classify", "leftover_keys"]

# Key shapes the lock leaves on a node, spelled out here rather than imported: a
# release's tombstone ``<key>\\0released\\0<token>`` (must expire) and a fence counter
# ``<key>\\0fence`` (expires a week after its last fence). Anything else is a lock key.
TOMBSTONE_MARK = "\x00released\x00"
FENCE_SUFFIX = "\x00fence"


def classify(name: Union[bytes, str]) -> str:
    """``"lock"``, ``"tombstone"`` or ``"fence"`` (a counter, exempt from TTLs)."""
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    if TOMBSTONE_MARK in text:
        return "tombstone"
    if text.endswith(FENCE_SUFFIX):
        return "fence"
    return "lock"


class TtlScanner:
    """A thread that SCANs the lock nodes over and over and records every key it sees
    without an expiry (PTTL -1), except fence counters (counters written before they
    had one keep none until their next fence).

    ``start()`` / ``stop()``; ``seen`` counts distinct keys per class, ``without_ttl``
    lists the offenders as (node index, key). Nodes that are down or paused are
    skipped (short socket timeouts), not waited on.
    """

    def __init__(self, urls: Sequence[str], interval: float = 0.005) -> None:
        self._clients = [
            redis.Redis.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2)
            for url in urls
        ]
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttl-scanner", daemon=True)
        self.seen: dict[str, set[bytes]] = {"lock": set(), "tombstone": set(), "fence": set()}
        self.without_ttl: list[tuple[int, bytes]] = []
        self.sweeps = 0

    def start(self) -> TtlScanner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for client in self._clients:
            client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for index, client in enumerate(self._clients):
                try:
                    self._sweep(index, client)
                except redis.RedisError:
                    continue  # a node that is down or paused: nothing to see there now
            self.sweeps += 1
            self._stop.wait(self._interval)

    def _sweep(self, index: int, client: redis.Redis) -> None:
        names = list(client.scan_iter(count=1000))
        if not names:
            return
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
        for name, pttl in zip(names, pipe.execute()):
            if pttl == -2:
                continue  # gone between SCAN and PTTL
            kind = classify(name)
            self.seen[kind].add(name)
            if pttl == -1 and kind != "fence":
                self.without_ttl.append((index, name))


def leftover_keys(urls: Sequence[str]) -> dict[str, list[bytes]]:
    """Lock keys and tombstones still present on any reachable node (fence counters
    excluded), per URL."""
    found: dict[str, list[bytes]] = {}
    for url in urls:
        client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            names = [n for n in client.scan_iter(count=1000) if classify(n) != "fence"]
        finally:
            client.close()
        if names:
            found[url] = sorted(names)
    return found
