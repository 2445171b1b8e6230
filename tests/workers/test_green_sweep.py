"""A gevent or eventlet worker SIGKILLed with an ``acks_late`` task inside: the task
runs again on the other worker (tasks/green_sweep.py), in real ``celery worker``
subprocesses.

Without the sweep it never does: kombu sweeps unacked messages from the event loop's
timer, and green pools run without one (celery/celery#4976). tests/apps/redeliveryapp.py
keeps messages invisible for 2 s and sweeps every second. The observer (a Redis the
lock never sees) says which process ran which body; the test kills the one that
runs it.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Optional

import pytest
from kombu.connection import Connection

from celery_redlock.tasks.green_sweep import sweep_interval
from tests.support.observed import starts
from tests.support.workers import Launch, Stack, eventually


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_worker_killed_mid_body_has_its_task_run_by_the_other_worker(
    stack: Stack, launch: Launch, pool: str
) -> None:
    pytest.importorskip(pool, reason=f"the {pool} pool needs the {pool} package")
    workers = launch("redeliveryapp", 2, pool=pool, concurrency=2)
    counter, go = f"green-{pool}", f"go:green-{pool}"
    result = stack.client.send_task(
        "redeliveryapp.long_acks_late",
        kwargs={"tag": counter, "seconds": 60.0, "counter": counter, "until": go},
    )

    def first_body() -> Optional[int]:
        found = [pid for task_id, pid, _ in starts(stack.observer, counter) if task_id == result.id]
        return found[0] if found else None

    victim = eventually(first_body, 30, "the body began")
    os.kill(victim, signal.SIGKILL)  # the whole worker: a green pool runs bodies inside it
    stack.observer.set(go, 1)  # any body of this task ends at once from now on
    outcome = result.get(timeout=60)
    assert result.state == "SUCCESS"
    assert outcome["pid"] != victim and outcome["runs"] >= 2
    survivor = next(w for w in workers if w.pid != victim)
    assert survivor.lines(r"unacked messages are swept every 1s"), survivor.tail()
    print(f"{pool}: worker {victim} killed mid-body; the task ran again on {outcome['pid']}")


@pytest.mark.parametrize(
    ("given", "seconds"), [(None, 10.0), (1, 1.0), (2.5, 2.5), (0, 10.0), (-3, 10.0), ("x", 10.0)]
)
def test_the_sweep_interval_is_the_one_kombus_event_loop_would_use(
    given: object, seconds: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_redlock.worker")
    options = {} if given is None else {"unacked_restore_interval": given}
    with Connection("redis://127.0.0.1:1/0", transport_options=options) as connection:  # type: ignore[no-untyped-call]
        assert sweep_interval(connection) == seconds
    named = "unacked_restore_interval must be a number of seconds" in caplog.text
    assert named == (given == "x")
