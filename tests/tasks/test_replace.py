# mypy: disallow-untyped-decorators=False
"""Replace the queued copy (``redlock_on_queued="replace"``): a duplicate enqueue takes
the queued copy's place, the replaced copy never runs its body and its result is the
``Replaced`` marker at once (tasks/replace.py).

A real Redis broker and result backend, 3 real lock nodes, an embedded worker (threads
pool). The bodies write what they ran with to the broker's Redis (the observer); the
lock's own word is never the evidence.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from celery_redlock import REPLACED, ConfigurationError, RedlockTask, is_replaced
from celery_redlock.signals import lock_contended
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import worker_test_app

#: Only guards against a hang.
HANG_GUARD = 30.0


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    for app in worker_test_app("replace", broker, redis_nodes, 0.05, 0.1):
        app.conf.redlock_node_timeout = 0.5
        app.conf.worker_prefetch_multiplier = 1
        yield app  # then results are freed while their backend runs


@pytest.fixture
def sync(app: Celery, broker: RedisServer) -> Any:
    observer = broker.client()

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_dedupe_queued=True,
        redlock_on_queued="replace", redlock_key=["user"], name="r.sync",
    )  # fmt: skip
    def sync(self: RedlockTask, user: int, version: int) -> int:
        observer.rpush("ran", f"{self.request.id} {user} {version}")
        if observer.get("hold"):
            observer.blpop(["gate"], timeout=10)
        return version

    sync.observer = observer
    return sync


def _ran(sync: Any) -> list[tuple[str, int, int]]:
    rows = [row.decode().split() for row in sync.observer.lrange("ran", 0, -1)]
    return [(task_id, int(user), int(version)) for task_id, user, version in rows]


def test_each_duplicate_enqueue_replaces_the_queued_copy_and_only_the_last_runs(
    app: Celery, sync: Any
) -> None:
    results = [sync.delay(user=7, version=v) for v in range(5)]
    sync.delay(user=8, version=0)  # another key: untouched
    # Replaced copies are ready at once, each naming the copy that replaced it.
    for old, new in zip(results, results[1:]):
        marker = old.get(timeout=1)
        assert is_replaced(marker) and marker["redlock"] == REPLACED
        assert marker["by"] == new.id and marker["key"] == sync.lock_key(
            (), {"user": 7, "version": 0}
        )
    assert results[-1].state == "PENDING"
    replaced: dict[str, str] = {}

    def seen(sender: Any, task_id: str, action: str, holder: str, **_: Any) -> None:
        if action == "replaced":
            replaced[task_id] = holder

    lock_contended.connect(seen, weak=False)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert results[-1].get(timeout=HANG_GUARD) == 4
        deadline = time.monotonic() + HANG_GUARD
        while len(_ran(sync)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + HANG_GUARD
        while len(replaced) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # the replaced messages arrive and end too
    lock_contended.disconnect(seen)
    # Each replaced message ended where it arrived, naming its replacement (metrics
    # count it as contended_total{action="replaced"}).
    assert replaced == {old.id: new.id for old, new in zip(results, results[1:])}
    ran = sorted(_ran(sync), key=lambda row: row[1])
    assert ran == [(results[-1].id, 7, 4), (ran[1][0], 8, 0)]
    assert all(is_replaced(r.get(timeout=1)) for r in results[:-1])


def test_a_copy_that_has_started_is_not_replaced_the_next_one_queues(
    app: Celery, sync: Any
) -> None:
    sync.observer.set("hold", 1)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        first = sync.delay(user=1, version=1)
        deadline = time.monotonic() + HANG_GUARD
        while not _ran(sync) and time.monotonic() < deadline:
            time.sleep(0.02)
        second = sync.delay(user=1, version=2)  # first is running: not replaced
        third = sync.delay(user=1, version=3)  # replaces second, which waits
        assert is_replaced(second.get(timeout=1)) and second.get()["by"] == third.id
        sync.observer.delete("hold")
        sync.observer.rpush("gate", 1)
        assert first.get(timeout=HANG_GUARD) == 1
        assert third.get(timeout=HANG_GUARD) == 3
    assert [version for _, _, version in _ran(sync)] == [1, 3]


def _replace_many(sync: Any, process: int, count: int, out: Any) -> None:
    try:
        with ThreadPoolExecutor(8) as pool:
            sent = list(
                pool.map(
                    lambda i: (sync.delay(user=5, version=process * 100 + i).id, process * 100 + i),
                    range(count),
                )
            )
    except BaseException as exc:  # report it: a silent child would hang the test
        out.put(repr(exc))
        raise
    out.put(sent)


def test_concurrent_enqueues_from_several_processes_leave_one_copy_that_runs_once(
    app: Celery, sync: Any
) -> None:
    """100 enqueues of one key from 4 processes (8 threads each), no worker yet: one
    copy is left, every other one's result is the marker naming a copy that was sent,
    and the markers lead to the survivor; the worker then runs the body once, with
    the survivor's arguments."""
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_replace_many, args=(sync, p, 25, out)) for p in range(4)]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
    versions = dict(pair for report in reports for pair in report)
    assert len(versions) == 100
    by: dict[str, str] = {}
    for task_id in versions:
        result = AsyncResult(task_id, app=app)
        if result.state == "SUCCESS":
            marker = result.get(timeout=1)
            assert is_replaced(marker) and marker["by"] in versions
            by[task_id] = marker["by"]
    survivors = set(versions) - set(by)
    assert len(survivors) == 1, survivors
    (survivor,) = survivors
    for task_id in versions:  # every chain of replacements ends at the survivor
        seen = 0
        while task_id in by and seen <= 100:
            task_id, seen = by[task_id], seen + 1
        assert task_id == survivor
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        assert AsyncResult(survivor, app=app).get(timeout=HANG_GUARD) == versions[survivor]
        deadline = time.monotonic() + HANG_GUARD
        while sync.app.connection_for_read().default_channel.client.llen("celery") and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)  # every replaced message taken and dropped
        time.sleep(0.5)
    assert _ran(sync) == [(survivor, 5, versions[survivor])]


