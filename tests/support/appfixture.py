"""A Celery app for tests that run an embedded worker against real Redis servers.

Broker and result backend on one test Redis, lock nodes from ``redis_nodes``, quick
lock retries. When the test ends, two things older Celery releases (seen with 5.3)
would carry into the next test are cleared:

- results still waiting for the garbage collector are freed while that Redis still
  runs: a result freed after its backend stopped spends 20 s reconnecting in
  ``AsyncResult.__del__``, stalling whatever runs next. Given the test's ``caplog``,
  the log records captured so far are dropped first: pytest keeps them until the
  test's teardown ends, and a record logged with a traceback keeps the task's request
  (whose ``children`` are results) alive past this fixture;
- the process-wide event loop of the stopped embedded worker: the next worker would
  reuse it, with the old worker's timer, and never run a message with a countdown.

Tests order themselves by events, never by sleeping: :class:`Recorder` waits for a
lock signal of a given task id, and :func:`gate_wait` makes a task body run until
the test sets an event.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

import pytest
from celery import Celery
from celery.signals import task_postrun
from kombu.asynchronous import set_event_loop

from celery_redlock import signals
from celery_redlock.testing import RedisNodes, RedisServer


def worker_test_app(
    name: str,
    broker: RedisServer,
    nodes: RedisNodes,
    backoff: float,
    backoff_max: float,
    caplog: Optional[pytest.LogCaptureFixture] = None,
) -> Iterator[Celery]:
    """Yield the app (use with ``yield from`` in a fixture)."""
    app = Celery(name, broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.task_create_missing_queues = True
    app.conf.redlock_nodes = nodes.urls
    app.conf.redlock_retry_backoff = backoff
    app.conf.redlock_retry_backoff_max = backoff_max
    app.conf.result_extended = True
    app.conf.broker_connection_retry_on_startup = True
    yield app
    if caplog is not None:
        for when in ("setup", "call"):
            # The report's "Captured log" text is kept apart: only the records go.
            caplog.get_records(when).clear()
    free_results()
    set_event_loop(None)


def free_results() -> None:
    """Free results waiting for the garbage collector while their backend still
    runs (call it before stopping the result backend's Redis)."""
    gc.collect()


class Recorder:
    """Collects what the tasks and signals report, from any thread."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Condition()

    def __call__(self, name: str) -> Any:
        def receiver(sender: Any = None, **kwargs: Any) -> None:
            with self.lock:
                self.events.append((name, {"sender": sender, **kwargs}))
                self.lock.notify_all()

        return receiver

    def of(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [kw for n, kw in self.events if n == name]

    def wait_for(
        self, name: str, task_id: Optional[str] = None, timeout: float = 15, **fields: Any
    ) -> dict[str, Any]:
        """The first ``name`` signal sent for ``task_id`` (any, if None) whose other
        arguments include ``fields``, waiting for it if need be."""
        if task_id is not None:
            fields["task_id"] = task_id

        def sent() -> list[dict[str, Any]]:
            return [
                kw
                for n, kw in self.events
                if n == name and all(kw.get(f) == v for f, v in fields.items())
            ]

        with self.lock:
            assert self.lock.wait_for(sent, timeout), f"no {name} for {task_id}"
            return sent()[0]


def gate_wait(event: threading.Event, timeout: float = 15) -> Callable[[], None]:
    """A task body's pause that ends when the test sets ``event``."""

    def wait() -> None:
        assert event.wait(timeout), "the test never opened the gate"

    return wait


@contextmanager
def recording() -> Iterator[Recorder]:
    """A Recorder connected to every lock signal while the block runs, and to
    ``task_postrun`` (a task's trace has ended: whatever it stores or sends is done)."""
    rec = Recorder()
    receivers = {
        signal: rec(signal.name)
        for signal in (
            signals.lock_acquired,
            signals.lock_contended,
            signals.lock_extended,
            signals.lock_lost,
            signals.lock_released,
            task_postrun,
        )
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver, weak=False)
    try:
        yield rec
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
