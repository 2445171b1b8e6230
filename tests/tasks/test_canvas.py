# mypy: disallow-untyped-decorators=False
"""What each contention mode does inside each canvas primitive, with a real worker.

One embedded worker (threads pool), a real Redis broker and result backend and 3 real
lock nodes, shared by the module. In every case one member of the canvas meets a
lock held outside Celery ("elsewhere"):

- ``retry``: the member waits (lock retries keep its canvas options); the holder lets
  go once the member has met the lock, and the canvas goes on with its value;
- ``skip``: the member ends SUCCESS with the Skipped marker, which flows on;
- ``fail``: the member ends FAILURE with ``LockContended``: a chain stops, a chord
  fails, ``link_error`` is called with the error;
- ``once`` (``redlock_dedupe_queued``): the member's queue place is held by another
  copy; a canvas member is sent anyway (its later steps wait for its own id), and it
  runs once the run-time lock lets it.

The canvas guide's table (docs/guides/canvas.md) states the same, case by case.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
from celery import Celery, chain, chord, group
from celery.contrib.testing.worker import start_worker
from celery.exceptions import ChordError
from celery.signals import after_task_publish

from celery_redlock import LockContended, Redlock, RedlockTask
from celery_redlock.skipped import is_skipped
from celery_redlock.tasks.queue_once import QUEUED_SUFFIX
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, recording, worker_test_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("mode", ["retry", "skip", "fail", "once"]),
]

#: Only guards against a hang: every wait ends in well under a second when right.
HANG_GUARD = 30.0


@dataclass
class Stack:
    app: Celery
    nodes: RedisNodes
    recorder: Recorder
    tasks: dict[str, Any]
    #: Errors handed to the ``c.errback`` link_error: (failed task id, error).
    errors: list[tuple[str, BaseException]]
    #: Names of the tasks published, in order.
    published: list[str]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    broker, nodes = RedisServer(), RedisNodes(3)
    broker.start()
    nodes.start()
    published: list[str] = []

    def publish(sender: Any = None, **_: Any) -> None:
        published.append(str(sender))

    after_task_publish.connect(publish, weak=False)
    try:
        for app in worker_test_app("canvas", broker, nodes, 0.05, 0.2):
            errors: list[tuple[str, BaseException]] = []
            tasks = _define(app, errors)
            with (
                recording() as recorder,
                start_worker(app, pool="threads", concurrency=4, perform_ping_check=False),
            ):
                yield Stack(app, nodes, recorder, tasks, errors, published)
                # What the signals and errbacks kept refers to results: free them
                # while the backend runs (see appfixture).
                errors.clear()
                recorder.events.clear()
    finally:
        after_task_publish.disconnect(publish)
        nodes.close()
        broker.close()


def _define(app: Celery, errors: list[tuple[str, BaseException]]) -> dict[str, Any]:
    tasks: dict[str, Any] = {}
    for mode in ("retry", "skip", "fail"):

        @app.task(
            shared=False, base=RedlockTask, redlock_key="canvas:{tag}",
            redlock_on_contended=mode, name=f"c.{mode}",
        )  # fmt: skip
        def member(tag: str) -> str:
            return f"ran:{tag}"

        tasks[mode] = member

    @app.task(
        shared=False, base=RedlockTask, redlock_key="canvas:{tag}",
        redlock_dedupe_queued=True, name="c.once",
    )  # fmt: skip
    def once(tag: str) -> str:
        return f"ran:{tag}"

    @app.task(shared=False, name="c.echo")
    def echo(value: Any) -> Any:
        return value

    @app.task(shared=False, name="c.collect")
    def collect(values: list[Any]) -> list[Any]:
        return values

    @app.task(shared=False, name="c.errback")
    def errback(request: Any, exc: BaseException, traceback: Any) -> None:
        errors.append((request.id, exc))

    tasks.update(once=once, echo=echo, collect=collect, errback=errback)
    return tasks


@contextmanager
def _contended(stack: Stack, mode: str, tag: str) -> Iterator[None]:
    """The lock of ``tag`` held elsewhere (``once``: and its queue place). In retry
    and once mode it is let go once a copy has met it, else when the block ends."""
    key = f"redlock:canvas:{tag}"
    locks = Redlock(stack.nodes.urls)
    place = None
    if mode == "once":
        # Another copy's queue place, and the run-time lock, so that the member sent
        # beside it has to wait for the lock too.
        place = locks.acquire(key + QUEUED_SUFFIX, ttl=60, holder="queued")
        assert place is not None
    lease = locks.acquire(key, ttl=60, holder="elsewhere")
    assert lease is not None
    try:
        yield
        if mode in ("retry", "once"):
            stack.recorder.wait_for("lock_contended", None, HANG_GUARD, key=key)
    finally:
        lease.release()
    if place is not None:
        # The canvas member did not take the place over.
        assert locks.holder(key + QUEUED_SUFFIX).holder == "queued"
        place.release()
    locks.close()


def _run(stack: Stack, mode: str, tag: str, send: Callable[[], Any]) -> tuple[Any, Any]:
    """Send the canvas while ``tag`` is contended; its result and value once ready.

    Skip and fail: the value is read while the lock is still held. Retry and once:
    the holder lets go once the member has met the lock, and the value comes after.
    """
    waits = mode in ("retry", "once")
    with _contended(stack, mode, tag):
        result = send()
        if not waits:
            return result, result.get(timeout=HANG_GUARD, propagate=False)
    return result, result.get(timeout=HANG_GUARD, propagate=False)


def _traced(stack: Stack, mode: str, task_id: str) -> None:
    """Wait until the member's last run has been traced to its end (a lock retry's
    run ends RETRY first): whatever it stores, sends or calls is done by then."""
    final = "FAILURE" if mode == "fail" else "SUCCESS"
    stack.recorder.wait_for("task_postrun", task_id, HANG_GUARD, state=final)


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _expect(mode: str, value: Any, tag: str, holder: Optional[str] = "elsewhere") -> None:
    """The contended member's own outcome, as its mode says."""
    if mode in ("retry", "once"):
        assert value == f"ran:{tag}"
    elif mode == "skip":
        assert is_skipped(value) and value["holder"] == holder
    else:
        assert isinstance(value, LockContended) and value.holder == holder


