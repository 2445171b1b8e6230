"""The jobs: sent steadily, drained (bounded), and what the observer saw of them.

A job is one ``send_task`` of a contention mode's task on a key (``tag``) with a
body length. Its fate is read from the result backend; its bodies from the observer
Redis (see :mod:`tools.celery_soak.soakapp`), never from the lock's own word.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import redis
from celery import Celery
from celery.result import AsyncResult

from tests.support import observed
from tests.support.observed import Interval

from .soakapp import TASK_NAMES, counter

READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


@dataclass
class Job:
    task_id: str
    mode: str
    tag: str
    seconds: float
    sent: int  # monotonic ns
    state: str = "PENDING"
    result: Any = None


class Sender:
    """Sends ``rate`` jobs per second (each rate drawn once in ``rates``) from a thread
    until :meth:`stop`."""

    def __init__(
        self,
        client: Celery,
        rng: random.Random,
        tags: list[str],
        rates: tuple[float, float] = (5.0, 10.0),
        body_seconds: tuple[float, float] = (0.05, 1.0),
    ) -> None:
        self.client = client
        self.rng = rng
        self.tags = tags
        self.rate = rng.uniform(*rates)
        self.body_seconds = body_seconds
        self.jobs: list[Job] = []
        self.errors: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _loop(self) -> None:
        spacing = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stopping.is_set():
            mode = self.rng.choice(sorted(TASK_NAMES))
            tag = self.rng.choice(self.tags)
            seconds = round(self.rng.uniform(*self.body_seconds), 3)
            try:
                result = self.client.send_task(TASK_NAMES[mode], args=(tag, seconds))
            except Exception as error:  # the broker is never faulted; report, go on
                self.errors.append(f"{type(error).__name__}: {error}")
            else:
                self.jobs.append(Job(result.id, mode, tag, seconds, time.monotonic_ns()))
            next_at += spacing
            self._stopping.wait(max(0.0, next_at - time.monotonic()))


def drain(
    client: Celery,
    jobs: list[Job],
    deadline_s: float,
    log: Callable[[str], None] = lambda line: None,
) -> float:
    """Poll every job's state until all are ready or ``deadline_s`` passes; returns
    the seconds it took."""
    began = time.monotonic()
    waiting = list(jobs)
    last_note = began
    while True:
        still = []
        for job in waiting:
            result = AsyncResult(job.task_id, app=client)
            job.state = result.state
            if job.state in READY_STATES:
                job.result = result.result
            else:
                still.append(job)
        waiting = still
        now = time.monotonic()
        if not waiting or now - began > deadline_s:
            return now - began
        if now - last_note > 10:
            log(f"drain: {len(waiting)} of {len(jobs)} jobs not ready after {now - began:.0f}s")
            last_note = now
        time.sleep(0.5)


@dataclass
class Seen:
    """What the observer recorded of the bodies."""

    intervals: dict[str, list[Interval]]  # per tag: bodies that ran to the end
    starts: dict[str, list[tuple[str, int, int]]]  # per tag: (task_id, pid, start_ns)
    runs: dict[str, int]  # task id -> bodies begun (every tag)
    hosts: dict[int, str]  # pid -> worker hostname
    refused: list[dict[str, Any]] = field(default_factory=list)  # stale fenced writes
    max_occupancy: dict[str, int] = field(default_factory=dict)

    def worker_of(self, pid: int) -> Optional[str]:
        """The worker name (hostname before ``@``) that ran pid's bodies."""
        host = self.hosts.get(pid)
        return host.partition("@")[0] if host else None


def read_observer(client: redis.Redis, tags: list[str]) -> Seen:
    runs: dict[str, int] = {}
    for tag in tags:
        runs.update(observed.runs(client, counter(tag)))
    refused = []
    for entry in client.lrange("refused", 0, -1):
        task_id, tag, fence, where = str(entry).split()
        refused.append({"task_id": task_id, "tag": tag, "fence": int(fence), "where": where})
    return Seen(
        intervals={tag: observed.intervals(client, counter(tag)) for tag in tags},
        starts={tag: observed.starts(client, counter(tag)) for tag in tags},
        runs=runs,
        hosts={int(pid): str(host) for pid, host in client.hgetall("hosts").items()},
        refused=refused,
        max_occupancy={tag: observed.max_occupancy(client, counter(tag)) for tag in tags},
    )
