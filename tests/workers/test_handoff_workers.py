"""Hand-off to waiting duplicates (``redlock_handoff``) in real prefork, gevent and
eventlet workers.

Two ``celery worker`` subprocesses (celery_redlock.testing.CeleryProcess) run
tests/apps/handoffapp.py against a real Redis broker, 5 real lock nodes and a third Redis,
the observer, that the task bodies report to. Safety is judged from the observer
(occupancy, body intervals, runs per task id), never from the lock's own word: every
task's body runs exactly once, two are never inside at once, every caller's
``AsyncResult`` ends with its own body's result; a holder SIGKILLed mid-body leaves
the waiters to their fallback retries, and they all still run.

Messages published per task and the lock's busy share of the span are printed, not
asserted (speed lives in bench/).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
from celery.result import AsyncResult

from celery_redlock.testing import CeleryProcess
from tests.support.observed import Interval, intervals, max_occupancy, overlaps, runs, starts
from tests.support.workers import Stack, app_env, launch_workers, started_at, stop_workers, wait_all

#: Same-key tasks per run, and each body's length (s).
TASKS, BODY = 12, 0.1

pytestmark = pytest.mark.slow

StartWorkers = Callable[[], list[CeleryProcess]]


def start_workers(
    stack: Stack, log_dir: Path, pool: str = "prefork", concurrency: int = 2
) -> list[CeleryProcess]:
    """Two ready ``celery worker`` processes of ``pool``; SIGKILL them when done."""
    env = app_env(stack.broker.url, stack.nodes, stack.observer_server.url)
    return launch_workers(
        "handoffapp", ["w1", "w2"], log_dir, env, pool=pool, concurrency=concurrency
    )


@pytest.fixture
def workers(stack: Stack, tmp_path: Path) -> Iterator[list[CeleryProcess]]:
    """Two ready prefork workers of concurrency 2; SIGKILLed at teardown."""
    started = start_workers(stack, tmp_path)
    try:
        yield started
    finally:
        stop_workers(started)


def send(stack: Stack, task: str, **kwargs: Any) -> AsyncResult:
    return stack.client.send_task(f"handoffapp.{task}", kwargs=kwargs)


def published(stack: Stack, counter: str) -> int:
    """Task messages the workers published (retries, fallbacks, wakes)."""
    return int(stack.observer.get(f"published:{counter}") or 0)


def busy_share(spans: Sequence[Interval]) -> float:
    """The share of the span, first body start to last body end, with a body inside."""
    if not spans:
        return 0.0
    span = max(s.end for s in spans) - min(s.start for s in spans)
    return sum(s.end - s.start for s in spans) / span if span else 1.0


def rank_correlation(arrival: Sequence[str], ran: Sequence[str]) -> float:
    """Spearman's rho of run order against arrival order (1: first come, first run)."""
    order = {task_id: i for i, task_id in enumerate(ran)}
    ranks = [order[task_id] for task_id in arrival if task_id in order]
    n = len(ranks)
    if n < 2:
        return 1.0
    d2 = sum((i - r) ** 2 for i, r in enumerate(ranks))
    return 1 - 6 * d2 / (n * (n * n - 1))


def check_each_ran_once(
    stack: Stack, results: Sequence[AsyncResult], counter: str, killed: Sequence[str] = ()
) -> None:
    """Each of ``results`` ran its body once and ended SUCCESS with that body's result
    (``killed``: task ids whose one body began and was killed)."""
    states = {r.id: r.state for r in results}
    assert [s for s in states.values() if s != "SUCCESS"] == [], states
    for result in results:  # every caller sees its own body's result
        assert result.get(timeout=1)["task_id"] == result.id
    assert runs(stack.observer, counter) == dict.fromkeys([*states, *killed], 1)
    assert overlaps(intervals(stack.observer, counter)) == []
    if not killed:  # a killed body never leaves: the occupancy count keeps it
        assert max_occupancy(stack.observer, counter) == 1


@pytest.mark.parametrize("task", ["handoff", "plain"])
def test_same_key_tasks_each_run_once_one_at_a_time(
    stack: Stack, workers: list[CeleryProcess], task: str
) -> None:
    run_same_key_tasks(stack, task, "2 prefork workers x 2")


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_hand_off_in_green_pools_runs_each_task_once_one_at_a_time(
    stack: Stack, tmp_path: Path, pool: str
) -> None:
    """The waiters' registrations, wakes and fallbacks come from greenlets: many
    contended copies wait inside one process, and the holder's release wakes one."""
    started = start_workers(stack, tmp_path, pool, concurrency=10)
    try:
        run_same_key_tasks(stack, "handoff", f"2 {pool} workers x 10", counter=f"handoff-{pool}")
    finally:
        stop_workers(started)


def run_same_key_tasks(stack: Stack, task: str, where: str, counter: str = "") -> None:
    """TASKS same-key copies of ``task``: each runs once, never two at once; the busy
    share, messages per task and fairness are printed."""
    counter = counter or task
    results = [send(stack, task, tag="same", seconds=BODY, counter=counter) for _ in range(TASKS)]
    wait_all(results, timeout=180)
    check_each_ran_once(stack, results, counter)
    spans = intervals(stack.observer, counter)
    ran = [task_id for task_id, _, _ in starts(stack.observer, counter)]
    messages = (TASKS + published(stack, counter)) / TASKS
    print(
        f"{task}: {TASKS} same-key tasks of {BODY}s on {where}: busy "
        f"{busy_share(spans):.0%} of the span, {messages:.2f} messages per task, fairness "
        f"(rank correlation, run vs arrival) {rank_correlation([r.id for r in results], ran):.2f}"
    )


def test_waiters_still_all_run_when_the_holder_is_killed(
    stack: Stack, workers: list[CeleryProcess]
) -> None:
    holder = send(stack, "handoff", tag="kill", seconds=60.0, counter="kill")
    began = started_at(stack, "kill", holder, timeout=60)
    waiters = [send(stack, "handoff", tag="kill", seconds=BODY, counter="kill") for _ in range(6)]
    # Each waiter has met the held lock (and registered, and published its fallback).
    deadline = time.monotonic() + 60
    while published(stack, "kill") < len(waiters):
        assert time.monotonic() < deadline, "the waiters did not all meet the lock"
        time.sleep(0.05)
    (pid,) = {p for task_id, p, _ in starts(stack.observer, "kill") if task_id == holder.id}
    killed_at = time.monotonic_ns()
    os.kill(pid, signal.SIGKILL)  # no release, no wake: the lock frees at its TTL
    wait_all([holder, *waiters], timeout=180)
    assert holder.state == "FAILURE"  # WorkerLostError: the body died
    check_each_ran_once(stack, waiters, "kill", killed=[holder.id])
    later = [start for task_id, _, start in starts(stack.observer, "kill") if task_id != holder.id]
    assert min(later) > killed_at > began  # nobody ran beside the killed holder
    print(f"killed holder: {len(waiters)} waiters ran once each after the kill (fallback)")