def test_chain(stack: Stack, mode: str) -> None:
    tag = _tag()
    member, echo = stack.tasks[mode], stack.tasks["echo"]
    sent_before = len(stack.published)
    result, value = _run(stack, mode, tag, lambda: chain(member.s(tag), echo.s())())
    _expect(mode, value, tag)
    first = result.parent
    assert first is not None
    # Celery sends a chain's next step before it stores this one's result.
    _traced(stack, mode, first.id)
    if mode == "fail":
        # The chain stops: its first step failed, the echo step never ran.
        assert first.state == "FAILURE" and result.state == "FAILURE"
        assert "c.echo" not in stack.published[sent_before:]
    else:
        assert first.state == "SUCCESS" and result.state == "SUCCESS"


def test_group(stack: Stack, mode: str) -> None:
    tag, free = _tag(), _tag()
    member = stack.tasks[mode]
    members = [member.s(tag), member.s(free)]
    if mode == "once":
        members.append(member.s(tag))  # two copies of one key in the group: both run
    result, values = _run(stack, mode, tag, lambda: group(members)())
    _expect(mode, values[0], tag)
    assert values[1] == f"ran:{free}"
    if mode == "once":
        assert values[2] == f"ran:{tag}"
    assert result.ready()


def test_chord(stack: Stack, mode: str) -> None:
    tag, free = _tag(), _tag()
    member = stack.tasks[mode]
    _, value = _run(
        stack, mode, tag, lambda: chord([member.s(tag), member.s(free)])(stack.tasks["collect"].s())
    )
    if mode == "fail":
        assert isinstance(value, ChordError)  # the callback does not run
        assert "LockContended" in str(value)
    else:
        _expect(mode, value[0], tag)
        assert value[1] == f"ran:{free}"


def test_link(stack: Stack, mode: str) -> None:
    tag = _tag()
    member = stack.tasks[mode]
    result, value = _run(
        stack, mode, tag, lambda: member.apply_async((tag,), link=stack.tasks["echo"].s())
    )
    _expect(mode, value, tag)
    _traced(stack, mode, result.id)
    if mode == "fail":
        assert result.children in (None, [])  # link runs on success only
    else:
        (linked,) = result.children
        assert linked.get(timeout=HANG_GUARD) == value


def test_link_error(stack: Stack, mode: str) -> None:
    tag = _tag()
    member = stack.tasks[mode]
    result, value = _run(
        stack, mode, tag, lambda: member.apply_async((tag,), link_error=stack.tasks["errback"].s())
    )
    _expect(mode, value, tag)
    _traced(stack, mode, result.id)
    called = [exc for task_id, exc in stack.errors if task_id == result.id]
    if mode == "fail":
        assert len(called) == 1 and isinstance(called[0], LockContended)
        assert called[0].holder == "elsewhere"
    else:
        assert called == []  # a wait or a skip is not an error
