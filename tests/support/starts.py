"""An observer of task bodies that is not the lock, on a Redis of the test's own (the
broker's, in tests/tasks): an occupancy counter (INCR on entry, its highest value
kept, DECR on exit) and each start's time, read from that Redis' own clock (TIME).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from celery_redlock import RedlockTask

ENTER = """
local inside = redis.call('incr', KEYS[1])
if inside > tonumber(redis.call('get', KEYS[2]) or '0') then
  redis.call('set', KEYS[2], inside)
end
local now = redis.call('time')
redis.call('rpush', KEYS[3], now[1] * 1000000 + now[2])
return inside
"""


class Observer:
    """The bodies' report, on the broker's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.enter_script = client.register_script(ENTER)

    def enter(self, tag: str) -> None:
        self.enter_script(keys=[f"in:{tag}", f"max:{tag}", f"starts:{tag}"])

    def leave(self, tag: str) -> None:
        self.client.decr(f"in:{tag}")

    def most_inside(self, tag: str) -> int:
        return int(self.client.get(f"max:{tag}") or 0)

    def starts(self, tag: str) -> list[int]:
        """Start times in µs, by the observer's clock, in order."""
        return sorted(int(s) for s in self.client.lrange(f"starts:{tag}", 0, -1))


def observed_task(app: Celery, observer: Observer, name: str, **options: Any) -> Any:
    """A RedlockTask ``(tag, seconds=0, n=0) -> n`` whose body reports to ``observer``
    under ``tag`` and sleeps ``seconds``; ``redlock_ttl=5`` unless ``options`` say."""
    options.setdefault("redlock_ttl", 5)

    def body(tag: str, seconds: float = 0.0, n: int = 0) -> int:
        observer.enter(tag)
        time.sleep(seconds)
        observer.leave(tag)
        return n

    return app.task(shared=False, base=RedlockTask, name=name, **options)(body)
