"""Queue once with real ``celery worker`` subprocesses and callers in 4 processes, with
faults: a lock node SIGSTOPped mid-run, a body SIGKILLed.

Replace (``redlock_on_queued="replace"``): 100 enqueues of one key from 4 processes in
about 2 s, each with its own arguments (a version) and the same countdown (a
debounce), while the workers run. Judged by the
observer (the bodies report their task id and version), never by the lock's word:
every task ends SUCCESS; a copy whose result is the ``Replaced`` marker never ran its
body and its marker names a copy that was sent; every copy not replaced ran; and the
copy whose enqueue returned last ran with its arguments, or its replacements (each
enqueued while it was) lead to a copy that did.

Until executed (``redlock_queued_until="end"``): 20 enqueues from 4 processes while
the first copy runs each get that copy's id, nothing else is queued, and the task
runs once (again after its body is killed: ``acks_late``); once it has ended, a new
enqueue queues a new copy.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from celery.result import AsyncResult

from celery_redlock import is_replaced
from tests.apps import limitsapp
from tests.support.observed import runs, starts
from tests.support.workers import Launch, Stack, eventually, wait_all
from tests.workers.test_limits_workers import Pool, fault

pytestmark = pytest.mark.slow

#: The debounce: every call's countdown (seconds).
DEBOUNCE = 0.5


def _callers(
    broker_url: str, nodes: list[str], process: int, count: int, seconds: float, out: Any
) -> None:
    try:
        task = limitsapp.client_task("replaced", broker_url, nodes)

        def call(i: int) -> tuple[str, int, int, int]:
            version = process * 1000 + i
            time.sleep(0.08 * i)  # 25 calls over 2 s
            began = time.monotonic_ns()
            result = task.apply_async(
                kwargs={"tag": "r", "version": version, "seconds": seconds, "counter": "repl"},
                countdown=DEBOUNCE,
            )
            return result.id, version, began, time.monotonic_ns()

        with ThreadPoolExecutor(4) as pool:
            out.put(list(pool.map(call, range(count))))
    except BaseException as exc:  # report it: a silent child would hang the test
        out.put(repr(exc))
        raise


@pytest.mark.parametrize(
    ("pool", "kind"),
    [
        (Pool("prefork", 2, 4), "none"),
        (Pool("prefork", 2, 4), "node-stopped"),
        (Pool("prefork", 2, 4), "holder-killed"),
        (Pool("gevent", 2, 10), "none"),
    ],
    ids=["prefork-none", "prefork-node-stopped", "prefork-holder-killed", "gevent-none"],
)
def test_100_replacing_enqueues_from_4_processes_run_only_copies_nobody_replaced(
    stack: Stack, launch: Launch, pool: Pool, kind: str
) -> None:
    launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    seconds = 1.0 if kind == "holder-killed" else 0.05  # a body there is to kill
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=_callers,
            args=(stack.broker.url, stack.nodes.urls, p, 25, seconds, out),
        )
        for p in range(4)
    ]
    for proc in procs:
        proc.start()
    with fault(stack, launch, pool, kind, "repl", after=1 if kind != "none" else 4):
        reports = [out.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(10)
        assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
        sent = {task_id: call for report in reports for task_id, *call in report}
        assert len(sent) == 100
        results = [AsyncResult(task_id, app=stack.client) for task_id in sent]
        wait_all(results, timeout=120)
    states = {r.id: r.state for r in results}
    assert [s for s in states.values() if s != "SUCCESS"] == [], states
    replaced = {r.id: r.result["by"] for r in results if is_replaced(r.result)}
    assert set(replaced.values()) <= set(sent)  # each names a copy that was sent
    ran = runs(stack.observer, "repl")
    assert set(ran) == set(sent) - set(replaced)  # no replaced copy ran; every other did
    versions = {str(k): int(v) for k, v in stack.observer.hgetall("versions:repl").items()}
    # The copy whose enqueue returned last ran with its arguments, or was replaced by a
    # copy whose enqueue overlapped its own (the later claim wins, not the later return:
    # a call still swapping the place may return after a copy that replaced it), and so
    # on to a copy that ran with its arguments.
    last = max(sent, key=lambda task_id: sent[task_id][2])
    chain = [last]
    while chain[-1] in replaced:
        chain.append(replaced[chain[-1]])
        assert chain[-1] not in chain[:-1], chain  # fates are set once: no cycle
        assert sent[chain[-1]][1] <= sent[last][2]  # began before the last call returned
    assert chain[-1] in ran and versions[chain[-1]] == sent[chain[-1]][0]
    reruns = sum(n - 1 for n in ran.values())
    assert reruns == 0 or kind == "holder-killed"
    print(
        f"replace, {pool.name} {pool.workers}x-c{pool.concurrency}, fault {kind}: 100 tasks "
        f"SUCCESS, {len(replaced)} replaced, {len(ran)} ran ({reruns} again after a kill)"
    )


def _until_callers(broker_url: str, nodes: list[str], count: int, out: Any) -> None:
    try:
        task = limitsapp.client_task("until_end", broker_url, nodes)
        with ThreadPoolExecutor(4) as pool:
            out.put(
                list(pool.map(lambda i: task.delay(tag="u", version=i, counter="until").id,
                              range(count)))
            )  # fmt: skip
    except BaseException as exc:  # report it: a silent child would hang the test
        out.put(repr(exc))
        raise


@pytest.mark.parametrize("kind", ["none", "node-stopped", "holder-killed"])
def test_until_executed_duplicates_from_4_processes_get_the_running_copy(
    stack: Stack, launch: Launch, kind: str
) -> None:
    pool = Pool("prefork", 2, 4)
    launch("limitsapp", pool.workers, pool=pool.name, concurrency=pool.concurrency)
    task = limitsapp.client_task("until_end", stack.broker.url, stack.nodes.urls)
    first = task.delay(tag="u", version=0, seconds=3.0, counter="until")
    eventually(lambda: bool(starts(stack.observer, "until")), 60, "the first copy began")
    with fault(stack, launch, pool, kind, "until", after=1):
        ctx = multiprocessing.get_context("fork")
        out: Any = ctx.Queue()
        procs = [
            ctx.Process(target=_until_callers, args=(stack.broker.url, stack.nodes.urls, 5, out))
            for _ in range(4)
        ]
        for proc in procs:
            proc.start()
        reports = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(10)
    assert [r for r in reports if isinstance(r, str)] == []  # no caller failed
    assert {task_id for report in reports for task_id in report} == {first.id}
    wait_all([first], timeout=120)
    assert first.state == "SUCCESS"
    ran = runs(stack.observer, "until")
    assert list(ran) == [first.id] and ran[first.id] == 1 + (kind == "holder-killed")
    # The place is handed back just after the result is stored (task_postrun): a
    # duplicate enqueue in between still gets the first copy.
    sent: list[Any] = []

    def queued_anew() -> bool:
        sent.append(task.delay(tag="u", version=1, counter="until"))
        return bool(sent[-1].id != first.id)

    eventually(queued_anew, 30, "a new copy queued once the first had ended")
    later = sent[-1]
    wait_all([later], timeout=60)
    assert later.state == "SUCCESS"
