"""A backlog under ``redlock_rate`` in real Celery workers, for ``python -m bench limits``.

N copies of ``bench.rate`` (``bench/taskapp.py``: one key for them all, no limit on
how many run at once, ``redlock_rate`` 20/s) are published at once to ready prefork
workers on the bench's lock nodes. A copy over the rate is published again with a
countdown (the window's wait plus a random share of the period). From an observer
Redis the lock never sees:

- drain: starts per second, first body start to last, and the achieved rate as a
  fraction of the task's rate (the period over the effective period, as in
  ``limits_precision.window_stats``); the most starts in any window of one period;
- broker messages: the N published + every ``bench.rate`` message the workers
  published (``after_task_publish``), per task; and the copies sent back, counted by
  the ``lock_contended`` signal with action ``"wait"`` (the two should agree);
- each ran once: every task id's body started exactly once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable

from celery import Celery

from celery_redlock.lock.validate import rate as parse_rate
from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer, wait_all_ready

from . import taskapp
from .limits_precision import window_stats

__all__ = ["TASK_RATE", "drain"]

CHECKOUT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 90.0
TASK_RATE = "20/s"


def _publish(client: Celery, tag: str, copies: int) -> None:
    with client.producer_or_acquire() as producer:
        for index in range(copies):
            client.send_task(
                taskapp.RATE_TASK,
                kwargs={"tag": tag, "index": index},
                producer=producer,
                ignore_result=True,
            )


def _starts(observer: Any, tag: str, copies: int, timeout_s: float) -> list[tuple[str, int]]:
    """(task id, start ns) of every body of ``tag``, once ``copies`` started or time's up."""
    key = taskapp.rate_keys(tag)[0]
    deadline = time.monotonic() + timeout_s
    while int(observer.llen(key)) < copies and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a second start of some copy would show up here
    rows = []
    for entry in observer.lrange(key, 0, -1):
        task_id, start = entry.decode().split()
        rows.append((task_id, int(start)))
    return sorted(rows, key=lambda row: row[1])


def _measure(client: Celery, observer: Any, copies: int, rate: str) -> dict[str, Any]:
    count, period = parse_rate("rate", rate)
    tag = secrets.token_hex(4)
    starts_key, published_key, waits_key = taskapp.rate_keys(tag)
    sent = time.monotonic_ns()
    _publish(client, tag, copies)
    rows = _starts(observer, tag, copies, 30 + copies / count * period * 4)
    published = int(observer.get(published_key) or 0)
    waits = int(observer.get(waits_key) or 0)
    observer.delete(starts_key, published_key, waits_key)
    ids = [task_id for task_id, _ in rows]
    stamps_us = [start // 1000 for _, start in rows]
    windows = window_stats(stamps_us, count, period)
    span = (rows[-1][1] - rows[0][1]) / 1e9 if len(rows) > 1 else 0.0
    return {
        "copies": copies,
        "rate": rate,
        "started": len(rows),
        "ran_once": len(set(ids)) == len(ids) == copies,
        "first_to_last_start_s": round(span, 2),
        "publish_to_last_start_s": round((rows[-1][1] - sent) / 1e9, 2) if rows else None,
        "starts_per_s": round((len(rows) - 1) / span, 2) if span else None,
        **windows,
        "broker_messages": copies + published,
        "messages_per_task": round((copies + published) / copies, 2),
        "sent_back_signalled": waits,
    }


def drain(
    binary: str, nodes: RedisNodes, copies: int, rate: str, workers: int, concurrency: int,
    workdir: Path, log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Start a broker, an observer and ``workers`` prefork workers on ``nodes``; drain
    ``copies`` same-key copies under ``rate`` (after an unreported warm-up batch)."""
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(RedisServer(binary=binary))
        observer_server = stack.enter_context(RedisServer(binary=binary))
        observer = observer_server.client()
        client = Celery("bench_limits_client", broker=broker.url, set_as_current=False)
        client.conf.broker_connection_retry_on_startup = True
        stack.callback(client.close)
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=broker.url,
            BENCH_LOCK_NODES=",".join(nodes.urls),
            BENCH_OBSERVER_URL=observer_server.url,
            BENCH_TASK_RATE=rate,
        )
        started = []
        for index in range(workers):
            worker = CeleryProcess.worker(
                "bench.taskapp",
                name=f"rate{index}",
                pool="prefork",
                concurrency=concurrency,
                loglevel="INFO",  # readiness is read from the log
                log_path=workdir / f"rate{index}.log",
                cwd=CHECKOUT,
                env=env,
                pythonpath=[CHECKOUT],
            )
            started.append(worker)
            stack.callback(worker.stop, 20.0)
        wait_all_ready(started, READY_TIMEOUT)
        log(f"  {workers} prefork workers x {concurrency} ready")
        # Warm-up, not reported: each pool child's first task pays its imports and its
        # first connections to the lock nodes; a batch within the rate, on its own key.
        _measure(client, observer, workers * concurrency, rate)
        row = _measure(client, observer, copies, rate)
        row.update(workers=workers, concurrency=concurrency, pool="prefork")
        log(
            f"  tasks: {row['started']}/{copies} started, {row['starts_per_s']}/s "
            f"(achieved {row['achieved_fraction']}), max {row['max_in_window']} in a window, "
            f"{row['messages_per_task']} messages/task"
        )
        return row
