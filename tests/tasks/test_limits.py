# mypy: disallow-untyped-decorators=False
"""``redlock_limit`` and ``redlock_rate`` with an embedded worker, a real Redis broker
and 5 real lock nodes.

The bodies report to an observer that is not the lock (tests/support/starts.py), on
the broker's Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chord, group
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from celery_redlock import ConfigurationError, LockContended
from celery_redlock.skipped import is_skipped
from celery_redlock.tasks.limits import longest_countdown
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import worker_test_app
from tests.support.observed import most_in_window
from tests.support.starts import Observer, observed_task


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    yield from worker_test_app("redlock_limits", broker, redis_nodes, 0.05, 0.3)


def _results(results: list[AsyncResult], timeout: float) -> list[Any]:
    return [r.get(timeout=timeout, propagate=False) for r in results]


def test_a_limit_of_3_runs_3_at_a_time_and_every_copy(
    app: Celery, observer: Observer, contended: list[dict[str, Any]]
) -> None:
    job = observed_task(app, observer, "l.three", redlock_key="api:{tag}", redlock_limit=3)
    with start_worker(app, pool="threads", concurrency=8, perform_ping_check=False):
        results = [job.delay("api", 0.3, n) for n in range(12)]
        assert _results(results, 60) == list(range(12))
    assert observer.most_inside("api") == 3
    refusals = contended
    # A refusal names the limit, or none when racing copies split the nodes' slots.
    assert "limit 3/3" in {r["limit"] for r in refusals} <= {"limit 3/3", None}
    # A copy meeting a permit held under its own task id (its hand-off sibling: the
    # wake ran while its fallback was due) waits for it instead of spending a retry.
    assert {r["action"] for r in refusals} <= {"retry", "wait"}
    assert all(
        r["holder"].startswith(r["task_id"] + "@") for r in refusals if r["action"] == "wait"
    )


def test_bodies_longer_than_the_ttl_keep_their_permits(app: Celery, observer: Observer) -> None:
    # Each body outlasts three ttls: the watchdog renews each permit's slot. Were a
    # renewal to miss the slot, it would expire under a running body and a third copy
    # would start beside the two still inside.
    job = observed_task(
        app, observer, "l.long", redlock_key="long:{tag}", redlock_limit=2, redlock_ttl=0.6
    )
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        results = [job.delay("long", 2.0, n) for n in range(4)]
        assert _results(results, 60) == list(range(4))
    assert observer.most_inside("long") == 2


def _wait_inside(observer: Observer, tag: str) -> None:
    deadline = time.monotonic() + 30
    while int(observer.client.get(f"in:{tag}") or 0) < 1:
        assert time.monotonic() < deadline, f"no body of {tag} began"
        time.sleep(0.01)


def test_copies_with_a_wait_timeout_wait_in_the_worker_and_start_as_permits_free(
    app: Celery, observer: Observer, contended: list[dict[str, Any]]
) -> None:
    # 6 copies, 2 permits, 6 worker threads: 4 copies wait in their threads and each
    # starts when a permit frees -- none goes back through the broker.
    job = observed_task(
        app, observer, "l.wait", redlock_key="w:{tag}", redlock_limit=2,
        redlock_wait_timeout=20,
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=6, perform_ping_check=False):
        results = [job.delay("w", 0.4, n) for n in range(6)]
        assert _results(results, 60) == list(range(6))
    assert observer.most_inside("w") == 2
    assert contended == []
    assert all(r.state == "SUCCESS" for r in results)


def test_a_copy_whose_wait_timeout_runs_out_follows_its_contended_mode(
    app: Celery, observer: Observer, contended: list[dict[str, Any]]
) -> None:
    skipping = observed_task(
        app, observer, "l.wait_skip", redlock_key="ws:{tag}", redlock_wait_timeout=0.2,
        redlock_on_contended="skip",
    )  # fmt: skip
    waiting = observed_task(
        app, observer, "l.wait_long", redlock_key="wl:{tag}", redlock_wait_timeout=20,
        redlock_on_contended="skip",
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        first = skipping.delay("s", 1.5, 0)
        _wait_inside(observer, "s")
        short = _results([skipping.delay("s", 0.0, 1)], 30)[0]
        held = waiting.delay("l", 0.5, 0)
        _wait_inside(observer, "l")
        long = _results([waiting.delay("l", 0.0, 1)], 30)[0]
        assert _results([first, held], 30) == [0, 0]
    assert is_skipped(short), short  # waited 0.2 s of the 1.5 s hold, then skipped
    assert long == 1  # waited for the 0.5 s hold, then ran
    assert len(contended) == 1 and contended[0]["action"] == "skip"


def test_a_skipping_copy_over_the_limit_ends_skipped(app: Celery, observer: Observer) -> None:
    job = observed_task(
        app, observer, "l.skip", redlock_key="s:{tag}", redlock_limit=2,
        redlock_on_contended="skip",
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=6, perform_ping_check=False):
        results = _results([job.delay("s", 1.0, n) for n in range(5)], 30)
    ran = [r for r in results if not is_skipped(r)]
    skipped = [r for r in results if is_skipped(r)]
    assert len(ran) >= 2 and len(ran) + len(skipped) == 5
    assert all(r["key"].endswith("s:s") for r in skipped), skipped
    assert observer.most_inside("s") == 2


def test_callers_of_one_key_with_different_limits_fail_visibly(
    app: Celery, observer: Observer
) -> None:
    three = observed_task(app, observer, "l.k3", redlock_key="k:{tag}", redlock_limit=3)
    two = observed_task(app, observer, "l.k2", redlock_key="k:{tag}", redlock_limit=2)
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        first = three.delay("k", 2.0)
        deadline = time.monotonic() + 10
        while observer.most_inside("k") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        error = two.delay("k").get(timeout=20, propagate=False)
        assert first.get(timeout=20) == 0
    assert isinstance(error, ConfigurationError)
    assert "limit 2 for key" in str(error) and "the limit 3" in str(error)


def test_a_rate_holds_in_every_window_and_spends_no_lock_retry(
    app: Celery, observer: Observer, contended: list[dict[str, Any]]
) -> None:
    # redlock_max_retries=0: a copy that met a *held lock* would fail at once; copies
    # over the *rate* must all come back and run. So would a copy whose round a busy
    # machine stretched past the default 50 ms (an outage, no retry left; seen on a
    # loaded 2-CPU CI run): a round's deadline of 0.5 s keeps this about the rate.
    job = observed_task(
        app, observer, "r.five", redlock_key="rate:{tag}", redlock_limit="unlimited",
        redlock_rate="5/s", redlock_max_retries=0, redlock_node_timeout=0.5,
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=8, perform_ping_check=False):
        results = [job.delay("r", 0.0, n) for n in range(20)]
        assert _results(results, 60) == list(range(20))
    starts = observer.starts("r")
    assert len(starts) == 20
    # The observer reads its clock a moment after the start: a round trip at most.
    assert most_in_window(starts, 1_000_000 - 5_000) <= 5
    waits = contended
    assert waits and {w["action"] for w in waits} == {"wait"}
    assert {w["limit"] for w in waits} == {"rate 5/s"}
    assert all(w["countdown"] > 0 and w["attempt"] is None for w in waits)


def test_limit_and_rate_combine(app: Celery, observer: Observer) -> None:
    job = observed_task(
        app, observer, "r.both", redlock_key="both:{tag}", redlock_limit=2,
        redlock_rate=(4, 1.0),
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=8, perform_ping_check=False):
        assert _results([job.delay("b", 0.2, n) for n in range(10)], 60) == list(range(10))
    assert observer.most_inside("b") <= 2
    assert most_in_window(observer.starts("b"), 1_000_000 - 5_000) <= 4


def test_a_chord_and_a_group_over_a_limit_and_a_rate_get_every_members_value(
    app: Celery, observer: Observer
) -> None:
    # Copies over the limit retry and copies over the rate come back under their own
    # task id: the chord counts each member once, when its body ran, and the group's
    # results are the bodies' values.
    job = observed_task(
        app, observer, "r.canvas", redlock_key="canvas:{tag}", redlock_limit=2,
        redlock_rate="5/s",
    )  # fmt: skip

    @app.task(name="r.collect", shared=False)
    def collect(values: list[int]) -> list[int]:
        return sorted(values)

    with start_worker(app, pool="threads", concurrency=8, perform_ping_check=False):
        chorded = chord([job.s("c", 0.05, n) for n in range(8)])(collect.s())
        grouped = group([job.s("c", 0.05, n) for n in range(8, 12)])()
        assert chorded.get(timeout=60) == list(range(8))
        assert grouped.get(timeout=60) == list(range(8, 12))
    assert observer.most_inside("c") <= 2
    assert len(observer.starts("c")) == 12  # each member's body once
    assert most_in_window(observer.starts("c"), 1_000_000 - 5_000) <= 5


def test_eager_copies_wait_inline_for_the_rate(app: Celery, observer: Observer) -> None:
    app.conf.task_always_eager = True
    job = observed_task(app, observer, "r.eager", redlock_key="e:{tag}", redlock_rate="2/s")
    assert [job.delay("e", 0.0, n).get() for n in range(5)] == list(range(5))
    starts = observer.starts("e")
    assert most_in_window(starts, 1_000_000 - 5_000) <= 2
    assert starts[-1] - starts[0] >= 1_000_000 - 5_000  # the fifth waited a window


def test_a_failing_copy_over_the_limit_fails_naming_it(app: Celery, observer: Observer) -> None:
    job = observed_task(
        app, observer, "l.fail", redlock_key="f:{tag}", redlock_limit=1 + 1,
        redlock_on_contended="fail",
    )  # fmt: skip
    with start_worker(app, pool="threads", concurrency=6, perform_ping_check=False):
        results = _results([job.delay("f", 1.0, n) for n in range(4)], 30)
    errors = [r for r in results if isinstance(r, LockContended)]
    assert errors and all(e.limit == "limit 2/2" for e in errors)
    assert observer.most_inside("f") == 2


@pytest.mark.parametrize(
    ("options", "longest"),
    [({}, 1500.0), ({"visibility_timeout": 10}, 5.0), ({"visibility_timeout": "x"}, 1500.0),
     ({"visibility_timeout": 7200}, 1500.0)],
)  # fmt: skip
def test_a_copy_over_the_rate_waits_at_most_half_the_visibility_timeout(
    app: Celery, options: dict[str, Any], longest: float
) -> None:
    app.conf.broker_transport_options = options
    assert longest_countdown(app) == longest
