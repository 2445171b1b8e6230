"""What the task bodies of tests/apps/ reported to the observer Redis (see
tests/apps/factory.py): intervals, starts, runs, effects and the highest occupancy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import redis


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Interval:
    task_id: str
    pid: int
    start: int  # monotonic ns
    end: int


def intervals(observer: redis.Redis, counter: str) -> list[Interval]:
    found = []
    for entry in observer.lrange(f"intervals:{counter}", 0, -1):
        task_id, pid, start, end = _text(entry).split()
        found.append(Interval(task_id, int(pid), int(start), int(end)))
    return sorted(found, key=lambda i: i.start)


def starts(observer: redis.Redis, counter: str) -> list[tuple[str, int, int]]:
    """``(task_id, pid, start_ns)`` of every body that began, in order."""
    found = []
    for entry in observer.lrange(f"starts:{counter}", 0, -1):
        task_id, pid, start = _text(entry).split()
        found.append((task_id, int(pid), int(start)))
    return found


def overlaps(spans: Sequence[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of bodies that ran at the same time (each later one with the span it
    entered): empty when the spans are disjoint."""
    found: list[tuple[Interval, Interval]] = []
    latest: Optional[Interval] = None
    for span in sorted(spans, key=lambda i: i.start):
        if latest is not None and span.start < latest.end:
            found.append((latest, span))
        if latest is None or span.end > latest.end:
            latest = span
    return found


def max_occupancy(observer: redis.Redis, counter: str) -> int:
    return int(observer.get(f"max:{counter}") or 0)


def runs(observer: redis.Redis, counter: str) -> dict[str, int]:
    return {_text(k): int(v) for k, v in observer.hgetall(f"runs:{counter}").items()}


def effects(observer: redis.Redis, counter: str) -> dict[str, int]:
    return {_text(k): int(v) for k, v in observer.hgetall(f"effects:{counter}").items()}


def most_in_window(times: Sequence[int], window: int) -> int:
    """The most of ``times`` (sorted) in any window of ``window`` (the same unit) that
    one of them opens."""
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most
