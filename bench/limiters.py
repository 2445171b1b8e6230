"""The contenders of ``python -m bench limits`` that are not ours, and its observer.

- :class:`IncrCounter`, a single-Redis INCR counter, heimdall-style: a
  re-implementation of the approach (not that package) in redis-py, as a user would
  write it: ``GET`` the counter and compare it with N, then ``INCR`` + ``EXPIRE`` (one
  MULTI/EXEC pipeline); the release is a ``DECR``. Nothing stops two callers that
  both read N - 1 from both going in.
- :class:`FixedWindowRate`, a fixed-window INCR rate limiter on one Redis: ``INCR``
  the counter of the current period (the caller's clock cut into whole periods) with
  an ``EXPIRE``; admitted while the count is at most R. R starts late in one period
  and R early in the next fall within one period of each other.
- :class:`FloorRound`, the floor of one round: ``SET k v PX`` to N nodes at once over
  bare sockets, waiting for a quorum of replies (what one ``admit`` round costs with
  no client code at all; ``resp.FloorQuorum`` is the two-round floor).
- :class:`Observer`, a Redis the limiters never see: an occupancy counter whose every
  change is logged with the observer's clock (``TIME``, in the same Lua call, so the
  log is in the order of the changes), and a log of starts on the same clock.
"""

from __future__ import annotations

import time
from typing import Union

import redis

from .resp import FloorQuorum, pack

__all__ = ["FixedWindowRate", "FloorRound", "IncrCounter", "Observer"]


class IncrCounter:
    """Single-Redis INCR counter (heimdall-style): at most ``limit`` inside, in intent."""

    name = "single-Redis INCR counter (heimdall-style)"

    def __init__(self, client: redis.Redis, key: str, limit: int, ttl: float) -> None:
        self._client, self._key, self._limit, self._ttl = client, key, limit, int(ttl)

    def try_acquire(self) -> bool:
        if int(self._client.get(self._key) or 0) >= self._limit:
            return False
        pipe = self._client.pipeline()  # MULTI/EXEC, one round trip
        pipe.incr(self._key)
        pipe.expire(self._key, self._ttl)
        pipe.execute()
        return True

    def release(self) -> None:
        self._client.decr(self._key)


class FixedWindowRate:
    """Fixed-window INCR rate limiter: at most ``count`` starts per whole ``period`` of
    the caller's clock."""

    name = "fixed-window INCR counter (one Redis)"

    def __init__(self, client: redis.Redis, key: str, count: int, period: float) -> None:
        self._client, self._key, self._count, self._period = client, key, count, period

    def admit(self) -> float:
        """0.0 when admitted (counted), else the seconds until the next period."""
        now = time.time()
        window = int(now // self._period)
        pipe = self._client.pipeline()
        pipe.incr(f"{self._key}:{window}")
        pipe.expire(f"{self._key}:{window}", int(self._period * 2) + 1)
        count = pipe.execute()[0]
        if int(count) <= self._count:
            return 0.0
        return (window + 1) * self._period - now


class FloorRound(FloorQuorum):
    """One bare round: ``SET k v PX`` to every node at once, a quorum of replies."""

    def __init__(
        self, addresses: list[tuple[str, int]], key: str, value: bytes, ttl_ms: int
    ) -> None:
        super().__init__(addresses, key, value, ttl_ms)
        self._set = pack(b"SET", key, value, b"PX", ttl_ms)  # no NX: it always sets

    def __call__(self) -> None:
        self._round(self._set)


# KEYS[1] the occupancy counter; KEYS[2] its log; ARGV[1] +1 (in) or -1 (out)
# returns the occupancy after the change, logged as "<seconds> <µs> <occupancy>"
_OCCUPANCY = """
redis.replicate_commands()
local inside = redis.call('incrby', KEYS[1], ARGV[1])
local now = redis.call('time')
redis.call('rpush', KEYS[2], now[1] .. ' ' .. now[2] .. ' ' .. inside)
return inside
"""

# KEYS[1] the start log; logs the observer's time "<seconds> <µs>"
_START = """
redis.replicate_commands()
local now = redis.call('time')
redis.call('rpush', KEYS[1], now[1] .. ' ' .. now[2])
return 1
"""


def _us(seconds: Union[bytes, str, int], micros: Union[bytes, str, int]) -> int:
    return int(seconds) * 1_000_000 + int(micros)


class Observer:
    """Occupancy and starts as a separate Redis sees them, on its clock (µs)."""

    def __init__(self, client: redis.Redis, tag: str) -> None:
        self._client = client
        self._keys = (f"inside:{tag}", f"inside-log:{tag}", f"starts:{tag}")
        self._occupancy = client.register_script(_OCCUPANCY)
        self._start = client.register_script(_START)

    def now_us(self) -> int:
        seconds, micros = self._client.time()
        return _us(seconds, micros)

    def enter(self) -> int:
        return int(self._occupancy(keys=self._keys[:2], args=[1]))

    def leave(self) -> int:
        return int(self._occupancy(keys=self._keys[:2], args=[-1]))

    def started(self) -> None:
        self._start(keys=[self._keys[2]])

    def occupancy_log(self) -> list[tuple[int, int]]:
        """(µs, occupancy after the change), in the order of the changes."""
        rows = []
        for entry in self._client.lrange(self._keys[1], 0, -1):
            seconds, micros, inside = entry.split()
            rows.append((_us(seconds, micros), int(inside)))
        return rows

    def starts(self) -> list[int]:
        return sorted(_us(*entry.split()) for entry in self._client.lrange(self._keys[2], 0, -1))

    def clear(self) -> None:
        self._client.delete(*self._keys)
