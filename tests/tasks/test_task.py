"""RedlockTask with an embedded Celery worker, a real Redis broker and 5 real lock nodes."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any, Callable

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Ignore
from celery.result import AsyncResult
from hypothesis import given
from hypothesis import strategies as st

from celery_redlock import (
    SKIPPED,
    ConfigurationError,
    LockContended,
    LockKeyError,
    RedlockTask,
    redlock_task,
)
from celery_redlock.skipped import is_skipped
from celery_redlock.tasks.config import app_config
from celery_redlock.testing import RedisNodes, RedisServer
from tests.support.appfixture import Recorder, gate_wait, worker_test_app
from tests.support.observe import until


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Iterator[Celery]:
    yield from worker_test_app("redlock_tests", broker, redis_nodes, 0.1, 0.3)


def _occupancy(broker: RedisServer) -> redis.Redis:
    return broker.client()


def _define(app: Celery, broker: RedisServer) -> dict[str, Any]:
    """Tasks used across the tests; the occupancy counter lives on the broker Redis.

    ``pauses[tag]``, when a test sets it, replaces a body's ``sleep(seconds)``: the
    body then runs until an event the test sets, or meets the others at a barrier.
    """
    counter = broker.client()
    pauses: dict[str, Callable[[], object]] = {}

    def pause(seconds: float, tag: str) -> None:
        if tag in pauses:
            pauses[tag]()
        else:
            time.sleep(seconds)

    @app.task(
        shared=False, bind=True, base=RedlockTask, redlock_ttl=5, redlock_key=["tag"], name="t.hold"
    )
    def hold(self: RedlockTask, seconds: float, tag: str = "x") -> dict[str, Any]:
        if counter.incr(f"occ:{tag}") != 1:
            counter.incr("overlaps")
        pause(seconds, tag)
        counter.decr(f"occ:{tag}")
        lease = self.redlock
        assert lease is not None
        return {"key": lease.key, "retries": self.request.retries, "held": lease.held}

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_ttl=5,
        redlock_on_contended="skip",
        name="t.skip",
    )
    def skipper(self: RedlockTask, seconds: float, tag: str = "x") -> str:
        pause(seconds, tag)
        return "ran"

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_ttl=5,
        redlock_on_contended="fail",
        name="t.fail",
    )
    def failer(self: RedlockTask, seconds: float, tag: str = "x") -> str:
        pause(seconds, tag)
        return "ran"

    @app.task(shared=False, bind=True, base=RedlockTask, redlock_ttl=30, name="t.handoff")
    def handoff(self: RedlockTask, tag: str) -> dict[str, Any]:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return {"retries": self.request.retries}

    class Flaky(Exception):
        pass

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_ttl=30,
        autoretry_for=(Flaky,),
        retry_kwargs={"countdown": 0, "max_retries": 2},
        name="t.autoretry",
    )
    def autoretry(self: RedlockTask, tag: str) -> int:
        if self.request.retries < 2:
            raise Flaky("again")
        return int(self.request.retries)

    @app.task(shared=False, bind=True, base=RedlockTask, redlock_ttl=30, name="t.ignore")
    def ignorer(self: RedlockTask, tag: str) -> None:
        raise Ignore()

    def long_job(name: str, ttl: float) -> Any:
        """A task keyed ``long:{tag}`` whose body runs until its pause ends."""

        @app.task(
            shared=False, bind=True, base=RedlockTask, redlock_ttl=ttl,
            redlock_key="long:{tag}", name=name,
        )  # fmt: skip
        def run(self: RedlockTask, tag: str) -> dict[str, Any]:
            pauses[tag]()
            lease = self.redlock
            assert lease is not None
            return {"extensions": lease.extensions, "held": lease.held}

        return run

    return {
        "hold": hold,
        "skip": skipper,
        "fail": failer,
        "handoff": handoff,
        "autoretry": autoretry,
        "ignore": ignorer,
        # TTLs far above a loaded machine's pauses: a renewal is due every ttl/3.
        "long": long_job("t.long", 2.0),
        "lost": long_job("t.lost", 3.0),
        "counter": counter,
        "pauses": pauses,
    }


@pytest.fixture
def tasks(app: Celery, broker: RedisServer) -> dict[str, Any]:
    return _define(app, broker)


@pytest.fixture
def worker(app: Celery, tasks: dict[str, Any]) -> Iterator[Any]:
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False) as w:
        yield w


def _wait(result: AsyncResult, timeout: float = 15) -> Any:
    return result.get(timeout=timeout, propagate=False)


# -- contention modes ---------------------------------------------------------------------


def test_duplicate_is_retried_until_the_holder_finishes_and_never_overlaps(
    worker: Any, tasks: dict[str, Any], recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_redlock.task")
    gate = threading.Event()
    tasks["pauses"]["r"] = gate_wait(gate)
    first = tasks["hold"].delay(0, tag="r")
    recorder.wait_for("lock_acquired", first.id)
    second = tasks["hold"].delay(0, tag="r")  # sent while the first holds the lock
    recorder.wait_for("lock_contended", second.id)
    gate.set()  # the first ends only after the duplicate met its lock
    one, two = _wait(first), _wait(second)
    assert first.state == second.state == "SUCCESS"
    assert one["key"] == two["key"]
    assert tasks["counter"].get("overlaps") is None
    assert two["retries"] == 0  # lock retries do not spend the task's own retries
    contended = recorder.of("lock_contended")
    assert contended and contended[0]["action"] == "retry"
    # Later contentions are retries too, or -- once the holder's release handed the lock
    # to the duplicate -- its hand-off wake and its scheduled retry (two deliveries of
    # one task id) meeting each other: the later one waits for the earlier (redelivery).
    for c in contended[1:]:
        if c["action"] == "wait":
            assert c["task_id"] == second.id and c["holder"].startswith(second.id + "@"), c
        else:
            assert c["action"] == "retry", c
    assert contended[0]["holder"].startswith(first.id + "@")
    assert contended[0]["attempt"] == 1 and contended[0]["countdown"] > 0
    lines = [r.getMessage() for r in caplog.records if "lock contended" in r.getMessage()]
    assert len(lines) == len(contended)
    assert f"t.hold[{second.id}]" in lines[0]
    assert f"held by {first.id}@" in lines[0]
    assert "s left) -> retry in " in lines[0] and "(attempt 1/20)" in lines[0]


def test_skip_drops_the_duplicate_and_marks_it_skipped(
    worker: Any, tasks: dict[str, Any], recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_redlock.task")
    gate = threading.Event()
    tasks["pauses"]["s"] = gate_wait(gate)
    first = tasks["skip"].delay(0, tag="s")
    recorder.wait_for("lock_acquired", first.id)
    second = tasks["skip"].delay(0, tag="s")
    skipped = second.get(timeout=10)  # ready while the holder still runs (gate shut)
    gate.set()
    assert is_skipped(skipped) and skipped["redlock"] == SKIPPED  # not a silent success
    assert skipped["holder"].startswith(first.id + "@")
    assert _wait(first) == "ran"
    assert second.state == "SUCCESS"
    assert [c["action"] for c in recorder.of("lock_contended")] == ["skip"]
    assert any(
        r.getMessage().endswith("-> skipped") and second.id in r.getMessage()
        for r in caplog.records
    )


def test_fail_raises_lock_contended_naming_the_holder(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    gate = threading.Event()
    tasks["pauses"]["f"] = gate_wait(gate)
    first = tasks["fail"].delay(0, tag="f")
    recorder.wait_for("lock_acquired", first.id)
    second = tasks["fail"].delay(0, tag="f")
    error = _wait(second)  # ready while the holder still runs (gate shut)
    gate.set()
    assert second.state == "FAILURE"
    assert isinstance(error, LockContended)
    assert error.holder is not None and error.holder.startswith(first.id + "@")
    assert _wait(first) == "ran"


def test_distinct_keys_run_in_parallel(worker: Any, tasks: dict[str, Any]) -> None:
    # Each body holds its own lock and waits at the barrier for the other three:
    # they pass it only if all four hold their locks at the same time.
    barrier = threading.Barrier(4)
    for i in range(4):
        tasks["pauses"][f"p{i}"] = partial(barrier.wait, timeout=15)
    results = [tasks["hold"].delay(0, tag=f"p{i}") for i in range(4)]
    for result in results:
        assert result.get(timeout=20)["held"]  # a broken barrier fails the body
    assert not barrier.broken


def test_lock_retries_exhausted_fail_with_lock_contended(
    app: Celery, broker: RedisServer, redis_nodes: RedisNodes
) -> None:
    @app.task(shared=False, bind=True, base=RedlockTask, redlock_max_retries=2, name="t.budget")
    def budget(self: RedlockTask) -> str:
        return "ran"

    from celery_redlock import Redlock

    blocker = Redlock(redis_nodes.urls).acquire(budget.lock_key((), {}), ttl=30)
    assert blocker is not None
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        result = budget.delay()
        error = _wait(result)
    assert isinstance(error, LockContended)
    blocker.release()


# -- release on every path -------------------------------------------------------------


def test_retry_while_holding_hands_the_lock_to_the_next_attempt_at_once(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    result = tasks["handoff"].delay("h")
    assert _wait(result, 10) == {"retries": 1}
    assert recorder.of("lock_contended") == []  # the next attempt found it free
    assert len(recorder.of("lock_acquired")) == 2
    # The result is stored before after_return runs: wait for the hooks.
    until(lambda: len(recorder.of("lock_released")) == 2, "both attempts released the lock")


def test_autoretry_for_hands_the_lock_over_too(
    worker: Any, tasks: dict[str, Any], recorder: Recorder
) -> None:
    result = tasks["autoretry"].delay("a")
    assert _wait(result, 10) == 2
    assert recorder.of("lock_contended") == []


def test_ignore_from_the_body_still_releases(
    worker: Any, tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder
) -> None:
    result = tasks["ignore"].delay("i")
    until(lambda: recorder.of("lock_released"), "lock_released sent")
    key = tasks["ignore"].lock_key(("i",), {})
    assert recorder.of("lock_released")[0]["key"] == key
    clients = [server.client() for server in redis_nodes]  # the release returned at quorum
    until(lambda: all(c.get(key) is None for c in clients), "released on every node")
    assert result.id


def test_watchdog_keeps_the_lock_for_three_times_its_ttl(
    worker: Any, tasks: dict[str, Any], recorder: Recorder, redis_nodes: RedisNodes
) -> None:
    from celery_redlock import Redlock

    gate = threading.Event()
    tasks["pauses"]["w"] = gate_wait(gate, timeout=30)
    ttl = tasks["long"].redlock_options().ttl
    result = tasks["long"].delay(tag="w")
    recorder.wait_for("lock_acquired", result.id)
    taken_by = time.monotonic()  # the lock was taken before this
    # A node_timeout no loaded machine misses: each round must be decided (None), not
    # end as QuorumUnavailable because slow replies missed the default 0.05 s.
    other = Redlock(redis_nodes.urls, ttl=5, node_timeout=1.0)
    while time.monotonic() - taken_by < 3 * ttl:
        assert other.acquire("redlock:long:w", blocking=False) is None
        time.sleep(0.1)
    gate.set()
    outcome = _wait(result)
    assert outcome["held"] and outcome["extensions"] >= 3
    assert len(recorder.of("lock_extended")) >= 3
    assert recorder.of("lock_lost") == []


def test_losing_quorum_mid_task_fires_lock_lost_and_logs_an_error(
    worker: Any,
    tasks: dict[str, Any],
    recorder: Recorder,
    redis_nodes: RedisNodes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="celery_redlock.task")
    gate = threading.Event()
    tasks["pauses"]["lost"] = gate_wait(gate, timeout=30)
    ttl = tasks["lost"].redlock_options().ttl
    result = tasks["lost"].delay(tag="lost")
    recorder.wait_for("lock_acquired", result.id)
    servers = list(redis_nodes)[:3]
    for server in servers:
        server.pause()
    try:
        # The next renewal (due within ttl/3) fails: lost well within one TTL.
        recorder.wait_for("lock_lost", result.id, timeout=ttl)
    finally:
        for server in servers:
            server.resume()
        gate.set()
    lost = recorder.of("lock_lost")
    assert len(lost) == 1 and lost[0]["key"] == "redlock:long:lost"
    assert "needed 3" in lost[0]["reason"]
    assert _wait(result)["held"] is False
    errors = [r for r in caplog.records if r.getMessage().startswith("lock lost:")]
    assert len(errors) == 1 and result.id in errors[0].getMessage()


def test_a_release_without_quorum_is_a_warning_and_the_task_still_succeeds(
    worker: Any,
    tasks: dict[str, Any],
    recorder: Recorder,
    redis_nodes: RedisNodes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The body returns while 3 of 5 nodes are paused: the release cannot reach a
    quorum. The task's result is the body's, the lock is left to its TTL with one
    WARNING, and lock_released is still sent (the execution let go of it)."""
    caplog.set_level(logging.WARNING, logger="celery_redlock.task")
    gate = threading.Event()
    tasks["pauses"]["unreleased"] = gate_wait(gate, timeout=30)
    result = tasks["lost"].delay(tag="unreleased")
    recorder.wait_for("lock_acquired", result.id)
    servers = list(redis_nodes)[:3]
    for server in servers:
        server.pause()
    try:
        gate.set()
        recorder.wait_for("lock_released", result.id, timeout=30)
    finally:
        for server in servers:
            server.resume()
    assert "extensions" in _wait(result)  # the body's own return value: SUCCESS
    warnings = [r for r in caplog.records if r.getMessage().startswith("release of lock")]
    assert len(warnings) == 1 and "redlock:long:unreleased" in warnings[0].getMessage()
    assert warnings[0].levelno == logging.WARNING


