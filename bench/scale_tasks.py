"""The hot key in real Celery workers, for ``python -m bench scale``.

N duplicates of one lock key (``bench.hot.*`` in ``bench/taskapp.py``: a RedlockTask
whose body sleeps) are published at once to ready prefork workers, with
``redlock_handoff`` on and off. From the observer Redis (a server the lock never
sees) it reports:

- busy share: the time some body was inside, over first body start to last body end;
- broker messages: the N published + every task message the workers published
  (lock retries, hand-off wakes, fallbacks), per task;
- each ran once: every task id's body ran exactly once, and no two body spans overlap
  (read from the bodies' own CLOCK_MONOTONIC stamps, not from the lock);
- fairness: Spearman's rank correlation of run order against publish order.

It needs nothing of the lock rooms beyond the public task options.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import redis
from celery import Celery

from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer, wait_all_ready

from . import taskapp

__all__ = ["hot_key_rows", "measure_hot_key"]

CHECKOUT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 90.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _spans(observer: redis.Redis, key: str) -> list[tuple[str, int, int]]:
    spans = []
    for entry in observer.lrange(key, 0, -1):
        task_id, start, end = _text(entry).split()
        spans.append((task_id, int(start), int(end)))
    return sorted(spans, key=lambda span: span[1])


def _busy_share(spans: list[tuple[str, int, int]]) -> float:
    if not spans:
        return 0.0
    whole = max(end for _, _, end in spans) - spans[0][1]
    return sum(end - start for _, start, end in spans) / whole if whole else 1.0


def _overlaps(spans: list[tuple[str, int, int]]) -> int:
    """Pairs of consecutive (by start) bodies where the next began before the last ended."""
    return sum(1 for a, b in zip(spans, spans[1:]) if b[1] < a[2])


def _rank_correlation(arrival: list[str], ran: list[str]) -> float:
    """Spearman's rho of run order against arrival order (1: first come, first run)."""
    order = {task_id: i for i, task_id in enumerate(ran)}
    ranks = [order[task_id] for task_id in arrival if task_id in order]
    n = len(ranks)
    if n < 2:
        return 1.0
    # Ranks of the ranks: tasks that never ran leave gaps.
    dense = {rank: i for i, rank in enumerate(sorted(ranks))}
    d2 = sum((i - dense[rank]) ** 2 for i, rank in enumerate(ranks))
    return 1 - 6 * d2 / (n * (n * n - 1))


def measure_hot_key(
    client: Celery,
    observer: redis.Redis,
    handoff: bool,
    duplicates: int,
    body_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    """Publish ``duplicates`` same-key tasks at once; wait until each body has run."""
    tag = f"{secrets.token_hex(3)}-{'handoff' if handoff else 'retry'}-{duplicates}"
    runs_key, spans_key, published_key = taskapp.hot_keys(tag)
    ids = []
    with client.producer_or_acquire() as producer:
        for _ in range(duplicates):
            result = client.send_task(
                taskapp.HOT_TASKS[handoff],
                kwargs={"tag": tag, "seconds": body_s},
                producer=producer,
                ignore_result=True,
            )
            ids.append(result.id)
    sent = time.monotonic_ns()
    deadline = time.monotonic() + timeout_s
    while int(observer.hlen(runs_key)) < duplicates:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    done = time.monotonic_ns()
    time.sleep(0.5)  # a second run of some body would show up here
    runs = {_text(k): int(v) for k, v in observer.hgetall(runs_key).items()}
    spans = _spans(observer, spans_key)
    published = int(observer.get(published_key) or 0)
    observer.delete(runs_key, spans_key, published_key)
    ran_once = sum(1 for task_id in ids if runs.get(task_id) == 1)
    return {
        "handoff": handoff,
        "duplicates": duplicates,
        "body_s": body_s,
        "busy_share": round(_busy_share(spans), 4),
        "span_s": round((spans[-1][2] - spans[0][1]) / 1e9, 2) if spans else None,
        "publish_to_last_s": round((done - sent) / 1e9, 2),
        "broker_messages": duplicates + published,
        "messages_per_task": round((duplicates + published) / duplicates, 2),
        "ran_once": ran_once,
        "ran_twice_or_more": sum(1 for count in runs.values() if count > 1),
        "never_ran": sum(1 for task_id in ids if task_id not in runs),
        "overlapping_bodies": _overlaps(spans),
        "fairness": round(_rank_correlation(ids, [task_id for task_id, _, _ in spans]), 2),
        "timed_out": len(runs) < duplicates,
    }


def hot_key_rows(
    binary: str,
    nodes: RedisNodes,
    duplicates: tuple[int, ...],
    body_s: float,
    workers: int,
    concurrency: int,
    workdir: Path,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Start a broker, an observer and ``workers`` prefork workers on ``nodes``; one row
    per (duplicates, hand-off on/off), hand-off off last at each size."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(RedisServer(binary=binary))
        observer_server = stack.enter_context(RedisServer(binary=binary))
        observer = observer_server.client()
        client = Celery("bench_scale_client", broker=broker.url, set_as_current=False)
        client.conf.broker_connection_retry_on_startup = True
        stack.callback(client.close)
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=broker.url,
            BENCH_LOCK_NODES=",".join(nodes.urls),
            BENCH_OBSERVER_URL=observer_server.url,
        )
        started = []
        for index in range(workers):
            worker = CeleryProcess.worker(
                "bench.taskapp",
                name=f"hot{index}",
                pool="prefork",
                concurrency=concurrency,
                loglevel="INFO",  # readiness is read from the log
                log_path=workdir / f"hot{index}.log",
                cwd=CHECKOUT,
                env=env,
                pythonpath=[CHECKOUT],
            )
            started.append(worker)
            stack.callback(worker.stop, 20.0)
        wait_all_ready(started, READY_TIMEOUT)
        log(f"  {workers} prefork workers x {concurrency} ready")
        # Warm-up, not reported: each pool child's first task pays its imports and
        # its first connections to the lock nodes.
        measure_hot_key(client, observer, True, 2 * workers * concurrency, 0.0, 60.0)
        for count in duplicates:
            # Hand-off off is slow: give it room, bounded (the run goes on, marked).
            for handoff in (True, False):
                timeout = 30 + count * body_s * (3 if handoff else 15)
                row = measure_hot_key(client, observer, handoff, count, body_s, timeout)
                rows.append(row)
                log(
                    f"  hot key: {count} duplicates, handoff {'on' if handoff else 'off'}: "
                    f"busy {row['busy_share']:.0%}, {row['messages_per_task']} messages/task, "
                    f"ran once {row['ran_once']}/{count}, load {os.getloadavg()[0]:.2f}"
                )
    return rows
