"""Queue once: at most one queued copy per lock key, with real broker, nodes and worker."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_redlock import AlreadyQueued, ConfigurationError, LockContended, RedlockTask
from celery_redlock.testing import RedisNodes, RedisServer

QUEUE = "q1"


@pytest.fixture
def app(broker: RedisServer, redis_nodes: RedisNodes) -> Celery:
    app = Celery("queue_once", broker=broker.url, backend=broker.url, set_as_current=False)
    app.conf.redlock_nodes = redis_nodes.urls
    # Healthy nodes must never look down: a node_timeout no scheduler hiccup reaches.
    app.conf.redlock_node_timeout = 0.5
    app.conf.task_default_queue = QUEUE
    app.conf.worker_prefetch_multiplier = 1
    return app


@pytest.fixture
def tasks(app: Celery, broker: RedisServer) -> dict[str, Any]:
    gate = broker.client()

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_dedupe_queued=True,
        redlock_queued_ttl=60,
        redlock_key=["customer_id"],
        name="q.import",
    )
    def import_customer(self: RedlockTask, customer_id: int, note: str = "") -> str:
        gate.rpush("started", self.request.id)
        # Hold the run until the test opens the gate (at most 10 s).
        gate.blpop(["gate"], timeout=10)
        return str(self.request.id)

    @app.task(
        shared=False,
        bind=True,
        base=RedlockTask,
        redlock_dedupe_queued=True,
        redlock_queued_until="end",
        redlock_queued_ttl=60,
        redlock_key=["customer_id"],
        name="q.until",
    )
    def until_executed(self: RedlockTask, customer_id: int, note: str = "") -> str:
        gate.rpush("started", self.request.id)
        gate.blpop(["gate"], timeout=10)
        return str(self.request.id)

    @app.task(
        shared=False,
        base=RedlockTask,
        redlock_dedupe_queued=True,
        redlock_on_queued="raise",
        redlock_queued_ttl=1,
        name="q.strict",
    )
    def strict(customer_id: int) -> None:
        return None

    @app.task(shared=False, name="q.blocker")
    def blocker() -> None:
        gate.blpop(["gate"], timeout=10)

    return {
        "import": import_customer, "until": until_executed, "strict": strict, "blocker": blocker,
        "gate": gate,
    }  # fmt: skip


def _queued(broker: RedisServer) -> int:
    return int(broker.client().llen(QUEUE))


def _delay_many(task: Any, count: int, out: Any) -> None:
    try:
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda i: task.delay(7, note=str(i)).id, range(count)))
    except BaseException as exc:  # report it: a silent child would hang the test
        out.put(repr(exc))
        raise
    out.put(ids)


def test_concurrent_duplicates_from_several_processes_queue_one_message(
    tasks: dict[str, Any], broker: RedisServer
) -> None:
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_delay_many, args=(tasks["import"], 25, out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    reports = [out.get(timeout=60) for _ in procs]
    assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
    ids = [i for report in reports for i in report]
    for proc in procs:
        proc.join(10)
    assert len(ids) == 100
    assert len(set(ids)) == 1  # every caller got the one queued copy's id
    assert _queued(broker) == 1


def test_after_it_starts_another_copy_may_queue(
    app: Celery, tasks: dict[str, Any], broker: RedisServer
) -> None:
    first = tasks["import"].delay(1)
    assert tasks["import"].delay(1).id == first.id
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert tasks["gate"].blpop(["started"], timeout=10) is not None  # first is running
        second = tasks["import"].delay(1)
        assert second.id != first.id  # one running + one queued
        assert tasks["import"].delay(1).id == second.id
        tasks["gate"].rpush("gate", "open", "open")
        assert first.get(timeout=10) == first.id
        assert second.get(timeout=10) == second.id


def _next_copy(task: Any, customer_id: int, finished: str) -> Any:
    """Enqueue until the call queues a new copy, not the ``finished`` one: the place
    is handed back in task_postrun, a moment after the result the test read."""
    deadline = time.monotonic() + 10
    while True:
        result = task.delay(customer_id)
        if result.id != finished:
            return result
        assert time.monotonic() < deadline, "the finished copy kept its queue place"
        time.sleep(0.02)


def test_until_executed_duplicate_enqueues_while_it_runs_get_the_running_copy(
    app: Celery, tasks: dict[str, Any], broker: RedisServer
) -> None:
    first = tasks["until"].delay(7)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert tasks["gate"].blpop(["started"], timeout=10) is not None  # first is running
        ctx = multiprocessing.get_context("fork")
        out: Any = ctx.Queue()
        procs = [ctx.Process(target=_delay_many, args=(tasks["until"], 5, out)) for _ in range(4)]
        for proc in procs:
            proc.start()
        reports = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(10)
        assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
        ids = {i for report in reports for i in report}
        assert ids == {first.id}  # 20 enqueues from 4 processes: the running copy
        assert _queued(broker) == 0  # nothing else queued while it runs
        tasks["gate"].rpush("gate", "open")
        assert first.get(timeout=10) == first.id
        # Its run ended: the place is free (handed back just after the result is
        # stored), the next copy queues and runs.
        later = _next_copy(tasks["until"], 7, first.id)
        tasks["gate"].rpush("gate", "open")
        assert later.get(timeout=10) == later.id


def test_per_call_queued_until_end_keeps_the_place_through_the_run(
    app: Celery, tasks: dict[str, Any]
) -> None:
    first = tasks["import"].apply_async((2,), redlock={"queued_until": "end"})
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        assert tasks["gate"].blpop(["started"], timeout=10) is not None
        assert tasks["import"].delay(2).id == first.id  # still its place
        tasks["gate"].rpush("gate", "open")
        assert first.get(timeout=10) == first.id
        second = _next_copy(tasks["import"], 2, first.id)
        tasks["gate"].rpush("gate", "open")
        assert second.get(timeout=10) == second.id


def test_revoke_frees_the_queue_place(
    app: Celery, tasks: dict[str, Any], broker: RedisServer
) -> None:
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        busy = tasks["blocker"].delay()  # keeps the only worker thread busy
        time.sleep(0.3)
        queued = tasks["import"].delay(2)
        queued.revoke()
        deadline = time.monotonic() + 10
        tasks["gate"].rpush("gate", "open")  # the worker reaches the revoked copy
        while tasks["import"].delay(2).id == queued.id:
            assert time.monotonic() < deadline, "queue place not freed after revoke"
            time.sleep(0.1)
        busy.get(timeout=10)
        tasks["gate"].rpush("gate", "open", "open")


def test_purged_message_frees_the_place_within_its_ttl(
    app: Celery, tasks: dict[str, Any], broker: RedisServer
) -> None:
    strict = tasks["strict"]
    ttl = strict.redlock_options().queued_ttl
    for customer_id in range(3, 13):
        began = time.monotonic()  # the queue place is taken after this...
        first = strict.delay(customer_id)
        sent = time.monotonic()  # ...and before this
        try:
            strict.delay(customer_id)
        except AlreadyQueued as caught:
            assert caught.task_id == first.id
            break
        # Refused only while the place lives: a load pause longer than its TTL
        # between the two calls makes this round say nothing; try another key.
        assert time.monotonic() - began >= ttl, "a duplicate was queued within the TTL"
    else:
        pytest.fail("never two enqueues within the queue place's TTL")
    app.control.purge()
    assert _queued(broker) == 0
    # Redis expires the place at most ttl after it was set (plus clock-rate drift).
    time.sleep(max(0.0, sent + ttl * 1.01 + 0.002 - time.monotonic()))
    assert strict.delay(customer_id).id != first.id


def test_eager_calls_are_not_deduplicated(app: Celery, tasks: dict[str, Any]) -> None:
    app.conf.task_always_eager = True
    tasks["gate"].rpush("gate", "open", "open")
    first = tasks["import"].delay(4)
    second = tasks["import"].delay(4)
    assert first.id != second.id
    assert first.successful() and second.successful()


# -- per-call options: apply_async(redlock={...}) and celery-once's once={...} ----------


@pytest.fixture
def plain(app: Celery, tasks: dict[str, Any]) -> Any:
    """A RedlockTask without queue once (redlock_dedupe_queued off)."""

    @app.task(shared=False, base=RedlockTask, redlock_key=["customer_id"], name="q.plain")
    def plain_task(customer_id: int) -> int:
        return customer_id

    return plain_task


def _queued_pttls(nodes: RedisNodes, key: str) -> list[int]:
    """The queued lock's remaining TTL on each node, in ms (read by hand)."""
    return [int(server.client().pttl(key)) for server in nodes]


