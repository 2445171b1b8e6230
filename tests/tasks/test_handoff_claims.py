# mypy: disallow-untyped-decorators=False
"""Hand-off claims with a lock node down: a waiter's wake and fallback race, and
exactly one runs (tasks/handoff.py).

An embedded Celery worker (threads pool), a real Redis broker and result backend, and
5 real lock nodes, one of them stopped for the whole test. A copy that met the lock
registered its waiter id and published its fallback; the test then releases the lock
and wakes the waiter, so the wake and the fallback arrive together. Claimed before
the lock (the old order) they could split the four live nodes 2-2, neither decided,
and with one lock retry each both ended FAILURE although the lock's quorum was fine.
Claimed under the lock they cannot race: one wins the lock and its claim, the other
meets the lock or finds the claim taken, and the task ends SUCCESS with one run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import Redlock, RedlockTask
from celery_redlock.tasks import handoff
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
