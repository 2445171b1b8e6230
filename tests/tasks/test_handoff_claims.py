# mypy: disallow-untyped-decorators=False
"""Hand-off claims with a lock node down: a waiter's wake and fallback race, and
exactly one runs; a claimant whose run died comes back and runs (tasks/handoff.py).

An embedded Celery worker (threads pool), a real Redis broker and result backend, and
5 real lock nodes, one of them stopped for the whole test. A copy that met the lock
registered its waiter id and published its fallback; the test then releases the lock
and wakes the waiter, so the wake and the fallback arrive together. Claimed before
the lock (the old order) they could split the four live nodes 2-2, neither decided,
and with one lock retry each both ended FAILURE although the lock's quorum was fine.
Claimed under the lock they cannot race: one wins the lock and its claim, the other
meets the lock or finds the claim taken, and the task ends SUCCESS with one run.

A copy that won its claim and then died in the body (a SIGKILLed worker or pool child,
``acks_late``) is delivered again by the broker: the same message, so the same copy
id, the only one the claim lets run. When it met the lock again it used to be dropped
with the task never ending: a wake went back in the queue for the fallback, a
fallback published its next copy under a new copy id, and both of those lose the
claim. The test builds that state with real parts -- the claim won on the nodes for
a copy id, the lock held by another holder, the message published with the waiter's
and copy's ids -- and the task now ends SUCCESS, its body run once.

A copy whose claim round ended before its requests landed (a slow node, a lost reply)
is re-published with the same ids; its requests may land after it next reads the
claim. Reading nil everywhere it took a fresh copy id, then its late requests named
the old one on a quorum, and no copy could win any more. A copy marked as having
tried a claim keeps its ids for good, reading nothing: the test sends such a copy,
lets its "late requests" land while it waits, and the task ends SUCCESS.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery.signals import before_task_publish, task_postrun

from celery_redlock import Redlock, RedlockTask
from celery_redlock.lock import waiters
from celery_redlock.tasks import handoff
from celery_redlock.tasks.headers import (
    CLAIM_TRIED_HEADER,
    COPY_HEADER,
    WAITER_HEADER,
    WOKEN_HEADER,
)
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, worker_test_app

#: Only guards against a hang.
HANG_GUARD = 30.0
TRIALS = 8


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    with RedisNodes(5) as nodes:
        nodes[4].kill()  # a minority down: the lock's quorum (3 of 5) is fine
        yield from worker_test_app("claims", redis_server, nodes, 0.05, 0.1)


def counting_task(app: Celery, name: str) -> tuple[Any, Counter[str]]:
    """A task ``c.<name>`` on lock key ``<name>:{tag}`` (lock retries 0.2-0.5 s apart)
    whose body counts its runs per task id, and the counter."""
    runs: Counter[str] = Counter()

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key=f"{name}:{{tag}}",
        name=f"c.{name}", redlock_ttl=5, redlock_retry_backoff=0.2,
        redlock_retry_backoff_max=0.5,
    )  # fmt: skip
    def counted(self: Any, tag: str) -> str:
        runs[self.request.id] += 1
        return "ran"

    return counted, runs


def live_clients(app: Celery) -> list[redis.Redis]:
    """Clients of the 4 lock nodes that are up (the fifth is down)."""
    return [redis.Redis.from_url(url) for url in app.conf.redlock_nodes[:4]]


def test_a_waiters_wake_and_fallback_racing_with_a_node_down_run_the_body_once(
    app: Celery, recorder: Recorder
) -> None:
    runs: Counter[str] = Counter()

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="race:{tag}", name="c.race",
        redlock_max_retries=1, redlock_on_retries_exhausted="fail", redlock_ttl=5,
    )  # fmt: skip
    def race(self: Any, tag: str) -> str:
        runs[self.request.id] += 1
        return "ran"

    options = race.redlock_options()
    assert options.handoff  # the default
    redlock = Redlock(app.conf.redlock_nodes)
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results, woken = [], 0
        for trial in range(TRIALS):
            key = race.lock_key((), {"tag": str(trial)})
            blocker = redlock.acquire(key, ttl=HANG_GUARD, holder="elsewhere")
            assert blocker is not None
            result = race.delay(tag=str(trial))
            recorder.wait_for("lock_contended", result.id, HANG_GUARD)
            blocker.release()
            # The fallback is due within the retry backoff (0.1 s): wake the waiter now
            # (unless the fallback already ran and took its own entry out).
            woken += handoff.wake_next(race, key, options)
            results.append(result)
        outcomes = [r.get(timeout=HANG_GUARD, propagate=False) for r in results]
    assert outcomes == ["ran"] * TRIALS
    assert runs == Counter({r.id: 1 for r in results})
    assert woken >= 1
    print(f"{woken} of {TRIALS} waiters woken while their fallback was due: each ran once")


@pytest.mark.parametrize("woken", [True, False], ids=["wake", "fallback"])
def test_a_claimant_delivered_again_after_its_run_died_runs_once_the_lock_frees(
    app: Celery, recorder: Recorder, woken: bool
) -> None:
    runs: Counter[str] = Counter()

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="reborn:{tag}",
        name="c.reborn", redlock_ttl=5,
    )  # fmt: skip
    def reborn(self: Any, tag: str) -> str:
        runs[self.request.id] += 1
        return "ran"

    options = reborn.redlock_options()
    redlock = Redlock(app.conf.redlock_nodes)
    key = reborn.lock_key((), {"tag": "t"})
    waiter, copy = str(uuid4()), str(uuid4())
    # The earlier delivery of this message won the lock and its claim, then died.
    won = waiters.claim(
        redlock.node_set, redlock.quorum, key, waiter, copy, options.handoff_claim_ttl,
        redlock.node_timeout,
    )  # fmt: skip
    assert won.verdict == waiters.CLAIM_WON
    blocker = redlock.acquire(key, ttl=HANG_GUARD, holder="another-duplicate")
    assert blocker is not None
    headers: dict[str, Any] = {WAITER_HEADER: waiter, COPY_HEADER: copy}
    if woken:
        headers[WOKEN_HEADER] = 1
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        result = reborn.apply_async(kwargs={"tag": "t"}, headers=headers)
        recorder.wait_for("lock_contended", result.id, HANG_GUARD)
        blocker.release()
        assert result.get(timeout=HANG_GUARD) == "ran"
    assert runs == Counter({result.id: 1})


@pytest.mark.parametrize("woken", [True, False], ids=["wake", "fallback"])
def test_a_copy_meeting_the_lock_after_another_copy_claimed_its_waiter_ends_at_once(
    app: Celery, recorder: Recorder, woken: bool
) -> None:
    """Another copy of its waiter won the claim (it ran the body, runs it, or gave up):
    a copy of that waiter meeting the lock is dropped there -- no lock retry, no queue
    entry, no wake later -- rather than retrying until it wins a lease only to lose the
    claim, and wake the next waiter late. The task id's result stays the winner's."""
    settled, runs = counting_task(app, "settled")

    options = settled.redlock_options()
    redlock = Redlock(app.conf.redlock_nodes)
    key = settled.lock_key((), {"tag": "t"})
    waiter, task_id = str(uuid4()), str(uuid4())
    won = waiters.claim(
        redlock.node_set, redlock.quorum, key, waiter, "the-winner", options.handoff_claim_ttl,
        redlock.node_timeout,
    )  # fmt: skip
    assert won.verdict == waiters.CLAIM_WON
    app.backend.store_result(task_id, "ran by the winner", "SUCCESS")
    blocker = redlock.acquire(key, ttl=HANG_GUARD, holder="another-duplicate")
    assert blocker is not None
    published: list[str] = []
    ended = threading.Event()

    def seen(sender: str, headers: dict[str, Any], **_: Any) -> None:
        if sender == "c.settled":
            published.append(headers["id"])

    def done(sender: Any = None, **kwargs: Any) -> None:
        if kwargs.get("task_id") == task_id:
            ended.set()

    headers: dict[str, Any] = {WAITER_HEADER: waiter, COPY_HEADER: str(uuid4())}
    if woken:
        headers[WOKEN_HEADER] = 1
    before_task_publish.connect(seen, weak=False)
    task_postrun.connect(done, weak=False)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            settled.apply_async(kwargs={"tag": "t"}, headers=headers, task_id=task_id)
            assert ended.wait(HANG_GUARD)  # after the release hook's wake, if any
    finally:
        before_task_publish.disconnect(seen)
        task_postrun.disconnect(done)
        blocker.release()
    assert published == [task_id]  # the test's own message, nothing after it
    assert recorder.of("lock_contended") == []  # dropped before retrying
    queues = [c.zcard(waiters.queue_key(key)) for c in live_clients(app)]
    assert queues == [0, 0, 0, 0]
    assert AsyncResult(task_id, app=app).get(timeout=HANG_GUARD) == "ran by the winner"
    assert runs == Counter()


def test_a_copy_whose_claim_round_was_undecided_runs_when_its_late_claim_lands(
    app: Celery, recorder: Recorder
) -> None:
    late, runs = counting_task(app, "late")

    options = late.redlock_options()
    redlock = Redlock(app.conf.redlock_nodes)
    key = late.lock_key((), {"tag": "t"})
    waiter, copy = str(uuid4()), str(uuid4())
    blocker = redlock.acquire(key, ttl=HANG_GUARD, holder="another-duplicate")
    assert blocker is not None
    headers = {WAITER_HEADER: waiter, COPY_HEADER: copy, CLAIM_TRIED_HEADER: 1}
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        result = late.apply_async(kwargs={"tag": "t"}, headers=headers)
        # It met the lock (and, unmarked, would have read the claim: nil everywhere).
        recorder.wait_for("lock_contended", result.id, HANG_GUARD)
        landed = waiters.claim(
            redlock.node_set, redlock.quorum, key, waiter, copy, options.handoff_claim_ttl,
            redlock.node_timeout,
        )  # fmt: skip
        assert landed.verdict == waiters.CLAIM_WON  # its requests, landing late
        blocker.release()
        assert result.get(timeout=HANG_GUARD) == "ran"
    assert runs == Counter({result.id: 1})


def test_a_copy_whose_claim_is_split_is_published_again_marked_and_keeps_its_ids(
    app: Celery, redis_server: RedisServer
) -> None:
    """Four live nodes split 2-2 on the claim (the fifth is down): undecided. The copy
    gives the lock back and is published again with the same ids and the claim-tried
    mark; once one more node names it (the other claim expired there, its own request
    landed), it wins and runs."""
    split, runs = counting_task(app, "split")

    options = split.redlock_options()
    key = split.lock_key((), {"tag": "t"})
    waiter, copy = str(uuid4()), str(uuid4())
    claim = waiters.claim_key(key, waiter)
    clients = live_clients(app)
    ttl_ms = int(options.handoff_claim_ttl * 1000)
    for client, named in zip(clients, ["another-copy", "another-copy", copy, copy]):
        client.set(claim, named, px=ttl_ms)
    published: list[dict[str, Any]] = []

    def seen(sender: str, headers: dict[str, Any], **_: Any) -> None:
        if sender == "c.split":
            published.append(dict(headers))

    headers = {WAITER_HEADER: waiter, COPY_HEADER: copy}
    before_task_publish.connect(seen, weak=False)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            result = split.apply_async(kwargs={"tag": "t"}, headers=headers)
            deadline = time.monotonic() + HANG_GUARD
            while len(published) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            clients[0].set(claim, copy, px=ttl_ms)  # now 3 of 5 name it
            assert result.get(timeout=HANG_GUARD) == "ran"
    finally:
        before_task_publish.disconnect(seen)
    again = published[1]
    assert (again[WAITER_HEADER], again[COPY_HEADER]) == (waiter, copy)
    assert again[CLAIM_TRIED_HEADER] and CLAIM_TRIED_HEADER not in published[0]
    assert runs == Counter({result.id: 1})


def test_a_lock_retry_of_a_copy_with_a_waiter_id_stores_no_retry_over_a_siblings_result(
    app: Celery, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's fallback that meets the lock again while its wake has already run
    and stored SUCCESS: its lock retry publishes the next fallback without storing
    RETRY over that result (RETRY was stored once, when the waiter was first
    published). Celery's backend reads the state before it writes RETRY, so a plain
    read of the state cannot show a write it refused; a paused worker between its
    read and its write can (the soak saw it): the test records every RETRY write
    asked of the backend."""

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_key="sibling:{tag}",
        name="c.sibling", redlock_ttl=5, redlock_retry_backoff=0.2,
        redlock_retry_backoff_max=0.5,
    )  # fmt: skip
    def sibling(self: Any, tag: str) -> str:
        return "ran"

    redlock = Redlock(app.conf.redlock_nodes)
    key = sibling.lock_key((), {"tag": "t"})
    task_id = str(uuid4())
    app.backend.store_result(task_id, "ran by the wake", "SUCCESS")
    blocker = redlock.acquire(key, ttl=HANG_GUARD, holder="another-duplicate")
    assert blocker is not None
    published = threading.Semaphore(0)
    backend = type(app.backend)
    retries_stored: list[str] = []
    mark_as_retry = backend.mark_as_retry

    def recording(self: Any, task_id: str, *args: Any, **kwargs: Any) -> Any:
        retries_stored.append(task_id)
        return mark_as_retry(self, task_id, *args, **kwargs)

    monkeypatch.setattr(backend, "mark_as_retry", recording)

    def seen(sender: str, headers: dict[str, Any], **_: Any) -> None:
        if sender == "c.sibling" and headers.get("id") == task_id:
            published.release()

    headers = {WAITER_HEADER: str(uuid4()), COPY_HEADER: str(uuid4())}
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        before_task_publish.connect(seen, weak=False)
        try:
            sibling.apply_async(kwargs={"tag": "t"}, headers=headers, task_id=task_id)
            recorder.wait_for("lock_contended", task_id, HANG_GUARD)
            assert published.acquire(timeout=HANG_GUARD)  # the message the test sent
            assert published.acquire(timeout=HANG_GUARD)  # its next fallback
            # What a lock retry stores, it stores before it publishes.
            assert retries_stored == []
            assert AsyncResult(task_id, app=app).state == "SUCCESS"
        finally:
            before_task_publish.disconnect(seen)
            blocker.release()