def test_per_call_on_queued_raise_overrides_the_task(
    tasks: dict[str, Any], broker: RedisServer
) -> None:
    first = tasks["import"].delay(20)
    with pytest.raises(AlreadyQueued) as caught:
        tasks["import"].apply_async((20,), redlock={"on_queued": "raise"})
    assert caught.value.task_id == first.id
    assert tasks["import"].apply_async((20,), redlock={"on_queued": "return"}).id == first.id
    assert _queued(broker) == 1


def test_per_call_queued_ttl_sets_the_queue_place_ttl(
    tasks: dict[str, Any], redis_nodes: RedisNodes
) -> None:
    tasks["import"].apply_async((21,), redlock={"queued_ttl": 5})
    key = tasks["import"].lock_key((21,), {}) + ":queued"
    # The task's own redlock_queued_ttl is 60 s: a place set for 5 s has at most 5 s left.
    held = [ttl for ttl in _queued_pttls(redis_nodes, key) if ttl > 0]
    assert len(held) >= 3 and max(held) <= 5000


def test_per_call_dedupe_queued_false_sends_a_second_copy(
    tasks: dict[str, Any], broker: RedisServer
) -> None:
    first = tasks["import"].delay(22)
    second = tasks["import"].apply_async((22,), redlock={"dedupe_queued": False})
    assert second.id != first.id
    assert _queued(broker) == 2


