"""``count``: pushes ``"{tick} {task id}"`` on the observer's list ``runs`` (the tick
from the header the winning beat set), under its own lock."""

from __future__ import annotations

from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from celery_redlock import RedlockTask


@shared_task(base=RedlockTask, bind=True, name="ticks.count", redlock_key="ticks:count")
def count(self: Any) -> None:
    tick = getattr(self.request, "redlock_beat_tick", None)
    observer = redis.Redis.from_url(settings.OBSERVER_URL, decode_responses=True)
    observer.rpush("runs", f"{tick} {self.request.id}")
