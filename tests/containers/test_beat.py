"""Two beat containers with ``-S redlock``: every tick is sent once."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from celery_redlock.testing.containers.nodes import RedisNodeContainer

pytestmark = [pytest.mark.containers, pytest.mark.slow]

#: Ticks to see (one a second) before the beats are stopped.
TICKS = 6


def test_two_beat_containers_send_each_tick_once(
    redlock_worker_factory: Any, redlock_beat_factory: Any, observer: RedisNodeContainer
) -> None:
    redlock_worker_factory("worker")
    beats = [redlock_beat_factory(), redlock_beat_factory()]
    deadline = time.monotonic() + 60
    with observer.client() as client:
        while client.llen("ticks") < TICKS and time.monotonic() < deadline:
            time.sleep(0.2)
        for beat in beats:
            beat.kill()
        time.sleep(2)  # the last ticks sent reach the worker
        runs = [run.decode().split() for run in client.lrange("ticks", 0, -1)]
    ticks = Counter(tick for tick, _ in runs)
    assert len(ticks) >= TICKS
    assert "None" not in ticks, "a tick without the beat's header"
    assert {tick: n for tick, n in ticks.items() if n > 1} == {}
    # Both beats raced for the ticks: one of them lost some.
    assert any("sent by another beat" in beat.logs() for beat in beats)
