# mypy: disallow-untyped-decorators=False
"""A skipped copy's result: ready at once, counted by groups and chords, seen by links.

An embedded Celery worker (threads pool), a real Redis broker and result backend, and
5 real lock nodes. Each test prints what it measured (run with ``-s`` to see it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, chord, group
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from celery_redlock import LockContended, QuorumUnavailable, Redlock, RedlockTask
from celery_redlock.skipped import SKIPPED, is_skipped
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, gate_wait, worker_test_app

#: Only guards against a hang: every wait here ends in well under a second when right.
HANG_GUARD = 30.0


@pytest.fixture
def app(
    redis_server: RedisServer, redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> Iterator[Celery]:
    # caplog: an outage's ERROR line keeps a retried copy's result (see appfixture).
    yield from worker_test_app("skipped", redis_server, redis_nodes, 0.05, 0.1, caplog)


@pytest.fixture
def tasks(app: Celery) -> dict[str, Any]:
    #: The holder's body runs until the test sets its gate (keyed by tag).
    gates: dict[str, threading.Event] = {}

    @app.task(
        shared=False,
        base=RedlockTask,
        redlock_key="job:{tag}",
        redlock_on_contended="skip",
        name="s.skip",
    )
    def skip(seconds: float, tag: str) -> str:
        if tag in gates:
            gate_wait(gates[tag], HANG_GUARD)()
        else:
            time.sleep(seconds)
        return "ran"

    @app.task(
        shared=False,
        base=RedlockTask,
        redlock_key="job:{tag}",
        redlock_max_retries=1,
        redlock_on_retries_exhausted="skip",
        name="s.exhaust",
    )
    def exhaust(tag: str) -> str:
        return "ran"

    @app.task(shared=False, base=RedlockTask, redlock_on_contended="fail", name="s.fail")
    def fail(tag: str) -> str:
        return "ran"

    @app.task(shared=False, name="s.collect")
    def collect(results: list[Any]) -> dict[str, int]:
        return {
            "ran": sum(r == "ran" for r in results),
            "skipped": sum(is_skipped(r) for r in results),
        }

    @app.task(shared=False, name="s.seen")
    def seen(value: Any) -> Any:
        return value

    return {
        "skip": skip, "exhaust": exhaust, "fail": fail, "collect": collect, "seen": seen,
        "gates": gates,
    }  # fmt: skip


@pytest.fixture
def worker(app: Celery, tasks: dict[str, Any]) -> Iterator[Any]:
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False) as w:
        yield w


@contextmanager
def _running_copy(tasks: dict[str, Any], recorder: Recorder, tag: str) -> Iterator[AsyncResult]:
    """A copy of ``s.skip`` holding the lock of ``tag`` until the block ends.

    It has the lock once ``lock_acquired`` names it (a STARTED state would not do:
    Celery stores it before ``before_start`` takes the lock).
    """
    gate = tasks["gates"][tag] = threading.Event()
    holder = tasks["skip"].delay(0, tag=tag)
    recorder.wait_for("lock_acquired", holder.id, HANG_GUARD)
    try:
        yield holder
    finally:
        gate.set()
    assert holder.get(timeout=HANG_GUARD) == "ran"


@contextmanager
def _held_elsewhere(nodes: RedisNodes, key: str, holder: str = "elsewhere") -> Iterator[None]:
    """The lock ``key`` held outside Celery while the block runs."""
    lease = Redlock(nodes.urls).acquire(key, ttl=HANG_GUARD, holder=holder)
    assert lease is not None
    yield
    lease.release()


def test_a_skipped_copy_is_ready_at_once_with_the_marker(
    worker: Any,
    tasks: dict[str, Any],
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_redlock.task")
    with _running_copy(tasks, recorder, "get") as holder:
        sent = time.monotonic()
        copy = tasks["skip"].delay(0.01, tag="get")
        value = copy.get(timeout=HANG_GUARD)
        took = time.monotonic() - sent
        holder_running = not holder.ready()
    assert copy.ready() and copy.successful() and copy.state == "SUCCESS"
    assert is_skipped(value) and value["redlock"] == SKIPPED
    assert value["key"] == tasks["skip"].lock_key((), {"seconds": 0.01, "tag": "get"})
    assert value["holder"].startswith(f"{holder.id}@")
    assert value["retries_exhausted"] is False
    assert "is held by" in value["reason"]
    # Still observable: the signal and the WARNING line.
    assert [c["action"] for c in recorder.of("lock_contended")] == ["skip"]
    assert any(
        copy.id in r.getMessage() and r.getMessage().endswith("-> skipped") for r in caplog.records
    )
    print(
        f"skipped copy: .get() returned {took * 1000:.0f} ms after delay() "
        "(the holder still running)"
    )
    assert holder_running


def test_a_group_with_a_skipped_member_completes(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    with _running_copy(tasks, recorder, "group"):
        sent = time.monotonic()
        results = group(tasks["skip"].s(0.01, tag="group"), tasks["skip"].s(0.01, tag="other"))()
        values = results.get(timeout=HANG_GUARD)
        took = time.monotonic() - sent
    assert results.ready()
    assert is_skipped(values[0]) and values[1] == "ran"
    print(f"group with a skipped member: complete {took * 1000:.0f} ms after sending")


def test_a_chord_with_a_skipped_member_runs_its_callback(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    with _running_copy(tasks, recorder, "chord") as holder:
        sent = time.monotonic()
        header = [tasks["skip"].s(0.01, tag="chord"), tasks["skip"].s(0.01, tag="free")]
        summary = chord(header)(tasks["collect"].s()).get(timeout=HANG_GUARD)
        took = time.monotonic() - sent
        holder_running = not holder.ready()
    assert summary == {"ran": 1, "skipped": 1}
    print(
        f"chord with a skipped member: callback result {took * 1000:.0f} ms after sending "
        "(the holder still running)"
    )
    assert holder_running


def test_a_link_callback_receives_the_marker(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    with _running_copy(tasks, recorder, "link"):
        copy = tasks["skip"].apply_async((0.01,), {"tag": "link"}, link=tasks["seen"].s())
        value = copy.get(timeout=HANG_GUARD)
        (linked,) = copy.children
        assert linked.get(timeout=HANG_GUARD) == value and is_skipped(value)


def test_retries_exhausted_skip_is_ready_at_once(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes
) -> None:
    key = tasks["exhaust"].lock_key((), {"tag": "budget"})
    with _held_elsewhere(redis_nodes, key):
        sent = time.monotonic()
        copy = tasks["exhaust"].delay(tag="budget")
        value = copy.get(timeout=HANG_GUARD)
        took = time.monotonic() - sent
    assert copy.ready() and copy.state == "SUCCESS"
    assert is_skipped(value) and value["retries_exhausted"] is True
    assert value["key"] == key and value["holder"] == "elsewhere"
    print(f"retries exhausted -> skip: .get() returned {took * 1000:.0f} ms after delay()")


def test_fail_mode_still_raises_lock_contended_at_get(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes
) -> None:
    with _held_elsewhere(redis_nodes, tasks["fail"].lock_key((), {"tag": "f"})):
        copy = tasks["fail"].delay(tag="f")
        with pytest.raises(LockContended) as caught:
            copy.get(timeout=HANG_GUARD)
    assert caught.value.holder == "elsewhere" and copy.ready()


def test_an_eager_skipped_copy_returns_the_marker(
    tasks: dict[str, Any], redis_nodes: RedisNodes
) -> None:
    key = tasks["skip"].lock_key((), {"seconds": 0.01, "tag": "eager"})
    with _held_elsewhere(redis_nodes, key):
        result = tasks["skip"].apply((0.01,), {"tag": "eager"})
    assert result.successful() and is_skipped(result.get())
    assert result.get()["holder"] == "elsewhere"
    assert tasks["skip"].apply((0.01,), {"tag": "eager"}).get() == "ran"


def test_a_skipping_copy_retries_an_outage_and_runs_once_the_nodes_answer(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder
) -> None:
    # Nobody is known to hold the lock during an outage: skipping would drop work
    # nobody does (the copy used to end skipped, naming no holder).
    paused = list(redis_nodes)[:3]
    for node in paused:
        node.pause()
    try:
        copy = tasks["skip"].delay(0.01, tag="outage")
        met = recorder.wait_for("lock_contended", copy.id, HANG_GUARD)
    finally:
        for node in paused:
            node.resume()
    assert met["action"] == "retry" and met["holder"] is None
    assert copy.get(timeout=HANG_GUARD) == "ran"


def test_an_outage_past_the_lock_retries_fails_and_never_skips(
    app: Celery, redis_nodes: RedisNodes
) -> None:
    @app.task(
        shared=False, base=RedlockTask, redlock_on_contended="skip", redlock_max_retries=0,
        redlock_on_retries_exhausted="skip", name="s.no_budget",
    )  # fmt: skip
    def no_budget() -> str:
        return "ran"

    paused = list(redis_nodes)[:3]
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        for node in paused:
            node.pause()
        try:
            with pytest.raises(QuorumUnavailable):
                no_budget.delay().get(timeout=HANG_GUARD)
        finally:
            for node in paused:
                node.resume()