def test_per_call_dedupe_queued_true_on_a_task_without_queue_once(
    plain: Any, broker: RedisServer
) -> None:
    first = plain.apply_async((23,), redlock={"dedupe_queued": True})
    assert plain.apply_async((23,), redlock={"dedupe_queued": True}).id == first.id
    assert plain.delay(23).id != first.id  # a call without the option is not deduplicated
    assert _queued(broker) == 2


def test_celery_once_graceful_alias_returns_the_queued_copy(
    plain: Any, broker: RedisServer
) -> None:
    first = plain.apply_async((24,), once={"graceful": True, "timeout": 60})
    assert plain.apply_async((24,), once={"graceful": True}).id == first.id
    with pytest.raises(AlreadyQueued) as caught:
        plain.apply_async((24,), once={"graceful": False})
    assert caught.value.task_id == first.id
    assert _queued(broker) == 1


def test_celery_once_timeout_alias_sets_the_queue_place_ttl(
    plain: Any, redis_nodes: RedisNodes
) -> None:
    plain.apply_async((25,), once={"timeout": 4})
    key = plain.lock_key((25,), {}) + ":queued"
    held = [ttl for ttl in _queued_pttls(redis_nodes, key) if ttl > 0]
    assert len(held) >= 3 and max(held) <= 4000


