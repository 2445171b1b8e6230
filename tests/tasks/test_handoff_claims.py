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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import Redlock, RedlockTask
from celery_redlock.lock import waiters
from celery_redlock.tasks import handoff
from celery_redlock.tasks.headers import COPY_HEADER, WAITER_HEADER, WOKEN_HEADER
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
