# mypy: disallow-untyped-decorators=False
"""Eager mode, the way users unit-test a RedlockTask: ``task_always_eager`` and ``apply()``.

Against real lock nodes; a holder in another thread. Each case runs with
``task_eager_propagates`` off and on: the copy behaves the same, only how the caller
learns an error differs (stored in the EagerResult, or raised).

- An outage of the lock nodes surfaces at once as ``QuorumUnavailable``: one lock
  round, no inline retries (they slept the caller through 20 backoffs, minutes).
- A contended lock (or a limit's every permit taken) is waited for inline, for at most
  the holder's remaining TTL as first seen; then the body runs. A holder that keeps
  renewing past that bound ends the wait like exhausted lock retries
  (``redlock_on_retries_exhausted``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockContended, QuorumUnavailable, Redlock, RedlockTask
from celery_redlock.skipped import is_skipped
from celery_redlock.testing import RedisNodes
from tests.support.appfixture import Recorder

pytestmark = pytest.mark.parametrize("propagates", [False, True], ids=["stored", "raised"])


#: For the app and the test's own holders: healthy nodes answer well within it, loaded or not.
NODE_TIMEOUT = 0.5


def _eager_app(nodes: RedisNodes, propagates: bool) -> Celery:
    """Default lock settings (1 s first backoff, 20 lock retries) but a node_timeout
    no scheduler hiccup of a loaded machine reaches: a healthy node must never look down."""
    app = Celery("eager", set_as_current=False)
    app.conf.redlock_nodes = nodes.urls
    app.conf.redlock_node_timeout = NODE_TIMEOUT
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = propagates
    return app


def _job(app: Celery, ran: list[float], **options: Any) -> Any:
    @app.task(shared=False, base=RedlockTask, redlock_key="eager:{n}", name="e.job", **options)
    def job(n: int) -> str:
        ran.append(time.monotonic())
        return "ran"

    return job


def _outcome(call: Any, propagates: bool) -> Any:
    """The call's value or error, however eager mode delivers it."""
    if propagates:
        try:
            return call().get()
        except Exception as exc:
            return exc
    return call().get(propagate=False)


def _call_released_once_it_waits(
    call: Any, propagates: bool, recorder: Recorder, lease: Any
) -> tuple[Any, float]:
    """``_outcome`` of ``call``, with ``lease`` released from another thread once the
    copy said it waits (``lock_contended``); the outcome and when the lease went."""
    released_at: list[float] = []

    def release_once_the_copy_waits() -> None:
        deadline = time.monotonic() + 30
        while not recorder.of("lock_contended") and time.monotonic() < deadline:
            time.sleep(0.01)
        released_at.append(time.monotonic())
        lease.release()

    thread = threading.Thread(target=release_once_the_copy_waits, daemon=True)
    thread.start()
    outcome = _outcome(call, propagates)
    thread.join(30)
    return outcome, released_at[0]


def test_an_outage_surfaces_at_once_without_inline_retries(
    redis_nodes_factory: Any, recorder: Recorder, propagates: bool
) -> None:
    nodes: RedisNodes = redis_nodes_factory(3)
    ran: list[float] = []
    job = _job(_eager_app(nodes, propagates), ran)
    for server in nodes:
        server.stop()
    error = _outcome(lambda: job.delay(1), propagates)
    assert isinstance(error, QuorumUnavailable), error
    assert "could not be reached" in str(error)
    # One lock round and done: a retry would have sent lock_contended first.
    assert [c["action"] for c in recorder.of("lock_contended")] == ["fail"]
    assert ran == []


def test_a_contended_copy_waits_inline_for_the_holder_then_runs(
    redis_nodes: RedisNodes, recorder: Recorder, propagates: bool
) -> None:
    ran: list[float] = []
    job = _job(_eager_app(redis_nodes, propagates), ran)
    key = job.lock_key((7,))
    holder = Redlock(redis_nodes.urls, node_timeout=NODE_TIMEOUT).acquire(
        key, ttl=30, holder="other-thread"
    )
    assert holder is not None
    call = lambda: job.delay(7)  # noqa: E731
    outcome, released_at = _call_released_once_it_waits(call, propagates, recorder, holder)
    assert outcome == "ran"
    assert len(ran) == 1 and ran[0] > released_at  # the body ran after the holder
    waits = recorder.of("lock_contended")
    assert waits and all(c["action"] == "retry" for c in waits)
    assert waits[0]["holder"] == "other-thread"
    assert len(recorder.of("lock_acquired")) == 1


def test_a_copy_over_the_limit_waits_inline_for_a_permit_then_runs(
    redis_nodes: RedisNodes, recorder: Recorder, propagates: bool
) -> None:
    ran: list[float] = []
    job = _job(_eager_app(redis_nodes, propagates), ran, redlock_limit=2)
    key = job.lock_key((9,))
    others = Redlock(redis_nodes.urls, node_timeout=NODE_TIMEOUT)
    first, second = (others.acquire(key, ttl=30, limit=2, holder=f"other-{i}") for i in range(2))
    assert first is not None and second is not None
    call = lambda: job.delay(9)  # noqa: E731
    outcome, released_at = _call_released_once_it_waits(call, propagates, recorder, first)
    second.release()
    assert outcome == "ran"
    assert len(ran) == 1 and ran[0] > released_at  # the body ran once a permit freed
    waits = recorder.of("lock_contended")
    assert waits and all(c["action"] == "retry" for c in waits)
    assert waits[0]["limit"] == "limit 2/2"


@pytest.mark.parametrize("exhausted", ["fail", "skip"])
def test_the_inline_wait_ends_after_the_holders_ttl(
    redis_nodes: RedisNodes, recorder: Recorder, propagates: bool, exhausted: str
) -> None:
    ran: list[float] = []
    job = _job(_eager_app(redis_nodes, propagates), ran, redlock_on_retries_exhausted=exhausted)
    key = job.lock_key((8,))
    ttl = 3.0  # renewed every ttl/3: a renewal round has room to spare under load
    holder = Redlock(redis_nodes.urls, node_timeout=NODE_TIMEOUT)
    with holder.lock(key, ttl=ttl, auto_extend=True, holder="renewing"):
        began = time.monotonic()
        outcome = _outcome(lambda: job.delay(8), propagates)
        waited = time.monotonic() - began
    assert ran == []
    if exhausted == "fail":
        assert isinstance(outcome, LockContended) and outcome.holder == "renewing"
    else:
        assert is_skipped(outcome) and outcome["retries_exhausted"] is True
    waits = recorder.of("lock_contended")
    assert [c["action"] for c in waits[:-1]] == ["retry"] * (len(waits) - 1)
    assert waits[-1]["action"] == exhausted
    # The bound is the holder's TTL as first seen: the copy gave up only after it.
    assert waited >= waits[0]["ttl"] > 0
    assert waits[0]["ttl"] <= ttl
