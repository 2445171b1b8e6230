"""``redlock_cooldown`` with an embedded worker, a real Redis broker and 5 real lock
nodes (tasks/cooldown.py).

The bodies report their starts to an observer that is not the lock
(tests/support/starts.py): start times read from the broker Redis' own clock. A
cooldown is judged on those: consecutive starts of one key at least the cooldown
apart. Waiting for a cooldown to pass is sleeping by design here (it is what the
feature does), never a timed assertion.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import LockContended
from celery_redlock.skipped import is_skipped
from celery_redlock.tasks.headers import ENTRY_HEADER, TICK_HEADER
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import worker_test_app
from tests.support.starts import Observer, observed_task

#: Only guards against a hang.
HANG_GUARD = 30.0
#: The observer notes a body's entry, a thread switch or two after its admission: a
#: first body entered late shortens the gap it opens by that much (1.4 ms seen in CI).
ENTRY_SLACK = 0.01


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    yield from worker_test_app("redlock_cooldown", broker, redis_nodes, 0.05, 0.3)


def _gaps(starts: list[int]) -> list[float]:
    """Seconds between consecutive starts (observer's µs)."""
    return [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]


def test_copies_inside_a_cooldown_are_skipped_with_its_end_then_the_next_runs(
    app: Celery, observer: Observer
) -> None:
    job = observed_task(
        app, observer, "c.skip", redlock_key="report:{tag}", redlock_cooldown=2,
        redlock_on_contended="skip",
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert job.delay("a", n=0).get(timeout=HANG_GUARD) == 0
        inside = [job.delay("a", n=n).get(timeout=HANG_GUARD) for n in range(1, 4)]
        assert all(is_skipped(r) for r in inside), inside
        for marker in inside:
            assert marker["key"].endswith("report:a")
            assert "cooldown of 2s" in marker["reason"]
            assert time.time() < marker["until"] <= time.time() + 2.5
        time.sleep(max(r["until"] for r in inside) - time.time() + 0.05)
        assert job.delay("a", n=9).get(timeout=HANG_GUARD) == 9
        # another key has a cooldown of its own
        assert job.delay("b", n=5).get(timeout=HANG_GUARD) == 5
    starts = observer.starts("a")
    assert len(starts) == 2 and _gaps(starts)[0] >= 2.0 - ENTRY_SLACK, _gaps(starts)


def test_a_retrying_copy_comes_back_when_the_cooldown_ends_spending_no_lock_retry(
    app: Celery, observer: Observer, contended: list[dict[str, Any]]
) -> None:
    # redlock_max_retries=0: a copy that met a held lock would fail at once; copies
    # inside the cooldown must all come back and run. No lock: only the cooldown. A
    # round's deadline of 0.5 s: a busy machine's stall is not an outage here (as in
    # test_limits.py's rate test).
    job = observed_task(
        app, observer, "c.retry", redlock_key="sync:{tag}", redlock_limit="unlimited",
        redlock_cooldown=1.0, redlock_max_retries=0, redlock_node_timeout=0.5,
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results = [job.delay("r", n=n) for n in range(3)]
        assert sorted(r.get(timeout=HANG_GUARD) for r in results) == [0, 1, 2]
    gaps = _gaps(observer.starts("r"))
    assert len(gaps) == 2 and min(gaps) >= 1.0 - ENTRY_SLACK, gaps
    assert contended and {r["action"] for r in contended} == {"retry"}
    assert {r["limit"] for r in contended} == {"cooldown of 1s"}
    assert {r["attempt"] for r in contended} == {None}  # no lock retry spent


def test_a_failing_copy_inside_a_cooldown_fails_naming_it(app: Celery, observer: Observer) -> None:
    job = observed_task(
        app, observer, "c.fail", redlock_key="f:{tag}", redlock_cooldown=5,
        redlock_on_contended="fail",
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert job.delay("f", n=1).get(timeout=HANG_GUARD) == 1
        second = job.delay("f", n=2)
        with pytest.raises(LockContended, match="cooldown of 5s reached"):
            second.get(timeout=HANG_GUARD)
        assert second.state == "FAILURE"
    assert len(observer.starts("f")) == 1


def test_a_beat_tick_inside_a_cooldown_is_skipped_whatever_the_mode(
    app: Celery, observer: Observer
) -> None:
    job = observed_task(app, observer, "c.tick", redlock_key="t:{tag}", redlock_cooldown=5)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        first, second = (
            job.apply_async(
                ("t",), {"n": n}, headers={TICK_HEADER: n, ENTRY_HEADER: "every-s"}
            ).get(timeout=HANG_GUARD)
            for n in (1, 2)
        )  # one after the other: the second tick comes inside the first's cooldown
    assert first == 1
    assert is_skipped(second) and "cooldown of 5s" in second["reason"], second
    assert len(observer.starts("t")) == 1


def test_eager_copies_wait_inline_for_the_cooldown_or_skip(app: Celery, observer: Observer) -> None:
    waits = observed_task(app, observer, "c.eager", redlock_key="e:{tag}", redlock_cooldown=0.5)
    skips = observed_task(
        app, observer, "c.eager-skip", redlock_key="es:{tag}", redlock_cooldown=5,
        redlock_on_contended="skip",
    )  # fmt: skip
    assert [waits.apply(("e",), {"n": n}).get() for n in range(2)] == [0, 1]
    gaps = _gaps(observer.starts("e"))
    assert len(gaps) == 1 and gaps[0] >= 0.5, gaps
    assert skips.apply(("s",), {"n": 1}).get() == 1
    assert is_skipped(skips.apply(("s",), {"n": 2}).get())