def test_per_call_options_are_not_sent_with_the_message(
    app: Celery, tasks: dict[str, Any], broker: RedisServer
) -> None:
    app.conf.task_always_eager = True  # checked, popped, and the call runs inline
    tasks["gate"].rpush("gate", "open")
    result = tasks["import"].apply_async((26,), redlock={"on_queued": "raise"})
    assert result.successful()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"redlock": ["on_queued"]}, r"apply_async\(redlock=\.\.\.\) must be a dict"),
        ({"redlock": {"ttl": 5}}, r"unknown option 'ttl'; accepted: 'on_queued', 'queued_ttl'"),
        ({"redlock": {"on_queued": "skip"}}, r"redlock\['on_queued'\] must be one of 'return'"),
        ({"redlock": {"queued_ttl": 0}}, r"redlock\['queued_ttl'\] must be > 0 seconds"),
        ({"redlock": {"queued_ttl": "1h"}}, r"redlock\['queued_ttl'\] must be a finite number"),
        ({"redlock": {"dedupe_queued": 1}}, r"redlock\['dedupe_queued'\] must be True or False"),
        (
            {"redlock": {"queued_until": "later"}},
            r"redlock\['queued_until'\] must be one of 'start', 'end'",
        ),
        ({"once": "graceful"}, r"apply_async\(once=\.\.\.\) must be a dict"),
        ({"once": {"graceful": "yes"}}, r"once\['graceful'\] must be True or False"),
        ({"once": {"timeout": -1}}, r"once\['timeout'\] must be > 0 seconds"),
        ({"once": {"grace": True}}, r"unknown option 'grace'; accepted: 'graceful', 'timeout'"),
        ({"once": {"keys": ["a"]}}, r"once\['keys'\] is a task-level option.*redlock_key"),
        ({"once": {"unlock_before_run": True}}, r"once\['unlock_before_run'\] is a task-level"),
        ({"once": {}, "redlock": {}}, r"redlock=\{\.\.\.\} or celery-once's once=\{\.\.\.\}"),
    ],
)
def test_bad_per_call_options_are_refused_naming_them(
    tasks: dict[str, Any], broker: RedisServer, call: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        tasks["import"].apply_async((27,), **call)
    assert _queued(broker) == 0


# -- celery-once's task-level once = {...} class attribute -----------------------------


def test_celery_once_class_attribute_sets_the_task_options(
    app: Celery, broker: RedisServer, redis_nodes: RedisNodes
) -> None:
    @app.task(
        shared=False,
        base=RedlockTask,
        once={"graceful": True, "timeout": 30, "keys": ["customer_id"]},
        name="q.once",
    )
    def once_task(customer_id: int, note: str = "") -> int:
        return customer_id

    options = once_task.redlock_options()
    assert (options.dedupe_queued, options.on_queued, options.queued_ttl) == (True, "return", 30)
    assert options.queued_until == "start"
    first = once_task.delay(30, note="a")
    assert once_task.delay(30, note="b").id == first.id  # keys: only customer_id counts
    key = once_task.lock_key((30,), {}) + ":queued"
    held = [ttl for ttl in _queued_pttls(redis_nodes, key) if ttl > 0]
    assert len(held) >= 3 and max(held) <= 30_000
    assert _queued(broker) == 1


def test_celery_once_unlock_before_run_false_keeps_the_place_until_the_end(app: Celery) -> None:
    @app.task(shared=False, base=RedlockTask, once={"unlock_before_run": False}, name="q.ubr")
    def kept(customer_id: int) -> int:
        return customer_id

    options = kept.redlock_options()
    assert (options.dedupe_queued, options.queued_until) == (True, "end")


def test_celery_once_class_attribute_not_graceful_raises(app: Celery, broker: RedisServer) -> None:
    @app.task(shared=False, base=RedlockTask, once={"graceful": False}, name="q.once_strict")
    def strict_once(customer_id: int) -> int:
        return customer_id

    first = strict_once.delay(31)
    with pytest.raises(AlreadyQueued) as caught:
        strict_once.delay(31)
    assert caught.value.task_id == first.id
    assert _queued(broker) == 1


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"once": "graceful"}, r"task q\.bad_once: once must be a dict with keys among"),
        ({"once": {"graceful": "yes"}}, r"once\['graceful'\] must be True or False"),
        ({"once": {"timeout": 0}}, r"once\['timeout'\] must be > 0 seconds"),
        ({"once": {"keys": "customer_id"}}, r"once\['keys'\] must be a list of argument names"),
        ({"once": {"keys": ["nope"]}}, r"nope"),
        ({"once": {"unlock_before_run": 1}}, r"once\['unlock_before_run'\] must be True or"),
        ({"once": {"grace": True}}, r"once\['grace'\]: unknown key; accepted: 'graceful'"),
        (
            {"once": {"timeout": 5}, "redlock_queued_ttl": 5},
            r"redlock_queued_ttl is set both as a class attribute and through celery-once",
        ),
    ],
)
def test_bad_celery_once_class_attributes_are_refused_naming_them(
    app: Celery, broker: RedisServer, attributes: dict[str, Any], message: str
) -> None:
    @app.task(shared=False, base=RedlockTask, name="q.bad_once", **attributes)
    def bad_once(customer_id: int) -> int:
        return customer_id

    with pytest.raises(ConfigurationError, match=message):
        bad_once.delay(32)
    assert _queued(broker) == 0


def test_an_enqueue_whose_vote_stays_split_is_refused_not_pointed_at_a_phantom_copy(
    tasks: dict[str, Any], broker: RedisServer, redis_nodes: RedisNodes
) -> None:
    # Two other callers each hold the queue place on 2 of 5 nodes for longer than an
    # enqueue's patience: nobody holds it on a quorum, so no copy is known to be
    # queued. Answering "already queued as <one node's holder>" would drop the call.
    key = tasks["import"].lock_key((40,), {}) + ":queued"
    for i, server in enumerate(list(redis_nodes)[:4]):
        server.client().set(key, b"loser-a|a" if i < 2 else b"loser-b|b", px=5_000)
    with pytest.raises(LockContended) as raised:
        tasks["import"].delay(40)
    assert raised.value.split and "the vote split" in str(raised.value)
    assert _queued(broker) == 0  # not sent, and the caller knows