# -- keys, eager mode and signals ---------------------------------------------------------


def test_call_forms_share_a_key(tasks: dict[str, Any]) -> None:
    task = tasks["fail"]  # default key: every argument
    key = task.lock_key((1.0,), {"tag": "k"})
    assert key == task.lock_key((), {"seconds": 1.0, "tag": "k"})
    assert key == task.lock_key((), {"tag": "k", "seconds": 1.0})
    assert task.lock_key((1.0,), {}) == task.lock_key((1.0, "x"), {})  # default applied
    assert key != task.lock_key((2.0,), {"tag": "k"})
    assert key.startswith("redlock:t.fail:")
    hold = tasks["hold"]  # keyed on ["tag"] only
    assert hold.lock_key((1.0,), {"tag": "k"}) == hold.lock_key((9.0,), {"tag": "k"})


def test_apply_locks_and_releases_like_a_worker(
    app: Celery, tasks: dict[str, Any], recorder: Recorder, redis_nodes: RedisNodes
) -> None:
    result = tasks["hold"].apply(args=(0.01,), kwargs={"tag": "e"})
    assert result.successful()
    assert len(recorder.of("lock_acquired")) == len(recorder.of("lock_released")) == 1
    from celery_redlock import Redlock

    key = tasks["fail"].lock_key((0.01,), {"tag": "e"})
    blocker = Redlock(redis_nodes.urls).acquire(key, ttl=30)
    assert blocker is not None
    failed = tasks["fail"].apply(args=(0.01,), kwargs={"tag": "e"})
    assert isinstance(failed.result, LockContended)
    blocker.release()


