# mypy: disallow-untyped-decorators=False
"""A copy published again: what a lock retry stores, and a redelivery that meets its
own task id's lock (tasks/republish.py, tasks/redelivery.py).

An embedded Celery worker (threads pool), a real Redis broker and result backend, and
5 real lock nodes. The earlier delivery of a task id is played by a lease taken
outside Celery under that task id's holder name: a lease nobody renews is a run
whose pool child died; one the test releases is a run that finished.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.signals import after_task_publish

from celery_redlock import Redlock, RedlockTask
from celery_redlock.lock.lease import Lease
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, worker_test_app

#: Only guards against a hang: every wait here ends within a few seconds when right.
HANG_GUARD = 30.0


@pytest.fixture
def app(redis_server: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    yield from worker_test_app("republish", redis_server, redis_nodes, 0.05, 0.1)


@pytest.fixture
def tasks(app: Celery) -> dict[str, Any]:
    #: Task ids whose body ran, in order.
    runs: list[str] = []

    def body(task: Any) -> str:
        runs.append(task.request.id)
        return "ran"

    @app.task(shared=False, bind=True, base=RedlockTask, redlock_key="job:{tag}", name="r.retry")
    def retry(self: Any, tag: str) -> str:
        return body(self)

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="job:{tag}",
        redlock_on_contended="skip", name="r.skip",
    )  # fmt: skip
    def skip(self: Any, tag: str) -> str:
        return body(self)

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="job:{tag}",
        redlock_on_contended="fail", name="r.fail",
    )  # fmt: skip
    def fail(self: Any, tag: str) -> str:
        return body(self)

    return {"retry": retry, "skip": skip, "fail": fail, "runs": runs}


@pytest.fixture
def worker(app: Celery, tasks: dict[str, Any]) -> Iterator[Any]:
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False) as w:
        yield w


@contextmanager
def _held(nodes: RedisNodes, key: str, holder: str, ttl: float) -> Iterator[Lease]:
    """``key`` held under ``holder`` for ``ttl`` s, renewed by nobody."""
    lease = Redlock(nodes.urls).acquire(key, ttl=ttl, holder=holder)
    assert lease is not None
    yield lease


# -- a lock retry --------------------------------------------------------------------------------


def test_a_lock_retry_stores_retry_before_it_publishes_the_copy(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder
) -> None:
    # Stored after the copy is out (Celery's Retry), RETRY could land over the SUCCESS
    # the copy stored meanwhile when the worker paused in between: stored first, it
    # cannot -- and the delivery then ends storing nothing more.
    task = tasks["retry"]
    task_id = "lock-retry-0001"
    seen_at_publish: list[str] = []
    publishing = threading.Lock()

    def published(headers: Any = None, **_: Any) -> None:
        if (headers or {}).get("id") == task_id:
            with publishing:
                seen_at_publish.append(str(task.backend.get_state(task_id)))

    after_task_publish.connect(published, weak=False)
    try:
        with _held(redis_nodes, task.lock_key((), {"tag": "r"}), "elsewhere", 30.0) as lease:
            result = task.apply_async(kwargs={"tag": "r"}, task_id=task_id)
            recorder.wait_for("lock_contended", task_id, HANG_GUARD)
            lease.release()
        assert result.get(timeout=HANG_GUARD) == "ran"
    finally:
        after_task_publish.disconnect(published)
    retries = len(recorder.of("lock_contended"))
    assert retries >= 1
    # The first publish is the caller's (PENDING); each later one (a lock retry's
    # fallback, a wake) comes after RETRY was stored.
    assert seen_at_publish[0] == "PENDING" and len(seen_at_publish) >= 2
    assert set(seen_at_publish[1:]) == {"RETRY"}, seen_at_publish
    assert result.state == "SUCCESS" and tasks["runs"] == [task_id]


# -- a redelivery meeting its own task id's lock --------------------------------------------------


@pytest.mark.parametrize("mode", ["retry", "skip", "fail"])
def test_a_copy_meeting_its_own_dead_run_waits_for_its_lease_and_runs(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder, mode: str
) -> None:
    # A redelivery after its first delivery's pool child died: the dead run's lease
    # runs out by itself and nothing was stored, so the copy must run (dropping it, as
    # skip and fail once did, left the task PENDING forever).
    task, task_id = tasks[mode], f"dead-run-{mode}"
    with _held(redis_nodes, task.lock_key((), {"tag": mode}), f"{task_id}@w1:1234", 1.0):
        copy = task.apply_async(kwargs={"tag": mode}, task_id=task_id)
        met = recorder.wait_for("lock_contended", task_id, HANG_GUARD)
        assert met["action"] == "wait" and met["attempt"] is None  # no lock retry spent
    assert copy.get(timeout=HANG_GUARD) == "ran" and copy.state == "SUCCESS"
    assert [c["action"] for c in recorder.of("lock_contended")] == ["wait"]
    assert tasks["runs"] == [task_id]


def test_a_copy_meeting_its_own_run_is_dropped_once_that_run_stored_its_result(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder
) -> None:
    # A redelivery while its first delivery still runs (a visibility timeout): the
    # copy waits, storing nothing; the first run stores SUCCESS and releases; the copy
    # then wins the lock, reads that state and runs nothing, storing nothing over it.
    task, task_id = tasks["skip"], "live-run"
    with _held(redis_nodes, task.lock_key((), {"tag": "live"}), f"{task_id}@w1:1234", 2.0) as lease:
        copy = task.apply_async(kwargs={"tag": "live"}, task_id=task_id)
        assert recorder.wait_for("lock_contended", task_id, HANG_GUARD)["action"] == "wait"
        assert copy.state == "PENDING"
        task.backend.store_result(task_id, "the first run's", "SUCCESS")
        lease.release()
    with recorder.lock:  # the copy's two deliveries: the wait, then the drop

        def ended() -> list[Any]:
            return [e for e in recorder.of("task_postrun") if e["task_id"] == task_id]

        assert recorder.lock.wait_for(lambda: len(ended()) == 2, HANG_GUARD)
    assert copy.get(timeout=HANG_GUARD) == "the first run's"
    assert tasks["runs"] == []
    assert [c["action"] for c in recorder.of("lock_contended")] == ["wait"]


@pytest.mark.parametrize("mark", ["redelivered", "retry"])
def test_a_copy_of_a_finished_task_handed_out_again_is_dropped(
    worker: Any, tasks: dict[str, Any], recorder: Recorder, mark: str
) -> None:
    # A worker dies after the body returned but before its late ack left (a green
    # pool sends acks from its loop), or between publishing a retry copy and acking
    # the message it retried: the broker hands the message out again later, marked
    # redelivered (a retry carries its count), and it meets no lease. Holding the
    # lease, it reads the stored state: the task finished, so its body does not run twice.
    task, task_id = tasks["retry"], f"finished-{mark}"
    assert task.apply_async(kwargs={"tag": mark}, task_id=task_id).get(HANG_GUARD) == "ran"
    marked = {"headers": {"redelivered": True}} if mark == "redelivered" else {"retries": 1}
    again = task.apply_async(kwargs={"tag": mark}, task_id=task_id, **marked)
    with recorder.lock:

        def ended() -> list[Any]:
            return [e for e in recorder.of("task_postrun") if e["task_id"] == task_id]

        assert recorder.lock.wait_for(lambda: len(ended()) == 2, HANG_GUARD)
    assert tasks["runs"] == [task_id]
    assert again.get(timeout=HANG_GUARD) == "ran" and again.state == "SUCCESS"


def test_an_unmarked_copy_of_a_finished_task_id_runs_again(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    # Only a copy that says it may be a second one reads the stored state: a new
    # message that reuses a task id on purpose is the caller's to run.
    task, task_id = tasks["retry"], "finished-unmarked"
    assert task.apply_async(kwargs={"tag": "u"}, task_id=task_id).get(HANG_GUARD) == "ran"
    task.apply_async(kwargs={"tag": "u"}, task_id=task_id)
    with recorder.lock:

        def ended() -> list[Any]:
            return [e for e in recorder.of("task_postrun") if e["task_id"] == task_id]

        assert recorder.lock.wait_for(lambda: len(ended()) == 2, HANG_GUARD)
    assert tasks["runs"] == [task_id, task_id]
