"""Real ``celery worker`` subprocesses and what their task bodies report, for the
tests in tests/workers/ (and the beats of tests/tasks/test_beat.py).

The workers run an app of tests/apps/ (``celery -A tests.apps.<name>``), configured by
environment variables: ``BROKER_URL``, ``REDLOCK_NODES``, ``OBSERVER_URL``. The
task bodies report to the observer, a Redis the lock never sees (see
tests/apps/factory.py for what they write there); the readers below turn that into
intervals, runs and occupancy. The ``stack`` fixture is in tests/workers/conftest.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

import redis
from celery import Celery
from celery.result import AsyncResult

from celery_redlock.testing import CeleryProcess, RedisNodes, RedisServer, wait_all_ready
from tests.support.observe import until
from tests.support.observed import starts

CHECKOUT = Path(__file__).resolve().parents[2]
#: Seconds a worker gets to log "ready." (a loaded 2-core CI machine is slow to fork).
READY_TIMEOUT = 60.0

#: ``launch(app, count, **options)``: the ``launch`` fixture (tests/workers/conftest.py).
Launch = Callable[..., list[CeleryProcess]]


# -- the servers of a test, and the workers ------------------------------------------------


@dataclass
class Stack:
    """The servers of one test and a client app that sends to its workers."""

    broker: RedisServer
    nodes: RedisNodes
    observer_server: RedisServer
    observer: redis.Redis
    client: Celery


def app_env(
    broker_url: str, nodes: Union[RedisNodes, Sequence[str]], observer_url: str, **more: str
) -> dict[str, str]:
    """This process's environment, with what an app of tests/apps/ reads (``nodes``:
    the lock nodes, or their URLs)."""
    env = dict(os.environ)
    env.update(
        BROKER_URL=broker_url,
        REDLOCK_NODES=",".join(nodes.urls if isinstance(nodes, RedisNodes) else nodes),
        OBSERVER_URL=observer_url,
        **more,
    )
    return env


def app_process(app: str, log_path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The arguments of :class:`CeleryProcess` ``worker``/``beat`` that run
    ``tests/apps/<app>.py`` from the checkout."""
    return {
        "app": f"tests.apps.{app}",
        "log_path": log_path,
        "cwd": CHECKOUT,
        "env": dict(env),
        "pythonpath": [CHECKOUT],
    }


def launch_workers(
    app: str,
    names: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str],
    queues: Sequence[Sequence[str]] = (),
    **options: Any,
) -> list[CeleryProcess]:
    """One ``celery -A tests.apps.<app> worker`` per name, all started before any is
    waited for; ``queues``: each worker's (by position); ``options``: pool,
    concurrency, ... Returns once all are ready; if one is not ready in time, all
    are stopped."""
    started = [
        CeleryProcess.worker(
            name=name,
            queues=queues[i] if queues else (),
            **app_process(app, log_dir / f"{name}.log", env),
            **options,
        )
        for i, name in enumerate(names)
    ]
    try:
        wait_all_ready(started, READY_TIMEOUT)
    except BaseException:
        stop_workers(started)
        raise
    return started


def stop_workers(workers: Sequence[CeleryProcess], lines: int = 40) -> None:
    """SIGKILL every worker's process group; print their log tails (pytest shows them
    only when the test failed)."""
    for worker in workers:
        worker.kill()
    for worker in workers:
        print(f"--- {worker.name} log tail ---\n{worker.tail(lines)}")


def started_at(stack: Stack, counter: str, result: AsyncResult, timeout: float = 30) -> int:
    """When ``result``'s body began (monotonic ns); fails at once if the task ended
    without its body beginning (e.g. the lock round raised)."""
    deadline = time.monotonic() + timeout
    while True:
        for task_id, _, start in starts(stack.observer, counter):
            if task_id == result.id:
                return start
        if result.ready():
            raise AssertionError(
                f"{result.id} ended {result.state} before its body began: {result.result!r}"
            )
        assert time.monotonic() < deadline, f"{result.id} did not begin within {timeout}s"
        time.sleep(0.02)


# -- waiting --------------------------------------------------------------------------------


def wait_all(results: Sequence[AsyncResult], timeout: float) -> None:
    """Wait for every result to be ready (any state), within one overall deadline."""
    deadline = time.monotonic() + timeout
    for result in results:
        left = deadline - time.monotonic()
        assert left > 0, f"{result.id} not ready in {timeout}s (state {result.state})"
        result.get(timeout=left, propagate=False)


def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something true, and return that."""
    return until(check, what, within=timeout)