def test_always_eager_retries_inline_then_runs(
    app: Celery, tasks: dict[str, Any], redis_nodes: RedisNodes
) -> None:
    from celery_redlock import Redlock

    key = tasks["hold"].lock_key((0.01,), {"tag": "eager"})
    blocker = Redlock(redis_nodes.urls).acquire(key, ttl=0.4)
    assert blocker is not None
    app.conf.task_always_eager = True
    result = tasks["hold"].delay(0.01, tag="eager")
    assert result.successful()


def test_redlock_task_decorator_is_app_task_with_the_base(app: Celery) -> None:
    @redlock_task(app, shared=False, redlock_on_contended="skip", name="t.decorated")
    def nightly() -> str:
        return "done"

    assert isinstance(nightly, RedlockTask)
    assert nightly.redlock_options().on_contended == "skip"
    assert nightly.apply().get() == "done"


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"redlock_on_contended": "wait"}, "redlock_on_contended must be one of"),
        ({"redlock_ttl": 0}, "redlock_ttl must be > 0"),
        ({"redlock_ttl": "10"}, "redlock_ttl must be a finite number"),
        ({"redlock_max_retries": -1}, "redlock_max_retries must be an int >= 0"),
        ({"redlock_auto_extend": "yes"}, "redlock_auto_extend must be True or False"),
        ({"redlock_tll": 5}, "unknown option 'redlock_tll'"),
        ({"redlock_key": 42}, "redlock_key must be None"),
        ({"redlock_key": "import:{nope}"}, "nope"),
        ({"redlock_limit": 0}, "redlock_limit must be an int from 1 to 1000"),
        ({"redlock_limit": "5"}, "redlock_limit must be an int from 1 to 1000"),
        ({"redlock_limit": "unlimited"}, 'redlock_limit="unlimited" needs redlock_rate'),
        ({"redlock_rate": "10/fortnight"}, 'redlock_rate must be "R/s", "R/m"'),
        ({"redlock_rate": (0, 1)}, 'redlock_rate must be "R/s", "R/m"'),
        ({"redlock_rate": (5, -1)}, 'redlock_rate must be "R/s", "R/m"'),
    ],
)
def test_bad_task_option_is_a_clear_error_for_the_caller_and_the_worker_lives_on(
    app: Celery, tasks: dict[str, Any], options: dict[str, Any], expected: str
) -> None:
    def job(customer_id: int = 1) -> None:
        return None

    bad = app.task(shared=False, base=RedlockTask, name="t.bad", **options)(job)
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        bad.delay()  # the caller learns at once
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        # A message sent by name (another client) reaches the worker anyway:
        error = _wait(app.send_task("t.bad"))
        assert isinstance(error, ConfigurationError)
        assert expected in str(error)
        assert _wait(tasks["hold"].delay(0.01, tag="alive"))["held"]