def test_the_same_countdown_on_every_call_debounces(app: Celery, sync: Any) -> None:
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        results = []
        for v in range(5):
            results.append(sync.apply_async(kwargs={"user": 3, "version": v}, countdown=1.0))
            time.sleep(0.1)
        assert results[-1].get(timeout=HANG_GUARD) == 4
        time.sleep(1.0)  # every replaced message has come due and ended
    assert [version for _, _, version in _ran(sync)] == [4]
    assert all(is_replaced(r.get(timeout=1)) for r in results[:-1])


def test_a_replaced_copy_that_ignores_results_still_never_runs(
    app: Celery, broker: RedisServer
) -> None:
    observer = broker.client()

    @app.task(
        shared=False, base=RedlockTask, redlock_dedupe_queued=True, ignore_result=True,
        redlock_on_queued="replace", redlock_key="quiet", name="r.quiet",
    )  # fmt: skip
    def quiet(version: int) -> None:
        observer.rpush("quiet", version)

    old = quiet.delay(1)
    quiet.delay(2)
    assert AsyncResult(old.id, app=app).state == "PENDING"  # nothing stored: ignored
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        deadline = time.monotonic() + HANG_GUARD
        while not observer.llen("quiet") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    assert observer.lrange("quiet", 0, -1) == [b"2"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"redlock_on_queued": "replace"}, "redlock_dedupe_queued=True"),
        (
            {"redlock_on_queued": "replace", "redlock_dedupe_queued": True,
             "redlock_queued_until": "end"},
            'redlock_queued_until="start"',
        ),
        ({"redlock_on_queued": "replce", "redlock_dedupe_queued": True}, "'replace'"),
    ],
)  # fmt: skip
def test_replace_without_queue_once_or_with_until_end_is_refused_at_registration(
    app: Celery, options: dict[str, Any], named: str
) -> None:
    @app.task(shared=False, base=RedlockTask, name="r.bad", **options)
    def bad() -> None:
        return None

    with pytest.raises(ConfigurationError, match="redlock_on_queued") as caught:
        bad.redlock_options()
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("task_option", "per_call"), [("return", "replace"), ("replace", "return")]
)
def test_one_call_cannot_switch_replace_on_or_off(
    app: Celery, task_option: str, per_call: str
) -> None:
    @app.task(
        shared=False, base=RedlockTask, redlock_dedupe_queued=True,
        redlock_on_queued=task_option, name="r.switch",
    )  # fmt: skip
    def switch() -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"redlock\['on_queued'\].*task option"):
        switch.apply_async(redlock={"on_queued": per_call})


def test_a_caller_without_a_result_backend_replaces_and_the_replaced_copy_stores_its_marker(
    app: Celery, broker: RedisServer, redis_nodes: RedisNodes, caplog: pytest.LogCaptureFixture
) -> None:
    caller = Celery("replace", broker=broker.url, set_as_current=False)  # no backend
    caller.conf.redlock_nodes = redis_nodes.urls
    options = {
        "redlock_dedupe_queued": True, "redlock_on_queued": "replace", "redlock_key": "nb",
    }  # fmt: skip
    observer = broker.client()

    def body(version: int) -> int:
        observer.rpush("nb", version)
        return version

    sent = caller.task(shared=False, base=RedlockTask, name="r.nb", **options)(body)
    app.task(shared=False, base=RedlockTask, name="r.nb", **options)(body)
    with caplog.at_level("WARNING", logger="celery_redlock.queue_once"):
        old, new = sent.delay(1), sent.delay(2)
    assert [r.message for r in caplog.records] == []
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        marker = AsyncResult(old.id, app=app).get(timeout=HANG_GUARD)  # stored on arrival
        assert is_replaced(marker) and marker["by"] == new.id
        assert AsyncResult(new.id, app=app).get(timeout=HANG_GUARD) == 2
    assert observer.lrange("nb", 0, -1) == [b"2"]