def test_unknown_app_setting_is_named(app: Celery, tasks: dict[str, Any]) -> None:
    app.conf.redlock_tll = 5
    with pytest.raises(ConfigurationError, match="unknown setting 'redlock_tll'"):
        tasks["hold"].apply(args=(0.01,), throw=True)


def test_missing_nodes_with_a_non_redis_broker_is_a_clear_error() -> None:
    app = Celery("nonredis", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)

    @app.task(shared=False, base=RedlockTask, name="t.amqp")
    def job() -> None:
        return None

    with pytest.raises(ConfigurationError, match="redlock_nodes is not set and the broker"):
        job.apply(throw=True)


def test_a_broker_given_only_by_celery_broker_url_is_the_lock_node(
    redis_nodes: RedisNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery reads CELERY_BROKER_URL from the environment ahead of app.conf (a common
    # container set-up): with redlock_nodes unset, that broker is the lock node.
    url = redis_nodes[0].url
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    app = Celery("envbroker", set_as_current=False)

    @app.task(shared=False, base=RedlockTask, name="t.envbroker")
    def job() -> str:
        return "ran"

    assert job.apply(throw=True).get() == "ran"
    assert app_config(app).nodes == (url,)


def test_argument_without_canonical_form_is_a_clear_error(tasks: dict[str, Any]) -> None:
    with pytest.raises(LockKeyError, match=r"t\.hold") as caught:
        tasks["hold"].apply(args=(0.01,), kwargs={"tag": object()}, throw=True)
    assert "tag" in str(caught.value)


def test_split_vote_does_not_make_a_skip_task_drop_its_work(
    tasks: dict[str, Any], redis_nodes: RedisNodes, recorder: Recorder
) -> None:
    # Two losers of a race each hold 2 of 5 nodes for 0.2 s: nobody has a quorum.
    key = tasks["skip"].lock_key((0.01,), {"tag": "split"})
    clients = [server.client() for server in redis_nodes]
    for i, client in enumerate(clients[:4]):
        client.set(key, b"loser-a|a" if i < 2 else b"loser-b|b", px=200)
    result = tasks["skip"].apply(args=(0.01,), kwargs={"tag": "split"})
    assert result.get() == "ran"  # waited out the split instead of skipping
    assert recorder.of("lock_contended") == []


@pytest.mark.parametrize("mode", ["skip", "fail"])
def test_a_split_vote_with_one_node_down_is_waited_out_not_read_as_an_outage(
    mode: str,
    tasks: dict[str, Any],
    redis_nodes: RedisNodes,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One of 5 nodes is down; two losers of a race each hold 2 of the other 4 for
    # 0.2 s. A quorum (3) can still answer, so this is a split, not an outage.
    caplog.set_level(logging.WARNING, logger="celery_redlock.task")
    redis_nodes[4].kill()
    key = tasks[mode].lock_key((0.01,), {"tag": "split-down"})
    for i, server in enumerate(list(redis_nodes)[:4]):
        server.client().set(key, b"loser-a|a" if i < 2 else b"loser-b|b", px=200)
    result = tasks[mode].apply(args=(0.01,), kwargs={"tag": "split-down"})
    assert result.get() == "ran"  # waited out the split: not skipped, not failed
    assert recorder.of("lock_contended") == []
    assert "lock nodes unavailable" not in caplog.text


def test_a_split_copy_is_retried_whatever_its_mode_until_its_retries_run_out() -> None:
    from celery_redlock.tasks.contention import verdict
    from celery_redlock.tasks.options import DEFAULTS, TASK_OPTIONS, task_options

    values = {name: DEFAULTS[name] for name in TASK_OPTIONS}
    for mode in ("skip", "fail"):
        values.update(redlock_on_contended=mode, redlock_max_retries=3)
        options = task_options(values)
        for attempt in (1, 3):
            decided = verdict(
                options, attempt, None, outage=False, eager=False, eager_left=None, split=True
            )
            assert decided.action == "retry" and decided.countdown is not None
        decided = verdict(options, 4, None, outage=False, eager=False, eager_left=None, split=True)
        assert decided.exhausted and decided.action == options.on_retries_exhausted
    with pytest.raises(ValueError, match="outage or a split vote, not both"):
        verdict(options, 1, None, outage=True, eager=False, eager_left=None, split=True)


def test_a_beat_tick_sent_twice_runs_once(tasks: dict[str, Any], recorder: Recorder) -> None:
    from celery_redlock.beat import ENTRY_HEADER, TICK_HEADER

    tick = {TICK_HEADER: 1234, ENTRY_HEADER: "every-second"}
    first = tasks["hold"].apply(args=(0.01,), kwargs={"tag": "tick"}, headers=tick)
    assert first.successful()
    again = tasks["hold"].apply(
        args=(0.01,), kwargs={"tag": "tick"}, headers=tick, task_id=first.id
    )
    assert again.successful()  # the same copy retried: not a duplicate
    duplicate = tasks["hold"].apply(args=(0.01,), kwargs={"tag": "tick"}, headers=tick)
    assert is_skipped(duplicate.get())  # another copy of the same tick: skipped
    skipped = [c for c in recorder.of("lock_contended") if c["action"] == "skip"]
    assert [c["key"] for c in skipped] == ["redlock:beat-ran:every-second:1234"]
    assert skipped[0]["holder"].startswith(first.id + "@")
    next_tick = {TICK_HEADER: 1235, ENTRY_HEADER: "every-second"}
    assert tasks["hold"].apply(args=(0.01,), kwargs={"tag": "tick"}, headers=next_tick).successful()


# -- the contended copy's verdict (contention.verdict), without a worker ---------------------


@given(
    on_contended=st.sampled_from(["retry", "skip", "fail"]),
    exhausted_to=st.sampled_from(["skip", "fail"]),
    attempt=st.integers(1, 12),
    max_retries=st.integers(0, 10),
    holder_ttl=st.one_of(st.none(), st.floats(0.0, 600.0)),
    outage=st.booleans(),
    eager=st.booleans(),
    eager_left=st.one_of(st.none(), st.floats(-1.0, 30.0)),
)
def test_the_verdict_of_a_contended_copy_follows_its_options(
    on_contended: str, exhausted_to: str, attempt: int, max_retries: int,
    holder_ttl: Any, outage: bool, eager: bool, eager_left: Any,
) -> None:  # fmt: skip
    from celery_redlock.tasks.contention import MIN_COUNTDOWN, verdict
    from celery_redlock.tasks.options import DEFAULTS, TASK_OPTIONS, task_options

    values = {name: DEFAULTS[name] for name in TASK_OPTIONS}
    values.update(
        redlock_on_contended=on_contended, redlock_on_retries_exhausted=exhausted_to,
        redlock_max_retries=max_retries,
    )  # fmt: skip
    options = task_options(values)
    left = eager_left if eager else None
    decided = verdict(options, attempt, holder_ttl, outage=outage, eager=eager, eager_left=left)
    retrying = (on_contended == "retry" or outage) and not (eager and outage)
    over = attempt > max_retries or (eager and left is None)
    assert decided.exhausted == (retrying and over)
    if retrying and not over:
        assert decided.action == "retry"
        assert decided.countdown is not None
        assert MIN_COUNTDOWN <= decided.countdown <= options.retry_backoff_max
        if left is not None:
            assert decided.countdown <= max(0.0, left) + MIN_COUNTDOWN
        assert decided.then.startswith("retry in ")
    else:
        chosen = on_contended
        if outage:  # an eager outage fails at once, an outage past the retries fails
            chosen = "fail"
        elif on_contended == "retry":  # the retries ran out
            chosen = exhausted_to
        assert decided.action == chosen
        assert decided.countdown is None
